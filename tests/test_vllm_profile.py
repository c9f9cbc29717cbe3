"""The vLLM engine profile against vLLM 0.33.0's own code: a bake equals vLLM's post-load parameters byte for byte.
In a release-matrix run (``tests/engine_releases/prove.py``) the same tests run another release's code against bakes
made for it (``MOEBAKE_ORACLE_ENGINE``): what differs between releases (padding multiples, the SM90 layout of the
pinned FlashInfer) is read from that release's profile (``release_profile(parse_engine(VLLM))``) or from the engine's output.

The oracle (``tests/engine_oracles/vllm_oracle.py``) builds vLLM's real MoE layers with the method vLLM
picks for ``--moe-backend flashinfer_cutlass`` on SM90 (GPT-OSS, loaded by vLLM's GPT-OSS loader;
DeepSeek-V4, through its parameters' weight loaders) and ``--moe-backend flashinfer_cutedsl`` on SM100
(ModelOpt NVFP4, loaded through its parameters' weight loaders), loads the *source* checkpoint and runs
``process_weights_after_loading`` on CPU (``tests/test_engine_profiles.py`` checks that every verified
profile entry has such a test).
"""

import json

import pytest
import torch

from conftest import load_all
from kernel_emulation import flashinfer_layout_here, gptq_marlin_repack_reference, kernel_interleave_v1, kernel_interleave_v2
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import MODELOPT_MISMATCHES, write_deepseek_v4, write_modelopt_nvfp4
from moebake.schema.profiles import parse_engine, pinned_layout, release_profile, releases
from moebake.synthetic import write_gpt_oss

vllm_oracle = pytest.importorskip("engine_oracles.vllm_oracle")
VLLM = vllm_oracle.ENGINE
"""The vLLM release the bakes are made for: the one whose code runs here (``vllm==0.32.0`` in a release-matrix run)."""


def _spec(engine: str) -> str:
    """``--engine`` for a test parametrized by engine name: vLLM's is the release whose code runs here."""
    return VLLM if engine == "vllm" else engine


def _release_of(record: dict) -> str:
    """The oracle's release where an engine record lists it among the releases that build its bytes, else its
    ``version`` (another engine's bake names its newest release in ``serves``, and lists the others)."""
    return vllm_oracle.VLLM_VERSION if vllm_oracle.VLLM_VERSION in record.get("releases", ()) else record["version"]


if not vllm_oracle.vllm_installed():
    pytest.skip(f"vllm {vllm_oracle.VLLM_VERSION} is not installed (bin/setup installs it)", allow_module_level=True)

KERNELS = {"v2": kernel_interleave_v2, "v1": kernel_interleave_v1}


def _assert_bake_equals_vllm(out, layer_prefix, engine_params, parameter_names):
    baked = load_all(out)
    by_engine_name = {engine: short for short, engine in parameter_names.items()}
    assert len(engine_params) == 6
    for name, expected in engine_params.items():
        got = baked[layer_prefix + by_engine_name.get(name, name)]
        assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
        assert torch.equal(got.view(torch.uint8), expected.contiguous().view(torch.uint8)), f"{name} differs from vLLM's"


@pytest.mark.parametrize(
    "hidden, intermediate",
    [
        (160, 96),  # pads H 160 -> 256, I 96 -> 128 (zeros)
        (2880, 128),  # GPT-OSS's H: 2880 -> 2944 (vLLM pads to 128, SGLang to 256)
        (256, 64),  # no hidden padding: the same bytes as SGLang 0.5.23's, so the bake serves both
    ],
)
def test_gpt_oss_flashinfer_cutlass_equals_vllm(tmp_path, hidden, intermediate):
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=intermediate, vocab=32)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm90-cutlass", engine=VLLM), progress=False).to_json()
    engine_record = manifest["engine"]
    assert (engine_record["name"], engine_record["version"], engine_record["exact"]) == ("vllm", vllm_oracle.VLLM_VERSION, True)
    assert engine_record["parameter_names"] == {"w13_weight_bias": "w13_bias", "w2_weight_bias": "w2_bias"}
    engine = vllm_oracle.gpt_oss_flashinfer_cutlass(source, 0, KERNELS[flashinfer_layout_here()])
    _assert_bake_equals_vllm(tmp_path / "out", "model.layers.0.mlp.experts.", engine, engine_record["parameter_names"])
    served = [(e["name"], e["version"]) for e in manifest["serves"]]
    # SGLang's bytes where H needs no padding: the record is of the newest SGLang release whose pinned FlashInfer reads
    # the installed FlashInfer's SM90 layout (0.5.23 beside vLLM 0.28.0-0.33.0's FlashInfer, 0.5.18 beside older ones)
    newest = [r for r in releases("sglang") if pinned_layout(r) == manifest["flashinfer_layout"]["id"]][-1]
    assert served == ([("sglang", newest.version)] if hidden % 256 == 0 else [])


