"""Engine profiles against the engine's own code: a bake equals SGLang 0.5.23's post-load parameters byte for byte.

The oracle (``tests/engine_oracles/sglang_oracle.py``) builds SGLang's real ``FusedMoE`` layer with
the method SGLang picks for the serving flags the profile names, loads the *source* checkpoint with
SGLang's own loaders and runs its ``process_weights_after_loading`` on CPU. Every verified profile
entry is covered here; the test of the registry itself fails if a verified entry has no oracle.
"""

import pytest
import torch

from conftest import load_all
from engine_oracles import standins  # noqa: E402
from engine_releases.cells import ORACLE_TESTS
from kernel_emulation import (
    flashinfer_layout_here,
    gptq_marlin_repack_reference,
    kernel_interleave_fp4_fp8,
    kernel_interleave_v1,
    kernel_interleave_v2,
)
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import UnsupportedError
from moebake.layouts.nvfp4_scalars import load_time_scales
from moebake.reference.synthetic_sources import MODELOPT_MISMATCHES, write_bf16_moe, write_deepseek_v4, write_modelopt_nvfp4
from moebake.schema.profiles import RULES, parse_engine, release_profile
from moebake.synthetic import write_gpt_oss

sglang_oracle = pytest.importorskip("engine_oracles.sglang_oracle")
if not sglang_oracle.sglang_installed():
    pytest.skip("sglang 0.5.23 is not installed (bin/setup installs it)", allow_module_level=True)
standins_hidden_after_each_test = sglang_oracle.standins_hidden_after_each_test  # autouse fixture

KERNELS = {"v2": kernel_interleave_v2, "v1": kernel_interleave_v1}


ENGINE = sglang_oracle.ENGINE
"""The engine release the bakes are made for: the one whose code runs here (``sglang==0.5.17`` in a release-matrix run,
``tests/engine_releases/prove.py``); plain ``sglang``, the newest proven, in the suite."""


def oracle_options(target: str, **options) -> ConvertOptions:
    return ConvertOptions(target, engine=ENGINE, **options)


def test_every_verified_profile_entry_has_an_oracle_test():
    from pathlib import Path

    for rule in RULES.values():
        for (target, source), entry in rule.targets.items():
            key = (rule.first.engine, target, source)
            if entry.verified:
                assert key in ORACLE_TESTS, f"{key} is marked verified without an oracle test"
                test_file, test = ORACLE_TESTS[key]
                assert f"def {test}(" in (Path(__file__).parent / test_file).read_text(), key


def _assert_bake_equals_engine(out, layer_prefix, engine_params, derived):
    baked = load_all(out)
    for name, expected in engine_params.items():
        if name in derived:
            continue
        got = baked[layer_prefix + name]
        assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"{name} differs from SGLang's"


@pytest.mark.parametrize(
    "hidden, intermediate",
    [
        (160, 96),  # pads H 160 -> 256 (127 scales), I 96 -> 128 (zeros)
        (2880, 128),  # GPT-OSS's H: 2880 -> 3072
        (256, 128),  # no padding
    ],
)
def test_gpt_oss_sm90_cutlass_equals_sglang(tmp_path, hidden, intermediate):
    layout = flashinfer_layout_here()
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=intermediate, vocab=32)
    manifest = convert(source, tmp_path / "out", oracle_options("sm90-cutlass", flashinfer_layout=layout), progress=False).to_json()
    assert manifest["engine"]["exact"] is True
    engine = sglang_oracle.gpt_oss_sm90_cutlass(source, 0, KERNELS[layout])
    derived = {"swiglu_alpha", "swiglu_beta", "swiglu_limit"}
    _assert_bake_equals_engine(tmp_path / "out", "model.layers.0.mlp.experts.", engine, derived)
    activation = manifest["activation"]  # what a loader derives the per-expert SwiGLU constants from
    for name in derived:
        assert torch.equal(engine[name], torch.full((2,), activation[name.removeprefix("swiglu_")], dtype=torch.float32)), name
    assert release_profile(parse_engine(ENGINE)).target("sm90-cutlass", "gpt-oss").hidden_multiple == 256


