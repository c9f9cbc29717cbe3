"""The manifest ``moebake.json``: typed records of what was baked, from what, how, and every file's checksum.

Schema ``moebake.manifest/1`` (documented in docs/manifest.md; add fields freely, bump the number only
when a field changes meaning or a reader must refuse older files):

  schema, moebake_version, created (UTC ISO 8601; only when SOURCE_DATE_EPOCH is set, so that
  identical runs write identical bytes), target, target_layout_version,
  flashinfer_layout {id, description} (null for targets it does not apply to),
  source {format, location, revision, files {name: "ALGORITHM:hex"}}  (before checksums were named: bare sha256 hex),
  options {...ConvertOptions},
  engine EngineRecord: {name, version, runner_backend, a2a_backend, engine_method, hidden_multiple,
         intermediate_multiple, hidden_scale_fill, verified, parameter_names, exact, not_exact_because}
         (absent in manifests from before engine profiles),
  serves [EngineRecord] (the other engines whose preparation gives the same bytes),
  activation {kind, alpha, beta, limit},
  layers [LayerRecord: {index, prefix, experts, hidden, hidden_padded, intermediate, intermediate_padded,
           tensors {short name: TensorRecord: {source, dtype, shape, gate_up_order, source_gate_up_order}}}],
  files {output file name: {ALGORITHM: hex, bytes}}   (every file in OUT except moebake.json itself)
  manifest_sha256   the manifest's *self-checksum*: SHA-256 of every other field (see :func:`self_checksum`)

Two digests of a manifest are stored under the name ``manifest_sha256`` (on-disk names, kept for
compatibility); in code each has one name of its own:

  * the **self-checksum** (:func:`self_checksum`, :data:`SELF_CHECKSUM_KEY`): this file's field
    ``manifest_sha256``, over every other field; it proves the file is as moebake wrote it;
  * the **bake digest** (:func:`moebake.schema.config_json.manifest_digest`): the output config.json's
    ``quantization_config.manifest_sha256``, over the fields that fix the bake (no ``created``, no
    ``source.location``, no self-checksum); it ties config.json to this manifest.

ALGORITHM is ``xxh3-128`` in new manifests (``sha256`` in older ones, and for source files whose
Hub-cache blob name is their SHA-256); see :mod:`moebake.convert.hashing`.

The manifest protects itself: the engine and ``moebake.serve`` trust its fields (target, layout,
activation limit, padding), so a changed field must not go unnoticed. :func:`write_manifest` stores
``manifest_sha256`` and writes one exact spelling (:func:`render_manifest`); :func:`load_manifest`
reports a checksum that does not match, or bytes that are not that spelling (an edit that keeps the
values, e.g. ``1e-05`` -> ``1E-05``), or fields of the wrong type. Every reader goes through it.

Each record (:class:`Manifest`, :class:`LayerRecord`, :class:`TensorRecord`, ...) has ``to_json()``
(the JSON object written, keys in this order) and ``from_json(data, where)``, the one validation
path of the fields: a missing field or a value of the wrong type raises
:class:`~moebake.errors.ManifestError` naming ``where`` (the file) and the field's path. Fields a
record does not know are kept (``extra``) and written back, so readers accept what newer writers add.
"""

import datetime
import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal, overload

from moebake.errors import CheckpointError, ManifestError
from moebake.schema.config_values import parse_json
from moebake.schema.engine_release import EngineRelease
from moebake.schema.enums import ActivationKind, DType, FlashInferLayout, GateUpOrder
from moebake.schema.files import open_regular

MANIFEST_NAME = "moebake.json"
SCHEMA = "moebake.manifest/1"
KNOWN_SCHEMAS = (SCHEMA,)
SELF_CHECKSUM_KEY = "manifest_sha256"
LOG = logging.getLogger(__name__)


