"""moebake's SGLang plugin serving every target x source (GPT-OSS ``sm90-cutlass``: test_sglang_plugin.py), against stock
SGLang 0.5.23 on CPU.

For each, a real SGLang ``FusedMoE`` built with ``--quantization moebake`` (the serving flags the bake's
engine record names, the platform told it is the bake's GPU) gets the manifest's parameters; SGLang's loader call
puts the files' bytes in them untransformed; after the post-load step, every parameter stock SGLang holds for the
same layer prepared from the *source* (``tests/engine_oracles/sglang_oracle.py``) is the plugin's, byte for byte.
(CuteDSL and trtllm-gen kernels run on Blackwell only: no GPU test here.)
"""

import json
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import torch

from conftest import load_all
from kernel_emulation import gptq_marlin_repack_reference, kernel_interleave_fp4_fp8, kernel_interleave_here, kernel_interleave_v2
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import write_bf16_moe, write_deepseek_v4, write_modelopt_nvfp4
from moebake.schema.profiles import parse_engine, release_profile
from moebake.synthetic import write_gpt_oss

sglang_oracle = pytest.importorskip("engine_oracles.sglang_oracle")
if not sglang_oracle.sglang_installed():
    pytest.skip("sglang 0.5.23 is not installed (bin/setup installs it)", allow_module_level=True)


from engine_oracles.sglang_oracle import plugins_loaded_for_the_module, standins, standins_hidden_after_each_test  # noqa: E402,F401  (autouse)

E, H, I = 4, 256, 128
MODELOPT_PREFIX = "model.layers.1.mlp.experts."
GPT_OSS_PREFIX = "model.layers.0.mlp.experts."
DSV4_PREFIX = "layers.0.ffn.experts."
BF16_PREFIX = "model.layers.0.mlp.experts."


@dataclass(frozen=True)
class Case:
    """One target x source: how to write the source, the layer it checks, the SGLang flags and GPU the bake is
    served with, a GPU it must refuse (and the words of that refusal), and stock SGLang's preparation of the source."""

    write: Callable[[Path], Path]
    prefix: str
    flags: dict
    gpu: str
    wrong_gpu: str
    gpu_words: str
    stock: Callable[[Path], dict]


def _modelopt(path):
    return write_modelopt_nvfp4(path, num_layers=2, num_experts=E, hidden=H, intermediate=I, mismatches=())


def _modelopt_differing_globals(path):
    return write_modelopt_nvfp4(path, num_layers=2, num_experts=E, hidden=H, intermediate=I)  # MODELOPT_MISMATCHES


def _dsv4(path):
    return write_deepseek_v4(path, num_layers=1, num_experts=E, hidden=H, intermediate=I, mtp_layers=0)


def _wide(write):
    """``write``, then the expert scales widened so that the Humming range clamp rewrites groups."""

    def written(path):
        from engine_oracles.humming_oracle import widen_mxfp4_scales

        source = write(path)
        widen_mxfp4_scales(source, seed=3)
        return source

    return written


def _gpt_oss(path):
    return write_gpt_oss(path, num_layers=1, num_experts=E, hidden=160, intermediate=96, vocab=32)


HUMMING = {"moe_runner_backend": "flashinfer_mxfp4", "flashinfer_mxfp4_moe_precision": "fp8"}


