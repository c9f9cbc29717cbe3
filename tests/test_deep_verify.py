"""Deep verify (`verify --source`): the inverse check and the re-bake check, and their reports.

Corruptions are written by this test with its own safetensors header parsing; the expected
report (file, tensor, element index, values) is computed here from the corrupted position and,
for the inverse direction, from GPT-OSS's documented gate/up convention (source rows pair-
interleaved: 2i = gate_i, 2i+1 = up_i; baked halves [up; gate]).
"""

import hashlib
import json
import shutil
import struct

import numpy as np
import pytest
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.source_check import compare_with_source, inverse_problems
from moebake.formats import open_source
from moebake.formats.safetensors_file import SafetensorsFile
from moebake.schema.config_json import manifest_digest
from moebake.schema.manifest import read_manifest_record, write_manifest
from moebake.synthetic import write_gpt_oss
from tests.conftest import TINY

ELEMENT_BYTES = {"U8": 1, "BF16": 2, "F32": 4}
LAYER1 = "model.layers.1.mlp.experts."
SHARD1 = "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def baked(gpt_oss_tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("deep") / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass", chunk_bytes=1 << 16), progress=False)
    return out


@pytest.fixture()
def damaged(baked, tmp_path):
    return shutil.copytree(baked, tmp_path / "out")


def flip(path, tensor, index, mask=0x01, byte_in_element=0):
    """XOR ``mask`` into one byte of element ``index`` of ``tensor`` in safetensors file ``path``."""
    raw = bytearray(path.read_bytes())
    (header_len,) = struct.unpack("<Q", raw[:8])
    spec = json.loads(raw[8 : 8 + header_len])[tensor]
    size = ELEMENT_BYTES[spec["dtype"]]
    flat = int(np.ravel_multi_index(index, spec["shape"]))
    position = 8 + header_len + spec["data_offsets"][0] + flat * size + byte_in_element
    raw[position] ^= mask
    path.write_bytes(bytes(raw))
    return raw[position]


