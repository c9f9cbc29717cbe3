"""SGLang's own DeepSeek-V4 model (``DeepseekV4ForCausalLM`` and its MTP draft ``DeepseekV4ForCausalLMNextN``) built on
CPU from a checkpoint's config.json and loaded from its shards through SGLang's ``load_weights``: the oracle of a
servable DeepSeek-V4 checkpoint (``tests/test_deepseek_v4_servable.py`` runs it with SGLang 0.5.17's tree first on
``PYTHONPATH``).

  python tests/engine_oracles/sglang_dsv4_model.py CHECKPOINT [CHECKPOINT ...]

prints one JSON line per checkpoint: ``parameters`` (SGLang's parameter names, shapes and dtypes; the draft's prefixed
``nextn:``), ``unloaded`` (the parameters no checkpoint tensor reached, less those SGLang itself does not check: the
attention's ``k_scale``/``v_scale``, the draft's embedding and head), ``unused`` (the checkpoint tensors that reached no
parameter's loader of either model), ``error`` (what a loader raised: a shape that is not the parameter's). SGLang's
config loader (``get_config``), its model classes, its weight-name mapping, its fusions (``wqkv_a``, the compressors'
``wkv_gate``) and its parameters' loaders are all SGLang's; only the compiled modules it imports (:mod:`standins`), the
device (CPU), and two post-load steps that call CUDA kernels (the mHC JIT prewarm, DeepGEMM's FP8 ``wo_a`` scale layout)
are not.
"""

import json
import sys
import traceback
import types
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]  # tests/, this checkout

import torch  # noqa: E402

from engine_oracles import sglang_oracle  # noqa: E402

SKIPPED = ("attn_mqa.k_scale", "attn_mqa.v_scale")
NEXTN_SKIPPED = ("lm_head", "embed_tokens")
"""Parameters SGLang's ``load_weights`` itself leaves out of its check (``skipped_checking_patterns``): the draft model's
embedding and head are the main model's (``set_embed_and_head``)."""
FUSED = (
    ".compressor.wkv.weight",
    ".compressor.wgate.weight",
    ".attn.wq_a.weight",
    ".attn.wq_a.scale",
    ".attn.wkv.weight",
    ".attn.wkv.scale",
)
"""Checkpoint tensors SGLang concatenates before a loader sees them (``wkv_gate``, ``wqkv_a``): used when the fused
parameter is loaded, which SGLang's ``load_weights`` asserts (its fusion caches end empty)."""


def _build(config, quant_config, nextn: bool):
    import sglang.srt.models.deepseek_v4 as dsv4
    import sglang.srt.models.deepseek_v4_nextn as nextn_module

    cls = nextn_module.DeepseekV4ForCausalLMNextN if nextn else dsv4.DeepseekV4ForCausalLM
    return cls(config, quant_config)


