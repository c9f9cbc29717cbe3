"""DeepSeek-V4 MXFP4 source: on-disk format, validation and error paths, and its sm90-cutlass bake.

The sm90-cutlass oracle is built here the way SGLang's ``Mxfp4FlashinferCutlassMoEMethod`` does it,
from tensors read with safetensors' own reader: W13 = ``[w3; w1]`` per expert (up; gate), bytes
viewed as uint8, then the SM90 fp4 interleave (the kernel's index emulation in
``kernel_emulation.py``) and FlashInfer's own ``interleave_moe_scales_for_sm90_mixed_gemm``.
"""

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from conftest import load_all
from kernel_emulation import kernel_interleave_v2
from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.formats import open_source
from moebake.reference.synthetic_sources import write_deepseek_v4

DIMS = {"num_layers": 2, "num_experts": 3, "hidden": 256, "intermediate": 128, "mtp_layers": 1, "shard_bytes": 96 << 10}
PREFIXES = ("layers.0.ffn.experts.", "layers.1.ffn.experts.", "mtp.0.ffn.experts.")


@pytest.fixture(scope="module")
def dsv4(tmp_path_factory):
    return write_deepseek_v4(tmp_path_factory.mktemp("dsv4") / "src", **DIMS)


@pytest.fixture(scope="module")
def dsv4_baked(dsv4, tmp_path_factory):
    out = tmp_path_factory.mktemp("dsv4-out") / "out"
    convert(dsv4, out, ConvertOptions("sm90-cutlass", chunk_bytes=1 << 16), progress=False)
    return out


@pytest.fixture()
def dsv4_copy(dsv4, tmp_path):
    return shutil.copytree(dsv4, tmp_path / "src")


