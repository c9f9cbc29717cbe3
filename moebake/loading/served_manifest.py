"""A bake's manifest as a server reads it: strictly, and only if config.json names exactly this manifest.

Both engine plugins start here: the manifest is read by the one manifest reader (strict JSON, its own
checksum, field types; as ``moebake verify`` reads it), then config.json's
``quantization_config.manifest_sha256`` must be its digest, so a manifest changed after baking is
never trusted. Problems are one-line :class:`~moebake.errors.MoebakeError`\\ s the caller re-raises
as its engine's refusal.
"""

from pathlib import Path

from moebake.errors import ManifestError
from moebake.schema.config_json import digest_refusal
from moebake.schema.manifest import MANIFEST_NAME, Manifest, read_manifest


def read_served_manifest(directory: str | Path, quantization_config: dict) -> Manifest:
    """The typed manifest of the bake in ``directory``, checked against config.json's ``quantization_config``."""
    directory = Path(directory)
    raw = read_manifest(directory)
    if refusal := digest_refusal(raw, quantization_config, directory / MANIFEST_NAME):
        raise ManifestError(refusal)
    return Manifest.from_json(raw, directory / MANIFEST_NAME)  # validated by read_manifest: the typed records
