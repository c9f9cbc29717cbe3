"""``verify`` reports each damage once: a missing or damaged index is one line, not a line for every baked tensor of
intact shards (their headers are still read, through the manifest's list of files); ``--source`` names the source in
the closing line only where the bake was compared with it."""

import shutil

import pytest
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.verify import verify_output, verify_report

INDEX = "model.safetensors.index.json"
SHARD0, SHARD1 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def baked(gpt_oss_tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("verify") / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    return out


@pytest.fixture()
def copy(baked, tmp_path):
    return shutil.copytree(baked, tmp_path / "out")


def test_a_missing_index_is_one_mismatch(copy):
    (copy / INDEX).unlink()
    assert verify_output(copy) == [f"{copy / INDEX}: listed in moebake.json but missing"]
    result = CliRunner().invoke(main, ["verify", str(copy), "--quiet"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"mismatch: {copy / INDEX}: listed in moebake.json but missing",
        f"failed: {copy}: 1 mismatch in 1 file",
    ]


def test_without_the_index_the_shards_headers_are_still_checked(copy):
    (copy / INDEX).unlink()
    report = verify_report(copy)
    assert report.shards == 2 and report.tensors == 12  # every baked tensor found, with its recorded dtype and shape


def test_a_missing_index_and_a_missing_shard_are_two_mismatches(copy):
    (copy / INDEX).unlink()
    (copy / SHARD1).unlink()
    assert verify_output(copy) == [
        f"{copy / SHARD1}: listed in moebake.json but missing",
        f"{copy / INDEX}: listed in moebake.json but missing",
    ]


def test_a_damaged_index_is_one_mismatch(copy):
    (copy / INDEX).write_text("{\n")
    problems = verify_output(copy)
    assert len(problems) == 1 and problems[0].startswith(f"{copy / INDEX}: 2 bytes, manifest says "), problems


def test_a_failed_check_before_the_source_is_not_reported_against_it(copy, gpt_oss_tiny):
    with open(copy / SHARD0, "r+b") as shard:
        shard.seek(-1, 2)
        last = shard.read(1)
        shard.seek(-1, 2)
        shard.write(bytes([last[0] ^ 1]))
    result = CliRunner().invoke(main, ["verify", str(copy), "--source", str(gpt_oss_tiny), "--quiet"])
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"mismatch: {copy / SHARD0}: ") and "mismatch (manifest" in lines[0], lines
    assert lines[1] == (f"failed: {copy}: 1 mismatch in 1 file (not compared with {gpt_oss_tiny}: the bake fails its own checks first)")