@pytest.mark.parametrize("style, names", [("qwen3", ("gate_proj", "up_proj", "down_proj")), ("mixtral", ("w1", "w3", "w2"))])
def test_bf16_moe_deepep_bf16_equals_sglang(tmp_path, style, names):
    source = write_bf16_moe(tmp_path / "src", style=style, num_layers=1, num_experts=4, hidden=64, intermediate=32)
    manifest = convert(source, tmp_path / "out", oracle_options("deepep-bf16"), progress=False).to_json()
    assert manifest["engine"]["exact"] is True
    record = manifest["layers"][0]
    engine = sglang_oracle.unquantized_deepep_bf16(source, record["prefix"], 4, 64, 32, names)
    assert sorted(engine) == sorted(record["tensors"]) == ["w13_weight", "w2_weight"]
    _assert_bake_equals_engine(tmp_path / "out", record["prefix"], engine, derived=set())


def test_modelopt_bf16_mtp_experts_deepep_bf16_equal_sglang(tmp_path):
    """A ModelOpt NVFP4 checkpoint's BF16 MTP experts bake as source format bf16-moe (its profile, exact)."""
    source = write_modelopt_nvfp4(tmp_path / "src", num_layers=2, num_experts=4, hidden=256, intermediate=128)
    manifest = convert(source, tmp_path / "out", oracle_options("deepep-bf16"), progress=False).to_json()
    assert (manifest["source"]["format"], manifest["engine"]["exact"]) == ("bf16-moe", True)
    record = manifest["layers"][0]
    engine = sglang_oracle.unquantized_deepep_bf16(source, record["prefix"], 4, 256, 128, ("gate_proj", "up_proj", "down_proj"))
    _assert_bake_equals_engine(tmp_path / "out", record["prefix"], engine, derived=set())


def test_deepseek_v4_sm90_cutlass_equals_sglang(tmp_path):
    """SGLang names the scales ``w*_weight_scale_inv`` and types weights int8 / scales float8_e8m0fnu;
    the bake keeps U8 (the same bytes): a loader ``copy_``s bytes, so names map and bytes must match."""
    layout = flashinfer_layout_here()
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=256, intermediate=128, mtp_layers=0)
    manifest = convert(source, tmp_path / "out", oracle_options("sm90-cutlass", flashinfer_layout=layout), progress=False).to_json()
    assert manifest["engine"]["exact"] is True
    record = manifest["layers"][0]
    engine = sglang_oracle.deepseek_v4_sm90_cutlass(source, record["prefix"], 3, 256, 128, KERNELS[layout])
    baked = load_all(tmp_path / "out")
    assert sorted(n.replace("_scale_inv", "_scale") for n in engine) == sorted(record["tensors"])
    for name, expected in engine.items():
        got = baked[record["prefix"] + name.replace("_scale_inv", "_scale")]
        assert tuple(got.shape) == tuple(expected.shape), name
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"{name} differs from SGLang's"


@pytest.mark.parametrize(
    "hidden, intermediate",
    [
        (160, 96),  # pads H 160 -> 256, I 96 -> 128: the scale padding holds each expert's first scale, not 127
        (2880, 128),  # GPT-OSS's H: 2880 -> 3072 (FusedMoE's rounding: the loader's never-written tail is refilled too)
        (256, 128),  # no padding
    ],
)
def test_gpt_oss_sm90_cutlass_w4a8_equals_sglang(tmp_path, hidden, intermediate):
    """--flashinfer-mxfp4-moe-precision fp8: SGLang's Humming path, FlashInfer's preprocess run on CPU (its torch code,
    its CUDA "fp4_fp8" interleave emulated), on scales wide enough that the range clamp rewrites groups."""
    from engine_oracles.humming_oracle import widen_mxfp4_scales

    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=3, hidden=hidden, intermediate=intermediate, vocab=32)
    widen_mxfp4_scales(source, seed=hidden)
    manifest = convert(source, tmp_path / "out", oracle_options("sm90-cutlass-w4a8"), progress=False).to_json()
    assert manifest["engine"]["exact"] is True and manifest["engine"]["engine_flags"] == "--flashinfer-mxfp4-moe-precision fp8"
    engine = sglang_oracle.gpt_oss_sm90_cutlass(source, 0, kernel_interleave_v2, kernel_interleave_fp4_fp8)
    derived = {"swiglu_alpha", "swiglu_beta", "swiglu_limit", "humming_fc2_act_scale"}  # made at load by the plugin
    assert sorted(set(engine) - derived) == sorted(manifest["layers"][0]["tensors"])
    _assert_bake_equals_engine(tmp_path / "out", "model.layers.0.mlp.experts.", engine, derived)
    assert engine["humming_fc2_act_scale"].tolist() == 1.0
    residual = load_all(tmp_path / "out")["model.layers.0.mlp.experts.w13_humming_residual_scale"]
    assert residual.tolist() == [2.0 ** (127 - 11 - 128) * 64] * 3  # max 127, min clamped from 60.. up to 116


