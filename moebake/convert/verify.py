"""Integrity check of a baked output directory: manifest, checksums, index, shard headers."""

import json
from pathlib import Path

from moebake.convert.hashing import checksum_problem
from moebake.convert.manifest import MANIFEST_NAME, read_manifest
from moebake.errors import MoebakeError
from moebake.formats.checkpoint import INDEX_NAME
from moebake.formats.safetensors_file import read_header

HUB_ADDED = {".gitattributes", ".cache"}
"""What a Hub repo or ``hf download --local-dir`` adds beside the files of a downloaded output."""


def verify_output(out: str | Path) -> list[str]:
    """Problems found in ``out`` (empty when every check passes). Each problem is one line."""
    out = Path(out)
    manifest = read_manifest(out)
    problems = []
    for name, record in manifest.get("files", {}).items():
        path = out / name
        if not path.is_file():
            problems.append(f"{path}: listed in {MANIFEST_NAME} but missing")
        elif path.stat().st_size != record["bytes"]:
            problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {record['bytes']}")
        elif problem := checksum_problem(path, record):
            problems.append(problem)
    problems += _check_index(out)
    listed = set(manifest.get("files", {})) | {MANIFEST_NAME} | HUB_ADDED
    problems += [f"{p}: not listed in {MANIFEST_NAME}" for p in sorted(out.iterdir()) if p.name not in listed]
    return problems


def _check_index(out: Path) -> list[str]:
    index_path = out / INDEX_NAME
    try:
        index = json.loads(index_path.read_text())
        weight_map, total_size = index["weight_map"], index["metadata"]["total_size"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"{index_path}: unreadable index ({err})"]
    problems, payload = [], 0
    for shard_name in sorted(set(weight_map.values())):
        try:
            header = read_header(out / shard_name)
        except MoebakeError as err:
            problems.append(str(err))
            continue
        if header.metadata.get("format") != "pt":
            problems.append(f"{out / shard_name}: __metadata__ lacks \"format\": \"pt\"")
        expected = {t for t, s in weight_map.items() if s == shard_name}
        for tensor in sorted(expected - set(header.tensors)):
            problems.append(f"{index_path}: maps tensor {tensor} to {shard_name}, which does not contain it")
        for tensor in sorted(set(header.tensors) - expected):
            problems.append(f"{out / shard_name}: tensor {tensor} is not in the index")
        payload += sum(entry.nbytes for entry in header.tensors.values())
    if payload != total_size and not problems:
        problems.append(f"{index_path}: metadata.total_size is {total_size}, shards hold {payload} tensor bytes")
    return problems
