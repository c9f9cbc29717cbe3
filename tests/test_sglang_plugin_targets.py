"""moebake's SGLang plugin serving ``cutedsl``, ``cutedsl-deepep`` and ``sm100-trtllm`` bakes, against stock SGLang 0.5.23 on CPU.

For each target, a real SGLang ``FusedMoE`` built with ``--quantization moebake`` (the serving flags the bake's
engine record names, the platform told it is an SM100 GPU) gets the manifest's parameters; SGLang's loader call
puts the files' bytes in them untransformed; after the post-load step, every parameter stock SGLang holds for the
same layer prepared from the *source* (``tests/engine_oracles/sglang_oracle.py``) is the plugin's, byte for byte.
(CuteDSL and trtllm-gen kernels run on Blackwell only: no GPU test here.)
"""

import json
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from conftest import load_all
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.synthetic import write_deepseek_v4, write_gpt_oss, write_modelopt_nvfp4

sglang_oracle = pytest.importorskip("engine_oracles.sglang_oracle")
if not sglang_oracle.sglang_installed():
    pytest.skip("sglang 0.5.23 is not installed (bin/setup installs it)", allow_module_level=True)

from sglang.srt.plugins import load_plugins  # noqa: E402  (after the stand-ins are installed)
from engine_oracles.sglang_oracle import standins, standins_hidden_after_each_test  # noqa: E402,F401  (autouse)

E, H, I = 4, 256, 128
MODELOPT_PREFIX = "model.layers.1.mlp.experts."
GPT_OSS_PREFIX = "model.layers.0.mlp.experts."
DSV4_PREFIX = "layers.0.ffn.experts."
# target -> (source writer, layer prefix, SGLang flags, stock SGLang's preparation of the source)
CASES = {
    "cutedsl": (lambda path: write_modelopt_nvfp4(path, num_layers=2, num_experts=E, hidden=H, intermediate=I, mismatches=()),
                MODELOPT_PREFIX, {"moe_runner_backend": "flashinfer_cutedsl", "moe_a2a_backend": "none"},
                lambda src: sglang_oracle.modelopt_nvfp4_cutedsl(src, MODELOPT_PREFIX, E, H, I, "none")),
    "cutedsl-deepep": (lambda path: write_modelopt_nvfp4(path, num_layers=2, num_experts=E, hidden=H, intermediate=I, mismatches=()),
                       MODELOPT_PREFIX, {"moe_runner_backend": "flashinfer_cutedsl", "moe_a2a_backend": "deepep"},
                       lambda src: sglang_oracle.modelopt_nvfp4_cutedsl(src, MODELOPT_PREFIX, E, H, I, "deepep")),
    "sm100-trtllm": (lambda path: write_gpt_oss(path, num_layers=1, num_experts=E, hidden=160, intermediate=96, vocab=32),
                     GPT_OSS_PREFIX, {"moe_runner_backend": "flashinfer_mxfp4"},
                     lambda src: sglang_oracle.gpt_oss_sm100_trtllm(src, 0)),
    "sm100-trtllm/deepseek-v4": (
        lambda path: write_deepseek_v4(path, num_layers=1, num_experts=E, hidden=H, intermediate=I, mtp_layers=0),
        DSV4_PREFIX, {"moe_runner_backend": "flashinfer_mxfp4"},
        lambda src: sglang_oracle.deepseek_v4_sm100_trtllm(src, DSV4_PREFIX, E, H, I)),
}


@pytest.fixture(scope="module", autouse=True)
def plugin_loaded():
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    QUANTIZATION_METHODS.setdefault("mxfp4", Mxfp4Config)  # as SGLang registers it on a CUDA machine
    load_plugins()
    standins.hide()