def test_deepseek_v4_sm90_cutlass_w4a8_equals_sglang(tmp_path):
    """``Mxfp4FlashinferCutlassMoEMethod`` with ``_use_sm90_humming`` (no padding); its names ``w*_weight_scale_inv``."""
    from engine_oracles.humming_oracle import widen_mxfp4_scales

    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=256, intermediate=128, mtp_layers=0)
    widen_mxfp4_scales(source, seed=1)
    manifest = convert(source, tmp_path / "out", oracle_options("sm90-cutlass-w4a8"), progress=False).to_json()
    assert manifest["engine"]["exact"] is True
    record = manifest["layers"][0]
    engine = sglang_oracle.deepseek_v4_sm90_cutlass(source, record["prefix"], 3, 256, 128, kernel_interleave_v2, kernel_interleave_fp4_fp8)
    assert engine.pop("humming_fc2_act_scale").tolist() == 1.0
    baked = load_all(tmp_path / "out")
    assert sorted(n.replace("_scale_inv", "_scale") for n in engine) == sorted(record["tensors"])
    for name, expected in engine.items():
        got = baked[record["prefix"] + name.replace("_scale_inv", "_scale")]
        assert tuple(got.shape) == tuple(expected.shape), name
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"{name} differs from SGLang's"


@pytest.mark.parametrize(
    "hidden, intermediate",
    [
        (160, 96),  # pads H 160 -> 256 and I 96 -> 128: 127 in all the scales' padding, zero weights and biases
        (2880, 128),  # GPT-OSS's H: 2880 -> 3072
        (256, 128),  # no padding
    ],
)
def test_gpt_oss_sm100_trtllm_equals_sglang(tmp_path, hidden, intermediate):
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=intermediate, vocab=32)
    manifest = convert(source, tmp_path / "out", oracle_options("sm100-trtllm"), progress=False).to_json()
    assert manifest["engine"]["exact"] is True
    engine = sglang_oracle.gpt_oss_sm100_trtllm(source, 0)
    assert sorted(engine) == sorted(manifest["layers"][0]["tensors"])
    _assert_bake_equals_engine(tmp_path / "out", "model.layers.0.mlp.experts.", engine, derived=set())


def test_deepseek_v4_sm100_trtllm_equals_sglang(tmp_path):
    """SGLang holds the shuffled weights as uint8 (the bake keeps the source's int8: the same bytes) and passes
    the SwiGLU limit to its kernel at run time; the bake also stores it per expert (``gemm1_clamp_limit``)."""
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=256, intermediate=128, mtp_layers=0)
    manifest = convert(source, tmp_path / "out", oracle_options("sm100-trtllm"), progress=False).to_json()
    assert manifest["engine"]["exact"] is True
    record = manifest["layers"][0]
    engine = sglang_oracle.deepseek_v4_sm100_trtllm(source, record["prefix"], 3, 256, 128)
    baked = load_all(tmp_path / "out")
    assert sorted(n.replace("_scale_inv", "_scale") for n in engine) == sorted(set(record["tensors"]) - {"gemm1_clamp_limit"})
    for name, expected in engine.items():
        got = baked[record["prefix"] + name.replace("_scale_inv", "_scale")]
        assert tuple(got.shape) == tuple(expected.shape), name
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"{name} differs from SGLang's"


# Derived at load by SGLang's CuteDSL standard path from tensors the bake stores (the plugin runs SGLang's own
# post-load step for them): the F32 scalars below, and the MMA-layout views of the swizzled scales.
CUTEDSL_LOAD_TIME_SCALARS = ("g1_alphas", "g2_alphas", "w2_input_scale_quant")
CUTEDSL_MMA_VIEWS = {"w13_blockscale_mma": "w13_weight_scale", "w2_blockscale_mma": "w2_weight_scale"}
# Computed at the CuteDSL wrapper's first forward (resolve_cutedsl_standard_scales), not post-load parameters.
CUTEDSL_WRAPPER_SCALARS = ("w1_alpha", "w2_alpha", "fc2_input_scale")