def rehash(out, name):
    """Record ``name``'s new checksum in the manifest (and the manifest's digest in config.json), as a
    consistently wrong bake would have."""
    manifest = json.loads((out / "moebake.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256((out / name).read_bytes()).hexdigest(), "bytes": (out / name).stat().st_size}
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["manifest_sha256"] = manifest_digest(manifest)
    (out / "config.json").write_text(json.dumps(config))
    manifest["files"]["config.json"] = {
        "sha256": hashlib.sha256((out / "config.json").read_bytes()).hexdigest(),
        "bytes": (out / "config.json").stat().st_size,
    }
    write_manifest(out, manifest)  # as a consistently wrong moebake would


def test_a_clean_output_is_bit_exact_both_ways(baked, gpt_oss_tiny):
    assert compare_with_source(baked, gpt_oss_tiny) == []


def test_a_flipped_padding_byte_is_caught_by_the_rebake_only(damaged, gpt_oss_tiny):
    # w2_weight is [E, H_pad=256, I_pad/2]; the SM90 interleave keeps rows within groups of 16,
    # so row 200 (>= H=160) holds padding only.
    flip(damaged / SHARD1, LAYER1 + "w2_weight", (1, 200, 5))
    assert inverse_problems(damaged, read_manifest_record(damaged), open_source(gpt_oss_tiny)) == []
    assert compare_with_source(damaged, gpt_oss_tiny) == [
        f"{damaged / SHARD1}: tensor {LAYER1}w2_weight: first difference at index [1, 200, 5] "
        "(0x01 != 0x00) (stored != re-baked from source); 1 of 49152 bytes differ"
    ]


def test_a_flipped_bias_is_reported_in_both_index_spaces(damaged, gpt_oss_tiny):
    e, j = 2, 5  # baked w13_weight_bias[e, j] with j < I is up_j = source gate_up_proj_bias[e, 2j + 1]
    flip(damaged / SHARD1, LAYER1 + "w13_weight_bias", (e, j), mask=0x80, byte_in_element=1)
    problems = compare_with_source(damaged, gpt_oss_tiny)
    assert len(problems) == 2
    inverse, rebake = problems
    assert inverse.startswith(
        f"{damaged / SHARD1}: {LAYER1}w13_weight_bias inverted to {LAYER1}gate_up_proj_bias: "
        f"first difference at index [{e}, {2 * j + 1}] (0x"
    )
    assert f"(restored != source {gpt_oss_tiny / SHARD1})" in inverse
    assert rebake.startswith(f"{damaged / SHARD1}: tensor {LAYER1}w13_weight_bias: first difference at index [{e}, {j}] (0x")
    stored, original = rebake.split("(0x")[1].split(")")[0].split(" != 0x")
    assert int(stored, 16) ^ int(original, 16) == 0x8000  # the sign bit of that BF16 element


def test_a_flipped_pass_through_byte_is_caught(damaged, gpt_oss_tiny):
    name = "model.layers.0.self_attn.q_proj.weight"
    flip(damaged / "model-00001-of-00002.safetensors", name, (7, 9), byte_in_element=1)
    (problem,) = compare_with_source(damaged, gpt_oss_tiny)
    assert problem.startswith(f"{damaged / 'model-00001-of-00002.safetensors'}: tensor {name}: first difference at index [7, 9]")


def test_another_source_fails_every_expert_tensor(baked, tmp_path):
    other = write_gpt_oss(tmp_path / "other", **TINY, seed=1)
    problems = compare_with_source(baked, other)
    for layer in (0, 1):
        for short in ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias", "down_proj_blocks"):
            assert any(f"inverted to model.layers.{layer}.mlp.experts.{short}:" in p for p in problems)
        for short in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_bias"):
            assert any(f"tensor model.layers.{layer}.mlp.experts.{short}: first difference" in p for p in problems)


def test_a_source_with_fewer_layers_is_reported_as_another_model(baked, tmp_path):
    other = write_gpt_oss(tmp_path / "one-layer", **{**TINY, "num_layers": 1})
    assert compare_with_source(baked, other) == [
        f"{baked / 'moebake.json'}: the source is not the checkpoint this was baked from: MoE layers "
        "['model.layers.0.mlp.experts.', 'model.layers.1.mlp.experts.'], the source has ['model.layers.0.mlp.experts.']"
    ]


def test_a_source_with_more_experts_is_reported_by_field(baked, tmp_path):
    other = write_gpt_oss(tmp_path / "four-experts", **{**TINY, "num_experts": 4})
    problems = compare_with_source(baked, other)
    where = f"{baked / 'moebake.json'}: the source is not the checkpoint this was baked from: layer {LAYER1}"
    assert f"{where} experts is 3, the source gives 4" in problems
    assert f"{where} tensors.w13_weight.shape is [3, 256, 128], the source gives [4, 256, 128]" in problems
    assert len(problems) == 4  # two fields in each of the two layers, and no byte comparisons


def test_a_stale_layout_version_cannot_be_rederived(damaged, gpt_oss_tiny):
    manifest = json.loads((damaged / "moebake.json").read_text())
    manifest["target_layout_version"] = 0
    write_manifest(damaged, manifest)
    assert any("layout version 0" in p and "cannot re-derive" in p for p in compare_with_source(damaged, gpt_oss_tiny))


def test_cli_verify_source_catches_what_checksums_cannot(damaged, gpt_oss_tiny):
    flip(damaged / SHARD1, LAYER1 + "w2_weight_bias", (0, 180))  # padding: H = 160
    rehash(damaged, SHARD1)
    assert CliRunner().invoke(main, ["verify", str(damaged)]).exit_code == 0
    result = CliRunner().invoke(main, ["verify", str(damaged), "--source", str(gpt_oss_tiny), "--quiet"])
    assert result.exit_code == 1
    assert f"mismatch: {damaged / SHARD1}: tensor {LAYER1}w2_weight_bias: first difference at index [0, 180]" in result.output


def test_deep_verify_reads_in_bounded_chunks(tmp_path, monkeypatch):
    source = write_gpt_oss(tmp_path / "many", num_layers=1, num_experts=40, hidden=64, intermediate=64, vocab=32)
    out = tmp_path / "out"
    convert(source, out, ConvertOptions("sm90-cutlass", chunk_bytes=1 << 16), progress=False)
    sizes, original = [], SafetensorsFile.read_bytes

    def recording(self, entry, start=0, stop=None):
        chunk = original(self, entry, start, stop)
        sizes.append(len(chunk))
        return chunk

    monkeypatch.setattr(SafetensorsFile, "read_bytes", recording)
    assert compare_with_source(out, source) == []
    experts_per_chunk = (1 << 16) // (2 * 64 * 64 // 2)  # source gate_up_proj_blocks rows per 64 KiB
    baked_row = 2 * 128 * 256 // 2  # one expert of w13_weight: H padded 64 -> 256 (SGLang profile), I 64 -> 128
    assert max(sizes) <= experts_per_chunk * baked_row < 40 * baked_row


def test_every_phase_shows_a_bar_and_a_line_per_step(baked, gpt_oss_tiny, monkeypatch):
    import logging

    import moebake.progress_bars

    bars = []

    class Recording(moebake.progress_bars.ByteBar):
        def __init__(self, *args, **kwargs):
            bars.append(kwargs["desc"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(moebake.progress_bars, "ByteBar", Recording)
    result = CliRunner().invoke(main, ["-v", "verify", str(baked), "--source", str(gpt_oss_tiny)])
    logging.getLogger("moebake").setLevel(logging.INFO)
    assert result.exit_code == 0, result.output
    assert bars == ["verifying", "inverting baked experts", "re-baking from source"]
    lines = result.output.splitlines()
    assert [line for line in lines if line.startswith("debug: inverted")] == [
        f"debug: inverted and compared layer {i + 1}/2: model.layers.{i}.mlp.experts. (159.7 kB)" for i in range(2)
    ]
    assert sum(line.startswith("debug: re-baked and compared shard") for line in lines) == 2
    assert sum(line.startswith("debug: checked file") for line in lines) == 6
    assert lines[-1].startswith(f"ok: {baked} (") and lines[-1].endswith(
        f"; bit-exact against {gpt_oss_tiny}: experts invert to it, and re-baking it reproduces every byte)"
    )


def test_a_bake_that_rescaled_gate_up_scales_is_not_called_bit_exact(tmp_path):
    from moebake.reference.synthetic_sources import write_modelopt_nvfp4

    source = write_modelopt_nvfp4(tmp_path / "nvfp4")  # gate/up globals differ in 4 of 8 experts
    for globals_, expected in (
        (
            "share",
            f"; against {source}: re-baking it reproduces every byte, and the experts invert to it except, by design "
            "(--gate-up-globals share), the gate/up block scales of 4 of 8 experts, which invert to its values "
            "rescaled to one shared global (largest relative change 75.00%); those are not bit-exact to the "
            "source (--gate-up-globals keep bakes its bytes))\n",
        ),
        ("keep", f"; bit-exact against {source}: experts invert to it, and re-baking it reproduces every byte)\n"),
    ):
        out = tmp_path / globals_
        converted = CliRunner().invoke(
            main, ["convert", str(source), str(out), "--target", "cutedsl", "--quiet", "--gate-up-globals", globals_]
        )
        assert converted.exit_code == 0, converted.output
        assert ("NOT engine-exact" in converted.output) == (globals_ == "share")
        result = CliRunner().invoke(main, ["verify", str(out), "--source", str(source), "--quiet"])
        assert result.exit_code == 0 and result.output.startswith(f"ok: {out} (") and result.output.endswith(expected), result.output
        assert ("bit-exact against" in result.output) == (globals_ == "keep")


def test_mismatches_stop_at_ten_lines_then_a_count_and_a_summary(baked, tmp_path):
    other = write_gpt_oss(tmp_path / "other", **TINY, seed=1)
    problems = compare_with_source(baked, other)
    assert len(problems) > 12
    result = CliRunner().invoke(main, ["verify", str(baked), "--source", str(other), "--quiet"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[:10] == [f"mismatch: {problem}" for problem in problems[:10]]
    files = len({problem.split(": ", 1)[0] for problem in problems})
    assert lines[10:] == [
        f"mismatch: ... and {len(problems) - 10} more (--json lists them all)",
        f"failed: {baked}: {len(problems)} mismatches in {files} files against {other}",
    ]
    report = json.loads(CliRunner().invoke(main, ["verify", str(baked), "--source", str(other), "--json"]).output)
    assert report["problems"] == problems


def test_a_differing_tensor_is_one_line_with_its_count(damaged, gpt_oss_tiny):
    for index in ((0, 170, 1), (2, 250, 63)):  # padding rows (H = 160) of w2_weight [3, 256, 64]
        flip(damaged / SHARD1, LAYER1 + "w2_weight", index)
    assert compare_with_source(damaged, gpt_oss_tiny) == [
        f"{damaged / SHARD1}: tensor {LAYER1}w2_weight: first difference at index [0, 170, 1] "
        "(0x01 != 0x00) (stored != re-baked from source); 2 of 49152 bytes differ"
    ]


def test_a_source_of_another_supported_format_is_named_as_such(baked, tmp_path):
    from moebake.reference.synthetic_sources import write_deepseek_v4

    dsv4 = write_deepseek_v4(tmp_path / "dsv4")
    result = CliRunner().invoke(main, ["verify", str(baked), "--source", str(dsv4), "--quiet"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        f"mismatch: {baked / 'moebake.json'}: the source is not the checkpoint this was baked from: source.format is "
        f"'gpt-oss', {dsv4} is a deepseek-v4 checkpoint",
        f"failed: {baked}: 1 mismatch in 1 file against {dsv4}",
    ]
    out = tmp_path / "dsv4-baked"  # and DeepSeek-V4 is a source verify proves a bake against
    assert CliRunner().invoke(main, ["convert", str(dsv4), str(out), "--target", "sm90-cutlass", "--quiet"]).exit_code == 0
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(dsv4), "--quiet"])
    assert result.exit_code == 0 and result.output.endswith(
        f"; bit-exact against {dsv4}: experts invert to it, and re-baking it reproduces every byte)\n"
    ), result.output


def test_unsupported_model_lines_list_every_supported_format(gpt_oss_copy, tmp_path):
    from moebake.formats import open_source

    config = json.loads((gpt_oss_copy / "config.json").read_text())
    config.update(model_type="llama", quantization_config=None)
    (gpt_oss_copy / "config.json").write_text(json.dumps(config))
    needed = f'{gpt_oss_copy / "config.json"}: unsupported model (model_type="llama", quant_method=null); '
    with pytest.raises(Exception) as refused:
        open_source(gpt_oss_copy)
    assert str(refused.value) == needed + "supported: gpt-oss, modelopt-nvfp4, deepseek-v4, bf16-moe"
    with pytest.raises(Exception) as refused:
        open_source(gpt_oss_copy, ("gpt-oss",))
    assert str(refused.value) == needed + "supported here: gpt-oss (moebake reads gpt-oss, modelopt-nvfp4, deepseek-v4, bf16-moe)"
    result = CliRunner().invoke(main, ["convert", str(gpt_oss_copy), str(tmp_path / "out"), "--target", "sm90-cutlass"])
    assert result.exit_code == 2 and result.output.startswith(f"error: {needed}") and "deepseek-v4" in result.output, result.output