@pytest.fixture(scope="module")
def bakes(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin-targets")
    made = {}
    for target, (write, *_) in CASES.items():
        source = write(root / target / "src")
        convert(source, root / target / "out", ConvertOptions(target.split("/")[0]), progress=False)
        made[target] = source, root / target / "out"
    return made


@contextmanager
def serving(out, gpu="sm100", **flags):
    """SGLang's state for a one-GPU server of the bake ``out`` with ``flags``, FlashInfer's CPU-side stand-ins
    as the oracle uses them."""
    import sglang.srt.layers.moe.fused_moe_triton.layer as fused_moe_layer
    import sglang.srt.layers.quantization.mxfp4 as mxfp4

    with (sglang_oracle.sglang_engine(gpu=gpu, **flags), sglang_oracle._cutedsl_utils(), sglang_oracle._sm100_flashinfer(mxfp4),
          mock.patch.object(fused_moe_layer, "create_moe_dispatcher", lambda *a, **k: sglang_oracle._DispatcherStandin()),
          mock.patch("moebake.engines.sglang.config.model_directory", return_value=out)):
        yield


def plugin_layer(out, prefix):
    """SGLang's FusedMoE for the bake's layer at ``prefix`` with ``--quantization moebake`` (as the model builds it)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    config = json.loads((out / "config.json").read_text())
    quant_config = QUANTIZATION_METHODS["moebake"].from_config(config["quantization_config"])
    if "num_local_experts" in config:  # GPT-OSS, as GptOssSparseMoeBlock builds it
        return FusedMoE(num_experts=config["num_local_experts"], top_k=config["num_experts_per_tok"], layer_id=0,
                        hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
                        quant_config=quant_config, activation=config["hidden_act"], gemm1_alpha=1.702,
                        gemm1_clamp_limit=config["swiglu_limit"], with_bias=True, prefix=prefix.rstrip("."),
                        use_weight_loader_fused=True)
    return FusedMoE(num_experts=E, top_k=2, layer_id=1, hidden_size=H, intermediate_size=I, quant_config=quant_config,
                    prefix=prefix.rstrip("."), params_dtype=torch.bfloat16, swiglu_limit=config.get("swiglu_limit"))


@pytest.mark.parametrize("target", CASES)
def test_plugin_layer_equals_stock_sglang(bakes, target):
    _, prefix, flags, stock = CASES[target]
    source, out = bakes[target]
    record = next(r for r in json.loads((out / "moebake.json").read_text())["layers"] if r["prefix"] == prefix)
    baked = load_all(out)
    with serving(out, **flags):
        layer = plugin_layer(out, prefix)
        params = dict(layer.named_parameters())
        assert {name: list(p.shape) for name, p in params.items()} == {name: spec["shape"] for name, spec in record["tensors"].items()}
        for name, param in params.items():
            param.weight_loader(param, baked[prefix + name])  # SGLang's default loader call for a named parameter
        layer.quant_method.process_weights_after_loading(layer)
        after = dict(layer.named_parameters())
    for name in record["tensors"]:
        assert after[name].data_ptr() == params[name].data_ptr(), f"{name} was replaced at load"
        assert torch.equal(after[name].view(torch.uint8), baked[prefix + name].view(torch.uint8)), f"{name} was transformed at load"
    for name, expected in stock(source).items():
        got = getattr(layer, name)  # SGLang's names (DeepSeek-V4's *_scale_inv are bound to the baked *_scale)
        assert (got.dtype.itemsize, tuple(got.shape)) == (expected.dtype.itemsize, tuple(expected.shape)), name
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"{name} differs from stock SGLang's"


def test_cutedsl_expert_parallel_rank_holds_its_experts_and_sglangs_global_input_scales(bakes):
    from sglang.srt.runtime_context import get_parallel

    source, out = bakes["cutedsl"]
    baked, stock = load_all(out), sglang_oracle.modelopt_nvfp4_cutedsl(source, MODELOPT_PREFIX, E, H, I, "none")
    with serving(out, **CASES["cutedsl"][2]):
        get_parallel().override_permanently(tp_size=2, attn_tp_size=2, moe_ep_size=2, moe_ep_rank=1)
        layer = plugin_layer(out, MODELOPT_PREFIX)
        for name, param in layer.named_parameters():
            param.weight_loader(param, baked[MODELOPT_PREFIX + name])
        layer.quant_method.process_weights_after_loading(layer)
    assert torch.equal(layer.w13_input_scale, baked[MODELOPT_PREFIX + "w13_input_scale"])  # all experts, as SGLang keeps it
    for name in ("w13_weight", "w13_weight_scale", "g1_alphas", "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant"):
        assert torch.equal(getattr(layer, name).view(torch.uint8), stock[name][2:].contiguous().view(torch.uint8)), name


@pytest.mark.parametrize("target", CASES)
def test_refuses_a_gpu_that_is_not_blackwell(bakes, target):
    from moebake.engines.sglang.refusals import MoebakeRefusal

    _, prefix, flags, _ = CASES[target]
    out = bakes[target][1]
    with serving(out, gpu="sm90", **flags), pytest.raises(MoebakeRefusal) as caught:
        plugin_layer(out, prefix)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"moebake: target {target.split('/')[0]} runs on Blackwell (SM100) GPUs only")
