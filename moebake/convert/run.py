"""Run a conversion: plan, stream every shard into a staging directory, then publish it atomically.

OUT is built in the sibling ``.OUT.partial`` and renamed into place only when complete. What
OUT may be and what ``overwrite`` may replace is checked first (:mod:`moebake.convert.output_dir`);
bad input is detected while planning, before anything is written. The staging directory is
locked while the conversion runs (:mod:`moebake.convert.staging`). Before the first shard is written,
the file system must have room for every byte the plan will write. A MoebakeError (bad input) removes
a staging directory this run made; a fault (Ctrl-C, SIGTERM, an OSError such as a full disk, a dead
worker) keeps the finished shards (:mod:`moebake.convert.stopped`), and ``resume=True`` re-uses the
shards the progress record vouches for (:mod:`moebake.convert.resume_record`), when the source and options
are unchanged.

Shards are baked one after another in this process, or by ``workers`` processes in parallel
(:mod:`moebake.convert.workers`); either way each source shard is hashed from the bytes the
conversion reads (:class:`moebake.convert.hashing.StreamHash`), and stage times go to
:data:`moebake.convert.stages.STAGES`. ``workers`` is not a conversion option: it changes no output
byte, so it is neither in the manifest nor in the progress record's identity; nor is ``allow_inexact``
(it only lets a bake the engine cannot serve exactly be written, recorded as not engine-exact).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from huggingface_hub.constants import SAFETENSORS_INDEX_FILE

import moebake
from moebake.convert.allocator import reuse_freed_buffers
from moebake.convert.conversion import open_conversion, torch_threads, transform_threads
from moebake.convert.hashing import hub_blob_sha256
from moebake.convert.options import WRITERS_PER_DEVICE, ConvertOptions
from moebake.convert.output_dir import (
    OutputPaths,
    check_destination,
    check_free_space,
    check_output,
    check_replaceable,
    output_paths,
    remove_output,
)
from moebake.convert.resume_record import ResumeRecord, identity_difference, load_resume_record, reusable_shards, run_identity
from moebake.convert.stages import STAGES
from moebake.convert.staging import Staging
from moebake.convert.stopped import after_stop
from moebake.convert.workers import bake_in_workers, usable_workers
from moebake.convert.writer import shard_file_bytes, write_shard
from moebake.errors import OutputError
from moebake.formats.checkpoint import CONFIG_NAME
from moebake.progress_bars import byte_bar, shard_done
from moebake.schema.checksums import CHECKSUM, file_digest, file_record, tagged
from moebake.schema.config_json import write_baked_config
from moebake.schema.enums import FlashInferLayout
from moebake.schema.files import child, open_regular
from moebake.schema.flashinfer_versions import DESCRIPTIONS
from moebake.schema.index import write_index
from moebake.schema.manifest import MANIFEST_NAME, EngineRecord, FileRecord, LayerRecord, Manifest, SourceRecord, created, write_manifest
from moebake.schema.profiles import Padding, ReleaseProfile, check_servable, engines_with_same_bytes, manifest_engine
from moebake.schema.source_location import public_location

if TYPE_CHECKING:
    from moebake.convert.conversion import Conversion
    from moebake.convert.plan import OutputShard
    from moebake.formats.checkpoint import SourceCheckpoint

_HF_SNAPSHOT_RE = re.compile(r"/snapshots/([0-9a-f]{40})(/|$)")
OWN_FILES = {MANIFEST_NAME, SAFETENSORS_INDEX_FILE}
"""Files of OUT that moebake writes itself (never copied from the source)."""
LOG = logging.getLogger(__name__)


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
    writers_per_device: int = WRITERS_PER_DEVICE,
    allow_inexact: bool = False,
) -> Manifest:
    """Convert checkpoint ``source`` into ``out``; returns the manifest written to ``out/moebake.json`` (its typed record).

    ``workers`` > 1 bakes shards in that many processes in parallel, at most ``writers_per_device`` (the
    output is on one storage device) and :func:`moebake.convert.workers.usable_workers`'s other limits. A
    (target, source format) that ``options.release`` cannot serve exactly (no verified profile) is refused
    (UnsupportedError, nothing written) unless ``allow_inexact``: the bake is then recorded as not engine-exact.
    What may be replaced, re-used or deleted: :mod:`moebake.convert.output_dir`, :mod:`moebake.convert.staging`,
    :mod:`moebake.convert.resume_record`.
    """
    paths = output_paths(out)
    check_output(paths, overwrite=overwrite, resume=resume, source=source)
    STAGES.reset()
    reuse_freed_buffers()  # this process bakes: keep freed chunk buffers for the next chunk (process-wide, glibc)
    conversion = open_conversion(source, options)
    if not allow_inexact:
        check_servable(options.profile, options.target, conversion.model.format_name, options.engine_text)
    location = source_location or public_location(Path(source).resolve())  # never a local path: it is published with OUT
    revision = source_revision or _revision_from_path(Path(source).resolve())
    identity = run_identity(conversion.checkpoint, options, source_location or str(Path(source).resolve()), revision)
    with Staging.claim(paths, resume=resume) as staging:
        try:
            check_destination(paths, overwrite=overwrite)  # again, now that the lock is held
            done = _resumed(staging, identity, conversion.shards, resume)
            check_free_space(paths, staging.path, _bytes_to_write(conversion, done))
            manifest = _bake(conversion, source, options, staging.path, done, progress, workers, writers_per_device, location, revision)
            _publish(staging, paths, overwrite)
        except BaseException as err:
            replacement = after_stop(err, staging, [s.file_name for s in conversion.shards])
            if replacement is None:
                raise
            raise replacement from None
    return manifest


def _bytes_to_write(conversion: Conversion, done: ResumeRecord) -> int:
    """The bytes this run will write into the staging directory: the shards not ``done`` (headers included)
    and the side files copied from the source (the index and manifest, a few kB, aside)."""
    shards = sum(shard_file_bytes(s) for s in conversion.shards if s.file_name not in done.shards)
    side_files = sum(os.stat(conversion.checkpoint.root / name).st_size for name in conversion.checkpoint.side_files)
    return shards + side_files


def _resumed(staging: Staging, identity: dict, shards: list[OutputShard], resume: bool) -> ResumeRecord:
    """The resume record of this run: empty in a fresh staging directory, else the recorded one's
    re-usable shards (MoebakeError if it was made by another run identity)."""
    record = None if staging.fresh else load_resume_record(staging.path)
    if record is None:
        resumed = ResumeRecord(staging.path, identity)
    else:
        difference = identity_difference(record["identity"], identity)
        if difference is not None:
            raise OutputError(
                f"{staging.path}: cannot --resume this partial conversion: {difference}; "
                f"pass the same options, or remove {staging.path} to start over"
            )
        done = reusable_shards(staging.path, record, {s.file_name for s in shards})
        resumed = ResumeRecord(staging.path, identity, {name: record["shards"][name] for name in done}, record["sources"])
    if resume and record is not None:  # a fresh run has nothing to resume: no line
        LOG.info(
            "resume: %d of %d shards reused (size, inode, ctime and checksum as recorded), %d to bake",
            len(resumed.shards),
            len(shards),
            len(shards) - len(resumed.shards),
        )
    resumed.save()
    return resumed


def _bake(
    conversion: Conversion,
    source: str | os.PathLike,
    options: ConvertOptions,
    staging: Path,
    done: ResumeRecord,
    progress: bool,
    workers: int,
    writers_per_device: int,
    location: str,
    revision: str | None,
) -> Manifest:
    """Bake every shard not ``done`` into ``staging``, then the index, side files and manifest."""
    model, target, checkpoint, shards = conversion.model, conversion.target, conversion.checkpoint, conversion.shards
    todo = [s for s in shards if s.file_name not in done.shards]
    sizes = {s.file_name: s.nbytes for s in shards}

    def finished(name: str, digest: str, source_digest: str | None) -> None:
        done.record_shard(name, digest, source_digest)
        shard_done(bar, name, sizes[name])

    with byte_bar(
        sum(sizes.values()),
        f"baking {options.target}",
        enabled=progress,
        initial=sum(sizes[name] for name in done.shards),
        shards=len(shards),
    ) as bar:
        bar.shards_done = len(done.shards)
        for shard in todo:  # left by an interrupted run: never written through (it could be a link)
            if os.path.lexists(path := child(staging, shard.file_name)):
                os.unlink(path)
        count, fewer = usable_workers(workers, len(todo), writers_per_device=writers_per_device)
        if fewer:
            LOG.info("--workers %d: using %d (%s)", workers, count, fewer)
        if count > 1:
            bake_in_workers(source, options, [s.file_name for s in todo], staging, count, bar.update, finished)
        else:
            with torch_threads(transform_threads(1)):
                for shard in todo:
                    finished(shard.file_name, *conversion.bake(shard, child(staging, shard.file_name), bar.update, write_shard))
    files = {name: file_record(child(staging, name), entry["digest"]) for name, entry in done.shards.items()}
    write_index(staging, {t.name: shard.file_name for shard in shards for t in shard.tensors}, sum(s.nbytes for s in shards))
    side_files = [name for name in copied_side_files(checkpoint) if name != CONFIG_NAME]  # config.json: below
    for name in side_files:
        with open_regular(checkpoint.root / name) as f, open(child(staging, name), "wb") as copy:
            shutil.copyfileobj(f, copy)
    for name in (SAFETENSORS_INDEX_FILE, *side_files):
        files[name] = file_record(staging / name)
    layout = options.flashinfer_layout
    padding = options.padding(model.format_name)
    engine = manifest_engine(options.profile, options.target, model.format_name, padding, layout, conversion.layers)
    manifest = Manifest(
        moebake_version=moebake.__version__,
        created=created(),
        target=options.target,
        target_layout_version=target.spec.layout_version,
        flashinfer_layout=layout,
        flashinfer_layout_description=DESCRIPTIONS[layout] if layout else None,
        source=SourceRecord(format=model.format_name, location=location, revision=revision, files=_source_files(checkpoint, done.sources)),
        options=options.as_dict(),
        activation=model.activation(),
        layers=conversion.layers,
        files=_file_records(staging, files),
        engine=engine,
        serves=tuple(
            _engines_with_same_bytes(options.profile, options.target, model.format_name, padding, layout, conversion.layers)
            if engine.exact
            else ()
        ),
    )
    write_baked_config(checkpoint.root, staging, manifest.to_json())  # names quant_method moebake and this manifest's hash
    files[CONFIG_NAME] = file_record(staging / CONFIG_NAME)
    manifest = replace(manifest, files=_file_records(staging, files))
    write_manifest(staging, manifest.to_json())
    done.remove()
    return manifest


def _file_records(staging: Path, files: dict[str, dict]) -> dict[str, FileRecord]:
    """The manifest's ``files``, sorted by name, from :func:`file_record` dicts."""
    return {name: FileRecord.from_json(record, staging, name) for name, record in sorted(files.items())}


