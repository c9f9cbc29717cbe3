"""The vLLM plugin, run inside the real vLLM 0.33.0 Python package on CPU (``tests/engine_oracles/vllm_oracle.py``
makes the platform answer as an SM90 GPU, as vLLM picks its MoE kernel from that).

Found through the ``vllm.general_plugins`` entry point; the ``moebake`` MoE layers vLLM builds have the
manifest's parameters; the loader copies exactly the files' bytes (per EP rank) and hands every other
tensor to the model's own ``load_weights``; vLLM's post-load step (also in pre-processed mode) only builds
the kernel; each refusal is one line.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import load_all
from engine_oracles import vllm_oracle
from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.engines.vllm.bake import GPT_OSS
from moebake.errors import MoebakeError
from moebake.synthetic import write_gpt_oss
from vllm_plugin.conftest import (
    build_gpt_oss,
    experts_of,
    load,
    moebake_config,
    post_load,
    refusal,
    refusal_of_another_release,
    refusal_under_another_flashinfer_layout,
    vllm_layout,
)


def parameter_names() -> dict[str, str]:
    """Baked tensor short name -> vLLM parameter name (the installed vLLM's: read when a test runs, so that this module
    is collected without vLLM)."""
    return GPT_OSS.parameter_names


EXPERTS, HIDDEN, INTERMEDIATE = 4, 160, 96  # pads to 256, 128
BAKE, SERVES = ConvertOptions("sm90-cutlass", engine=vllm_oracle.ENGINE), []


def write_source(directory: Path) -> Path:
    return write_gpt_oss(directory, num_layers=2, num_experts=EXPERTS, hidden=HIDDEN, intermediate=INTERMEDIATE, vocab=32)


def _copy(bake, tmp_path) -> Path:
    return Path(shutil.copytree(bake, tmp_path / "bake"))


def test_plugin_is_found_through_the_entry_point():
    import importlib.metadata

    from vllm.config.load import LoadConfig
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.plugins import load_general_plugins

    from moebake.engines.vllm.loader import MoebakeModelLoader
    from moebake.engines.vllm.quantization import MoebakeConfig

    points = {p.name: p.value for p in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert points.get("moebake") == "moebake.engines.vllm:register"
    load_general_plugins()
    assert get_quantization_config("moebake") is MoebakeConfig
    assert type(get_model_loader(LoadConfig(load_format="moebake"))) is MoebakeModelLoader


def test_stock_vllm_refuses_a_bake(bake):
    """Without the plugin (a vLLM process that loads no moebake plugin), vLLM's own config parsing refuses
    config.json's quant_method: moebake instead of loading the bake as GPT-OSS MXFP4."""
    import os
    import subprocess
    import sys

    if os.environ.get("MOEBAKE_ORACLE_HIDE"):
        pytest.skip("a release-matrix run: stock vLLM's own refusal is checked on the installed release")
    script = "from vllm.config import ModelConfig\ntry:\n    ModelConfig(model=sys.argv[1])\nexcept ValueError as err:\n    print(err)\n"
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_PLUGINS": "none"}
    result = subprocess.run(
        [sys.executable, "-c", "import sys\n" + script, str(bake)], env=env, capture_output=True, text=True, timeout=600
    )
    assert "Unknown quantization method: moebake" in result.stdout, result.stdout + result.stderr


def test_vllm_config_parsing_selects_the_plugin(bake):
    from vllm.config import ModelConfig

    assert ModelConfig(model=str(bake)).quantization == "moebake"


def test_layer_parameters_equal_the_manifest(bake):
    model, _ = build_gpt_oss(bake)
    manifest = json.loads((bake / "moebake.json").read_text())
    dtypes = {"U8": torch.uint8, "BF16": torch.bfloat16}
    for index, record in enumerate(manifest["layers"]):
        experts = experts_of(model, index)
        params = dict(experts.named_parameters())
        names = parameter_names()
        assert set(params) == {names[short] for short in record["tensors"]} == set(names.values())
        for short, spec in record["tensors"].items():
            p = params[names[short]]
            assert (p.dtype, list(p.shape)) == (dtypes[spec["dtype"]], spec["shape"]), short


