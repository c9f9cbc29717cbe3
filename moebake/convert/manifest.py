"""The manifest ``moebake.json``: what was baked, from what, how, and the checksum of every file.

Schema ``moebake.manifest/1`` (documented in the README; add fields freely, bump the number only
when a field changes meaning or a reader must refuse older files):

  schema, moebake_version, created (UTC ISO 8601), target, target_layout_version,
  flashinfer_layout {id, description} (null for targets it does not apply to),
  source {format, location, revision, files {name: "ALGORITHM:hex"}}  (before checksums were named: bare sha256 hex),
  options {...ConvertOptions}, activation {kind, alpha, beta, limit},
  layers [{index, prefix, experts, hidden, hidden_padded, intermediate, intermediate_padded,
           tensors {short name: {source, dtype, shape, gate_up_order, source_gate_up_order}}}],
  files {output file name: {ALGORITHM: hex, bytes}}   (every file in OUT except moebake.json itself)
  manifest_sha256   SHA-256 of every other field (see :func:`manifest_checksum`)

ALGORITHM is ``xxh3-128`` in new manifests (``sha256`` in older ones, and for source files whose
Hub-cache blob name is their SHA-256); see :mod:`moebake.convert.hashing`.

The manifest protects itself: the engine and ``moebake.serve`` trust its fields (target, layout,
activation limit, padding), so a changed field must not go unnoticed. :func:`write_manifest` stores
``manifest_sha256`` and writes one exact spelling (:func:`render_manifest`); :func:`load_manifest`
reports a checksum that does not match, or bytes that are not that spelling (an edit that keeps the
values, e.g. ``1e-05`` -> ``1E-05``), or fields of the wrong type. Every reader goes through it.
"""

import datetime
import hashlib
import json
import logging
import os
from pathlib import Path

from moebake.errors import MoebakeError
from moebake.formats.config_values import json_type, parse_json

MANIFEST_NAME = "moebake.json"
SCHEMA = "moebake.manifest/1"
KNOWN_SCHEMAS = (SCHEMA,)
CHECKSUM_KEY = "manifest_sha256"
LOG = logging.getLogger(__name__)
# Top-level fields every reader relies on, with their JSON types.
_FIELDS = {"schema": str, "moebake_version": str, "target": str, "target_layout_version": int, "source": dict,
           "options": dict, "activation": dict, "layers": list, "files": dict}


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def manifest_checksum(manifest: dict) -> str:
    """SHA-256 of the manifest without its ``manifest_sha256``: canonical JSON (sorted keys, no spaces, ASCII)."""
    fields = {key: value for key, value in manifest.items() if key != CHECKSUM_KEY}
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def render_manifest(manifest: dict) -> str:
    """The exact text of ``moebake.json`` for ``manifest``: its fields, then ``manifest_sha256``; strict
    JSON (no bare NaN / Infinity), two-space indent, a final newline."""
    fields = {key: value for key, value in manifest.items() if key != CHECKSUM_KEY}
    return json.dumps({**fields, CHECKSUM_KEY: manifest_checksum(fields)}, indent=2, allow_nan=False) + "\n"


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
        raise MoebakeError(f"{directory}: does not exist")
    if not directory.is_dir():
        raise MoebakeError(f"{directory}: not a directory (a moebake output is a directory with {MANIFEST_NAME})")
    if not path.is_file():
        raise MoebakeError(f"{directory}: not a moebake output (no {MANIFEST_NAME})")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise MoebakeError(f"{path}: cannot read ({err.strerror})") from None
    manifest = parse_json(raw, f"{path}: corrupt manifest")
    schema = manifest.get("schema") if isinstance(manifest, dict) else None
    if schema not in KNOWN_SCHEMAS:
        raise MoebakeError(f"{path}: unknown manifest schema {schema!r}; this moebake reads {', '.join(KNOWN_SCHEMAS)}")
    return manifest, _integrity_problems(path, raw, manifest) or _field_problems(path, manifest)


def read_manifest(directory: str | os.PathLike) -> dict:
    """:func:`load_manifest`'s manifest; MoebakeError (the first problem) unless it is intact."""
    manifest, problems = load_manifest(directory)
    if problems:
        raise MoebakeError(problems[0])
    return manifest


def _integrity_problems(path: Path, raw: bytes, manifest: dict) -> list[str]:
    recorded = manifest.get(CHECKSUM_KEY)
    if recorded is None and _written_before_checksums_were_named(manifest):
        LOG.warning("%s: written by a moebake before manifests carried %s: its fields are not protected "
                    "(re-bake with this moebake to protect them)", path, CHECKSUM_KEY)
        return []
    if recorded is None:
        return [f"{path}: has no {CHECKSUM_KEY}, so a changed field would go unnoticed"]
    try:
        text = render_manifest(manifest)
    except ValueError as err:
        return [f"{path}: not strict JSON ({err})"]
    if recorded != manifest_checksum(manifest):
        return [f"{path}: changed since moebake wrote it ({CHECKSUM_KEY} does not match its fields)"]
    if raw != text.encode("utf-8"):
        return [f"{path}: its bytes were edited since moebake wrote it (same fields, other spelling or spacing)"]
    return []


def _written_before_checksums_were_named(manifest: dict) -> bool:
    """A manifest from before named checksums (and so before ``manifest_sha256``): every file record is
    ``{sha256, bytes}``. A newer manifest that lost its ``manifest_sha256`` (say, a flipped bit in the
    key) has xxh3-128 records, so it is not taken for an old one."""
    files = manifest.get("files")
    return isinstance(files, dict) and bool(files) and all(isinstance(r, dict) and set(r) == {"sha256", "bytes"} for r in files.values())


def _field_problems(path: Path, manifest: dict) -> list[str]:
    """Fields readers rely on that are missing or of the wrong JSON type."""
    problems = [f"{path}: {key} is {json_type(manifest.get(key)) if key in manifest else 'missing'}, expected {kind.__name__}"
                for key, kind in _FIELDS.items() if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool)]
    if problems:
        return problems
    for name, record in manifest["files"].items():
        if not (isinstance(record, dict) and type(record.get("bytes")) is int):
            problems.append(f"{path}: files.{name} is not {{ALGORITHM: hex digest, bytes}}")
    for position, layer in enumerate(manifest["layers"]):
        if not (isinstance(layer, dict) and isinstance(layer.get("prefix"), str) and type(layer.get("experts")) is int
                and isinstance(layer.get("tensors"), dict)):
            problems.append(f"{path}: layers[{position}] is not a layer record with prefix, experts, tensors")
    return problems
