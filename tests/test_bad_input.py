"""Every bad input ends with exit 2, one line `error: ...` naming the file or tensor, and nothing written."""

import json
import struct

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from moebake.cli import main

SHARD0 = "model-00001-of-00002.safetensors"
SHARD1 = "model-00002-of-00002.safetensors"


def run_convert(source, out, *extra):
    return CliRunner().invoke(main, ["convert", str(source), str(out), "--target", "sm90-cutlass", "--quiet", *extra])


def assert_clean_failure(result, out, *needles):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in result.output
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.*"))


def edit_json(path, edit):
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def test_not_a_directory(tmp_path):
    assert_clean_failure(run_convert(tmp_path / "nope", tmp_path / "out"), tmp_path / "out", "nope", "not a checkpoint")


def test_directory_without_config(tmp_path):
    (tmp_path / "src").mkdir()
    assert_clean_failure(run_convert(tmp_path / "src", tmp_path / "out"), tmp_path / "out", "no config.json")


def test_config_without_weights(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text("{}")
    assert_clean_failure(run_convert(tmp_path / "src", tmp_path / "out"), tmp_path / "out", "no model.safetensors")


def test_missing_shard(gpt_oss_copy, tmp_path):
    (gpt_oss_copy / SHARD1).unlink()
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", SHARD1, "missing")


def test_truncated_shard(gpt_oss_copy, tmp_path):
    data = (gpt_oss_copy / SHARD0).read_bytes()
    (gpt_oss_copy / SHARD0).write_bytes(data[:-1000])
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", SHARD0, "truncated")


def test_corrupt_header_json(gpt_oss_copy, tmp_path):
    data = bytearray((gpt_oss_copy / SHARD0).read_bytes())
    data[8:12] = b"\xff\xfe{["
    (gpt_oss_copy / SHARD0).write_bytes(bytes(data))
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", SHARD0, "corrupt safetensors header")


def test_header_length_beyond_file(gpt_oss_copy, tmp_path):
    data = bytearray((gpt_oss_copy / SHARD0).read_bytes())
    data[:8] = struct.pack("<Q", len(data) * 2)
    (gpt_oss_copy / SHARD0).write_bytes(bytes(data))
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", SHARD0, "corrupt safetensors header")


def test_tiny_file_is_not_safetensors(gpt_oss_copy, tmp_path):
    (gpt_oss_copy / SHARD0).write_bytes(b"abc")
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", SHARD0, "not a safetensors file")


def test_index_names_missing_file(gpt_oss_copy, tmp_path):
    edit_json(
        gpt_oss_copy / "model.safetensors.index.json",
        lambda index: index["weight_map"].update({"lm_head.weight": "model-00010-of-00010.safetensors"}),
    )
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", "model-00010-of-00010.safetensors", "missing")


def test_index_names_tensor_not_in_shard(gpt_oss_copy, tmp_path):
    edit_json(gpt_oss_copy / "model.safetensors.index.json", lambda index: index["weight_map"].update({"lm_head.weight": SHARD0}))
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", "lm_head.weight", SHARD0)


def test_unsupported_model(gpt_oss_copy, tmp_path):
    edit_json(gpt_oss_copy / "config.json", lambda c: c.update(model_type="llama", quantization_config=None))
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", "config.json", "unsupported model", "llama")


def test_unsupported_quantization(gpt_oss_copy, tmp_path):
    edit_json(gpt_oss_copy / "config.json", lambda c: c["quantization_config"].update(quant_method="fp8"))
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", "config.json", "fp8")


def test_shape_not_matching_config(gpt_oss_copy, tmp_path):
    edit_json(gpt_oss_copy / "config.json", lambda c: c.update(hidden_size=192))
    assert_clean_failure(
        run_convert(gpt_oss_copy, tmp_path / "out"),
        tmp_path / "out",
        "model.layers.0.mlp.experts.gate_up_proj_blocks",
        "expected U8 [3, 192, 6, 16]",
    )


def test_dtype_not_matching(gpt_oss_copy, tmp_path):
    tensors = load_file(gpt_oss_copy / SHARD0)
    name = "model.layers.0.mlp.experts.gate_up_proj_scales"
    tensors[name] = tensors[name].to(torch.float32)
    save_file(tensors, gpt_oss_copy / SHARD0, metadata={"format": "pt"})
    assert_clean_failure(run_convert(gpt_oss_copy, tmp_path / "out"), tmp_path / "out", name, "F32", "expected U8")


def test_out_exists(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = run_convert(gpt_oss_tiny, out)
    assert result.exit_code == 2 and "already exists" in result.output and "--overwrite" in result.output
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "option, value, needle",
    [
        ("--hidden-multiple", "100", "multiple of 128"),
        ("--intermediate-multiple", "0", "multiple of 128"),
    ],
)
def test_bad_options(gpt_oss_tiny, tmp_path, option, value, needle):
    assert_clean_failure(run_convert(gpt_oss_tiny, tmp_path / "out", option, value), tmp_path / "out", needle)


def test_verify_on_non_output(tmp_path):
    result = CliRunner().invoke(main, ["verify", str(tmp_path)])
    assert result.exit_code == 2 and "no moebake.json" in result.output


def test_verify_refuses_unknown_schema(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    assert run_convert(gpt_oss_tiny, out).exit_code == 0
    edit_json(out / "moebake.json", lambda m: m.update(schema="moebake.manifest/99"))
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 2 and "unknown manifest schema" in result.output