def test_loaded_bytes_equal_the_files_and_the_rest_goes_to_the_model(bake):
    model, _ = build_gpt_oss(bake)
    load(bake, model)
    files, manifest = load_all(bake), json.loads((bake / "moebake.json").read_text())
    baked = set()
    for index, record in enumerate(manifest["layers"]):
        experts = experts_of(model, index)
        for short in record["tensors"]:
            baked.add(record["prefix"] + short)
            got, want = getattr(experts, parameter_names()[short]).data, files[record["prefix"] + short]
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), short
    assert set(model.handed) == set(files) - baked
    for name, tensor in model.handed.items():
        assert torch.equal(tensor.view(torch.uint8), files[name].view(torch.uint8)), name


def test_an_sglang_bake_that_serves_vllm_loads(tmp_path):
    """One bake for both engines: the default SGLang bake (in the layout the vLLM under test reads) of a model whose H
    needs no padding lists vLLM in ``serves``, and the plugin loads it byte for byte."""
    source = write_gpt_oss(tmp_path / "src", num_layers=2, num_experts=EXPERTS, hidden=256, intermediate=INTERMEDIATE, vocab=32)
    options = ConvertOptions("sm90-cutlass", flashinfer_layout=vllm_layout())
    manifest = convert(source, tmp_path / "out", options, progress=False).to_json()
    assert manifest["engine"]["name"] == "sglang" and [e["name"] for e in manifest["serves"]] == ["vllm"]
    model, _ = build_gpt_oss(tmp_path / "out")
    load(tmp_path / "out", model)
    files = load_all(tmp_path / "out")
    for short, parameter in parameter_names().items():
        got = getattr(experts_of(model, 1), parameter).data
        assert torch.equal(got.view(torch.uint8), files[f"model.layers.1.mlp.experts.{short}"].view(torch.uint8)), short


@pytest.mark.parametrize("pre_processed", [False, True])
def test_post_load_step_only_builds_the_kernel(bake, pre_processed):
    """vLLM's own post-load driver: every byte stays as loaded, the FlashInfer CUTLASS kernel is set up."""
    model, vllm_config = build_gpt_oss(bake)
    load(bake, model)
    before = {n: p.data.clone() for n, p in model.named_parameters() if ".experts." in n}
    post_load(model, vllm_oracle.vllm_engine(vllm_config.model_config.hf_config, vllm_config.quant_config), pre_processed)
    after = dict(model.named_parameters())
    for name, tensor in before.items():
        assert torch.equal(after[name].data.view(torch.uint8), tensor.view(torch.uint8)), name
    method = experts_of(model, 0).quant_method
    assert type(method.moe_kernel.fused_experts).__name__ == "FlashInferExperts"


@pytest.mark.parametrize("rank", [0, 1])
def test_each_ep_rank_holds_its_slice(bake, rank):
    """EP 2 (``--enable-expert-parallel`` over 2 GPUs): vLLM's expert map gives rank r experts [2r, 2r+2);
    the loader copies exactly those rows of the files into its parameters."""
    model, _ = build_gpt_oss(bake, tensor_parallel=(2, rank), expert_parallel=True)
    load(bake, model)
    files = load_all(bake)
    for index in (0, 1):
        experts = experts_of(model, index)
        assert experts.moe_config.moe_parallel_config.ep_size == 2
        for short, parameter in parameter_names().items():
            got = getattr(experts, parameter).data
            want = files[f"model.layers.{index}.mlp.experts.{short}"][2 * rank : 2 * rank + 2]
            assert got.shape == want.shape and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (rank, short)


# --- refusals: one line each -------------------------------------------------------------------------