def test_synthetic_has_deepseek_on_disk_names_and_dtypes(dsv4):
    config = json.loads((dsv4 / "config.json").read_text())
    assert config["model_type"] == "deepseek_v4" and config["expert_dtype"] == "fp4"
    assert "expert_dtype" not in config["quantization_config"]
    index = json.loads((dsv4 / "model.safetensors.index.json").read_text())["weight_map"]
    H, I = DIMS["hidden"], DIMS["intermediate"]
    expected = {
        "w1.weight": ("I8", [I, H // 2]),
        "w1.scale": ("F8_E8M0", [I, H // 32]),
        "w3.weight": ("I8", [I, H // 2]),
        "w3.scale": ("F8_E8M0", [I, H // 32]),
        "w2.weight": ("I8", [H, I // 2]),
        "w2.scale": ("F8_E8M0", [H, I // 32]),
    }
    for prefix in PREFIXES:
        for e in range(DIMS["num_experts"]):
            for suffix, (dtype, shape) in expected.items():
                name = f"{prefix}{e}.{suffix}"
                header = json.loads(_header(dsv4 / index[name]))
                assert (header[name]["dtype"], header[name]["shape"]) == (dtype, shape), name
    for name in (
        "layers.0.ffn.gate.weight",
        "layers.0.ffn.gate.tid2eid",
        "layers.1.ffn.shared_experts.w1.weight",
        "layers.1.attn.wq_a.scale",
        "mtp.0.ffn.gate.bias",
        "embed.weight",
        "head.weight",
    ):
        assert name in index
    experts_of_layer0 = {index[f"layers.0.ffn.experts.{e}.{s}"] for e in range(3) for s in expected}
    assert len(experts_of_layer0) > 1  # one layer's experts straddle shards, as in the real release


def _header(path):
    raw = path.read_bytes()
    return raw[8 : 8 + int.from_bytes(raw[:8], "little")]


def test_open_model_reads_config_and_layers(dsv4):
    model = open_source(dsv4)
    assert model.format_name == "deepseek-v4"
    assert (model.hidden_size, model.intermediate_size, model.num_experts) == (256, 128, 3)
    assert [layer.prefix for layer in model.layers] == list(PREFIXES)
    assert model.activation().to_json() == {"kind": "swiglu", "alpha": 1.0, "beta": 0.0, "limit": 10.0}


def test_canonical_parts_are_the_raw_source_bytes(dsv4):
    model, src = open_source(dsv4), load_all(dsv4)
    layer = model.layers[1]
    sources = model.expert_sources(layer)
    assert set(sources) == {"w13_weight", "w13_scale", "w2_weight", "w2_scale"}  # no biases
    for key, projections, part in (
        ("w13_weight", ("w1", "w3"), "weight"),
        ("w13_scale", ("w1", "w3"), "scale"),
        ("w2_weight", ("w2",), "weight"),
        ("w2_scale", ("w2",), "scale"),
    ):
        source = sources[key]
        chunks = [model.checkpoint.read_experts(name, 1, 3) for name in source.names]
        for got, projection in zip(source.parts(*chunks), projections):
            expected = torch.stack([src[f"{layer.prefix}{e}.{projection}.{part}"].view(torch.uint8) for e in (1, 2)])
            assert got.dtype == torch.uint8 and torch.equal(got, expected), (key, projection)


def sglang_style_dsv4_layer(src, prefix, E):
    """SGLang's DeepSeek-V4 sm90 path: W13 = [w3; w1] per expert, uint8 views, SM90 interleave + scale fold."""
    fold = pytest.importorskip("flashinfer.fused_moe").interleave_moe_scales_for_sm90_mixed_gemm

    def stacked(projections, part):
        return torch.stack([torch.cat([src[f"{prefix}{e}.{p}.{part}"].view(torch.uint8) for p in projections]) for e in range(E)])

    return {
        "w13_weight": kernel_interleave_v2(stacked(("w3", "w1"), "weight")),
        "w13_weight_scale": fold(stacked(("w3", "w1"), "scale"), group_size=32),
        "w2_weight": kernel_interleave_v2(stacked(("w2",), "weight")),
        "w2_weight_scale": fold(stacked(("w2",), "scale"), group_size=32),
    }


@pytest.mark.oracle
def test_sm90_bake_equals_sglang_style_construction(dsv4, dsv4_baked):
    src, baked = load_all(dsv4), load_all(dsv4_baked)
    manifest = json.loads((dsv4_baked / "moebake.json").read_text())
    assert [r["prefix"] for r in manifest["layers"]] == list(PREFIXES)
    for record in manifest["layers"]:
        assert (record["hidden"], record["hidden_padded"], record["intermediate"], record["intermediate_padded"]) == (256, 256, 128, 128)
        expected = sglang_style_dsv4_layer(src, record["prefix"], DIMS["num_experts"])
        assert set(record["tensors"]) == set(expected)
        for short, tensor in expected.items():
            got = baked[record["prefix"] + short]
            assert got.dtype == torch.uint8 and got.shape == tensor.shape and torch.equal(got, tensor), short
        assert record["tensors"]["w13_weight"]["gate_up_order"] == "up_gate"
        assert record["tensors"]["w13_weight"]["source_gate_up_order"] == "separate"
    experts = {n for n in src if ".ffn.experts." in n}
    produced = {r["prefix"] + short for r in manifest["layers"] for short in r["tensors"]}
    assert set(baked) == (set(src) - experts) | produced
    for name in set(src) - experts:  # shared experts, router, attention, norms, MTP extras
        assert baked[name].dtype == src[name].dtype and torch.equal(baked[name].view(torch.uint8), src[name].view(torch.uint8)), name
    assert manifest["activation"] == {"kind": "swiglu", "alpha": 1.0, "beta": 0.0, "limit": 10.0}
    assert manifest["source"]["format"] == "deepseek-v4"


def test_deep_verify_passes_and_catches_a_flipped_expert_byte(dsv4, dsv4_baked, tmp_path):
    result = CliRunner().invoke(main, ["verify", str(dsv4_baked), "--source", str(dsv4), "--quiet"])
    assert result.exit_code == 0, result.output
    out = shutil.copytree(dsv4_baked, tmp_path / "out")
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    name = "layers.1.ffn.experts.w2_weight_scale"
    tensors = load_file(out / index[name])
    tensors[name][1, 0, 0, 0, 0] ^= 1
    save_file(tensors, out / index[name], metadata={"format": "pt"})
    from moebake.convert.source_check import inverse_problems
    from moebake.schema.manifest import read_manifest_record

    problems = inverse_problems(out, read_manifest_record(out), open_source(dsv4))
    assert len(problems) == 1 and "layers.1.ffn.experts.*.w2.scale" in problems[0] and "index [1, 0, 0]" in problems[0]


def test_sm90_v1_layout_and_scales_as_u8_also_bake(dsv4_copy, tmp_path):
    """Scales stored as U8 (the same bytes) are accepted and bake to the same output."""
    index = json.loads((dsv4_copy / "model.safetensors.index.json").read_text())["weight_map"]
    for shard in sorted(set(index.values())):
        tensors = load_file(dsv4_copy / shard)
        tensors = {n: t.view(torch.uint8) if n.endswith(".scale") and ".experts." in n else t for n, t in tensors.items()}
        save_file(tensors, dsv4_copy / shard, metadata={"format": "pt"})
    convert(dsv4_copy, tmp_path / "u8", ConvertOptions("sm90-cutlass"), progress=False)
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "u8"), "--source", str(dsv4_copy), "--quiet"]).exit_code == 0


def _rewrite(src, name, change):
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = load_file(src / index[name])
    tensors[name] = change(tensors[name])
    save_file(tensors, src / index[name], metadata={"format": "pt"})
    return src / index[name]


def _convert_fails(src, tmp_path, *expected):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(src), str(out), "--target", "sm90-cutlass", "--quiet"])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert message.startswith("error: ") and "\n" not in message, message
    for fragment in expected:
        assert fragment in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing half-written
    return message


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_refuses_scales_cast_to_float(dsv4_copy, tmp_path, dtype):
    name = "layers.1.ffn.experts.2.w3.scale"
    path = _rewrite(dsv4_copy, name, lambda s: s.to(dtype))  # numeric cast: 2**(b - 127), no longer E8M0 bytes
    _convert_fails(dsv4_copy, tmp_path, str(path), name, "cast to a float", "F8_E8M0")


def test_refuses_fp8_experts(dsv4_copy, tmp_path):
    config = json.loads((dsv4_copy / "config.json").read_text())
    config["expert_dtype"] = "fp8"
    (dsv4_copy / "config.json").write_text(json.dumps(config))
    _convert_fails(dsv4_copy, tmp_path, "config.json", "expert_dtype is 'fp8'")


def test_refuses_a_wrong_shape(dsv4_copy, tmp_path):
    name = "layers.0.ffn.experts.1.w2.weight"
    path = _rewrite(dsv4_copy, name, lambda w: w[:, :-1].contiguous())
    _convert_fails(dsv4_copy, tmp_path, str(path), name, "[256, 63]", "[256, 64]")


def test_refuses_a_missing_expert_tensor(dsv4_copy, tmp_path):
    name = "layers.1.ffn.experts.2.w3.weight"
    index_path = dsv4_copy / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = dsv4_copy / index["weight_map"].pop(name)
    tensors = load_file(shard)
    del tensors[name]
    save_file(tensors, shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index))
    _convert_fails(dsv4_copy, tmp_path, name, "missing")


def test_refuses_mixed_weight_dtypes_across_experts(dsv4_copy, tmp_path):
    name = "mtp.0.ffn.experts.2.w1.weight"
    _rewrite(dsv4_copy, name, lambda w: w.view(torch.uint8))
    _convert_fails(dsv4_copy, tmp_path, name, "expected I8")


def test_refuses_sizes_sglang_would_not_pad(tmp_path):
    src = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=2, hidden=192, intermediate=128, mtp_layers=0)
    _convert_fails(src, tmp_path, "config.json", "hidden size 192", "multiples of 128", "not padded")


def test_swiglu_limit_absent_means_no_clamp(tmp_path):
    src = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=2, mtp_layers=0, swiglu_limit=None)
    assert open_source(src).activation().limit is None