@pytest.mark.parametrize("hidden, intermediate", [(256, 128), (384, 192)])
@pytest.mark.parametrize("target, a2a", [("cutedsl", "none"), ("cutedsl-deepep", "deepep")])
@pytest.mark.parametrize(
    "mismatches, gate_up_globals",
    [
        ((), "share"),  # every expert's gate and up globals agree: nothing to share
        (MODELOPT_MISMATCHES, "keep"),  # experts 1 and 3 differ (up x0.3, x4): kept apart, as SGLang keeps them
    ],
)
def test_modelopt_nvfp4_cutedsl_equals_sglang(tmp_path, target, a2a, hidden, intermediate, mismatches, gate_up_globals):
    """SGLang's ModelOptNvFp4FusedMoEMethod (flashinfer_cutedsl; a2a deepep = its v1 path) on the source, against
    the bake: every parameter it holds after its post-load step, byte for byte, for experts whose gate and up
    globals agree, and for ones whose globals differ baked with ``--gate-up-globals keep`` (shared, the
    default, see the next test)."""
    source = write_modelopt_nvfp4(
        tmp_path / "src", num_layers=2, num_experts=4, hidden=hidden, intermediate=intermediate, mismatches=mismatches
    )
    manifest = convert(source, tmp_path / "out", oracle_options(target, gate_up_globals=gate_up_globals), progress=False).to_json()
    assert manifest["engine"]["exact"] is True, manifest["engine"]
    baked = load_all(tmp_path / "out")
    record = manifest["layers"][0]
    prefix = record["prefix"]
    globals_ = baked[prefix + "w13_weight_scale_2"]
    assert [int(e) for e in (globals_[:, 0] != globals_[:, 1]).nonzero()] == [e for e, _ in mismatches]
    assert record["gate_up_global_scale"]["experts_rescaled"] == 0
    assert record["gate_up_global_scale"].get("experts_kept_apart", 0) == len(mismatches)
    engine = sglang_oracle.modelopt_nvfp4_cutedsl(source, prefix, 4, hidden, intermediate, a2a)
    derived = set(CUTEDSL_MMA_VIEWS) | set(CUTEDSL_LOAD_TIME_SCALARS) if target == "cutedsl" else set()
    assert set(engine) - derived == set(record["tensors"]) - set(CUTEDSL_WRAPPER_SCALARS)
    _assert_bake_equals_engine(tmp_path / "out", prefix, engine, derived)
    if target == "cutedsl":
        stored = {name: baked[prefix + name] for name in ("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale")}
        expected = load_time_scales(stored)
        for name in CUTEDSL_LOAD_TIME_SCALARS:
            assert torch.equal(engine[name].view(torch.int32), expected[name].view(torch.int32)), name
        for view, stored_name in CUTEDSL_MMA_VIEWS.items():
            scales = baked[prefix + stored_name]
            m, k = scales.shape[1], scales.shape[2] * 16
            mine = standins.convert_sf_to_mma_layout(scales.contiguous().view(torch.uint8).reshape(-1), m, k, 4)
            assert torch.equal(engine[view].view(torch.uint8), mine), view


def test_modelopt_nvfp4_with_differing_gate_up_globals_is_not_engine_exact(tmp_path):
    """Where an expert's gate and up globals differ, moebake shares them (the accurate choice for kernels taking
    one W13 alpha); SGLang keeps both, so the bake says it is not SGLang's bytes, and why."""
    source = write_modelopt_nvfp4(tmp_path / "src", num_layers=2, num_experts=4, hidden=256, intermediate=128)
    manifest = convert(source, tmp_path / "out", oracle_options("cutedsl"), progress=False).to_json()
    assert manifest["engine"]["exact"] is False and manifest["serves"] == []
    assert manifest["engine"]["not_exact_because"].startswith("gate and up global scales shared in 2 experts")
    engine = sglang_oracle.modelopt_nvfp4_cutedsl(source, manifest["layers"][0]["prefix"], 4, 256, 128, "none")
    baked = load_all(tmp_path / "out")
    assert not torch.equal(engine["w13_weight_scale_2"], baked[manifest["layers"][0]["prefix"] + "w13_weight_scale_2"])