def created() -> str | None:
    """The manifest's ``created`` (UTC ISO 8601) from ``SOURCE_DATE_EPOCH`` (the reproducible-builds
    convention) when it is set, else None (no field): the manifests of two identical runs are the same bytes."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not epoch.isdigit():
        return None
    return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).isoformat()


def self_checksum(manifest: dict) -> str:
    """SHA-256 of the manifest without its ``manifest_sha256``: canonical JSON (sorted keys, no spaces, ASCII)."""
    fields = {key: value for key, value in manifest.items() if key != SELF_CHECKSUM_KEY}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def render_manifest(manifest: dict) -> str:
    """The exact text of ``moebake.json`` for ``manifest``: its fields, then ``manifest_sha256``; strict
    JSON (no bare NaN / Infinity), two-space indent, a final newline."""
    fields = {key: value for key, value in manifest.items() if key != SELF_CHECKSUM_KEY}
    return json.dumps({**fields, SELF_CHECKSUM_KEY: self_checksum(fields)}, indent=2, allow_nan=False) + "\n"


def write_manifest(directory: Path, manifest: dict) -> None:
    """Write ``directory/moebake.json`` (:func:`render_manifest`) atomically (a temporary file renamed over it)."""
    temporary = Path(directory) / f".{MANIFEST_NAME}.tmp"
    temporary.write_text(render_manifest(manifest), encoding="utf-8")
    os.replace(temporary, Path(directory) / MANIFEST_NAME)


def tensor_sources(spec: dict) -> list[str]:
    """Source tensor names (or per-expert patterns) a layer record's tensor spec names in ``source``:
    one (a string), several (a list), or none (None: a tensor derived from others)."""
    source = spec.get("source")
    return [] if source is None else [source] if isinstance(source, str) else list(source)


def load_manifest(directory: str | os.PathLike) -> tuple[dict, list[str]]:
    """``directory/moebake.json`` and the problems found in it (one line each; empty if moebake wrote it
    as it is). MoebakeError when there is nothing to check: no such directory, no manifest, not JSON,
    an unknown schema."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.exists():
        raise ManifestError(f"{directory}: does not exist")
    if not directory.is_dir():
        raise ManifestError(f"{directory}: not a directory (a moebake output is a directory with {MANIFEST_NAME})")
    if not os.path.lexists(path):
        raise ManifestError(f"{directory}: not a moebake output (no {MANIFEST_NAME})")
    with open_regular(path, error=ManifestError) as f:  # a FIFO would block a plain read
        raw = f.read()
    try:
        manifest = parse_json(raw, f"{path}: corrupt manifest")
    except CheckpointError as err:
        raise ManifestError(str(err)) from None
    schema = manifest.get("schema") if isinstance(manifest, dict) else None
    if schema not in KNOWN_SCHEMAS:
        raise ManifestError(f"{path}: unknown manifest schema {schema!r}; this moebake reads {', '.join(KNOWN_SCHEMAS)}")
    return manifest, _integrity_problems(path, raw, manifest) or _field_problems(path, manifest)


def read_manifest(directory: str | os.PathLike) -> dict:
    """:func:`load_manifest`'s manifest; MoebakeError (the first problem) unless it is intact."""
    manifest, problems = load_manifest(directory)
    if problems:
        raise ManifestError(problems[0])
    return manifest


def read_manifest_record(directory: str | os.PathLike) -> "Manifest":
    """:func:`read_manifest` as the typed :class:`Manifest` (what the runtime and the engine plugins read)."""
    return Manifest.from_json(read_manifest(directory), Path(directory) / MANIFEST_NAME)