def check(checkpoint: Path) -> dict:
    import sglang.srt.models.deepseek_v4 as dsv4
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.model_loader import loader
    from sglang.srt.utils.hf_transformers_utils import get_config

    config = get_config(str(checkpoint), trust_remote_code=False)
    raw = json.loads((checkpoint / "config.json").read_text())
    baked = raw["quantization_config"]["quant_method"] == "moebake"
    files = sorted(str(p) for p in checkpoint.glob("*.safetensors"))
    names = [name for f in files for name in _keys(f)]
    result = {"parameters": {}, "unloaded": [], "unused": [], "error": None, "model_config_error": None}
    try:  # the server's first step with config.json (ServerArgs.get_model_config): the attention geometry it derives
        from sglang.srt.configs.model_config import ModelConfig

        ModelConfig(model_path=str(checkpoint), context_length=4096)
    except Exception as err:
        result["model_config_error"] = "".join(traceback.format_exception_only(err)).strip()
    used: set[str] = set()
    cpu = types.SimpleNamespace(device=torch.device("cpu"))
    with ExitStack() as stack:
        stack.enter_context(sglang_oracle.sglang_engine(moe_runner_backend="marlin", gpu="sm90"))
        stack.enter_context(mock.patch.object(dsv4, "get_device", lambda *a: cpu))
        stack.enter_context(mock.patch("sglang.srt.layers.rotary_embedding.rope_variant.get_device", lambda *a: "cpu"))
        stack.enter_context(mock.patch.object(dsv4.DeepseekV4ForCausalLM, "_prewarm_mhc_kernels", lambda self: None))
        stack.enter_context(mock.patch.object(dsv4.DeepseekV4ForCausalLM, "_setup_fp8_wo_a_scales", lambda self, is_nextn: None))
        if baked:  # --quantization moebake: moebake's plugin, loaded as a server loads it, reading this bake's manifest
            from sglang.srt.layers.quantization import QUANTIZATION_METHODS

            sglang_oracle.load_plugins_as_a_server_does()
            stack.enter_context(mock.patch("moebake.engines.sglang.config.model_directory", return_value=checkpoint))
            quant_config = QUANTIZATION_METHODS["moebake"].from_config(raw["quantization_config"])
        else:
            quant_config = Fp8Config.from_config(raw["quantization_config"])
            quant_config.is_fp4_experts = raw.get("expert_dtype", "fp4") == "fp4"  # what SGLang's ModelConfig derives
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # the server's model dtype (config.json torch_dtype)
        try:
            for nextn in [False, True] if raw.get("num_nextn_predict_layers") else [False]:
                model = _build(config, quant_config, nextn)
                params = dict(model.named_parameters())
                loaded: set[str] = set()
                yielded: dict[int, str] = {}
                keep = []

                def weights():
                    # the iterator as SGLang's loader binds it: for a bake, the plugin's wrapper (shard_iterator)
                    for name, tensor in loader.safetensors_weights_iterator(files):
                        yielded[id(tensor)] = name
                        keep.append(tensor)
                        yield name, tensor

                by_id = {id(param): pname for pname, param in params.items()}

                def submit(*, executor, futures, use_async, func, func_args=(), func_kwargs=None, _submit=dsv4.maybe_executor_submit):
                    # every load of SGLang's load_weights goes through here: (param, tensor, ...) to the param's loader
                    param, tensor = func_args[0], func_args[1]
                    loaded.add(by_id[id(param)])
                    if id(tensor) in yielded:
                        used.add(yielded[id(tensor)])
                    _submit(executor=executor, futures=futures, use_async=False, func=func, func_args=func_args, func_kwargs=func_kwargs)

                try:
                    with mock.patch.object(dsv4, "maybe_executor_submit", submit):
                        model.load_weights(weights())
                except Exception as err:  # a loader's refusal: the checkpoint is wrong
                    result["error"] = "".join(traceback.format_exception_only(err)).strip()
                    return result
                prefix = "nextn:" if nextn else ""
                result["parameters"] |= {prefix + n: [list(p.shape), str(p.dtype)] for n, p in params.items()}
                skipped = SKIPPED + (NEXTN_SKIPPED if nextn else ())
                result["unloaded"] += [prefix + n for n in params if n not in loaded and not any(s in n for s in skipped)]
                used |= {yielded[id(t)] for t in keep if yielded[id(t)].endswith(FUSED) and _fused_loaded(yielded[id(t)], loaded)}
                keep.clear()
        finally:
            torch.set_default_dtype(previous)
    result["unused"] = [name for name in names if name not in used]
    return result


def _fused_loaded(name: str, loaded: set[str]) -> bool:
    """Whether the parameter SGLang fuses ``name`` into was loaded (``wkv_gate`` of its compressor, ``wqkv_a`` of its
    attention), in the main model's names (``layers.L.``) or the draft's (``mtp.J.``: its decoder layer)."""
    module = name.rsplit(".", 2)[0]  # layers.0.attn.compressor, layers.0.attn (wq_a, wkv)
    fused = module + (
        ".wkv_gate.weight"
        if module.endswith(".compressor")
        else ".wqkv_a.weight_scale_inv"
        if name.endswith(".scale")
        else ".wqkv_a.weight"
    )
    block, rest = fused.split(".attn.", 1) if ".attn." in fused else fused.split(".attn", 1)
    rest = rest.lstrip(".")
    layer = f"model.{block}" if block.startswith("layers.") else "model.decoder"
    return f"{layer}.self_attn.{rest}" in loaded


def _keys(path: str) -> list[str]:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return list(f.keys())


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print(json.dumps({"checkpoint": argument} | check(Path(argument))), flush=True)
