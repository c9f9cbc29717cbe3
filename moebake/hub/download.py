"""Hub repos as conversion sources: ``org/name[@revision]`` -> a local snapshot of the files needed.

A source argument that is not an existing local path but reads ``org/name`` or
``org/name@revision`` (a branch, tag, commit or ``refs/pr/N``) is a Hub model repo. Only the files
a conversion reads or copies are downloaded, from the repo's root (``original/``, ``metal/`` and
other sub-folders are skipped): the safetensors shards and index, ``config.json`` and the other
JSON side files (generation config, tokenizer), tokenizer/chat-template files and the licence.
They land in the Hugging Face cache (``HF_HUB_CACHE``), so a second run downloads nothing, and
``HF_HUB_OFFLINE=1`` works from the cache. The snapshot folder is named by the resolved commit,
which the manifest records as the source revision.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from moebake.errors import HubError, OptionError
from moebake.hub.client import HUB_ERRORS, OFFLINE, UNREACHABLE, hub_error, hub_reason
from moebake.schema.source_location import parse_repo_spec

if TYPE_CHECKING:
    from huggingface_hub import HfApi

SOURCE_PATTERNS = ["*.safetensors", "*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken", "LICENSE*", "USAGE_POLICY*"]
"""Root-level files a conversion needs (fnmatch patterns, as ``snapshot_download`` applies them)."""
SUBFOLDERS = ["*/*"]
"""Ignored: anything below the root (``*`` matches ``/`` in these patterns)."""

_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class ResolvedSource:
    """Where a source checkpoint is on disk and, for a Hub source, which repo and commit it is."""

    path: Path
    repo_id: str | None = None  # None for a local source
    revision: str | None = None  # the resolved commit sha of a Hub source


def resolve_source(text: str | os.PathLike, client: HfApi, revision: str | None = None) -> ResolvedSource:
    """A local path as is; otherwise a Hub repo spec, downloaded with ``client`` (see :mod:`moebake.hub.client`).

    ``revision`` (``--revision``) is the same as ``@REVISION`` in the spec, for Hub sources only.
    Text that is neither an existing path nor a repo spec is returned as a (missing) local path, for
    the checkpoint reader to report.
    """
    path = Path(text)
    spec = None if path.exists() else parse_repo_spec(str(text))
    if spec is None:
        if revision is not None:
            raise OptionError(f"{text}: --revision {revision} applies to a Hub source (ORG/NAME), not a local path")
        return ResolvedSource(path)
    repo_id, spec_revision = spec
    if revision is not None and spec_revision is not None and revision != spec_revision:
        raise OptionError(f"{text}: names revision {spec_revision}, but --revision says {revision}")
    return download_source(repo_id, revision or spec_revision, client)


def download_source(repo_id: str, revision: str | None, client: HfApi) -> ResolvedSource:
    """Download the files a conversion needs from ``repo_id`` at ``revision`` (default branch if None)."""
    spec = repo_id + (f"@{revision}" if revision else "")
    try:
        folder = client.snapshot_download(repo_id, revision=revision, allow_patterns=SOURCE_PATTERNS, ignore_patterns=SUBFOLDERS)
    except HUB_ERRORS as err:
        reason = hub_reason(err)
        if reason is None:
            raise hub_error(f"{spec}: not a local path, and downloading it from the Hugging Face Hub failed", err) from None
        if reason == OFFLINE or reason.startswith(UNREACHABLE):
            cached = " and the Hugging Face cache does not have it" if reason == OFFLINE else ""
            raise HubError(f"{spec}: neither a local folder nor reachable on the Hugging Face Hub: {reason}{cached}{_near(spec)}") from None
        raise HubError(f"{spec}: not a local folder, and {reason}{_near(spec)}") from None  # no such repo or revision
    commit = Path(folder).name
    if not _COMMIT.fullmatch(commit):
        raise HubError(f"{spec}: downloaded to {folder}, which is not a cache snapshot folder named by its commit")
    return ResolvedSource(Path(folder), repo_id, commit)


def _near(spec: str) -> str:
    """``; ./ORG is a local folder: check the path`` where the repo spec's first part is a local folder (a mistyped
    local path, more likely than a Hub repo), else nothing."""
    first = spec.split("/", 1)[0]
    return f"; ./{first} is a local folder: check the path" if Path(first).is_dir() else ""
