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
    return SimpleNamespace(scale=scale, payload=payload, lut=prepare._humming_mxfp4_w4a8_rewrite_lut_cpu, preprocess=preprocess,
                           checks={"scale": scale_checks, "payload": payload_checks, "preprocess": preprocess_checks})
