"""How a manifest names its source: a Hub repo id, or a local folder's name (never a local path).

A source argument reading ``org/name[@revision]`` names a Hub model repo (:func:`parse_repo_spec`); a Hugging Face cache
snapshot path names its repo (:func:`hub_repo_of`); any other local path is recorded by its folder's name only
(:func:`public_location`), because the manifest goes wherever the bake goes and ``upload`` publishes it.
"""

import os
import re

_CACHE_SNAPSHOT = re.compile(r"/models--([^/]+?)--([^/]+)/snapshots/[0-9a-f]{40}/?$")
_REPO_SPEC = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[^@\s]+))?")


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