BLACKWELL, HOPPER = "Blackwell (SM100)", "Hopper (SM90)"
CASES = {
    "cutedsl/modelopt-nvfp4": Case(
        _modelopt,
        MODELOPT_PREFIX,
        {"moe_runner_backend": "flashinfer_cutedsl"},
        "sm100",
        "sm90",
        BLACKWELL,
        lambda src: sglang_oracle.modelopt_nvfp4_cutedsl(src, MODELOPT_PREFIX, E, H, I, "none"),
    ),
    "cutedsl-deepep/modelopt-nvfp4": Case(
        _modelopt,
        MODELOPT_PREFIX,
        {"moe_runner_backend": "flashinfer_cutedsl", "moe_a2a_backend": "deepep"},
        "sm100",
        "sm90",
        BLACKWELL,
        lambda src: sglang_oracle.modelopt_nvfp4_cutedsl(src, MODELOPT_PREFIX, E, H, I, "deepep"),
    ),
    # experts 1 and 3 with gate and up globals that differ, baked with --gate-up-globals keep (SGLang's bytes)
    "cutedsl/modelopt-nvfp4/keep-globals": Case(
        _modelopt_differing_globals,
        MODELOPT_PREFIX,
        {"moe_runner_backend": "flashinfer_cutedsl"},
        "sm100",
        "sm90",
        BLACKWELL,
        lambda src: sglang_oracle.modelopt_nvfp4_cutedsl(src, MODELOPT_PREFIX, E, H, I, "none"),
    ),
    "cutedsl-deepep/modelopt-nvfp4/keep-globals": Case(
        _modelopt_differing_globals,
        MODELOPT_PREFIX,
        {"moe_runner_backend": "flashinfer_cutedsl", "moe_a2a_backend": "deepep"},
        "sm100",
        "sm90",
        BLACKWELL,
        lambda src: sglang_oracle.modelopt_nvfp4_cutedsl(src, MODELOPT_PREFIX, E, H, I, "deepep"),
    ),
    "sm100-trtllm/gpt-oss": Case(
        lambda path: write_gpt_oss(path, num_layers=1, num_experts=E, hidden=160, intermediate=96, vocab=32),
        GPT_OSS_PREFIX,
        {"moe_runner_backend": "flashinfer_mxfp4"},
        "sm100",
        "sm90",
        BLACKWELL,
        lambda src: sglang_oracle.gpt_oss_sm100_trtllm(src, 0),
    ),
    "sm100-trtllm/deepseek-v4": Case(
        _dsv4,
        DSV4_PREFIX,
        {"moe_runner_backend": "flashinfer_mxfp4"},
        "sm100",
        "sm90",
        BLACKWELL,
        lambda src: sglang_oracle.deepseek_v4_sm100_trtllm(src, DSV4_PREFIX, E, H, I),
    ),
    "sm90-cutlass/deepseek-v4": Case(
        _dsv4,
        DSV4_PREFIX,
        {"moe_runner_backend": "flashinfer_mxfp4"},
        "sm90",
        "sm100",
        HOPPER,
        lambda src: sglang_oracle.deepseek_v4_sm90_cutlass(src, DSV4_PREFIX, E, H, I, kernel_interleave_here),
    ),
    "sm90-marlin/gpt-oss": Case(
        lambda path: write_gpt_oss(path, num_layers=1, num_experts=E, hidden=192, intermediate=96, vocab=32),
        GPT_OSS_PREFIX,
        {"moe_runner_backend": "marlin"},
        "sm90",
        "sm100",
        HOPPER,
        lambda src: sglang_oracle.gpt_oss_marlin(src, 0, gptq_marlin_repack_reference),
    ),
    "sm90-marlin/deepseek-v4": Case(
        _dsv4,
        DSV4_PREFIX,
        {"moe_runner_backend": "marlin"},
        "sm90",
        "sm100",
        HOPPER,
        lambda src: sglang_oracle.deepseek_v4_marlin(src, DSV4_PREFIX, E, H, I, gptq_marlin_repack_reference),
    ),
    "sm90-cutlass-w4a8/gpt-oss": Case(
        _wide(_gpt_oss),
        GPT_OSS_PREFIX,
        HUMMING,
        "sm90",
        "sm100",
        HOPPER,
        lambda src: sglang_oracle.gpt_oss_sm90_cutlass(src, 0, kernel_interleave_v2, kernel_interleave_fp4_fp8),
    ),
    "sm90-cutlass-w4a8/deepseek-v4": Case(
        _wide(_dsv4),
        DSV4_PREFIX,
        HUMMING,
        "sm90",
        "sm100",
        HOPPER,
        lambda src: sglang_oracle.deepseek_v4_sm90_cutlass(src, DSV4_PREFIX, E, H, I, kernel_interleave_v2, kernel_interleave_fp4_fp8),
    ),
    "deepep-bf16/bf16-moe": Case(
        lambda path: write_bf16_moe(path, style="qwen3", num_layers=1, num_experts=E, hidden=64, intermediate=32),
        BF16_PREFIX,
        {"moe_runner_backend": "deep_gemm", "moe_a2a_backend": "deepep"},
        "sm90",
        "neither",
        f"{HOPPER} or {BLACKWELL}",
        lambda src: sglang_oracle.unquantized_deepep_bf16(src, BF16_PREFIX, E, 64, 32, ("gate_proj", "up_proj", "down_proj")),
    ),
}
"""Every target x source but GPT-OSS sm90-cutlass, which tests/test_sglang_plugin.py covers (and the H100 runs)."""