def _integrity_problems(path: Path, raw: bytes, manifest: dict) -> list[str]:
    recorded = manifest.get(SELF_CHECKSUM_KEY)
    if recorded is None and _written_before_checksums_were_named(manifest):
        LOG.warning(
            "%s: written by a moebake before manifests carried %s: its fields are not protected "
            "(re-bake with this moebake to protect them)",
            path,
            SELF_CHECKSUM_KEY,
        )
        return []
    if recorded is None:
        return [f"{path}: has no {SELF_CHECKSUM_KEY}, so a changed field would go unnoticed"]
    try:
        text = render_manifest(manifest)
    except ValueError as err:
        return [f"{path}: not strict JSON ({err})"]
    if recorded != self_checksum(manifest):
        return [f"{path}: changed since moebake wrote it ({SELF_CHECKSUM_KEY} does not match its fields)"]
    if raw != text.encode("utf-8"):
        return [f"{path}: its bytes were edited since moebake wrote it (same fields, other spelling or spacing)"]
    return []


def _written_before_checksums_were_named(manifest: dict) -> bool:
    """A manifest from before named checksums (and so before ``manifest_sha256``): every file record is
    ``{sha256, bytes}``. A newer manifest that lost its ``manifest_sha256`` (say, a flipped bit in the
    key) has xxh3-128 records, so it is not taken for an old one."""
    files = manifest.get("files")
    return isinstance(files, dict) and bool(files) and all(isinstance(r, dict) and set(r) == {"sha256", "bytes"} for r in files.values())


class _Fields:
    """Typed access to one JSON object of the manifest; every failure names ``where`` and the field path."""

    def __init__(self, data: object, where: object, path: str):
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: {path or 'the manifest'} is {_kind(data)}, expected an object")
        self.data, self.where, self.path = data, where, path

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, check: Callable[[Any], bool], expected: str, optional: bool = False) -> Any:
        if key not in self.data:
            if optional:
                return None
            raise ManifestError(f"{self.where}: field {self.name(key)} is missing")
        value = self.data[key]
        if (value is None and optional) or check(value):
            return value
        raise ManifestError(f"{self.where}: field {self.name(key)} is {_kind(value)}, expected {expected}")

    @overload
    def integer(self, key: str, optional: Literal[False] = False) -> int: ...
    @overload
    def integer(self, key: str, optional: bool) -> int | None: ...

    def integer(self, key: str, optional: bool = False) -> int | None:
        return self.get(key, lambda v: type(v) is int and v >= 0, "a non-negative integer", optional)

    def boolean(self, key: str) -> bool:
        return self.get(key, lambda v: isinstance(v, bool), "true or false")

    @overload
    def string(self, key: str, optional: Literal[False] = False) -> str: ...
    @overload
    def string(self, key: str, optional: bool) -> str | None: ...

    def string(self, key: str, optional: bool = False) -> str | None:
        return self.get(key, lambda v: isinstance(v, str), "a string", optional)

    def number(self, key: str, optional: bool = False) -> float | None:
        return self.get(key, lambda v: type(v) in (int, float) and math.isfinite(v), "a finite number", optional)

    @overload
    def shape(self, key: str, optional: Literal[False] = False) -> tuple[int, ...]: ...
    @overload
    def shape(self, key: str, optional: bool) -> tuple[int, ...] | None: ...

    def shape(self, key: str, optional: bool = False) -> tuple[int, ...] | None:
        value = self.get(
            key, lambda v: isinstance(v, list) and all(type(d) is int and d >= 0 for d in v), "a list of non-negative integers", optional
        )
        return None if value is None else tuple(value)

    def choice(self, key: str, enum: type[Enum], optional: bool = False) -> Any:
        value = self.get(
            key, lambda v: isinstance(v, str) and v in {m.value for m in enum}, f"one of {', '.join(m.value for m in enum)}", optional
        )
        return None if value is None else enum(value)

    @overload
    def obj(self, key: str, optional: Literal[False] = False) -> "_Fields": ...
    @overload
    def obj(self, key: str, optional: bool) -> "_Fields | None": ...

    def obj(self, key: str, optional: bool = False) -> "_Fields | None":
        value = self.get(key, lambda v: isinstance(v, dict), "an object", optional)
        return None if value is None else _Fields(value, self.where, self.name(key))

    def extra(self, known: Collection[str]) -> dict:
        return {key: value for key, value in self.data.items() if key not in known}


