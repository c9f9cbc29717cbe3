"""FlashInfer's own Humming preprocess (``flashinfer.fused_moe.prepare``), made runnable on CPU tensors.

``_preprocess_humming_e8m0_weight_scale`` and ``_process_humming_mxfp4_w4a8_payload`` are plain torch
but refuse tensors that are not on CUDA (``if not x.is_cuda: raise``). :func:`cpu_helpers` compiles
their own source again with exactly those checks replaced by ``False`` (nothing else changes; the
test asserts the source had the checks), in a copy of the module's globals, so the CPU suite runs
FlashInfer's code, not moebake's. ``preprocess`` is ``preprocess_moe_weights_for_sm90_mixed_gemm_humming``
compiled the same way with the two helpers above; its CUDA weight interleave
(``interleave_moe_weights_for_sm90_mixed_gemm``) is the caller's stand-in.
"""

import inspect
import re
import textwrap
from types import SimpleNamespace

_CUDA_CHECK = re.compile(r"not (\w+)\.is_cuda")


def _recompile(function, namespace: dict) -> tuple:
    """``function`` re-defined from its source in ``namespace`` with its ``is_cuda`` checks off; and how many were."""
    source = textwrap.dedent(inspect.getsource(inspect.unwrap(function)))
    source = "\n".join(line for line in source.splitlines() if not line.startswith("@"))  # decorators (tracing)
    replaced, count = _CUDA_CHECK.subn("False", source)
    exec(compile(replaced, inspect.getsourcefile(function), "exec"), namespace)  # noqa: S102 - FlashInfer's own code
    return namespace[function.__name__], count


def cpu_helpers(interleave_weights=None) -> SimpleNamespace:
    """FlashInfer's Humming helpers runnable on CPU: ``scale`` (the E8M0 clamp), ``payload`` (the LUT rewrite),
    ``lut`` (the rewrite table, CPU already), ``preprocess`` (the public entry point, with
    ``interleave_weights(w, quant_type)`` standing in for the CUDA interleave) and ``checks`` (how many
    ``is_cuda`` checks each had)."""
    from flashinfer.fused_moe import prepare

    namespace = dict(vars(prepare))
    scale, scale_checks = _recompile(prepare._preprocess_humming_e8m0_weight_scale, namespace)
    payload, payload_checks = _recompile(prepare._process_humming_mxfp4_w4a8_payload, namespace)

    def no_interleave(weight, quant_type):
        raise AssertionError("cpu_helpers(interleave_weights=...) was not given a stand-in for the CUDA interleave")

    namespace["interleave_moe_weights_for_sm90_mixed_gemm"] = interleave_weights or no_interleave
    preprocess, preprocess_checks = _recompile(prepare.preprocess_moe_weights_for_sm90_mixed_gemm_humming, namespace)
    return SimpleNamespace(
        scale=scale,
        payload=payload,
        lut=prepare._humming_mxfp4_w4a8_rewrite_lut_cpu,
        preprocess=preprocess,
        checks={"scale": scale_checks, "payload": payload_checks, "preprocess": preprocess_checks},
    )


def widen_mxfp4_scales(source_dir, seed: int = 0) -> None:
    """Rewrite, in place, a synthetic GPT-OSS / DeepSeek-V4 checkpoint's expert E8M0 scales (``*_proj_scales``,
    ``ffn.experts.*.w?.scale``) so that the Humming range clamp has work: most in [110, 128), 3% far below
    (60..109: clamped groups, rewritten codes), same names, shapes and dtypes (``moebake.synthetic`` and its reference writers write
    [118, 123), a range of 4, which the clamp keeps whole)."""
    from pathlib import Path

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    for shard in sorted(Path(source_dir).glob("*.safetensors")):
        with safe_open(shard, framework="pt") as f:
            tensors, metadata = {name: f.get_tensor(name) for name in f.keys()}, f.metadata()
        for name, tensor in tensors.items():
            if not (name.endswith("_proj_scales") or (".ffn.experts." in name and name.endswith(".scale"))):
                continue
            wide = torch.randint(110, 128, tensor.shape, dtype=torch.uint8, generator=generator)
            low = torch.rand(tensor.shape, generator=generator) < 0.03
            wide[low] = torch.randint(60, 110, (int(low.sum()),), dtype=torch.uint8, generator=generator)
            tensors[name] = wide.view(tensor.dtype)
        save_file(tensors, shard, metadata=metadata)