@pytest.fixture(scope="module")
def bakes(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin-targets")
    made = {}
    served = release_profile(parse_engine(sglang_oracle.ENGINE))
    for name, case in CASES.items():
        if not served.target(*name.split("/")[:2]).verified:
            continue  # a release the matrix refuses this cell for (SGLang 0.5.17: no Humming W4A8): its tests skip
        source = case.write(root / name / "src")
        gate_up_globals = "keep" if name.endswith("/keep-globals") else "share"
        options = ConvertOptions(name.split("/")[0], gate_up_globals=gate_up_globals, engine=sglang_oracle.ENGINE)
        convert(source, root / name / "out", options, progress=False)
        made[name] = source, root / name / "out"
    return _Bakes(made)


class _Bakes(dict):
    """The bakes by case; a case the SGLang release here cannot serve is a skip, with the matrix's reason."""

    def __missing__(self, name):
        from moebake.schema.profiles import refused_because

        release = parse_engine(sglang_oracle.ENGINE)
        pytest.skip(f"{release} cannot serve {name}: {refused_because(release, *name.split('/')[:2])}")


@contextmanager
def serving(out, gpu="sm100", **flags):
    """SGLang's state for a one-GPU server of the bake ``out`` with ``flags``, FlashInfer's CPU-side stand-ins
    as the oracle uses them; DeepEP's dispatcher stood in for, and DeepEP and DeepGEMM taken as importable (the plugin
    refuses a DeepEP or DeepGEMM bake without them: tests/test_sglang_deepep_refusals.py)."""
    import sglang.srt.layers.moe.fused_moe_triton.layer as fused_moe_layer
    import sglang.srt.layers.quantization.mxfp4 as mxfp4

    with (
        sglang_oracle.sglang_engine(gpu=gpu, **flags),
        standins.cutedsl_utils(),
        sglang_oracle._sm100_flashinfer(mxfp4),
        mock.patch.object(fused_moe_layer, "create_moe_dispatcher", lambda *a, **k: sglang_oracle._DispatcherStandin()),
        mock.patch.object(mxfp4, "_FI_HAS_SM90_CUTLASS_MXFP4", True),  # FlashInfer on a GPU has it
        mock.patch("moebake.engines.sglang.config.model_directory", return_value=out),
        mock.patch("moebake.engines.sglang.internals.import_problem", return_value=None),
    ):
        yield


def plugin_layer(out, prefix):
    """SGLang's FusedMoE for the bake's layer at ``prefix`` with ``--quantization moebake`` (as the model builds it)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    config = json.loads((out / "config.json").read_text())
    quant_config = QUANTIZATION_METHODS["moebake"].from_config(config["quantization_config"])
    record = next(r for r in json.loads((out / "moebake.json").read_text())["layers"] if r["prefix"] == prefix)
    if config.get("model_type") == "gpt_oss":  # as GptOssSparseMoeBlock builds it
        return FusedMoE(
            num_experts=config["num_local_experts"],
            top_k=config["num_experts_per_tok"],
            layer_id=0,
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            quant_config=quant_config,
            activation=config["hidden_act"],
            gemm1_alpha=1.702,
            gemm1_clamp_limit=config["swiglu_limit"],
            with_bias=True,
            prefix=prefix.rstrip("."),
            use_weight_loader_fused=True,
        )
    return FusedMoE(
        num_experts=record["experts"],
        top_k=2,
        layer_id=record["index"],
        hidden_size=record["hidden"],
        intermediate_size=record["intermediate"],
        quant_config=quant_config,
        prefix=prefix.rstrip("."),
        params_dtype=torch.bfloat16,
        swiglu_limit=config.get("swiglu_limit"),
    )


@pytest.mark.parametrize("name", CASES)
def test_plugin_layer_equals_stock_sglang(bakes, name):
    case = CASES[name]
    source, out = bakes[name]
    record = next(r for r in json.loads((out / "moebake.json").read_text())["layers"] if r["prefix"] == case.prefix)
    baked = load_all(out)
    with serving(out, gpu=case.gpu, **case.flags):
        layer = plugin_layer(out, case.prefix)
        params = dict(layer.named_parameters())
        assert {name: list(p.shape) for name, p in params.items()} == {name: spec["shape"] for name, spec in record["tensors"].items()}
        for short, param in params.items():
            param.weight_loader(param, baked[case.prefix + short])  # SGLang's default loader call for a named parameter
        layer.quant_method.process_weights_after_loading(layer)
        after = dict(layer.named_parameters())
    for short in record["tensors"]:
        assert after[short].data_ptr() == params[short].data_ptr(), f"{short} was replaced at load"
        assert torch.equal(after[short].view(torch.uint8), baked[case.prefix + short].view(torch.uint8)), f"{short} was transformed at load"
    for engine_name, expected in case.stock(source).items():
        # SGLang's names; DeepSeek-V4's *_scale_inv are the baked *_scale (bound to them on SM100, read as them on SM90)
        got = getattr(layer, engine_name, None)
        got = got if got is not None else getattr(layer, engine_name.replace("_scale_inv", "_scale"))
        assert (got.dtype.itemsize, tuple(got.shape)) == (expected.dtype.itemsize, tuple(expected.shape)), engine_name
        assert torch.equal(got.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)), (
            f"{engine_name} differs from stock SGLang's"
        )  # reshape: SGLang's humming_fc2_act_scale is 0-d


def test_cutedsl_expert_parallel_rank_holds_its_experts_and_sglangs_global_input_scales(bakes):
    source, out = bakes["cutedsl/modelopt-nvfp4"]
    baked, stock = load_all(out), sglang_oracle.modelopt_nvfp4_cutedsl(source, MODELOPT_PREFIX, E, H, I, "none")
    with serving(out, **CASES["cutedsl/modelopt-nvfp4"].flags):
        sglang_oracle.override_parallel(tp_size=2, attn_tp_size=2, moe_ep_size=2, moe_ep_rank=1)
        layer = plugin_layer(out, MODELOPT_PREFIX)
        for name, param in layer.named_parameters():
            param.weight_loader(param, baked[MODELOPT_PREFIX + name])
        layer.quant_method.process_weights_after_loading(layer)
    assert torch.equal(layer.w13_input_scale, baked[MODELOPT_PREFIX + "w13_input_scale"])  # all experts, as SGLang keeps it
    for name in ("w13_weight", "w13_weight_scale", "g1_alphas", "g2_alphas", "w13_input_scale_quant", "w2_input_scale_quant"):
        assert torch.equal(getattr(layer, name).view(torch.uint8), stock[name][2:].contiguous().view(torch.uint8)), name


@pytest.mark.parametrize("name", CASES)
def test_refuses_another_gpu(bakes, name):
    from moebake.engines.sglang.refusals import MoebakeRefusal

    case, out = CASES[name], bakes[name][1]
    with serving(out, gpu=case.wrong_gpu, **case.flags), pytest.raises(MoebakeRefusal) as caught:
        plugin_layer(out, case.prefix)
    message = str(caught.value)
    assert "\n" not in message and f"target {name.split('/')[0]} runs on {case.gpu_words} GPUs only" in message


@pytest.mark.parametrize("name", ["sm90-cutlass-w4a8/gpt-oss", "sm90-cutlass-w4a8/deepseek-v4"])
def test_refuses_a_humming_bake_without_the_fp8_precision(bakes, name):
    from moebake.engines.sglang.refusals import MoebakeRefusal

    case, out = CASES[name], bakes[name][1]
    with serving(out, gpu="sm90", moe_runner_backend="flashinfer_mxfp4"), pytest.raises(MoebakeRefusal) as caught:
        plugin_layer(out, case.prefix)
    assert str(caught.value) == (
        "moebake: this sm90-cutlass-w4a8 bake holds FlashInfer's Humming W4A8 weights, the server "
        "runs SM90 MXFP4 MoE in W4A16; start it with --flashinfer-mxfp4-moe-precision fp8"
    )


def test_refuses_a_w4a16_bake_under_the_fp8_precision(bakes):
    from moebake.engines.sglang.refusals import MoebakeRefusal

    if not release_profile(parse_engine(sglang_oracle.ENGINE)).target("sm90-cutlass-w4a8", "gpt-oss").verified:
        pytest.skip(f"{sglang_oracle.ENGINE} has no --flashinfer-mxfp4-moe-precision fp8 (Humming W4A8) to refuse under")
    case, out = CASES["sm90-cutlass/deepseek-v4"], bakes["sm90-cutlass/deepseek-v4"][1]
    with serving(out, gpu="sm90", **HUMMING), pytest.raises(MoebakeRefusal) as caught:
        plugin_layer(out, case.prefix)
    assert str(caught.value) == (
        "moebake: the server runs --flashinfer-mxfp4-moe-precision fp8 (Humming W4A8), this "
        "sm90-cutlass bake holds W4A16 weights; drop that flag, or bake target sm90-cutlass-w4a8"
    )


def test_sglang_sees_real_scalar_type_ids_through_the_stand_ins():
    """SGLang's Marlin MoE GEMM passes ``b_q_type.id`` to its JIT kernel: through the test stand-ins, SGLang's
    ``get_scalar_types()`` gives ``engine_oracles.sgl_scalar_type`` (SGLang's C++ ``ScalarType`` id packing), whose
    ids equal those of vLLM's pure-Python ``ScalarType``, an independent implementation of the same encoding."""
    import vllm.scalar_type as twin
    from sglang.srt.layers.quantization.utils import get_scalar_types

    from engine_oracles import sgl_scalar_type

    standins.install()
    ScalarType, scalar_types = get_scalar_types()
    assert ScalarType is sgl_scalar_type.ScalarType
    named = [n for n in vars(sgl_scalar_type.scalar_types) if not n.startswith("_")]
    assert len(named) == 13
    for name in named:
        ours, theirs = getattr(scalar_types, name), getattr(twin.scalar_types, name)
        assert isinstance(ours.id, int) and ours.id == theirs.id, name
        assert (ours.exponent, ours.mantissa, ours.signed, ours.bias, ours.size_bits) == (
            theirs.exponent,
            theirs.mantissa,
            theirs.signed,
            theirs.bias,
            theirs.size_bits,
        ), name
    assert scalar_types.float4_e2m1f == ScalarType.float_(2, 1, True, sgl_scalar_type.NanRepr.NONE)


def test_deepep_bf16_layer_takes_stock_sglangs_route_through_deepep_moe(bakes):
    """Under ``--moe-a2a-backend deepep`` SGLang's models build their experts as ``get_moe_impl_class(quant_config)``,
    a ``DeepEPMoE``, which decides at construction whether a layer runs through FusedMoE's runner (the unquantized
    BF16 DeepGEMM path: ``deprecate_flag``) or through its own masked forward, whose DeepEP low-latency branch for
    this layer is ``assert False, "forward_deepgemm_masked is deprecated"``. It reads ``quant_config is None``; a
    ``--quantization moebake`` layer has a config. After the post-load step the bake's layer takes the route stock
    SGLang's unquantized layer takes, from the same class."""
    from sglang.srt.layers import deep_gemm_wrapper
    from sglang.srt.layers.moe.ep_moe.layer import DeepEPMoE, get_moe_impl_class
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    case = CASES["deepep-bf16/bf16-moe"]
    _, out = bakes["deepep-bf16/bf16-moe"]
    config = json.loads((out / "config.json").read_text())
    record = next(r for r in json.loads((out / "moebake.json").read_text())["layers"] if r["prefix"] == case.prefix)
    baked = load_all(out)
    shape = dict(
        num_experts=record["experts"],
        top_k=2,
        layer_id=record["index"],
        hidden_size=record["hidden"],
        intermediate_size=record["intermediate"],
        params_dtype=torch.bfloat16,
        prefix=case.prefix.rstrip("."),
    )
    with serving(out, gpu=case.gpu, **case.flags), mock.patch.object(deep_gemm_wrapper, "ENABLE_JIT_DEEPGEMM", True):
        stock = get_moe_impl_class(None)(quant_config=None, **shape)
        quant_config = QUANTIZATION_METHODS["moebake"].from_config(config["quantization_config"])
        layer = get_moe_impl_class(quant_config)(quant_config=quant_config, **shape)
        for short, param in layer.named_parameters():
            param.weight_loader(param, baked[case.prefix + short])
        layer.quant_method.process_weights_after_loading(layer)
    assert type(stock) is DeepEPMoE and type(layer) is DeepEPMoE
    assert stock.deprecate_flag is True, "stock SGLang's unquantized DeepEP layer runs through FusedMoE's runner"
    assert layer.deprecate_flag is True, "the bake's layer would take DeepEPMoE's masked branch, which SGLang asserts away"
