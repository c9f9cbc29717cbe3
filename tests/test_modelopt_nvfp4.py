"""ModelOpt NVFP4 source: detection (config.json / hf_quant_config.json), exclude list, validation errors."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from moebake.cli import main
from moebake.formats import detect_format, open_source
from moebake.formats.checkpoint import open_checkpoint
from moebake.formats.modelopt_nvfp4 import is_excluded
from moebake.reference.synthetic_sources import write_modelopt_nvfp4

EXPERT = "model.layers.1.mlp.experts.2."


@pytest.fixture()
def source(tmp_path):
    return write_modelopt_nvfp4(tmp_path / "src")


def rewrite(root, name, tensor):
    """Replace (or, with None, drop) tensor ``name`` in its shard and the index."""
    index_path = root / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = root / index["weight_map"][name]
    tensors = load_file(shard)
    if tensor is None:
        del tensors[name], index["weight_map"][name]
        index_path.write_text(json.dumps(index))
    else:
        tensors[name] = tensor
    save_file(tensors, shard, metadata={"format": "pt"})


def edit_json(path, edit):
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def convert_error(source, tmp_path, target="cutedsl"):
    """The one error line of a failed CLI convert; checks exit 2 and that nothing was written."""
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(source), str(out), "--target", target, "--quiet"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
    return lines[0]


@pytest.mark.parametrize("quant_config", ["both", "config", "hf_quant_config"])
def test_detects_either_quant_config_and_reads_dims(tmp_path, quant_config):
    model = open_source(write_modelopt_nvfp4(tmp_path / "src", quant_config=quant_config))
    assert model.format_name == "modelopt-nvfp4"
    assert (model.hidden_size, model.intermediate_size, model.num_experts) == (128, 64, 4)
    assert [layer.prefix for layer in model.layers] == ["model.layers.1.mlp.experts.", "model.layers.2.mlp.experts."]
    assert model.excluded_layers == ("model.layers.3.mlp.experts.",)  # the BF16 MTP layer


def test_quant_method_modelopt_fp4_and_producer_only_are_detected(source):
    edit_json(source / "config.json", lambda c: c["quantization_config"].update(quant_method="modelopt_fp4"))
    assert detect_format(open_checkpoint(source)) == "modelopt-nvfp4"
    edit_json(source / "config.json", lambda c: c["quantization_config"].pop("quant_method"))
    assert detect_format(open_checkpoint(source)) == "modelopt-nvfp4"


def test_exclude_patterns_match_the_module_or_an_ancestor():
    patterns = ("*.mlp.gate", "model.layers.3*", "lm_head")
    assert is_excluded("model.layers.1.mlp.gate", patterns)
    assert not is_excluded("model.layers.1.mlp.gate_proj", patterns)
    assert is_excluded("model.layers.3.mlp.experts.0.up_proj", patterns)
    assert is_excluded("model.layers.1.mlp.experts.0.up_proj", ("model.layers.1.mlp.experts",))
    assert not is_excluded("model.layers.1.mlp.experts.0.up_proj", patterns)


def test_consumed_view_shares_one_global_and_leaves_other_tensors_alone(source):
    model = open_source(source)
    layer = model.layers[0]
    stored = load_file(source / "model-00003-of-00006.safetensors")  # layer 1, experts 2 and 3
    gate3, up3 = (stored[f"model.layers.1.mlp.experts.3.{p}_proj.weight_scale_2"] for p in ("gate", "up"))
    assert float(up3) > float(gate3)  # the generator makes expert 3's up global 4x its gate global
    for proj in ("gate", "up"):
        assert torch.equal(model.consumed(layer, 3, proj, "weight_scale_2"), up3)
        assert torch.equal(model.consumed(layer, 2, proj, "weight_scale"), stored[f"{EXPERT}{proj}_proj.weight_scale"].view(torch.uint8))
    assert torch.equal(
        model.consumed(layer, 3, "up", "weight_scale"), stored["model.layers.1.mlp.experts.3.up_proj.weight_scale"].view(torch.uint8)
    )
    assert not torch.equal(
        model.consumed(layer, 3, "gate", "weight_scale"), stored["model.layers.1.mlp.experts.3.gate_proj.weight_scale"].view(torch.uint8)
    )


def test_scalar_shape_one_is_accepted(tmp_path):
    model = open_source(write_modelopt_nvfp4(tmp_path / "src", scalar_shape=(1,)))
    assert model.scalar_shape == (1,)


def test_missing_weight_scale_2(source, tmp_path):
    rewrite(source, EXPERT + "up_proj.weight_scale_2", None)
    line = convert_error(source, tmp_path)
    assert EXPERT + "up_proj.weight_scale_2 is missing" in line


def test_block_scales_of_the_wrong_dtype(source, tmp_path):
    name = EXPERT + "gate_proj.weight_scale"
    rewrite(source, name, torch.ones(64, 8, dtype=torch.float32))
    line = convert_error(source, tmp_path)
    assert name in line and "F32" in line and "expected F8_E4M3 [64, 8]" in line


def test_weight_of_the_wrong_shape(source, tmp_path):
    name = EXPERT + "down_proj.weight"
    rewrite(source, name, torch.zeros(128, 64, dtype=torch.uint8))
    assert "expected U8 [128, 32]" in convert_error(source, tmp_path)


@pytest.mark.parametrize("quant_config", ["config", "hf_quant_config"])
def test_group_size_not_16(tmp_path, quant_config):
    line = convert_error(write_modelopt_nvfp4(tmp_path / "src", quant_config=quant_config, group_size=32), tmp_path)
    assert "group_size is 32, expected 16" in line


def test_quant_algo_other_than_nvfp4(source, tmp_path):
    edit_json(source / "config.json", lambda c: c["quantization_config"].update(quant_algo="FP8"))
    assert "quant_algo is 'FP8', not supported" in convert_error(source, tmp_path)


def test_layer_with_excluded_and_quantized_experts(source, tmp_path):
    edit_json(source / "config.json", lambda c: c["quantization_config"]["ignore"].append("model.layers.2.mlp.experts.1*"))
    assert "model.layers.2.mlp.experts has both excluded and quantized experts" in convert_error(source, tmp_path)


def test_unexcluded_bf16_layer(source, tmp_path):
    edit_json(source / "config.json", lambda c: c["quantization_config"]["ignore"].remove("model.layers.3*"))
    line = convert_error(source, tmp_path)
    assert "model.layers.3.mlp.experts.0." in line and "expected" in line


def test_expert_beyond_the_config(source, tmp_path):
    edit_json(source / "config.json", lambda c: c.update(n_routed_experts=3))
    assert "model.layers.1.mlp.experts.3." in convert_error(source, tmp_path)


def test_nan_block_scale_in_a_rescaled_half(source, tmp_path):
    name = "model.layers.1.mlp.experts.1.up_proj.weight_scale"  # expert 1's up half is rescaled
    scales = load_file(source / "model-00002-of-00006.safetensors")[name].view(torch.uint8).clone()
    scales[0, 0] = 0x7F
    rewrite(source, name, scales.view(torch.float8_e4m3fn))
    line = convert_error(source, tmp_path)
    assert name in line and "finite" in line


def test_config_without_the_expert_intermediate_size(source, tmp_path):
    edit_json(source / "config.json", lambda c: [c.pop("moe_intermediate_size"), c.pop("intermediate_size")])
    assert "none of moe_intermediate_size / intermediate_size is set" in convert_error(source, tmp_path)