def test_sglang_bake_of_an_unpadded_hidden_size_serves_vllm_too(tmp_path):
    """The other direction: the default (SGLang) profile's bake lists vLLM when its bytes are vLLM's."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=256, intermediate=96, vocab=32)
    manifest = convert(
        source, tmp_path / "out", ConvertOptions("sm90-cutlass", flashinfer_layout=flashinfer_layout_here()), progress=False
    ).to_json()
    assert manifest["engine"]["name"] == "sglang"
    assert [(e["name"], e["exact"], e["parameter_names"]) for e in manifest["serves"]] == [
        ("vllm", True, {"w13_weight_bias": "w13_bias", "w2_weight_bias": "w2_bias"})
    ]
    engine = vllm_oracle.gpt_oss_flashinfer_cutlass(source, 0, KERNELS[flashinfer_layout_here()])
    _assert_bake_equals_vllm(tmp_path / "out", "model.layers.0.mlp.experts.", engine, manifest["serves"][0]["parameter_names"])


@pytest.mark.parametrize(
    "hidden, intermediate",
    [
        (160, 96),  # pads H 160 -> 256, I 96 -> 128 (256 before vLLM 0.27.0) (zero scale padding, where SGLang leaves 127)
        (2880, 128),  # GPT-OSS's H: 2880 -> 3072, as SGLang pads it
        (256, 128),  # H not padded; I neither from vLLM 0.27.0 on: the same bytes as SGLang 0.5.23's, so the bake serves both
    ],
)
def test_gpt_oss_sm100_trtllm_equals_vllm(tmp_path, hidden, intermediate):
    """GPT-OSS on SM100: vLLM's GptOssMxfp4MoEMethod with FLASHINFER_TRTLLM_MXFP4_BF16 holds the bake's six tensors byte
    for byte (biases F32, under vLLM's names), H padded to 256 and I to 128 (256 before 0.27.0) with zeros, as vLLM's
    own padded sizes say; the bake's gemm1_alpha/beta/clamp_limit are not vLLM parameters. SGLang's bake differs in the
    scale padding (127) wherever H or I is padded."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=intermediate, vocab=32)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm100-trtllm", engine=VLLM), progress=False).to_json()
    engine_record, record = manifest["engine"], manifest["layers"][0]
    profile = release_profile(parse_engine(VLLM)).target("sm100-trtllm", "gpt-oss")
    assert (engine_record["name"], engine_record["version"], engine_record["exact"], engine_record["runner_backend"]) == (
        "vllm",
        vllm_oracle.VLLM_VERSION,
        True,
        "flashinfer_trtllm",
    )
    assert (
        engine_record["hidden_multiple"],
        engine_record["intermediate_multiple"],
        engine_record["hidden_scale_fill"],
        engine_record.get("intermediate_scale_fill", 0),
    ) == (profile.hidden_multiple, profile.intermediate_multiple, 0, 0)
    engine = vllm_oracle.gpt_oss_sm100_trtllm(source, 0)
    assert (
        (engine.pop("hidden_dim"), engine.pop("intermediate_size_per_partition"))
        == (record["hidden_padded"], record["intermediate_padded"])
        == (
            -(-hidden // profile.hidden_multiple) * profile.hidden_multiple,
            -(-intermediate // profile.intermediate_multiple) * profile.intermediate_multiple,
        )
    )
    assert set(record["tensors"]) - {engine_record["parameter_names"].get(n, n) for n in record["tensors"]} == {
        "w13_weight_bias",
        "w2_weight_bias",
    }
    _assert_bake_equals_vllm(tmp_path / "out", "model.layers.0.mlp.experts.", engine, engine_record["parameter_names"])
    assert set(record["tensors"]) - {"w13_weight_bias", "w2_weight_bias"} - set(engine) == {
        "gemm1_alpha",
        "gemm1_beta",
        "gemm1_clamp_limit",
    }
    padded = (hidden, intermediate) != (record["hidden_padded"], record["intermediate_padded"])
    assert [(e["name"], e["version"]) for e in manifest["serves"]] == ([] if padded else [("sglang", "0.5.23")])
    sglang = convert(source, tmp_path / "sglang", ConvertOptions("sm100-trtllm"), progress=False).to_json()
    assert [e["name"] for e in sglang["serves"] if vllm_oracle.VLLM_VERSION in e["releases"]] == ([] if padded else ["vllm"])


NVFP4_WEIGHTS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
MXFP4_WEIGHTS = NVFP4_WEIGHTS


@pytest.mark.parametrize("hidden, intermediate", [(256, 128), (384, 256)])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_deepseek_v4_flashinfer_cutlass_equals_vllm(tmp_path, hidden, intermediate, engine):
    """DeepSeek-V4 MXFP4 on SM90: vLLM's generic Mxfp4MoEMethod (FLASHINFER_CUTLASS_MXFP4_BF16) holds the bake's four
    tensors byte for byte, under the bake's names. SGLang 0.5.23's bake is the same bytes (nothing is padded), so
    either engine's bake lists the other in ``serves``."""
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=hidden, intermediate=intermediate, mtp_layers=0)
    manifest = convert(
        source,
        tmp_path / "out",
        ConvertOptions("sm90-cutlass", engine=_spec(engine), flashinfer_layout=flashinfer_layout_here()),
        progress=False,
    ).to_json()
    record = manifest["layers"][0]
    assert (manifest["engine"]["name"], manifest["engine"]["exact"]) == (engine, True)
    vllm = manifest["engine"] if engine == "vllm" else manifest["serves"][0]
    assert [(e["name"], e["exact"]) for e in manifest["serves"]] == [({"vllm": "sglang", "sglang": "vllm"}[engine], True)]
    assert (vllm["name"], _release_of(vllm), vllm["runner_backend"], vllm["parameter_names"]) == (
        "vllm",
        vllm_oracle.VLLM_VERSION,
        "flashinfer_cutlass",
        {},
    )
    assert vllm["engine_method"] == "vllm.model_executor.layers.quantization.mxfp4.Mxfp4MoEMethod"
    engine_params = vllm_oracle.deepseek_v4_flashinfer_cutlass(
        source, record["prefix"], 3, hidden, intermediate, KERNELS[flashinfer_layout_here()]
    )
    assert sorted(engine_params) == sorted(record["tensors"]) == sorted(MXFP4_WEIGHTS)
    baked = load_all(tmp_path / "out")
    for name, expected in engine_params.items():
        got = baked[record["prefix"] + name]
        assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
        assert torch.equal(got, expected), f"{name} differs from vLLM's"


@pytest.mark.parametrize("hidden, intermediate", [(256, 128), (512, 256)])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_deepseek_v4_sm100_trtllm_equals_vllm(tmp_path, hidden, intermediate, engine):
    """DeepSeek-V4 MXFP4 on SM100: vLLM's Mxfp4MoEMethod with FLASHINFER_TRTLLM_MXFP4_BF16 holds the bake's four
    tensors byte for byte (vLLM views the weights as uint8, the bake keeps the checkpoint's int8), under the bake's
    names, with H and I unpadded; SGLang 0.5.23's bake is the same bytes, so either lists the other in ``serves``.
    The bake's gemm1_clamp_limit is not a vLLM parameter (vLLM's trtllm-gen kernel takes config.json's swiglu_limit)."""
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=hidden, intermediate=intermediate, mtp_layers=0)
    profile = release_profile(parse_engine(VLLM)).target("sm100-trtllm", "deepseek-v4")
    if intermediate % profile.intermediate_multiple:  # vLLM before 0.27.0 pads I to 256: the release refuses the model
        _assert_vllm_pads_deepseek_v4_sm100(tmp_path, source, hidden, intermediate, profile)
        return
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm100-trtllm", engine=_spec(engine)), progress=False).to_json()
    record = manifest["layers"][0]
    vllm = manifest["engine"] if engine == "vllm" else manifest["serves"][0]
    assert [(e["name"], e["exact"]) for e in manifest["serves"]] == [({"vllm": "sglang", "sglang": "vllm"}[engine], True)]
    assert (vllm["name"], _release_of(vllm), vllm["runner_backend"], vllm["hidden_multiple"], vllm["exact"]) == (
        "vllm",
        vllm_oracle.VLLM_VERSION,
        "flashinfer_trtllm",
        profile.hidden_multiple,
        True,
    )
    engine_params = vllm_oracle.deepseek_v4_sm100_trtllm(source, record["prefix"], 3, hidden, intermediate)
    assert (engine_params.pop("hidden_dim"), engine_params.pop("intermediate_size_per_partition")) == (hidden, intermediate)
    assert sorted(engine_params) == sorted(MXFP4_WEIGHTS) and set(record["tensors"]) == {*MXFP4_WEIGHTS, "gemm1_clamp_limit"}
    baked = load_all(tmp_path / "out")
    for name, expected in engine_params.items():
        got = baked[record["prefix"] + name]
        assert tuple(got.shape) == tuple(expected.shape), name
        assert (got.dtype, expected.dtype) in ((torch.int8, torch.uint8), (torch.float8_e4m3fn, torch.float8_e4m3fn)), name
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"{name} differs from vLLM's"


