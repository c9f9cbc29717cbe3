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

import os
import re
from dataclasses import dataclass
from pathlib import Path

from moebake.errors import HubError, OptionError
from moebake.hub.client import HUB_ERRORS, hub_error

SOURCE_PATTERNS = ["*.safetensors", "*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken", "LICENSE*", "USAGE_POLICY*"]
"""Root-level files a conversion needs (fnmatch patterns, as ``snapshot_download`` applies them)."""
SUBFOLDERS = ["*/*"]
"""Ignored: anything below the root (``*`` matches ``/`` in these patterns)."""

_CACHE_SNAPSHOT = re.compile(r"/models--([^/]+?)--([^/]+)/snapshots/[0-9a-f]{40}/?$")
_REPO_SPEC = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[^@\s]+))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class ResolvedSource:
    """Where a source checkpoint is on disk and, for a Hub source, which repo and commit it is."""

    path: Path
    repo_id: str | None = None   # None for a local source
    revision: str | None = None  # the resolved commit sha of a Hub source


def parse_repo_spec(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` if ``text`` reads ``org/name[@revision]``, else None."""
    match = _REPO_SPEC.fullmatch(text)
    return (match["repo"], match["revision"]) if match else None


def hub_repo_of(location: str | None) -> str | None:
    """The Hub repo id a manifest's source location names: ``org/name`` itself, or the repo of a
    Hugging Face cache snapshot path ``.../models--org--name/snapshots/<sha>``; else None."""
    if not location:
        return None
    spec = parse_repo_spec(location)
    if spec and spec[1] is None:
        return spec[0]
    match = _CACHE_SNAPSHOT.search(location)
    return f"{match[1]}/{match[2]}" if match else None


def public_location(location: str | os.PathLike) -> str:
    """The source location a manifest records, which goes wherever the bake goes (``upload`` publishes it): a Hub
    repo id as it is, the repo id of a Hugging Face cache snapshot path, else the local folder's name only. The
    rest of a local path (which can name the user, the machine's layout, the host) is never recorded."""
    return hub_repo_of(str(location)) or os.path.basename(os.path.normpath(location))


def resolve_source(text: str | os.PathLike, client, revision: str | None = None) -> ResolvedSource:
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


def download_source(repo_id: str, revision: str | None, client) -> ResolvedSource:
    """Download the files a conversion needs from ``repo_id`` at ``revision`` (default branch if None)."""
    spec = repo_id + (f"@{revision}" if revision else "")
    try:
        folder = client.snapshot_download(repo_id, revision=revision, allow_patterns=SOURCE_PATTERNS,
                                          ignore_patterns=SUBFOLDERS)
    except HUB_ERRORS as err:
        raise hub_error(f"{spec}: not a local path, and downloading it from the Hugging Face Hub failed", err) from None
    commit = Path(folder).name
    if not _COMMIT.fullmatch(commit):
        raise HubError(f"{spec}: downloaded to {folder}, which is not a cache snapshot folder named by its commit")
    return ResolvedSource(Path(folder), repo_id, commit)