def _moebake_repack(b_q_weight, perm, size_k, size_n, num_bits, **_):
    """moebake's CPU repack with the CUDA op's arguments (``[K/8, N]`` int32 in, as the engines call it)."""
    from moebake.layouts.marlin import repack

    assert perm.numel() == 0 and num_bits == 4 and tuple(b_q_weight.shape) == (size_k // 8, size_n)
    return repack(b_q_weight.T.contiguous().view(torch.uint8).unsqueeze(0))[0]


# Stand-ins for the CUDA op gptq_marlin_repack: vLLM's Python reference (independent of moebake), and moebake's own.
MARLIN_REPACKS = {"vllm-reference": gptq_marlin_repack_reference, "moebake": _moebake_repack}


@pytest.mark.parametrize("repack", MARLIN_REPACKS)
@pytest.mark.parametrize(
    "hidden, intermediate",
    [
        (192, 96),  # pads H 192 -> 256 and I 96 -> 128: 127 in all the scales' padding, zero weights and biases
        (2880, 128),  # GPT-OSS's H: 2880 -> 3072
        (256, 128),  # no padding
    ],
)
def test_gpt_oss_sm90_marlin_equals_sglang(tmp_path, hidden, intermediate, repack):
    """SGLang's Marlin path (``--moe-runner-backend marlin``) with the CUDA op ``gptq_marlin_repack`` stood in for by
    vLLM's Python reference of Marlin packing (``tests/kernel_emulation.py``) or by moebake's repack: every parameter,
    byte for byte."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=intermediate, vocab=32)
    manifest = convert(source, tmp_path / "out", oracle_options("sm90-marlin"), progress=False).to_json()
    assert manifest["engine"]["exact"] is True
    engine = sglang_oracle.gpt_oss_marlin(source, 0, MARLIN_REPACKS[repack])
    assert sorted(engine) == sorted(manifest["layers"][0]["tensors"])
    _assert_bake_equals_engine(tmp_path / "out", "model.layers.0.mlp.experts.", engine, derived=set())


@pytest.mark.parametrize("repack", MARLIN_REPACKS)
@pytest.mark.parametrize("hidden, intermediate", [(256, 128), (512, 192)])
def test_deepseek_v4_sm90_marlin_equals_sglang(tmp_path, hidden, intermediate, repack):
    """SGLang's ``Mxfp4MarlinMoEMethod`` on SM90 (the repack as above); its scales end as ``w*_weight_scale``. Where the
    release pads I (0.5.17-0.5.21 to 128; I = 192 here) moebake bakes no such model: refused, and the engine's own
    W13 (Marlin ``[E, H/16, 4 * I_pad]``) shows the padding the profile names."""
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=hidden, intermediate=intermediate, mtp_layers=0)
    multiple = release_profile(parse_engine(ENGINE)).target("sm90-marlin", "deepseek-v4").intermediate_multiple
    if intermediate % multiple:
        with pytest.raises(UnsupportedError, match="experts are not padded"):
            convert(source, tmp_path / "out", oracle_options("sm90-marlin"), progress=False)
        engine = sglang_oracle.deepseek_v4_marlin(source, "layers.0.ffn.experts.", 3, hidden, intermediate, MARLIN_REPACKS[repack])
        assert engine["w13_weight"].shape[-1] == 4 * (-(-intermediate // multiple) * multiple), engine["w13_weight"].shape
        return
    manifest = convert(source, tmp_path / "out", oracle_options("sm90-marlin"), progress=False).to_json()
    assert manifest["engine"]["exact"] is True
    record = manifest["layers"][0]
    engine = sglang_oracle.deepseek_v4_marlin(source, record["prefix"], 3, hidden, intermediate, MARLIN_REPACKS[repack])
    assert sorted(engine) == sorted(record["tensors"])
    _assert_bake_equals_engine(tmp_path / "out", record["prefix"], engine, derived=set())


def test_a_changed_byte_is_caught(tmp_path):
    """The comparison every oracle test makes fails on one flipped byte of one parameter (mutation check)."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=256, intermediate=128, vocab=32)
    convert(source, tmp_path / "out", oracle_options("sm90-marlin"), progress=False)
    engine = sglang_oracle.gpt_oss_marlin(source, 0, MARLIN_REPACKS["vllm-reference"])
    _assert_bake_equals_engine(tmp_path / "out", "model.layers.0.mlp.experts.", engine, derived=set())
    for name in ("w13_weight", "w2_weight_scale"):
        mutated = dict(engine)
        mutated[name] = engine[name].clone()
        mutated[name].view(torch.uint8).view(-1)[7] ^= 0x10
        with pytest.raises(AssertionError, match=name):
            _assert_bake_equals_engine(tmp_path / "out", "model.layers.0.mlp.experts.", mutated, derived=set())
