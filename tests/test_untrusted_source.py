"""Untrusted sources, what is accepted: real ModelOpt MIXED_PRECISION releases, every safetensors dtype
as pass-through bytes, an index that leaves out a tensor (carried through), a source side file named
like one moebake writes (skipped), strict JSON in the manifest. (What is refused: tests/fuzz.)"""

import json
import logging
import math
import struct

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from conftest import load_all
from moebake.cli import main
from moebake.formats import open_source
from moebake.formats.safetensors_file import DTYPES, encode_header
from moebake.reference.synthetic_sources import write_modelopt_nvfp4
from moebake.schema.config_values import ConfigValues
from moebake.schema.manifest import MANIFEST_NAME

INDEX = "model.safetensors.index.json"


def convert(source, out, target, *extra):
    result = CliRunner().invoke(main, ["convert", str(source), str(out), "--target", target, "--quiet", *extra])
    assert result.exit_code == 0, result.output
    return result


def verify_against(out, source):
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(source), "--quiet"])
    assert result.exit_code == 0 and "ok:" in result.output, result.output


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return write_modelopt_nvfp4(tmp_path_factory.mktemp("mixed") / "src", mixed_precision=True)


@pytest.mark.parametrize("quant_config", ["config", "hf_quant_config"])
def test_mixed_precision_release_reads_nvfp4_experts(tmp_path, quant_config):
    model = open_source(write_modelopt_nvfp4(tmp_path / "src", mixed_precision=True, quant_config=quant_config))
    assert model.format_name == "modelopt-nvfp4" and model.expert_algo == "NVFP4" and not model.weight_only
    assert [layer.prefix for layer in model.layers] == ["model.layers.1.mlp.experts.", "model.layers.2.mlp.experts."]
    assert model.excluded_layers == ("model.layers.3.mlp.experts.",)  # the MTP layer is not in quantized_layers


@pytest.mark.parametrize("target", ["cutedsl", "cutedsl-deepep", "deepep-bf16"])
def test_mixed_precision_release_converts_bit_exact(mixed, tmp_path, target):
    convert(mixed, tmp_path / "out", target)
    verify_against(tmp_path / "out", mixed)
    baked, source = load_all(tmp_path / "out"), load_all(mixed)
    fp8 = "model.layers.1.self_attn.q_proj.weight"  # FP8 attention passes through untouched
    assert baked[fp8].dtype == torch.float8_e4m3fn and torch.equal(baked[fp8].view(torch.uint8), source[fp8].view(torch.uint8))


def test_weight_only_experts_are_refused_by_cutedsl_with_the_reason(tmp_path):
    source = write_modelopt_nvfp4(tmp_path / "src", mixed_precision=True, expert_algo="W4A16_NVFP4")
    assert open_source(source).weight_only
    for target in ("cutedsl", "cutedsl-deepep"):
        result = CliRunner().invoke(main, ["convert", str(source), str(tmp_path / "out"), "--target", target, "--quiet"])
        assert result.exit_code == 2 and "W4A16_NVFP4" in result.output and "input_scale" in result.output, result.output
        assert "MIXED_PRECISION is not supported" not in result.output
    convert(source, tmp_path / "bf16", "deepep-bf16")  # its BF16 MTP layer still bakes


def test_mixed_precision_fp8_experts_are_refused_naming_the_module(tmp_path):
    source = write_modelopt_nvfp4(tmp_path / "src", mixed_precision=True)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"]["quantized_layers"]["model.layers.2.mlp.experts.1.up_proj"] = {"quant_algo": "FP8"}
    (source / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["convert", str(source), str(tmp_path / "out"), "--target", "cutedsl", "--quiet"])
    assert result.exit_code == 2 and "model.layers.2.mlp.experts.1.up_proj" in result.output and "FP8" in result.output


EXTRA_DTYPES = ["F8_E4M3FNUZ", "F8_E5M2FNUZ", "F6_E2M3", "F6_E3M2", "F4", "C64", "U16", "U32", "U64", "BOOL", "F8_E8M0"]


