"""Manifest checksums: named by algorithm (xxh3-128 now, sha256 before), read back either way; Hub-cache
blobs are not hashed again (their name is their SHA-256)."""

import hashlib
import json
import os

import pytest
import xxhash
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert import conversion
from moebake.convert.hashing import hub_blob_sha256
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.verify import verify_output
from moebake.schema.checksums import CHECKSUM, parse_tagged, record_checksum, tagged
from moebake.schema.manifest import write_manifest

SHARD = "model-00002-of-00002.safetensors"


def test_new_manifests_name_xxh3_128(gpt_oss_tiny, tmp_path):
    manifest = convert(gpt_oss_tiny, tmp_path / "out", ConvertOptions("sm90-cutlass"), progress=False).to_json()
    assert CHECKSUM == "xxh3-128"
    for name, record in manifest["files"].items():
        assert record_checksum(record) == ("xxh3-128", xxhash.xxh3_128((tmp_path / "out" / name).read_bytes()).hexdigest())
    for name, value in manifest["source"]["files"].items():
        assert value == "xxh3-128:" + xxhash.xxh3_128((gpt_oss_tiny / name).read_bytes()).hexdigest(), name


def as_old_manifest(out):
    """Rewrite ``out``'s manifest the way moebake wrote it before checksums were named: bare SHA-256s."""
    path = out / "moebake.json"
    manifest = json.loads(path.read_text())
    manifest["files"] = {
        name: {"sha256": hashlib.sha256((out / name).read_bytes()).hexdigest(), "bytes": record["bytes"]}
        for name, record in manifest["files"].items()
    }
    manifest["source"]["files"] = {name: "0" * 64 for name in manifest["source"]["files"]}
    del manifest["manifest_sha256"]  # nor did manifests protect themselves then
    del manifest["engine"]  # nor name an engine profile (their config.json was the source's)
    path.write_text(json.dumps(manifest, indent=2))


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))


def test_verify_reads_old_sha256_manifests(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    as_old_manifest(out)
    assert verify_output(out) == []
    flip_a_byte(out / SHARD)
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1 and f"{SHARD}: sha256 mismatch" in result.output


def test_a_record_without_a_known_checksum_is_a_problem(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    manifest = json.loads((out / "moebake.json").read_text())
    manifest["files"][SHARD] = {"md5": "0" * 32, "bytes": manifest["files"][SHARD]["bytes"]}
    write_manifest(out, manifest)  # as a moebake writing an unknown algorithm would
    assert [p for p in verify_output(out) if SHARD in p] == [
        f"{out / SHARD}: no checksum of a known algorithm (xxh3-128, sha256) in ['bytes', 'md5']"
    ]


def test_tagged_checksums_round_trip_and_bare_hex_is_sha256():
    assert parse_tagged(tagged("xxh3-128", "ab" * 16)) == ("xxh3-128", "ab" * 16)
    assert parse_tagged("cd" * 32) == ("sha256", "cd" * 32)


def hub_cache_snapshot(source, cache):
    """``source``'s files laid out as a Hugging Face cache repo: ``blobs/<id>`` and
    ``snapshots/<rev>/<name>`` symlinks; ``*.safetensors`` blobs are named by their SHA-256 (LFS),
    others by a git SHA-1 (40 hex)."""
    repo = cache / "models--acme--tiny"
    snapshot = repo / "snapshots" / ("1" * 40)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        data = path.read_bytes()
        if path.suffix == ".safetensors":
            blob = hashlib.sha256(data).hexdigest()
        else:
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        os.symlink(f"../../blobs/{blob}", snapshot / path.name)
    return snapshot


def test_hub_cache_blobs_are_not_hashed_again(gpt_oss_tiny, tmp_path, monkeypatch):
    snapshot = hub_cache_snapshot(gpt_oss_tiny, tmp_path / "hub")

    def no_stream_hash(*args, **kwargs):
        raise AssertionError("a Hub-cache blob was hashed")

    monkeypatch.setattr(conversion, "StreamHash", no_stream_hash)
    manifest = convert(snapshot, tmp_path / "out", ConvertOptions("sm90-cutlass"), progress=False).to_json()
    for name, value in manifest["source"]["files"].items():
        data = (gpt_oss_tiny / name).read_bytes()
        if name.endswith(".safetensors"):
            assert value == "sha256:" + hashlib.sha256(data).hexdigest(), name
        else:  # git-stored files are named by a SHA-1: hashed
            assert value == "xxh3-128:" + xxhash.xxh3_128(data).hexdigest(), name
    assert manifest["source"]["revision"] == "1" * 40


def test_only_the_cache_structure_is_trusted(gpt_oss_tiny, tmp_path):
    snapshot = hub_cache_snapshot(gpt_oss_tiny, tmp_path / "hub")
    shard = next(snapshot.glob("*.safetensors"))
    assert hub_blob_sha256(shard) == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert hub_blob_sha256(os.path.realpath(shard)) is None  # the blob itself: not a snapshot symlink
    elsewhere = tmp_path / "elsewhere" / "snapshots" / "rev"
    elsewhere.mkdir(parents=True)
    os.symlink(os.path.realpath(shard), elsewhere / shard.name)  # a symlink into another repo's blobs
    assert hub_blob_sha256(elsewhere / shard.name) is None
    plain = tmp_path / "plain"
    plain.mkdir()
    os.symlink(os.path.realpath(shard), plain / shard.name)  # not under snapshots/<rev>/
    assert hub_blob_sha256(plain / shard.name) is None


@pytest.mark.parametrize("algorithm", ["xxh3-128", "sha256"])
def test_verify_catches_a_changed_byte_under_either_algorithm(gpt_oss_tiny, tmp_path, algorithm):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    if algorithm == "sha256":
        as_old_manifest(out)
    flip_a_byte(out / SHARD)
    assert any(f"{SHARD}: {algorithm} mismatch" in p for p in verify_output(out))