def _kind(value: object) -> str:
    return "null" if value is None else f"{type(value).__name__} {json.dumps(value)[:60]}"


@dataclass(frozen=True, kw_only=True)
class TensorRecord:
    """One baked tensor of a layer: safetensors ``dtype`` and ``shape``; the source tensors (or per-expert
    patterns) it is made from (``source``: a name, a list, or None when derived from the config); the W13
    row order it is written in and the source's; for canonical MXFP4 sources, one expert's source
    slice ``source_shape`` and ``source_dtype``. A derived tensor (``source`` None) has no source order."""

    dtype: DType
    shape: tuple[int, ...]
    source: str | tuple[str, ...] | None
    gate_up_order: GateUpOrder | None = None
    source_gate_up_order: GateUpOrder | None = None
    source_shape: tuple[int, ...] | None = None
    source_dtype: DType | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def sources(self) -> list[str]:
        return tensor_sources({"source": self.source})

    def to_json(self) -> dict:
        out = {
            "source": list(self.source) if isinstance(self.source, tuple) else self.source,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "gate_up_order": self.gate_up_order,
        }
        if self.source is not None:
            out["source_gate_up_order"] = self.source_gate_up_order
        if self.source_shape is not None:
            out |= {"source_shape": list(self.source_shape), "source_dtype": self.source_dtype}
        return out | self.extra

    @classmethod
    def from_json(cls, data: Any, where: object, path: str = "tensor") -> "TensorRecord":
        f = _Fields(data, where, path)
        source = f.get(
            "source",
            lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
            "a tensor name or a list of them",
            optional=True,
        )
        return cls(
            dtype=f.choice("dtype", DType),
            shape=f.shape("shape"),
            source=tuple(source) if isinstance(source, list) else source,
            gate_up_order=f.choice("gate_up_order", GateUpOrder, optional=True),
            source_gate_up_order=f.choice("source_gate_up_order", GateUpOrder, optional=True),
            source_shape=f.shape("source_shape", optional=True),
            source_dtype=f.choice("source_dtype", DType, optional=True),
            extra=f.extra(("source", "dtype", "shape", "gate_up_order", "source_gate_up_order", "source_shape", "source_dtype")),
        )


_LAYER_KEYS = ("index", "prefix", "experts", "hidden", "hidden_padded", "intermediate", "intermediate_padded")
_LAYER_OPTIONAL = ("epilogue_tile_m", "scalar_shape", "gate_up_global_scale", "dispatcher_output_dtype")


@dataclass(frozen=True, kw_only=True)
class LayerRecord:
    """One baked MoE layer: its index and expert prefix, dims (padded as baked) and tensors by short name.

    Target-specific facts: ``epilogue_tile_m`` (trtllm-gen row shuffle), ``scalar_shape`` (one
    expert's NVFP4 global scale shape in the source), ``gate_up_global_scale`` (the NVFP4 gate/up
    global-scale sharing report), ``dispatcher_output_dtype`` (what DeepEP dispatches to the layer).
    """

    index: int
    prefix: str
    experts: int
    hidden: int
    hidden_padded: int
    intermediate: int
    intermediate_padded: int
    tensors: dict[str, TensorRecord]
    epilogue_tile_m: int | None = None
    scalar_shape: tuple[int, ...] | None = None
    gate_up_global_scale: dict | None = None
    dispatcher_output_dtype: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        out = {key: getattr(self, key) for key in _LAYER_KEYS}
        for key in _LAYER_OPTIONAL:
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        return out | self.extra | {"tensors": {short: spec.to_json() for short, spec in self.tensors.items()}}

    @classmethod
    def from_json(cls, data: Any, where: object, path: str = "layer") -> "LayerRecord":
        f = _Fields(data, where, path)
        tensors = f.obj("tensors")
        return cls(
            index=f.integer("index"),
            prefix=f.string("prefix"),
            **{key: f.integer(key) for key in _LAYER_KEYS[2:]},
            tensors={short: TensorRecord.from_json(spec, where, tensors.name(short)) for short, spec in tensors.data.items()},
            epilogue_tile_m=f.integer("epilogue_tile_m", optional=True),
            scalar_shape=f.shape("scalar_shape", optional=True),
            gate_up_global_scale=f.get("gate_up_global_scale", lambda v: isinstance(v, dict), "an object", optional=True),
            dispatcher_output_dtype=f.string("dispatcher_output_dtype", optional=True),
            extra=f.extra((*_LAYER_KEYS, *_LAYER_OPTIONAL, "tensors")),
        )