def copied_side_files(checkpoint: SourceCheckpoint) -> list[str]:
    """The source's side files that go into OUT: all but those named like a file moebake writes there
    (a source's ``moebake.json`` describes some other bake; it is skipped with a warning, not copied)."""
    skipped = [name for name in checkpoint.side_files if name in OWN_FILES]
    for name in skipped:
        LOG.warning("%s: not copied (moebake writes its own %s)", checkpoint.root / name, name)
    return [name for name in checkpoint.side_files if name not in OWN_FILES]


def _engines_with_same_bytes(
    profile: ReleaseProfile, target: str, source_format: str, padding: Padding, layout: FlashInferLayout | None, layers: list[LayerRecord]
) -> list[EngineRecord]:
    """Other engines this bake's bytes also equal (see :func:`engines_with_same_bytes`); none without MoE layers."""
    if not layers:
        return []
    return engines_with_same_bytes(profile, target, source_format, padding, layout, layers[0].hidden, layers[0].intermediate)


def _source_files(checkpoint: SourceCheckpoint, hashed: dict[str, str]) -> dict[str, str]:
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


def _revision_from_path(path: Path) -> str | None:
    """The commit of a Hugging Face cache snapshot path (``.../snapshots/<sha>/``), else None."""
    match = _HF_SNAPSHOT_RE.search(path.as_posix())
    return match.group(1) if match else None


def _publish(staging: Staging, paths: OutputPaths, overwrite: bool) -> None:
    """Move the finished staging directory to OUT (under its lock); a previous moebake output there
    (``overwrite``) is renamed aside first and deleted last."""
    retired = None
    if os.path.lexists(paths.out):
        if not overwrite:
            raise OutputError(f"{paths.label}: already exists (made while this conversion ran; pass --overwrite to replace it)")
        check_replaceable(paths.out, f"{paths.label}: --overwrite replaces only a previous moebake output, but it")
        if os.path.lexists(paths.retired):
            remove_output(paths.retired)
        os.replace(paths.out, paths.retired)
        retired = paths.retired
    staging.drop_lock_file()
    try:
        os.replace(staging.path, paths.out)
    except OSError:
        if retired is not None:
            os.replace(retired, paths.out)
        raise
    if retired is not None:
        remove_output(retired)
