"""Source format bf16-moe: detection, the layers it finds in each storage style, and every refusal."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from moebake.errors import MoebakeError
from moebake.formats import SOURCE_FORMATS, bf16_moe, detect_format, open_source
from moebake.formats.checkpoint import open_checkpoint
from moebake.reference.synthetic_sources import write_bf16_moe
from moebake.synthetic import write_gpt_oss

SMALL = {"num_layers": 2, "num_experts": 3, "hidden": 32, "intermediate": 16}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """One read-only checkpoint per style (Qwen3.5 with an MTP layer)."""
    root = tmp_path_factory.mktemp("bf16src")
    return {
        "qwen3.5": write_bf16_moe(root / "qwen35", style="qwen3.5", mtp_layers=1, **SMALL),
        "qwen3": write_bf16_moe(root / "qwen3", style="qwen3", **SMALL),
        "mixtral": write_bf16_moe(root / "mixtral", style="mixtral", **SMALL),
    }


def damaged_copy(tmp_path, source, change):
    """A copy of ``source`` whose tensors went through ``change(dict) -> dict`` (index rewritten to match)."""
    root = shutil.copytree(source, tmp_path / "damaged")
    weight_map = {}
    for shard in sorted(root.glob("*.safetensors")):
        tensors = change(load_file(shard))
        save_file(tensors, shard, metadata={"format": "pt"})
        weight_map |= {name: shard.name for name in tensors}
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def edit_config(root, change):
    config = json.loads((root / "config.json").read_text())
    change(config)
    (root / "config.json").write_text(json.dumps(config))


def test_qwen35_fused_layers_and_mtp_layer(sources):
    model = open_source(sources["qwen3.5"])
    assert model.format_name == "bf16-moe"
    assert (model.hidden_size, model.intermediate_size, model.num_experts) == (32, 16, 3)
    assert [(layer.prefix, layer.index) for layer in model.layers] == [
        ("model.language_model.layers.0.mlp.experts.", 0),
        ("model.language_model.layers.1.mlp.experts.", 1),
        ("mtp.layers.0.mlp.experts.", 0),
    ]
    first = model.layers[0]
    assert first.fused and first.gate_up == (first.prefix + "gate_up_proj",) and first.down == first.prefix + "down_proj"


@pytest.mark.parametrize("style, gate, up, down", [("qwen3", "gate_proj", "up_proj", "down_proj"), ("mixtral", "w1", "w3", "w2")])
def test_per_expert_layers_are_name_patterns(sources, style, gate, up, down):
    layer = open_source(sources[style]).layers[1]
    assert not layer.fused
    assert layer.gate_up == (f"{layer.prefix}*.{gate}.weight", f"{layer.prefix}*.{up}.weight")
    assert layer.down == f"{layer.prefix}*.{down}.weight"


def test_gpt_oss_is_not_bf16_moe(tmp_path):
    checkpoint = open_checkpoint(write_gpt_oss(tmp_path / "g", num_layers=1, num_experts=2, hidden=64, intermediate=64))
    assert not bf16_moe.detect(checkpoint)
    with pytest.raises(MoebakeError, match=r"config\.json: a gpt-oss checkpoint \(model_type=.*\); this needs bf16-moe$"):
        open_source(checkpoint.root, ("bf16-moe",))


def test_detection_prefers_formats_that_recognise_a_quantization(sources):
    """bf16-moe is the registry's last resort: plain BF16 checkpoints only, unless asked for by name."""
    assert detect_format(open_checkpoint(sources["qwen3"])) == "bf16-moe"
    assert list(SOURCE_FORMATS)[-1] == "bf16-moe"


def test_config_dims_may_live_in_text_config_or_at_the_top(sources, tmp_path):
    root = shutil.copytree(sources["qwen3.5"], tmp_path / "flat")
    edit_config(root, lambda c: c.update(c.pop("text_config")))
    assert open_source(root).intermediate_size == 16


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda c: c["text_config"].update(moe_intermediate_size=24),
            r"model-00001-of-00002\.safetensors: tensor model\.language_model\.layers\.0\.mlp\.experts\.gate_up_proj "
            r"is BF16 \[3, 32, 32\], expected BF16 \[3, 48, 32\] from config\.json$",
        ),
        (lambda c: c["text_config"].pop("num_experts"), r"config\.json: none of num_experts / num_local_experts / n_routed_experts is set"),
        (
            lambda c: c["text_config"].update(num_experts=True),
            r"config\.json: text_config\.num_experts is true, expected a positive integer",
        ),
        (lambda c: c["text_config"].update(hidden_act="gelu"), r"config\.json: text_config\.hidden_act is 'gelu', not supported"),
    ],
)
def test_config_mismatch_is_one_line_naming_file_and_tensor(sources, tmp_path, change, message):
    root = shutil.copytree(sources["qwen3.5"], tmp_path / "bad")
    edit_config(root, change)
    with pytest.raises(MoebakeError, match=message) as err:
        open_source(root)
    assert "\n" not in str(err.value)


def drop(name):
    return lambda tensors: {k: v for k, v in tensors.items() if k != name}


def retype(name, dtype):
    return lambda tensors: {k: v.to(dtype) if k == name else v for k, v in tensors.items()}


def rename(old, new):
    return lambda tensors: {new if k == old else k: v for k, v in tensors.items()}


P = "model.layers.1.mlp.experts."


@pytest.mark.parametrize(
    "change, message",
    [
        (drop(P + "2.up_proj.weight"), rf"tensor {P}2\.up_proj\.weight is missing"),
        (retype(P + "1.down_proj.weight", torch.float16), rf"tensor {P}1\.down_proj\.weight is F16 \[32, 16\], expected BF16 \[32, 16\]"),
        (
            rename(P + "2.gate_proj.weight", P + "7.gate_proj.weight"),
            rf"tensor {P}7\.gate_proj\.weight has expert index 7, but config\.json says 3",
        ),
        (rename(P + "0.up_proj.weight", P + "0.w3.weight"), rf"layer {P} names its up experts both up_proj and w3"),
    ],
)
def test_per_expert_damage_is_named(sources, tmp_path, change, message):
    with pytest.raises(MoebakeError, match=message) as err:
        open_source(damaged_copy(tmp_path, sources["qwen3"], change))
    assert "\n" not in str(err.value)


def test_unquantized_checkpoint_with_non_bf16_experts_is_refused(sources, tmp_path):
    to_f16 = lambda tensors: {k: v.half() if ".experts." in k and k.startswith("model.layers.0.") else v for k, v in tensors.items()}  # noqa: E731
    with pytest.raises(MoebakeError, match=r"tensor model\.layers\.0\.mlp\.experts\.0\.down_proj\.weight is F16, expected BF16"):
        open_source(damaged_copy(tmp_path, sources["qwen3"], to_f16))


def test_fused_and_per_expert_in_one_layer_is_refused(sources, tmp_path):
    def add_per_expert(tensors):
        name = "model.language_model.layers.0.mlp.experts.0.gate_proj.weight"
        first = "model.language_model.layers.0.mlp.experts.gate_up_proj"
        return tensors | ({name: tensors[first][0, :16].clone()} if first in tensors else {})

    with pytest.raises(MoebakeError, match=r"layer model\.language_model\.layers\.0\.mlp\.experts\. has both fused"):
        open_source(damaged_copy(tmp_path, sources["qwen3.5"], add_per_expert))