@dataclass(frozen=True, kw_only=True)
class Activation:
    """The expert activation: ``kind`` and its parameters (None where the kind's default applies).

    A kind this moebake does not know stays a plain string: a runtime refuses it, naming itself.
    """

    kind: ActivationKind | str
    alpha: float | None = None
    beta: float | None = None
    limit: float | None = None

    def to_json(self) -> dict:
        return {"kind": str(self.kind), "alpha": self.alpha, "beta": self.beta, "limit": self.limit}

    @classmethod
    def from_json(cls, data: Any, where: object, path: str = "activation") -> "Activation":
        f = _Fields(data, where, path)
        kind = f.string("kind")
        known = kind in {member.value for member in ActivationKind}
        return cls(
            kind=ActivationKind(kind) if known else kind, **{key: f.number(key, optional=True) for key in ("alpha", "beta", "limit")}
        )


@dataclass(frozen=True, kw_only=True)
class SourceRecord:
    """Where the baked checkpoint came from: its format, location (path or Hub repo), revision, file checksums."""

    format: str
    location: str
    revision: str | None
    files: dict[str, str]

    def to_json(self) -> dict:
        return {"format": self.format, "location": self.location, "revision": self.revision, "files": dict(self.files)}

    @classmethod
    def from_json(cls, data: Any, where: object, path: str = "source") -> "SourceRecord":
        f = _Fields(data, where, path)
        files = f.get(
            "files", lambda v: isinstance(v, dict) and all(isinstance(d, str) for d in v.values()), "an object of file name: checksum"
        )
        return cls(format=f.string("format"), location=f.string("location"), revision=f.string("revision", optional=True), files=files)


@dataclass(frozen=True, kw_only=True)
class FileRecord:
    """One output file: its checksums by algorithm name (``{"xxh3-128": hex}``; older manifests
    ``{"sha256": hex}``) and its size in bytes."""

    checksums: dict[str, str]
    bytes: int

    def to_json(self) -> dict:
        return {**self.checksums, "bytes": self.bytes}

    @classmethod
    def from_json(cls, data: Any, where: object, path: str) -> "FileRecord":
        f = _Fields(data, where, path)
        checksums = {key: f.string(key) for key in data if key != "bytes"}
        return cls(checksums=checksums, bytes=f.integer("bytes"))


EXPERT_PARALLEL_ONLY = "expert-only"
"""The engine record's ``moe_parallelism`` of every bake: experts are baked whole (I is not split), so an engine
serves them with expert parallelism (each rank a contiguous run of whole experts), never MoE tensor parallelism."""


