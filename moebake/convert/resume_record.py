"""The resume record of a conversion (its progress record in the staging directory), and what ``--resume`` re-uses.

``.moebake-progress.json`` holds the run's identity (:func:`run_identity`: the moebake version and
its checksum algorithm, the options that change output bytes, and the source: location, revision,
and every source file's size and mtime) and, for each finished output shard, its checksum
(:data:`~moebake.convert.hashing.CHECKSUM`), size, inode and ctime (taken after it was fsynced),
plus the checksums of the source shards read so far. A seal, the SHA-256 of the rest of the
record, is checked on every load.

``--resume`` refuses a record of another identity, naming what differs, and a record whose seal
does not match (an edited or damaged record). It re-uses a staged shard only if the shard's size,
inode and ctime are still those recorded *and* its bytes hash to the recorded checksum; anything
else is baked again. What that protects against:

* a shard altered after it was recorded, even with its recorded hash rewritten to match: the
  seal no longer matches; and if the seal is recomputed too, the shard's ctime has moved (the
  kernel sets ctime on every write, and nothing in user space can set it back), so it is re-baked;
* a truncated, damaged or replaced shard (size, inode or hash), a record from other options,
  another source, a changed source file, or another moebake version.

It does not stop someone who deliberately rewrites the record, seal and recorded ctimes to match
altered files: whoever can do that can equally alter OUT once it is published, and
``moebake verify --source`` (a full re-bake) is the check against that.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import moebake
from moebake.convert.options import ConvertOptions
from moebake.errors import MoebakeError, OutputError
from moebake.schema.checksums import CHECKSUM, file_digest
from moebake.schema.files import child, open_regular, plain_name_problem

if TYPE_CHECKING:
    from moebake.formats.checkpoint import SourceCheckpoint

PROGRESS_NAME = ".moebake-progress.json"
RECORD = "moebake.progress/1"
MEMORY_ONLY_OPTIONS = ("chunk_bytes",)
"""Options that change no output byte (only memory use): a resume may change them."""
_OPTION_FLAGS = {
    "target": "--target",
    "flashinfer_layout": "--flashinfer-layout",
    "hidden_multiple": "--hidden-multiple",
    "intermediate_multiple": "--intermediate-multiple",
}


def run_identity(checkpoint: SourceCheckpoint, options: ConvertOptions, location: str, revision: str | None) -> dict:
    """What a resumed run must share with the run that made the partial conversion."""
    names = [*checkpoint.shards, *checkpoint.side_files]
    if os.path.lexists(checkpoint.root / "model.safetensors.index.json"):
        names.append("model.safetensors.index.json")
    files = {}
    for name in sorted(names):
        st = os.stat(checkpoint.root / name)
        files[name] = [st.st_size, st.st_mtime_ns]
    return {
        "moebake_version": moebake.__version__,
        "checksum": CHECKSUM,
        "options": {k: v for k, v in options.as_dict().items() if k not in MEMORY_ONLY_OPTIONS},
        "source": {"location": location, "revision": revision, "files": files},
    }


def identity_difference(recorded: dict, current: dict) -> str | None:
    """What differs between two :func:`run_identity` values, as a phrase (None if nothing does)."""
    for key, what in (("moebake_version", "moebake"), ("checksum", "checksum algorithm")):
        if recorded.get(key) != current[key]:
            return f"it was made with {what} {recorded.get(key)}, this run uses {current[key]}"
    options = recorded.get("options") or {}
    for key, value in current["options"].items():
        if options.get(key) != value:
            flag = _OPTION_FLAGS.get(key, key)
            return f"it was made with {flag} {options.get(key)}, this run has {flag} {value}"
    source, now = recorded.get("source") or {}, current["source"]
    for key in ("location", "revision"):
        if source.get(key) != now[key]:
            return f"it was made from source {key} {source.get(key)}, this run reads {now[key]}"
    files = source.get("files") or {}
    for name in sorted(set(files) | set(now["files"])):
        if name not in files or name not in now["files"]:
            return f"the source file {name} was {'added' if name not in files else 'removed'} since"
        if files[name] != now["files"][name]:
            return f"the source file {name} changed since (size or modification time)"
    return None


class ResumeRecord:
    """The resume record of one run in ``staging``: saved (atomically) after every finished shard."""

    def __init__(self, staging: Path, identity: dict, shards: dict | None = None, sources: dict | None = None):
        self.staging, self.identity = staging, identity
        self.shards: dict[str, dict] = dict(shards or {})
        self.sources: dict[str, str] = dict(sources or {})

    def record_shard(self, name: str, digest: str, source_checksum: str | None) -> None:
        """Output shard ``name`` is finished (written and fsynced, its checksum ``digest``): record it and save."""
        st = os.stat(child(self.staging, name))
        self.shards[name] = {"digest": digest, "bytes": st.st_size, "inode": st.st_ino, "ctime_ns": st.st_ctime_ns}
        if source_checksum is not None:
            self.sources[name] = source_checksum
        self.save()

    def save(self) -> None:
        record = {"record": RECORD, "identity": self.identity, "shards": self.shards, "sources": self.sources}
        record["seal"] = _seal(record)
        temporary = self.staging / (PROGRESS_NAME + ".tmp")
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.staging / PROGRESS_NAME)

    def remove(self) -> None:
        os.unlink(self.staging / PROGRESS_NAME)


def load_resume_record(staging: Path) -> dict | None:
    """The sealed progress record in ``staging`` (None if there is none); OutputError if it is
    unreadable, of the wrong shape, or does not match its seal."""
    path = staging / PROGRESS_NAME
    if not os.path.lexists(path):
        return None
    with open_regular(path, error=OutputError) as f:
        raw = f.read()
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        record = None
    problem = _shape_problem(record)
    if problem is None and record["seal"] != _seal(record):
        problem = "it does not match its seal (it was edited or damaged)"
    if problem is not None:
        raise OutputError(f"{path}: cannot resume from this progress record: {problem}; remove {staging} to start over")
    return record


def reusable_shards(staging: Path, record: dict, planned: set[str]) -> dict[str, str]:
    """``{name: checksum}`` of the planned shards in ``staging`` that ``record`` lists and that are
    still exactly what was recorded (size, inode, ctime and checksum)."""
    done = {}
    for name, entry in record["shards"].items():
        if name not in planned:
            continue
        path = child(staging, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if (
            stat.S_ISREG(st.st_mode)
            and [st.st_size, st.st_ino, st.st_ctime_ns] == [entry["bytes"], entry["inode"], entry["ctime_ns"]]
            and file_digest(path) == entry["digest"]
        ):
            done[name] = entry["digest"]
    return done


def finished_shard_count(staging: Path) -> int:
    """Finished shards a progress record in ``staging`` lists (0 if it has none, or a bad one)."""
    try:
        record = load_resume_record(staging)
    except (MoebakeError, OSError):
        return 0
    return len(record["shards"]) if record else 0


def _seal(record: dict) -> str:
    body = {key: value for key, value in record.items() if key != "seal"}
    return hashlib.sha256(f"{RECORD}\0{json.dumps(body, sort_keys=True, separators=(',', ':'))}".encode()).hexdigest()


def _shape_problem(record: dict) -> str | None:
    if not isinstance(record, dict) or record.get("record") != RECORD:
        return f"it is not a {RECORD} record"
    if not isinstance(record.get("seal"), str) or not isinstance(record.get("identity"), dict):
        return "it has no seal or identity"
    shards, sources = record.get("shards"), record.get("sources")
    if not isinstance(shards, dict) or not isinstance(sources, dict):
        return "its shards or sources are not objects"
    for name, entry in shards.items():
        if plain_name_problem(name) is not None:
            return f"shard {name!r} is not a plain file name"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("digest"), str)
            or any(type(entry.get(key)) is not int for key in ("bytes", "inode", "ctime_ns"))
        ):
            return f"shard {name} has no digest, bytes, inode and ctime_ns"
    if not all(isinstance(value, str) for value in sources.values()):
        return "a source checksum is not a string"
    return None
