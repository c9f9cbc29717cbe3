"""The output's ``config.json``: a ``quantization_config`` that only an engine with the moebake plugin accepts.

A baked checkpoint's expert tensors are neither the source's nor any stock engine's format. Left
with the source's ``quant_method`` (e.g. ``mxfp4``), a stock engine would start and skip the baked
tensors without a missing-key check (SGLang's GPT-OSS loader does), serving all-zero experts. So
the output's ``config.json`` is the source's with::

  "quantization_config": {
    "quant_method": "moebake",          # unknown to stock engines: they refuse at start-up
    "original": {...} | null,           # the source's quantization config (what non-MoE layers use)
    "original_file": "config.json" | "hf_quant_config.json" | null,   # where it was read from
    "manifest": "moebake.json",
    "manifest_sha256": "<hex>",         # see manifest_digest
    "target": ..., "engine": ..., "engine_version": ...
  }

``manifest_sha256`` is the SHA-256 of the manifest's canonical JSON (keys sorted, no whitespace)
without ``created`` and ``source.location`` (when and where it ran: the same bake writes the same
bytes), without ``kernels`` (compiled kernels added to the bake later, :mod:`moebake.kernels`), and
without the ``files`` entries of ``config.json`` itself and of the model card ``README.md`` (both
are written after the manifest's content is fixed): a loader or ``verify`` that recomputes it
catches a manifest changed after baking.
"""

import hashlib
import json
from pathlib import Path

from moebake.errors import MoebakeError
from moebake.schema.config_values import read_json_object
from moebake.schema.files import CONFIG_NAME

QUANT_METHOD = "moebake"
HF_QUANT_CONFIG = "hf_quant_config.json"
UNHASHED_FILES = (CONFIG_NAME, "README.md")
UNHASHED_FIELDS = ("created", "manifest_sha256", "kernels")
"""Left out of the bake digest: when it ran, the self-checksum (which covers config.json's entry), and the kernel sets
added after baking (:mod:`moebake.kernels`; the self-checksum covers them)."""


def manifest_digest(manifest: dict) -> str:
    """SHA-256 (hex) of ``manifest``'s canonical JSON, less :data:`UNHASHED_FIELDS`, ``source.location``
    and the ``files`` entries of :data:`UNHASHED_FILES`."""
    hashed = {key: value for key, value in manifest.items() if key not in UNHASHED_FIELDS}
    if isinstance(hashed.get("source"), dict):
        hashed["source"] = {key: value for key, value in hashed["source"].items() if key != "location"}
    hashed["files"] = {name: record for name, record in manifest.get("files", {}).items() if name not in UNHASHED_FILES}
    return hashlib.sha256(json.dumps(hashed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def source_quantization(source_root: Path, config: dict) -> tuple[dict | None, str | None]:
    """The source's quantization config and the file it is in (config.json's, else ModelOpt's side file)."""
    if isinstance(config.get("quantization_config"), dict):
        return config["quantization_config"], CONFIG_NAME
    side = Path(source_root) / HF_QUANT_CONFIG
    if side.is_file():
        return json.loads(side.read_text(encoding="utf-8")), HF_QUANT_CONFIG
    return None, None


def baked_config(source_root: Path, manifest: dict) -> dict:
    """The output's config.json content: the source's, with the moebake ``quantization_config``."""
    config = json.loads((Path(source_root) / CONFIG_NAME).read_text(encoding="utf-8"))
    original, original_file = source_quantization(source_root, config)
    engine = manifest["engine"]
    config["quantization_config"] = {
        "quant_method": QUANT_METHOD,
        "original": original,
        "original_file": original_file,
        "manifest": "moebake.json",
        "manifest_sha256": manifest_digest(manifest),
        "target": manifest["target"],
        "engine": engine["name"],
        "engine_version": engine["version"],
    }
    return config


def write_baked_config(source_root: Path, directory: Path, manifest: dict) -> None:
    """Write ``directory/config.json`` (see :func:`baked_config`)."""
    text = json.dumps(baked_config(source_root, manifest), indent=2) + "\n"
    (Path(directory) / CONFIG_NAME).write_text(text, encoding="utf-8")


def digest_refusal(manifest: dict, quantization_config: dict, where: str | Path) -> str | None:
    """One line if config.json's ``quantization_config.manifest_sha256`` is not the digest of ``manifest`` (the
    manifest JSON as read), else None: what every server checks before it trusts the manifest."""
    if quantization_config.get("manifest_sha256") == manifest_digest(manifest):
        return None
    return (
        f"{where}: config.json and manifest disagree (manifest_sha256 differs: the manifest changed after baking); "
        "run `moebake verify` on the checkpoint, or re-bake"
    )


def config_problems(out: Path, manifest: dict) -> list[str]:
    """One line per way ``out/config.json`` fails to name this manifest (for ``verify``)."""
    path = Path(out) / CONFIG_NAME
    try:
        quant = read_json_object(path).get("quantization_config")  # a regular file only: a FIFO would block
    except MoebakeError as err:
        return [str(err)]
    if not isinstance(quant, dict) or quant.get("quant_method") != QUANT_METHOD:
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        return [
            f"{path}: quantization_config.quant_method is {method!r}, expected {QUANT_METHOD!r} "
            "(a stock engine would load this bake as its source format)"
        ]
    refusal = digest_refusal(manifest, quant, path)
    return [refusal] if refusal else []