@dataclass(frozen=True, kw_only=True)
class EngineRecord:
    """The engine profile a bake follows (:mod:`moebake.schema.profiles`): the engine and version, its
    serving flags (``runner_backend``, ``a2a_backend``), the class whose post-load parameters the bytes
    equal, the padding multiples and the fill of the scales' hidden and intermediate padding (bytes;
    ``intermediate_scale_fill`` is written only where it is not 0), how a loader may split the MoE layers
    over GPUs (``moe_parallelism``: ``expert-only``, whole experts per rank, no MoE tensor parallelism;
    manifests before the field mean the same), whether the
    profile is proven against the engine's code (``verified``), the engine's parameter names where they
    differ from the bake's short names, whether this bake is engine-exact (``exact``; if not, why), and further
    engine flags the serving path needs (``engine_flags``, written only where there are some)."""

    name: str
    version: str
    runner_backend: str
    a2a_backend: str
    engine_method: str
    hidden_multiple: int
    intermediate_multiple: int
    hidden_scale_fill: int
    verified: bool
    parameter_names: dict[str, str]
    exact: bool
    not_exact_because: str | None = None
    intermediate_scale_fill: int = 0
    moe_parallelism: str = EXPERT_PARALLEL_ONLY
    engine_flags: str = ""
    releases: tuple[EngineRelease, ...] | None = None
    """Every release of the engine whose own load-time code was proven to build these bytes (the release matrix,
    :mod:`moebake.schema.release_matrix`); None in manifests before the field, which name only ``version``. The
    manifest lists their versions."""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def release(self) -> EngineRelease:
        """The release the bake was made for."""
        return EngineRelease(self.name, self.version)

    @property
    def serving_releases(self) -> tuple[EngineRelease, ...]:
        """The releases that may serve this bake: :attr:`releases`, or ``version`` for manifests before it."""
        if self.releases is not None:
            return self.releases
        return (self.release,) if self.exact else ()

    _KEYS = (
        "name",
        "version",
        "runner_backend",
        "a2a_backend",
        "engine_method",
        "hidden_multiple",
        "intermediate_multiple",
        "hidden_scale_fill",
        "verified",
        "parameter_names",
        "exact",
        "not_exact_because",
    )

    def to_json(self) -> dict:
        out = {key: getattr(self, key) for key in self._KEYS} | {"parameter_names": dict(self.parameter_names)}
        if self.intermediate_scale_fill:  # written only where it is not 0 (manifests before it have none)
            out["intermediate_scale_fill"] = self.intermediate_scale_fill
        if self.engine_flags:  # written only where there are some (manifests before it have none)
            out["engine_flags"] = self.engine_flags
        if self.releases is not None:
            out["releases"] = [release.version for release in self.releases]
        return out | {"moe_parallelism": self.moe_parallelism} | self.extra

    @classmethod
    def from_json(cls, data: Any, where: object, path: str = "engine") -> "EngineRecord":
        f = _Fields(data, where, path)
        names = f.get(
            "parameter_names",
            lambda v: isinstance(v, dict) and all(isinstance(n, str) for n in v.values()),
            "an object of baked name: engine name",
        )
        strings: dict[str, Any] = {key: f.string(key) for key in cls._KEYS[:5]}
        integers: dict[str, Any] = {key: f.integer(key) for key in cls._KEYS[5:8]}
        return cls(
            **strings,
            **integers,
            verified=f.boolean("verified"),
            parameter_names=dict(names),
            exact=f.boolean("exact"),
            not_exact_because=f.string("not_exact_because", optional=True),
            intermediate_scale_fill=f.integer("intermediate_scale_fill", optional=True) or 0,
            moe_parallelism=f.string("moe_parallelism", optional=True) or EXPERT_PARALLEL_ONLY,
            engine_flags=f.string("engine_flags", optional=True) or "",
            releases=_releases(
                f.string("name"),
                f.get(
                    "releases",
                    lambda v: isinstance(v, list) and all(isinstance(r, str) for r in v),
                    "a list of release strings",
                    optional=True,
                ),
            ),
            extra=f.extra((*cls._KEYS, "intermediate_scale_fill", "moe_parallelism", "engine_flags", "releases")),
        )