def test_refuses_a_gpu_that_is_not_sm90(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build_gpt_oss(bake, capability=100)
    assert "compute capability 10.0" in refusal(excinfo) and "SM90" in refusal(excinfo)


def test_refuses_another_flashinfer_layout(bake, monkeypatch):
    """A FlashInfer other than the release's pin, that reads the other SM90 layout (0.6.17: v1), is refused."""
    refusal_under_another_flashinfer_layout(bake, build_gpt_oss, monkeypatch)


def test_refuses_moe_tensor_parallelism(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build_gpt_oss(bake, tensor_parallel=(2, 0), expert_parallel=False)
    assert "MoE tensor parallelism (2)" in refusal(excinfo) and "--enable-expert-parallel" in refusal(excinfo)


def test_refuses_experts_not_divisible_by_ep(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build_gpt_oss(bake, tensor_parallel=(3, 0), expert_parallel=True)
    assert "4 experts do not split evenly over 3 EP ranks" in refusal(excinfo)


def test_refuses_another_moe_backend(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build_gpt_oss(bake, moe_backend="marlin")
    assert "--moe-backend flashinfer_cutlass" in refusal(excinfo)


def test_refuses_another_load_format(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build_gpt_oss(bake, load_format="auto")
    assert "--load-format moebake" in refusal(excinfo)


def test_refuses_a_manifest_changed_after_baking(bake, tmp_path):
    """A manifest rewritten consistently (its own checksum updated) no longer matches config.json's digest."""
    from moebake.schema.manifest import write_manifest

    directory = _copy(bake, tmp_path)
    manifest = json.loads((directory / "moebake.json").read_text())
    manifest["activation"]["limit"] = 8.0
    write_manifest(directory, manifest)
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(directory)
    assert "manifest_sha256" in refusal(excinfo)


def test_refuses_an_edited_manifest(bake, tmp_path):
    directory = _copy(bake, tmp_path)
    text = (directory / "moebake.json").read_text()
    (directory / "moebake.json").write_text(text.replace('"limit": 7.0', '"limit": 8.0'))
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(directory)
    assert "moebake.json" in refusal(excinfo)


def test_refuses_a_config_that_disagrees_with_the_manifest(bake, tmp_path):
    directory = _copy(bake, tmp_path)
    hf_config = vllm_oracle.hf_config_of(directory)
    hf_config.intermediate_size = 2 * INTERMEDIATE
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(directory, hf_config)
    assert "config.json and the manifest disagree" in refusal(excinfo)


def test_refuses_another_architecture(bake, tmp_path):
    hf_config = vllm_oracle.hf_config_of(bake)
    hf_config.architectures = ["MixtralForCausalLM"]
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(bake, hf_config)
    assert "GptOssForCausalLM" in refusal(excinfo)


def test_refuses_a_bake_for_another_engine(source, tmp_path):
    out = tmp_path / "sglang"
    convert(source, out, ConvertOptions("sm90-cutlass", engine="sglang"), progress=False)
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(out)
    assert "--engine vllm" in refusal(excinfo)


def test_refuses_unloaded_parameters(bake):
    model, vllm_config = build_gpt_oss(bake)
    with pytest.raises(MoebakeError) as excinfo:
        post_load(model, vllm_oracle.vllm_engine(vllm_config.model_config.hf_config, vllm_config.quant_config))
    assert "was never loaded" in refusal(excinfo)


def test_refuses_a_baked_tensor_whose_shape_differs_from_the_manifest(bake, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = _copy(bake, tmp_path)
    files = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    name = "model.layers.0.mlp.experts.w2_weight_bias"
    tensors = load_file(directory / files[name])
    tensors[name] = tensors[name][:, :-1].contiguous()
    save_file(tensors, directory / files[name], metadata={"format": "pt"})
    model, _ = build_gpt_oss(directory)
    with pytest.raises(MoebakeError) as excinfo:
        load(directory, model)
    assert name in refusal(excinfo) and "the manifest says" in refusal(excinfo)


def test_refuses_another_vllm_version(bake, monkeypatch):
    """The plugin's private vLLM names are proven for the matrix's releases: another is refused in one line."""
    refusal_of_another_release(bake, build_gpt_oss, monkeypatch)


def test_refuses_a_humming_w4a8_bake_in_one_line(tmp_path):
    """vLLM 0.33.0's HUMMING MXFP4 backend is the humming package's own kernels and layout, not FlashInfer's SM90
    Humming layout of an sm90-cutlass-w4a8 bake (SGLang's bytes): the plugin refuses it, saying why, before any expert."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=3, hidden=160, intermediate=96, vocab=32)
    convert(source, tmp_path / "out", ConvertOptions("sm90-cutlass-w4a8"), progress=False)
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(tmp_path / "out")
    message = refusal(excinfo)
    assert "\n" not in message
    assert (
        "target 'sm90-cutlass-w4a8': the vLLM plugin cannot serve it: vLLM 0.33.0's HUMMING MXFP4 MoE backend runs the "
        "humming package's own GEMM"
    ) in message and message.endswith("serve it with SGLang --flashinfer-mxfp4-moe-precision fp8")
    result = CliRunner().invoke(
        main, ["convert", str(source), str(tmp_path / "vllm"), "--target", "sm90-cutlass-w4a8", "--engine", "vllm", "--quiet"]
    )  # convert gives the same reason, up front
    assert result.exit_code == 2 and result.output.count("\n") == 1 and not (tmp_path / "vllm").exists()
    assert message.split("cannot serve it: ")[1] in result.output and "no verified profile" not in result.output
