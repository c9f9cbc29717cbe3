"""The ``kernels`` field of ``moebake.json``: kernel sets, their compatibility records and their files.

::

    "kernels": {
      "schema": "moebake.kernels/1",
      "sets": [
        {"id": "sglang-0.5.17-sm90",            # also the folder kernels/<id>/ in the bake
         "engine": "sglang", "release": "0.5.17", "arch": "sm90",
         "versions": {"flashinfer": "0.6.15.post1", "deep_gemm": "0.1.5.post1", "tvm_ffi": "0.1.11",
                      "triton": "3.6.0", "tilelang": null, "torch": "2.11.0+cu130", "cuda": "13.0"},
         "files": {"tvm-ffi/<dir>/<module>.so": {"sha256": "<64 hex>", "bytes": 123456}, ...}}
      ]
    }

A file's path is relative to ``kernels/<id>/``: ``/``-separated plain names (no ``.``, ``..``, empty or absolute
parts, no control characters), its first part a kind of :data:`moebake.kernels.locations.KINDS`. A version is a
string, or null where the library was not installed where the kernels were made (a set then holds no file of a kind
tied to it, :data:`moebake.kernels.locations.NEEDS`); ``torch`` and ``cuda`` are always recorded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from moebake.errors import ManifestError
from moebake.kernels.environment import REQUIRED_FIELDS, VERSION_FIELDS
from moebake.kernels.locations import KINDS, NEEDS
from moebake.schema.files import plain_name_problem

FIELD = "kernels"
SCHEMA = "moebake.kernels/1"
FOLDER = "kernels"
"""The bake's folder of kernel files: ``BAKE/kernels/<set id>/<path>``."""
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class KernelFile:
    sha256: str
    bytes: int

    def to_json(self) -> dict:
        return {"sha256": self.sha256, "bytes": self.bytes}


@dataclass(frozen=True)
class KernelSet:
    """One engine release's kernels for one GPU architecture, with the versions they were built against."""

    id: str
    engine: str
    release: str
    arch: str
    versions: dict[str, str | None]
    files: dict[str, KernelFile] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())

    def kinds(self) -> dict[str, tuple[int, ...]]:
        """``{kind: (files, bytes)}`` in :data:`KINDS` order."""
        counts: dict[str, list[int]] = {}
        for path, record in self.files.items():
            entry = counts.setdefault(path.split("/", 1)[0], [0, 0])
            entry[0] += 1
            entry[1] += record.bytes
        return {kind: tuple(counts[kind]) for kind in KINDS if kind in counts}

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "engine": self.engine,
            "release": self.release,
            "arch": self.arch,
            "versions": {key: self.versions.get(key) for key in VERSION_FIELDS},
            "files": {path: record.to_json() for path, record in sorted(self.files.items())},
        }


def set_id(engine: str, release: str, arch: str) -> str:
    return f"{engine}-{release}-{arch}"


def path_problem(path: object) -> str | None:
    """Why ``path`` is not a kernel file path (None when it is one)."""
    if not isinstance(path, str):
        return f"a {type(path).__name__}, not a string"
    parts = path.split("/")
    if len(parts) < 2:
        return "not under a kind's folder"
    for part in parts:
        if (problem := plain_name_problem(part)) is not None:
            return f"part {part!r} is {problem}"
    if parts[0] not in KINDS:
        return f"kind {parts[0]!r} is not one of {', '.join(KINDS)}"
    return None


def kernel_sets(manifest: dict, where) -> list[KernelSet]:
    """The manifest's kernel sets (empty without a ``kernels`` field); ManifestError naming ``where`` and the field."""
    data = manifest.get(FIELD)
    if data is None:
        return []

    def bad(path: str, what: str) -> ManifestError:
        return ManifestError(f"{where}: field {path} {what}")

    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("sets"), list):
        raise bad(FIELD, f"is not a kernels record of schema {SCHEMA} (an object with a list 'sets')")
    sets, seen = [], set()
    for i, item in enumerate(data["sets"]):
        at = f"{FIELD}.sets[{i}]"
        if not isinstance(item, dict):
            raise bad(at, "is not an object")
        for key in ("id", "engine", "release", "arch"):
            if not isinstance(item.get(key), str) or not item[key]:
                raise bad(f"{at}.{key}", "is missing or not a string")
        if not _ID.match(item["id"]) or item["id"] in seen:
            raise bad(f"{at}.id", f"{item['id']!r} is not a plain folder name, or names two sets")
        seen.add(item["id"])
        versions = item.get("versions")
        if (
            not isinstance(versions, dict)
            or set(versions) != set(VERSION_FIELDS)
            or not all(v is None or (isinstance(v, str) and v) for v in versions.values())
        ):
            raise bad(f"{at}.versions", f"must give each of {', '.join(VERSION_FIELDS)} as a string or null")
        for required in REQUIRED_FIELDS:
            if versions[required] is None:
                raise bad(f"{at}.versions.{required}", "is null: every kernel set records it")
        files = item.get("files")
        if not isinstance(files, dict) or not files:
            raise bad(f"{at}.files", "is not a non-empty object of path: {sha256, bytes}")
        records = {}
        for path, record in files.items():
            if (problem := path_problem(path)) is not None:
                raise bad(f"{at}.files", f"lists {path!r}, which is not a kernel file path ({problem})")
            if (
                not isinstance(record, dict)
                or set(record) != {"sha256", "bytes"}
                or not isinstance(record["sha256"], str)
                or not _HEX64.match(record["sha256"])
                or type(record["bytes"]) is not int
                or record["bytes"] < 0
            ):
                raise bad(f"{at}.files.{path}", 'is not {"sha256": <64 lowercase hex>, "bytes": <size>}')
            needs = NEEDS[path.split("/", 1)[0]]
            if versions[needs] is None:
                raise bad(f"{at}.files.{path}", f"is a {path.split('/', 1)[0]} file, but versions.{needs} is null")
            records[path] = KernelFile(record["sha256"], record["bytes"])
        sets.append(KernelSet(item["id"], item["engine"], item["release"], item["arch"], dict(versions), records))
    return sets


def kernels_field(sets: list[KernelSet]) -> dict:
    """The ``kernels`` field for ``sets``."""
    return {"schema": SCHEMA, "sets": [s.to_json() for s in sets]}