def test_every_safetensors_dtype_passes_through_as_bytes(gpt_oss_copy, tmp_path):
    """A shard holding one tensor of each dtype (written by moebake's own header encoder) bakes to the
    same bytes, and safetensors itself opens the output."""
    shard = gpt_oss_copy / "model-00002-of-00002.safetensors"
    extra = [(f"extra.{dtype.lower()}", dtype, (4, 8)) for dtype in EXTRA_DTYPES]
    header, offsets = encode_header(extra, {"format": "pt"})
    sizes = [DTYPES[d][1] * 32 // 8 for _, d, _ in extra]
    payload = bytes(range(256)) * 2
    data = b"".join(payload[o % 200 : o % 200 + n] for o, n in zip(offsets, sizes))
    (gpt_oss_copy / "model-extra.safetensors").write_bytes(header + data)
    index = json.loads((gpt_oss_copy / INDEX).read_text())
    index["weight_map"].update({name: "model-extra.safetensors" for name, _, _ in extra})
    (gpt_oss_copy / INDEX).write_text(json.dumps(index))
    out = tmp_path / "out"
    convert(gpt_oss_copy, out, "sm90-cutlass")
    assert (out / "model-extra.safetensors").read_bytes()[len(header) :] == data
    assert shard.exists()
    with safe_open(out / "model-extra.safetensors", framework="numpy") as f:
        assert sorted(f.keys()) == sorted(name for name, _, _ in extra)
    verify_against(out, gpt_oss_copy)


def test_a_tensor_left_out_of_the_index_is_carried_through(gpt_oss_copy, tmp_path, caplog):
    index = json.loads((gpt_oss_copy / INDEX).read_text())
    del index["weight_map"]["lm_head.weight"]
    (gpt_oss_copy / INDEX).write_text(json.dumps(index))
    with caplog.at_level(logging.WARNING):
        convert(gpt_oss_copy, tmp_path / "out", "sm90-cutlass")
    assert any("lm_head.weight" in r.getMessage() and "carried through" in r.getMessage() for r in caplog.records)
    baked = json.loads((tmp_path / "out" / INDEX).read_text())["weight_map"]
    assert baked["lm_head.weight"] == "model-00002-of-00002.safetensors"
    assert torch.equal(load_all(tmp_path / "out")["lm_head.weight"], load_all(gpt_oss_copy)["lm_head.weight"])


def test_a_tensor_stored_in_two_shards_is_refused(gpt_oss_copy, tmp_path):
    from safetensors.torch import load_file, save_file

    first, second = (gpt_oss_copy / f"model-0000{i}-of-00002.safetensors" for i in (1, 2))
    tensors = load_file(second)
    tensors["model.embed_tokens.weight"] = load_file(first)["model.embed_tokens.weight"]
    save_file(tensors, second, metadata={"format": "pt"})
    result = CliRunner().invoke(main, ["convert", str(gpt_oss_copy), str(tmp_path / "out"), "--target", "sm90-cutlass"])
    assert result.exit_code == 2 and "model.embed_tokens.weight is stored twice" in result.output


def test_a_side_file_named_moebake_json_is_not_copied(gpt_oss_copy, tmp_path, caplog):
    (gpt_oss_copy / MANIFEST_NAME).write_text('{"schema": "someone else\'s"}')
    with caplog.at_level(logging.WARNING):
        convert(gpt_oss_copy, tmp_path / "out", "sm90-cutlass")
    assert any(MANIFEST_NAME in r.getMessage() and "not copied" in r.getMessage() for r in caplog.records)
    assert json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["schema"] == "moebake.manifest/1"
    result = CliRunner().invoke(main, ["verify", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output


def test_manifest_is_strict_json(gpt_oss_tiny, tmp_path):
    convert(gpt_oss_tiny, tmp_path / "out", "sm90-cutlass")

    def refuse(constant):
        raise ValueError(constant)

    manifest = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text(), parse_constant=refuse)
    assert math.isfinite(manifest["activation"]["limit"])


def test_integral_floats_are_integers_and_bools_are_not():
    values = ConfigValues({"a": 4096.0, "b": True, "c": 1e999, "d": 2.5}, "config.json")
    assert values.integer("a") == 4096 and type(values.integer("a")) is int
    for key, needle in (("b", "is true"), ("c", "is Infinity"), ("d", "is 2.5")):
        with pytest.raises(Exception, match=f"config.json: {key} {needle}, expected a positive integer"):
            values.integer(key)
    with pytest.raises(Exception, match="config.json: c is Infinity, expected a finite number"):
        values.number("c")


def test_header_refusals_match_safetensors(tmp_path):
    """What moebake refuses in a header, safetensors refuses too (one validation path, the same rules)."""
    from safetensors import SafetensorError

    from moebake.errors import MoebakeError
    from moebake.formats.safetensors_file import read_header

    for shape, offsets in (([-2, -2], [0, 4]), ([2.0, 2], [0, 4]), ([2, 2], ["0", "4"]), ([2, 2], [0.0, 4.0])):
        body = json.dumps({"t": {"dtype": "U8", "shape": shape, "data_offsets": offsets}}).encode()
        body += b" " * (-len(body) % 8)
        path = tmp_path / "t.safetensors"
        path.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * 4)
        with pytest.raises(MoebakeError):
            read_header(path)
        with pytest.raises(SafetensorError):
            safe_open(path, framework="numpy").keys()


def test_too_large_integer_is_out_of_range_not_negative(gpt_oss_copy, tmp_path):
    values = ConfigValues({"intermediate_size": 10**12, "hidden_size": 0}, "config.json")
    with pytest.raises(Exception, match=r"^config\.json: intermediate_size is 1000000000000, out of range \(at most 2147483647\)$"):
        values.integer("intermediate_size")
    with pytest.raises(Exception, match=r"^config\.json: hidden_size is 0, expected a positive integer$"):
        values.integer("hidden_size")
    config = json.loads((gpt_oss_copy / "config.json").read_text())
    config["intermediate_size"] = 10**12
    (gpt_oss_copy / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["convert", str(gpt_oss_copy), str(tmp_path / "out"), "--target", "sm90-cutlass", "--quiet"])
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
    expected = "intermediate_size is 1000000000000, out of range (at most 2147483647)"
    assert result.output == f"error: {gpt_oss_copy / 'config.json'}: {expected}\n"
