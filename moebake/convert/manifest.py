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

ALGORITHM is ``xxh3-128`` in new manifests (``sha256`` in older ones, and for source files whose
Hub-cache blob name is their SHA-256); see :mod:`moebake.convert.hashing`.
"""

import datetime
import json
import os
from pathlib import Path

from moebake.errors import MoebakeError

MANIFEST_NAME = "moebake.json"
SCHEMA = "moebake.manifest/1"
KNOWN_SCHEMAS = (SCHEMA,)


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def write_manifest(directory: Path, manifest: dict) -> None:
    """Write ``directory/moebake.json`` atomically (a temporary file renamed over it)."""
    temporary = Path(directory) / f".{MANIFEST_NAME}.tmp"
    with open(temporary, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, allow_nan=False)  # strict JSON: no bare NaN / Infinity
        f.write("\n")
    os.replace(temporary, Path(directory) / MANIFEST_NAME)


def tensor_sources(spec: dict) -> list[str]:
    """Source tensor names (or per-expert patterns) a layer record's tensor spec names in ``source``:
    one (a string), several (a list), or none (None: a tensor derived from others)."""
    source = spec.get("source")
    return [] if source is None else [source] if isinstance(source, str) else list(source)


def read_manifest(directory: str | Path) -> dict:
    """Load and check the schema of ``directory/moebake.json``; MoebakeError if absent or unknown."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        raise MoebakeError(f"{directory}: not a moebake output (no {MANIFEST_NAME})")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise MoebakeError(f"{path}: corrupt manifest ({err})") from None
    schema = manifest.get("schema") if isinstance(manifest, dict) else None
    if schema not in KNOWN_SCHEMAS:
        raise MoebakeError(f"{path}: unknown manifest schema {schema!r}; this moebake reads {', '.join(KNOWN_SCHEMAS)}")
    return manifest