def _assert_vllm_pads_deepseek_v4_sm100(tmp_path, source, hidden, intermediate, profile):
    """A DeepSeek-V4 model the release pads on SM100 (``profile``'s multiples): vLLM's own padded sizes are them,
    ``--engine vllm`` refuses the model in one line, and SGLang's bake does not list the release."""
    from moebake.errors import UnsupportedError

    engine_params = vllm_oracle.deepseek_v4_sm100_trtllm(source, "layers.0.ffn.experts.", 3, hidden, intermediate)
    padded = (
        -(-hidden // profile.hidden_multiple) * profile.hidden_multiple,
        -(-intermediate // profile.intermediate_multiple) * profile.intermediate_multiple,
    )
    assert padded != (hidden, intermediate)
    assert (engine_params["hidden_dim"], engine_params["intermediate_size_per_partition"]) == padded
    assert tuple(engine_params["w2_weight"].shape[1:]) == (padded[0], padded[1] // 2)
    with pytest.raises(UnsupportedError) as excinfo:
        convert(source, tmp_path / "vllm", ConvertOptions("sm100-trtllm", engine=VLLM), progress=False)
    assert "\n" not in str(excinfo.value)
    manifest = convert(source, tmp_path / "sglang", ConvertOptions("sm100-trtllm"), progress=False).to_json()
    assert not [e for e in manifest["serves"] if vllm_oracle.VLLM_VERSION in e["releases"]]


def test_deepseek_v4_sm100_trtllm_with_a_hidden_size_vllm_pads(tmp_path):
    """H = 384: vLLM's trtllm-gen path pads H to a multiple of 256 (its oracle's parameters are 512 wide) and moebake pads
    no DeepSeek-V4 expert, so --engine vllm refuses the model in one line and SGLang's bake does not list vLLM."""
    from moebake.errors import UnsupportedError

    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=384, intermediate=128, mtp_layers=0)
    profile = release_profile(parse_engine(VLLM)).target("sm100-trtllm", "deepseek-v4")
    _assert_vllm_pads_deepseek_v4_sm100(tmp_path, source, 384, 128, profile)
    with pytest.raises(UnsupportedError) as excinfo:
        convert(source, tmp_path / "vllm-again", ConvertOptions("sm100-trtllm", engine=VLLM), progress=False)
    assert "hidden size 384" in str(excinfo.value) and f"multiples of {profile.hidden_multiple}" in str(excinfo.value)
    manifest = convert(source, tmp_path / "sglang-again", ConvertOptions("sm100-trtllm"), progress=False).to_json()
    assert manifest["serves"] == []


@pytest.mark.parametrize(
    "hidden, intermediate, mismatches",
    [
        (384, 128, ()),  # H 384 -> 512 (vLLM's 256-wide K tiles), I needs none
        (256, 64, MODELOPT_MISMATCHES),  # no padding: SGLang 0.5.23's bytes too; experts 1, 3 differ (kept apart)
    ],
)
def test_modelopt_nvfp4_cutedsl_equals_vllm(tmp_path, hidden, intermediate, mismatches):
    """vLLM's ModelOptNvFp4FusedMoE on the source (--moe-backend flashinfer_cutedsl, its conversion): its W13/W2
    weights and swizzled block scales equal the bake's byte for byte, its four per-expert scalars equal the
    plugin's reduction of the bake's (:func:`moebake.engines.vllm.nvfp4.cutedsl_scalars`), and its padded sizes
    are the manifest's."""
    from moebake.engines.vllm.nvfp4 import cutedsl_scalars

    source = write_modelopt_nvfp4(
        tmp_path / "src", num_layers=2, num_experts=4, hidden=hidden, intermediate=intermediate, mismatches=mismatches
    )
    options = ConvertOptions("cutedsl", engine=VLLM, gate_up_globals="keep" if mismatches else "share")
    manifest = convert(source, tmp_path / "out", options, progress=False).to_json()
    engine_record, record = manifest["engine"], manifest["layers"][0]
    multiple = release_profile(parse_engine(VLLM)).target("cutedsl", "modelopt-nvfp4").hidden_multiple  # 256 from 0.32.0, 128 before
    assert (engine_record["name"], engine_record["exact"], engine_record["hidden_multiple"]) == ("vllm", True, multiple)
    assert [(e["name"], e["version"]) for e in manifest["serves"]] == ([("sglang", "0.5.23")] if hidden % multiple == 0 else [])
    engine = vllm_oracle.modelopt_nvfp4_cutedsl(source, record["prefix"], 4, hidden, intermediate)
    assert (
        (engine.pop("hidden_dim"), engine.pop("intermediate_size_per_partition"))
        == (record["hidden_padded"], record["intermediate_padded"])
        == (-(-hidden // multiple) * multiple, intermediate)
    )
    baked = {short: tensor for short, tensor in load_all(tmp_path / "out").items()}
    prefix = record["prefix"]
    for name in NVFP4_WEIGHTS:
        got, expected = baked[prefix + name], engine[name]
        assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"{name} differs from vLLM's"
    scalars = cutedsl_scalars(
        {name: baked[prefix + name] for name in ("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale")},
        torch.arange(4),
        enable_eplb=False,
    )
    assert set(engine) == set(NVFP4_WEIGHTS) | set(scalars)
    for name, value in scalars.items():
        assert value.dtype == torch.float32 and torch.equal(value.view(torch.int32), engine[name].view(torch.int32)), name


def test_modelopt_nvfp4_with_shared_gate_up_globals_is_not_vllm_exact(tmp_path):
    """moebake's default shares differing gate/up globals (rescaling block scales); vLLM takes the gate's for both
    halves and keeps the block scales, so such a bake says it is not vLLM's bytes."""
    source = write_modelopt_nvfp4(tmp_path / "src", num_layers=2, num_experts=4, hidden=256, intermediate=64)
    manifest = convert(source, tmp_path / "out", ConvertOptions("cutedsl", engine=VLLM), progress=False).to_json()
    assert manifest["engine"]["exact"] is False and manifest["serves"] == []
    assert manifest["engine"]["not_exact_because"].startswith("gate and up global scales shared in 2 experts")


def test_deepep_bf16_is_refused_for_vllm_with_the_reason_vllms_code_gives(tmp_path):
    """vLLM 0.33.0 has no DeepGEMM unquantized MoE: its unquantized backend map knows five backends, none DeepGEMM; its
    Triton paths would hold the bake's bytes unchanged, its FlashInfer CUTLASS path swaps the halves. So there is no
    vLLM path that is this target's (DeepGEMM masked BF16 grouped GEMM): ``convert --engine vllm`` and the plugin
    refuse in one line naming vLLM's functions."""
    from types import SimpleNamespace

    from click.testing import CliRunner
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import (
        UnquantizedMoeBackend,
        convert_to_unquantized_kernel_format,
        map_unquantized_backend,
    )

    from moebake.cli import main
    from moebake.engines.vllm.bake import PREFIX
    from moebake.errors import MoebakeError
    from moebake.reference.synthetic_sources import write_bf16_moe
    from moebake.schema.serving import NOT_SERVABLE

    why = NOT_SERVABLE[("vllm", "deepep-bf16", "bf16-moe")]
    backends = ("triton", "batched_triton", "flashinfer_trtllm", "flashinfer_cutlass", "aiter")
    assert [map_unquantized_backend(name).name for name in backends] == [
        "TRITON",
        "BATCHED_TRITON",
        "FLASHINFER_TRTLLM",
        "FLASHINFER_CUTLASS",
        "AITER",
    ]
    for name in ("deep_gemm", "deepgemm"):
        with pytest.raises(ValueError, match="is not supported for unquantized MoE"):
            map_unquantized_backend(name)
    assert all(name in why for name in backends) and "BATCHED_TRITON" in why and "DeepGEMM" in why

    source = write_bf16_moe(tmp_path / "src", style="qwen3", num_layers=1, num_experts=2, hidden=64, intermediate=32)
    manifest = convert(source, tmp_path / "sglang", ConvertOptions("deepep-bf16"), progress=False).to_json()
    assert manifest["serves"] == []
    record = manifest["layers"][0]
    baked = load_all(tmp_path / "sglang")
    w13, w2 = baked[record["prefix"] + "w13_weight"], baked[record["prefix"] + "w2_weight"]
    triton13, triton2 = convert_to_unquantized_kernel_format(
        UnquantizedMoeBackend.BATCHED_TRITON, SimpleNamespace(), w13.clone(), w2.clone()
    )
    assert torch.equal(triton13, w13) and torch.equal(triton2, w2)
    cutlass13, _ = convert_to_unquantized_kernel_format(
        UnquantizedMoeBackend.FLASHINFER_CUTLASS, SimpleNamespace(is_act_and_mul=True), w13.clone(), w2.clone()
    )
    assert torch.equal(cutlass13, torch.cat([w13[:, 32:], w13[:, :32]], 1))

    result = CliRunner().invoke(
        main, ["convert", str(source), str(tmp_path / "vllm"), "--target", "deepep-bf16", "--engine", "vllm", "--quiet"]
    )
    assert result.exit_code == 2 and result.output.count("\n") == 1 and result.output.startswith("error: "), result.output
    assert f"cannot serve deepep-bf16 bakes of bf16-moe checkpoints exactly ({why})" in result.output
    assert not (tmp_path / "vllm").exists()

    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what every vLLM process does: registers moebake's quantization
    config = json.loads((tmp_path / "sglang" / "config.json").read_text())
    quant = get_quantization_config("moebake").from_config(config["quantization_config"])
    with pytest.raises(MoebakeError) as excinfo:
        quant.maybe_update_config(str(tmp_path / "sglang"), hf_config=config)
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(PREFIX) and f"({why})" in message


@pytest.mark.parametrize("hidden, intermediate, engine", [(256, 128, "vllm"), (512, 256, "sglang")])
def test_deepseek_v4_marlin_equals_vllm(tmp_path, hidden, intermediate, engine):
    """DeepSeek-V4 MXFP4 with ``--moe-backend marlin``: vLLM's generic Mxfp4MoEMethod (MARLIN) holds the bake's four
    tensors byte for byte, under the bake's names, with the CUDA ``gptq_marlin_repack`` done by vLLM's own Python
    reference of Marlin packing (``tests/kernel_emulation.py``). Nothing is padded, so SGLang 0.5.23's bake is the same
    bytes and either engine's bake lists the other in ``serves``."""
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=hidden, intermediate=intermediate, mtp_layers=0)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm90-marlin", engine=_spec(engine)), progress=False).to_json()
    record = manifest["layers"][0]
    assert (manifest["engine"]["name"], manifest["engine"]["exact"]) == (engine, True)
    assert [(e["name"], e["exact"]) for e in manifest["serves"]] == [({"vllm": "sglang", "sglang": "vllm"}[engine], True)]
    vllm = manifest["engine"] if engine == "vllm" else manifest["serves"][0]
    assert (vllm["runner_backend"], vllm["engine_method"]) == ("marlin", "vllm.model_executor.layers.quantization.mxfp4.Mxfp4MoEMethod")
    engine_params = vllm_oracle.deepseek_v4_marlin(source, record["prefix"], 3, hidden, intermediate, gptq_marlin_repack_reference)
    assert sorted(engine_params) == sorted(record["tensors"]) == sorted(MXFP4_WEIGHTS)
    baked = load_all(tmp_path / "out")
    for name, expected in engine_params.items():
        got = baked[record["prefix"] + name]
        assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
        assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"{name} differs from vLLM's"


def test_deepseek_v4_marlin_bake_that_vllm_would_pad_serves_sglang_only(tmp_path):
    """I = 192: SGLang's Marlin path takes it as is (I % 64 == 0), vLLM's pads I to 256, so the SGLang bake lists no
    other engine, and ``--engine vllm`` refuses to bake it (DeepSeek-V4 is never padded)."""
    from moebake.errors import UnsupportedError

    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=2, hidden=256, intermediate=192, mtp_layers=0)
    assert convert(source, tmp_path / "out", ConvertOptions("sm90-marlin"), progress=False).to_json()["serves"] == []
    profile = release_profile(parse_engine(VLLM)).target("sm90-marlin", "deepseek-v4")
    with pytest.raises(UnsupportedError, match=f"must be multiples of {profile.hidden_multiple} and {profile.intermediate_multiple}"):
        convert(source, tmp_path / "out-vllm", ConvertOptions("sm90-marlin", engine=VLLM), progress=False)


def test_gpt_oss_marlin_is_refused_for_vllm_and_says_why(tmp_path):
    """vLLM 0.33.0's own GPT-OSS Marlin preparation, run on CPU (``GptOssMxfp4MoEMethod``, ``MARLIN``, vLLM's loader;
    the CUDA repack stood in for by vLLM's Python Marlin reference), holds the Marlin layout of the checkpoint's
    interleaved (gate, up) row pairs with the padding rows after them and zero scale padding, for its SWIGLUOAI
    activation: moebake's layout functions on that order give vLLM's bytes, and the sm90-marlin bake (SGLang's
    [gate; up] halves, scale padding 127) is not them. So there is no vLLM profile, and ``--engine vllm`` is refused in
    one line saying so (:data:`NOT_SERVABLE`)."""
    from moebake.errors import UnsupportedError
    from moebake.layouts import marlin
    from moebake.layouts.gate_up import pad_to
    from moebake.schema.serving import NOT_SERVABLE

    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=192, intermediate=96, vocab=32)
    engine = vllm_oracle.gpt_oss_marlin(source, 0, gptq_marlin_repack_reference)
    Hp, Ip = engine["hidden_dim"], engine["intermediate_size_per_partition"]
    assert (Hp, Ip, engine["activation"]) == (256, 128, "swigluoai")
    checkpoint, prefix = load_all(source), "model.layers.0.mlp.experts."
    pairs = checkpoint[prefix + "gate_up_proj_blocks"].flatten(2)  # rows g0, u0, g1, u1, ...
    assert torch.equal(engine["w13_weight"], marlin.repack(pad_to(pairs, (2 * Ip, Hp // 2))))
    assert torch.equal(
        engine["w13_weight_scale"].view(torch.uint8),
        marlin.permute_scales(pad_to(checkpoint[prefix + "gate_up_proj_scales"], (2 * Ip, Hp // 32), 0)),
    )
    assert torch.equal(
        engine["w2_weight_scale"].view(torch.uint8),
        marlin.permute_scales(pad_to(checkpoint[prefix + "down_proj_scales"], (Hp, Ip // 32), 0)),
    )
    assert torch.equal(
        engine["w13_bias"], marlin.permute_bias(pad_to(checkpoint[prefix + "gate_up_proj_bias"], (2 * Ip,))).to(engine["w13_bias"].dtype)
    )

    manifest = convert(source, tmp_path / "sglang", ConvertOptions("sm90-marlin"), progress=False).to_json()
    assert manifest["serves"] == []
    baked = load_all(tmp_path / "sglang")
    for name in ("w13_weight", "w13_weight_scale", "w2_weight_scale"):
        assert not torch.equal(baked[prefix + name].view(torch.uint8), engine[name].view(torch.uint8)), name
    assert torch.equal(baked[prefix + "w2_weight"], engine["w2_weight"])  # W2 has no halves: only its scale padding differs

    why = NOT_SERVABLE[("vllm", "sm90-marlin", "gpt-oss")]
    assert all(
        fact in why
        for fact in (
            "GptOssMxfp4MoEMethod",
            "prepare_moe_mxfp4_layer_for_marlin",
            "(gate, up) row pairs",
            "zero scale padding",
            "SWIGLUOAI",
            "[gate; up] halves",
            "scale padding 127",
        )
    )
    with pytest.raises(UnsupportedError) as refusal:
        convert(source, tmp_path / "out", ConvertOptions("sm90-marlin", engine=VLLM), progress=False)
    assert "\n" not in str(refusal.value)
    assert f"vllm {vllm_oracle.VLLM_VERSION} cannot serve sm90-marlin bakes of gpt-oss checkpoints exactly ({why})" in str(refusal.value)