def _releases(engine: str, versions: list[str] | None) -> tuple[EngineRelease, ...] | None:
    """A record's ``releases``, read: ``engine``'s releases of those versions (None where the manifest has none)."""
    return None if versions is None else tuple(EngineRelease(engine, version) for version in versions)


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The whole ``moebake.json`` (see the module docstring); ``extra`` keeps top-level fields added by newer writers."""

    moebake_version: str
    created: str | None
    target: str
    target_layout_version: int
    flashinfer_layout: FlashInferLayout | None
    flashinfer_layout_description: str | None
    source: SourceRecord
    options: dict
    activation: Activation
    layers: list[LayerRecord]
    files: dict[str, FileRecord]
    engine: EngineRecord | None = None
    serves: tuple[EngineRecord, ...] = ()
    schema: str = SCHEMA
    extra: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        layout = (
            None if self.flashinfer_layout is None else {"id": self.flashinfer_layout, "description": self.flashinfer_layout_description}
        )
        out = {"schema": self.schema, "moebake_version": self.moebake_version}
        if self.created is not None:
            out["created"] = self.created
        return (
            out
            | {
                "target": self.target,
                "target_layout_version": self.target_layout_version,
                "flashinfer_layout": layout,
                "source": self.source.to_json(),
                "options": dict(self.options),
                **({} if self.engine is None else {"engine": self.engine.to_json(), "serves": [e.to_json() for e in self.serves]}),
                "activation": self.activation.to_json(),
                "layers": [layer.to_json() for layer in self.layers],
                "files": {name: record.to_json() for name, record in self.files.items()},
            }
            | self.extra
        )

    @classmethod
    def from_json(cls, data: Any, where: object) -> "Manifest":
        f = _Fields(data, where, "")
        schema = f.get("schema", lambda v: v in KNOWN_SCHEMAS, f"one of {', '.join(KNOWN_SCHEMAS)}")
        layout = f.obj("flashinfer_layout", optional=True)
        layers = f.get("layers", lambda v: isinstance(v, list), "a list")
        files = f.obj("files")
        engine = f.obj("engine", optional=True)
        serves = f.get("serves", lambda v: isinstance(v, list), "a list", optional=True) or []
        return cls(
            moebake_version=f.string("moebake_version"),
            created=f.string("created", optional=True),
            target=f.string("target"),
            target_layout_version=f.integer("target_layout_version"),
            flashinfer_layout=None if layout is None else layout.choice("id", FlashInferLayout),
            flashinfer_layout_description=None if layout is None else layout.string("description", optional=True),
            source=SourceRecord.from_json(data.get("source"), where),
            options=f.obj("options").data,
            activation=Activation.from_json(data.get("activation"), where),
            layers=[LayerRecord.from_json(layer, where, f"layers[{i}]") for i, layer in enumerate(layers)],
            files={name: FileRecord.from_json(record, where, files.name(name)) for name, record in files.data.items()},
            engine=None if engine is None else EngineRecord.from_json(engine.data, where),
            serves=tuple(EngineRecord.from_json(e, where, f"serves[{i}]") for i, e in enumerate(serves)),
            schema=schema,
            extra=f.extra(
                (
                    "schema",
                    "moebake_version",
                    "created",
                    "target",
                    "target_layout_version",
                    "flashinfer_layout",
                    "source",
                    "options",
                    "engine",
                    "serves",
                    "activation",
                    "layers",
                    "files",
                )
            ),
        )


def _field_problems(path: Path, manifest: dict) -> list[str]:
    """The first field readers rely on that is missing or of the wrong type (:meth:`Manifest.from_json`)."""
    try:
        Manifest.from_json(manifest, path)
    except ManifestError as err:
        return [str(err)]
    return []


def rescaled_gate_up(manifest: "Manifest") -> tuple[int, int, float]:
    """``(experts rescaled, experts in all, largest relative change)`` of a bake whose NVFP4 gate/up globals
    were shared (``--gate-up-globals share``): those experts' block scales differ from the source by design.
    ``(0, experts, 0.0)`` for a bake that kept every source value."""
    reports = [layer.gate_up_global_scale for layer in manifest.layers if layer.gate_up_global_scale]
    rescaled = sum(report.get("experts_rescaled", 0) for report in reports)
    change = max((report.get("max_relative_change", 0.0) for report in reports), default=0.0)
    return rescaled, sum(layer.experts for layer in manifest.layers), change if rescaled else 0.0
