"""Run a conversion: plan, stream every shard into a staging directory, then publish it atomically.

OUT is built in the sibling ``.OUT.partial`` and renamed into place only when complete. Bad input
is detected while planning, before anything is written; a MoebakeError removes the staging
directory. After an interruption the staging directory stays, and ``resume=True`` re-uses every
shard whose recorded SHA-256 still matches, when the source and options are unchanged.
"""

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from tqdm import tqdm

import moebake
from moebake.convert.hashing import file_sha256, hash_files_in_background
from moebake.convert.manifest import MANIFEST_NAME, SCHEMA, utc_now, write_manifest
from moebake.convert.options import ConvertOptions
from moebake.convert.plan import assign_shards
from moebake.convert.targets import get_target
from moebake.convert.writer import write_shard
from moebake.errors import MoebakeError
from moebake.formats import open_source
from moebake.formats.checkpoint import INDEX_NAME
from moebake.layouts.flashinfer_versions import DESCRIPTIONS

PROGRESS_NAME = ".moebake-progress.json"
_HF_SNAPSHOT_RE = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")


def staging_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.partial"


def check_out_free(out: Path, overwrite: bool) -> None:
    """MoebakeError if ``out`` exists and may not be replaced."""
    if out.exists() and not overwrite:
        raise MoebakeError(f"{out}: already exists (pass --overwrite to replace it)")


def convert(
    source: str | os.PathLike,
    out: str | os.PathLike,
    options: ConvertOptions,
    *,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    source_location: str | None = None,
    source_revision: str | None = None,
) -> dict:
    """Convert checkpoint ``source`` into ``out``; returns the manifest written to ``out/moebake.json``."""
    out = Path(out)
    check_out_free(out, overwrite)
    target = get_target(options.target)
    model = open_source(source, getattr(target, "SOURCE_FORMATS", None))
    checkpoint = model.checkpoint
    converted, layers = target.plan(model, options)
    shards = assign_shards(checkpoint, converted, options.chunk_bytes)

    staging = staging_dir(out)
    fingerprint = _fingerprint(checkpoint, options)
    done = _resumable_shards(staging, fingerprint) if resume else {}
    if not done and staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    source_files = {name: checkpoint.root / name for name in (*checkpoint.shards, *checkpoint.side_files)}
    if (checkpoint.root / INDEX_NAME).is_file():
        source_files[INDEX_NAME] = checkpoint.root / INDEX_NAME
    source_hashes = hash_files_in_background(source_files)
    try:
        with tqdm(total=sum(s.nbytes for s in shards), unit="B", unit_scale=True, unit_divisor=1024,
                  desc=f"baking {options.target}", disable=not progress) as bar:
            for shard in shards:
                if shard.file_name in done:
                    bar.update(shard.nbytes)
                    continue
                done[shard.file_name] = write_shard(shard, staging / shard.file_name, bar.update)
                _save_progress(staging, fingerprint, done)
        files = {name: {"sha256": digest, "bytes": (staging / name).stat().st_size} for name, digest in done.items()}
        _write_index(staging, shards)
        for name in checkpoint.side_files:
            shutil.copyfile(checkpoint.root / name, staging / name)
        for name in (INDEX_NAME, *checkpoint.side_files):
            files[name] = {"sha256": file_sha256(staging / name), "bytes": (staging / name).stat().st_size}
        manifest = {
            "schema": SCHEMA,
            "moebake_version": moebake.__version__,
            "created": utc_now(),
            "target": options.target,
            "target_layout_version": target.LAYOUT_VERSION,
            "flashinfer_layout": {"id": options.flashinfer_layout, "description": DESCRIPTIONS[options.flashinfer_layout]},
            "source": {
                "format": model.format_name,
                "location": source_location or str(Path(source).resolve()),
                "revision": source_revision or _revision_from_path(Path(source).resolve()),
                "files": source_hashes.result(),
            },
            "options": options.as_dict(),
            "activation": model.activation(),
            "layers": layers,
            "files": dict(sorted(files.items())),
        }
        write_manifest(staging, manifest)
        (staging / PROGRESS_NAME).unlink()
    except MoebakeError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _publish(staging, out)
    return manifest


def _fingerprint(checkpoint, options: ConvertOptions) -> str:
    """Identity of (source files, options, moebake version): resumed shards must share it."""
    stats = {name: [os.stat(shard.path).st_size, os.stat(shard.path).st_mtime_ns] for name, shard in checkpoint.shards.items()}
    blob = json.dumps([moebake.__version__, options.as_dict(), stats], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _resumable_shards(staging: Path, fingerprint: str) -> dict[str, str]:
    """Finished shards in ``staging`` whose bytes still hash to what was recorded."""
    try:
        record = json.loads((staging / PROGRESS_NAME).read_text())
    except (OSError, ValueError):
        return {}
    if record.get("fingerprint") != fingerprint:
        return {}
    return {name: digest for name, digest in record.get("shards", {}).items()
            if (staging / name).is_file() and file_sha256(staging / name) == digest}


def _save_progress(staging: Path, fingerprint: str, done: dict[str, str]) -> None:
    temporary = staging / (PROGRESS_NAME + ".tmp")
    temporary.write_text(json.dumps({"fingerprint": fingerprint, "shards": done}))
    os.replace(temporary, staging / PROGRESS_NAME)


def _write_index(directory: Path, shards) -> None:
    weight_map = {t.name: shard.file_name for shard in shards for t in shard.tensors}
    index = {"metadata": {"total_size": sum(s.nbytes for s in shards)}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def _revision_from_path(path: Path) -> str | None:
    """The commit of a Hugging Face cache snapshot path (``.../snapshots/<sha>/``), else None."""
    match = _HF_SNAPSHOT_RE.search(path.as_posix())
    return match.group(1) if match else None


def _publish(staging: Path, out: Path) -> None:
    """Move the finished staging directory to ``out``, replacing an existing ``out`` last."""
    if out.exists():
        retired = out.parent / f".{out.name}.replaced"
        shutil.rmtree(retired, ignore_errors=True)
        os.replace(out, retired)
        os.replace(staging, out)
        shutil.rmtree(retired)
    else:
        os.replace(staging, out)
