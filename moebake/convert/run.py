"""Run a conversion: plan, stream every shard into a staging directory, then publish it atomically.

OUT is built in the sibling ``.OUT.partial`` and renamed into place only when complete. Bad input
is detected while planning, before anything is written; a MoebakeError removes the staging
directory. After an interruption the staging directory stays, and ``resume=True`` re-uses every
shard whose recorded checksum still matches, when the source and options are unchanged.

Shards are baked one after another in this process, or by ``workers`` processes in parallel
(:mod:`moebake.convert.workers`); either way each source shard is hashed from the bytes the
conversion reads (:class:`moebake.convert.hashing.StreamHash`), and stage times go to
:data:`moebake.convert.stages.STAGES`. ``workers`` is not a conversion option: it changes no output
byte, so it is neither in the manifest nor in the resume fingerprint.
"""

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

from huggingface_hub.constants import SAFETENSORS_INDEX_FILE

import moebake
from moebake.convert.allocator import reuse_freed_buffers
from moebake.convert.conversion import open_conversion, torch_threads, transform_threads
from moebake.convert.hashing import hub_blob_sha256
from moebake.convert.options import ConvertOptions
from moebake.convert.stages import STAGES
from moebake.convert.workers import bake_in_workers
from moebake.convert.writer import write_shard
from moebake.engines.config_json import write_baked_config
from moebake.engines.profiles import engines_with_same_bytes, manifest_engine
from moebake.errors import MoebakeError, OutputError
from moebake.formats.checkpoint import CONFIG_NAME
from moebake.progress import byte_bar, shard_done
from moebake.layouts.flashinfer_versions import DESCRIPTIONS
from moebake.schema.checksums import CHECKSUM, file_digest, file_record, tagged
from moebake.schema.index import write_index
from moebake.schema.manifest import MANIFEST_NAME, SCHEMA, utc_now, write_manifest

PROGRESS_NAME = ".moebake-progress.json"
OWN_FILES = {MANIFEST_NAME, SAFETENSORS_INDEX_FILE}
"""Files of OUT that moebake writes itself (never copied from the source)."""
LOG = logging.getLogger(__name__)
_HF_SNAPSHOT_RE = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")


def staging_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.partial"


def check_out_free(out: Path, overwrite: bool) -> None:
    """OutputError if ``out`` exists and may not be replaced."""
    if out.exists() and not overwrite:
        raise OutputError(f"{out}: already exists (pass --overwrite to replace it)")


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
    workers: int = 1,
) -> dict:
    """Convert checkpoint ``source`` into ``out``; returns the manifest written to ``out/moebake.json``.

    ``workers`` > 1 bakes shards in that many processes in parallel.
    """
    out = Path(out)
    check_out_free(out, overwrite)
    STAGES.reset()
    reuse_freed_buffers()  # this process bakes: keep freed chunk buffers for the next chunk (process-wide, glibc)
    conversion = open_conversion(source, options)
    model, target, checkpoint = conversion.model, conversion.target, conversion.checkpoint
    shards, layers = conversion.shards, conversion.layers

    staging = staging_dir(out)
    fingerprint = _fingerprint(checkpoint, options)
    done, source_hashes = _resumable_shards(staging, fingerprint) if resume else ({}, {})
    if not done and staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True, exist_ok=True)
    try:
        todo = [s for s in shards if s.file_name not in done]
        if resume:
            LOG.info("resume: %d of %d shards reused (their checksums match), %d to bake", len(done), len(shards), len(todo))
        sizes = {s.file_name: s.nbytes for s in shards}
        with byte_bar(sum(sizes.values()), f"baking {options.target}", enabled=progress,
                      initial=sum(sizes[name] for name in done), shards=len(shards)) as bar:
            bar.shards_done = len(done)

            def finished(name: str, digest: str, source_digest: str | None) -> None:
                done[name] = digest
                if source_digest is not None:
                    source_hashes[name] = source_digest
                _save_progress(staging, fingerprint, done, source_hashes)
                shard_done(bar, name, sizes[name])

            if workers > 1 and len(todo) > 1:
                bake_in_workers(source, options, [s.file_name for s in todo], staging, workers, bar.update, finished)
            else:
                with torch_threads(transform_threads(1)):
                    for shard in todo:
                        finished(shard.file_name, *conversion.bake(shard, staging / shard.file_name, bar.update, write_shard))
        files = {name: file_record(staging / name, digest) for name, digest in done.items()}
        write_index(staging, {t.name: shard.file_name for shard in shards for t in shard.tensors}, sum(s.nbytes for s in shards))
        side_files = [name for name in copied_side_files(checkpoint) if name != CONFIG_NAME]  # config.json: below
        for name in side_files:
            shutil.copyfile(checkpoint.root / name, staging / name)
        for name in (SAFETENSORS_INDEX_FILE, *side_files):
            files[name] = file_record(staging / name)
        manifest = {
            "schema": SCHEMA,
            "moebake_version": moebake.__version__,
            "created": utc_now(),
            "target": options.target,
            "target_layout_version": target.spec.layout_version,
            "flashinfer_layout": (
                {"id": options.flashinfer_layout, "description": DESCRIPTIONS[options.flashinfer_layout]}
                if target.spec.uses_flashinfer_layout else None
            ),
            "source": {
                "format": model.format_name,
                "location": source_location or str(Path(source).resolve()),
                "revision": source_revision or _revision_from_path(Path(source).resolve()),
                "files": _source_files(checkpoint, source_hashes),
            },
            "options": options.as_dict(),
            "engine": manifest_engine(options, model.format_name),
            "serves": _engines_with_same_bytes(options, model.format_name, layers),
            "activation": model.activation(),
            "layers": layers,
            "files": dict(sorted(files.items())),
        }
        write_baked_config(checkpoint.root, staging, manifest)  # names quant_method moebake and this manifest's hash
        files[CONFIG_NAME] = file_record(staging / CONFIG_NAME)
        manifest["files"] = dict(sorted(files.items()))
        write_manifest(staging, manifest)
        (staging / PROGRESS_NAME).unlink()
    except MoebakeError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _publish(staging, out)
    return manifest


def copied_side_files(checkpoint) -> list[str]:
    """The source's side files that go into OUT: all but those named like a file moebake writes there
    (a source's ``moebake.json`` describes some other bake; it is skipped with a warning, not copied)."""
    skipped = [name for name in checkpoint.side_files if name in OWN_FILES]
    for name in skipped:
        LOG.warning("%s: not copied (moebake writes its own %s)", checkpoint.root / name, name)
    return [name for name in checkpoint.side_files if name not in OWN_FILES]


def _engines_with_same_bytes(options: ConvertOptions, source_format: str, layers: list[dict]) -> list[dict]:
    """Other engines this bake's bytes also equal (see :func:`engines_with_same_bytes`); none without padded layers."""
    sizes = layers[0] if layers else {}
    if "hidden" not in sizes or "intermediate" not in sizes:
        return []
    return engines_with_same_bytes(options, source_format, sizes["hidden"], sizes["intermediate"])


def _fingerprint(checkpoint, options: ConvertOptions) -> str:
    """Identity of (source files, options, moebake version): resumed shards must share it."""
    stats = {name: [os.stat(shard.path).st_size, os.stat(shard.path).st_mtime_ns] for name, shard in checkpoint.shards.items()}
    blob = json.dumps([moebake.__version__, options.as_dict(), stats], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _resumable_shards(staging: Path, fingerprint: str) -> tuple[dict[str, str], dict[str, str]]:
    """Finished shards in ``staging`` whose bytes still hash to what was recorded, and the recorded
    source shard hashes (the fingerprint vouches that those files are unchanged)."""
    try:
        record = json.loads((staging / PROGRESS_NAME).read_text())
    except (OSError, ValueError):
        return {}, {}
    if record.get("fingerprint") != fingerprint:
        return {}, {}
    done = {name: digest for name, digest in record.get("shards", {}).items()
            if (staging / name).is_file() and file_digest(staging / name) == digest}
    return done, dict(record.get("sources", {}))


def _source_files(checkpoint, hashed: dict[str, str]) -> dict[str, str]:
    """``{file name: "ALGORITHM:hex"}`` of the source's shards, side files and index; shards not
    hashed while converting (none, unless resumed or not mirrored by an output shard) are read here,
    unless they are Hub-cache blobs named by their SHA-256."""
    names = [*checkpoint.shards, *checkpoint.side_files]
    if (checkpoint.root / SAFETENSORS_INDEX_FILE).is_file():
        names.append(SAFETENSORS_INDEX_FILE)
    return {name: hashed.get(name) or _source_checksum(checkpoint.root / name) for name in names}


def _source_checksum(path: Path) -> str:
    known = hub_blob_sha256(path)
    return tagged("sha256", known) if known else tagged(CHECKSUM, file_digest(path))


def _save_progress(staging: Path, fingerprint: str, done: dict[str, str], sources: dict[str, str]) -> None:
    temporary = staging / (PROGRESS_NAME + ".tmp")
    temporary.write_text(json.dumps({"fingerprint": fingerprint, "shards": done, "sources": sources}))
    os.replace(temporary, staging / PROGRESS_NAME)


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
