"""An engine release's Python tree, fetched from PyPI without its compiled parts: the oracle of that release.

A release is proven by running its own load-time code (``tests/engine_oracles``) on CPU. vLLM's wheels are
~300 MB, almost all compiled kernels the CPU oracles never load, so :func:`release_tree` reads the wheel's zip
directory over HTTP range requests and fetches only the members the oracles can execute: Python files and
the small data files beside them, plus the ``.dist-info`` that makes ``importlib.metadata`` report that
release. Trees are cached under ``$MOEBAKE_ENGINE_TREES`` (default ``~/.cache/moebake/engine-trees``), one
folder per ``<package>-<version>``, written under a temporary name and renamed into place when complete.

Put a tree first on ``PYTHONPATH`` (:func:`python_path`) and ``import sglang`` is that release's code.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import urllib.parse
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

INDEX = os.environ.get("MOEBAKE_PYPI_JSON", "https://pypi.org/pypi")
SKIPPED_SUFFIXES = (".so", ".cubin", ".fatbin", ".a", ".o", ".ptx", ".bin")
LARGEST_MEMBER = 4 << 20
"""Members other than Python files larger than this (4 MiB) are binaries or data the oracles never read: skipped."""
_MERGE_GAP = 1 << 20
_TIMEOUT = 120


def cache_root() -> Path:
    return Path(os.environ.get("MOEBAKE_ENGINE_TREES", Path.home() / ".cache" / "moebake" / "engine-trees"))


def release_tree(package: str, version: str) -> Path:
    """The folder holding ``package==version``'s Python tree (fetched once, then cached)."""
    tree = cache_root() / f"{package}-{version}"
    if (tree / ".complete").is_file():
        return tree
    url = wheel_url(package, version)
    tree.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{tree.name}.", dir=tree.parent))
    try:
        count = _extract_python_members(url, partial)
        (partial / ".complete").write_text(json.dumps({"url": url, "members": count}) + "\n")
        if tree.exists():
            shutil.rmtree(tree)
        partial.rename(tree)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return tree


def python_path(tree: Path) -> str:
    """``PYTHONPATH`` with ``tree`` first, so its release shadows any installed one."""
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(tree)] + ([rest] if rest else []))


def wheel_url(package: str, version: str) -> str:
    """The URL of an x86_64 Linux (or pure-Python) wheel of ``package==version`` on PyPI."""
    index_url = f"{INDEX}/{package}/json"
    with urllib.request.urlopen(index_url, timeout=_TIMEOUT) as response:
        releases = json.load(response)["releases"]
    files = releases.get(version) or []
    wheels = [f for f in files if f["filename"].endswith(".whl") and ("x86_64" in f["filename"] or "-none-any" in f["filename"])]
    if not wheels:
        raise LookupError(f"PyPI has no x86_64 or pure-Python wheel of {package}=={version}")
    # Any interpreter's wheel holds the same Python files; prefer the smallest.
    best = min(wheels, key=lambda f: f["size"])
    return urllib.parse.urljoin(index_url, best["url"])


class _RangeReader(io.RawIOBase):
    """A read-only, seekable view of a remote file: HTTP range requests, served from prefetched spans."""

    def __init__(self, url: str):
        self.url = url
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            self.size = int(response.headers["Content-Length"])
        self.position = 0
        self.spans: list[tuple[int, bytes]] = []

    def seekable(self):
        return True

    def readable(self):
        return True

    def tell(self):
        return self.position

    def seek(self, offset, whence=io.SEEK_SET):
        self.position = {io.SEEK_SET: offset, io.SEEK_CUR: self.position + offset, io.SEEK_END: self.size + offset}[whence]
        return self.position

    def fetch(self, start: int, end: int) -> bytes:
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={start}-{end - 1}"})
        with urllib.request.urlopen(request, timeout=_TIMEOUT) as response:
            data = response.read()
        if len(data) != end - start:
            raise OSError(f"{self.url}: asked for bytes {start}-{end - 1}, got {len(data)} bytes")
        return data

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for start, end in sorted(ranges):
            if merged and start - merged[-1][1] <= _MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        merged = [(start, min(end, self.size)) for start, end in merged]
        with ThreadPoolExecutor(8) as pool:
            self.spans = list(zip((s for s, _ in merged), pool.map(lambda span: self.fetch(*span), merged)))

    def readinto(self, buffer):
        want = min(len(buffer), self.size - self.position)
        if want <= 0:
            return 0
        end = self.position + want
        for start, data in self.spans:
            if start <= self.position and end <= start + len(data):
                buffer[:want] = data[self.position - start : end - start]
                break
        else:
            buffer[:want] = self.fetch(self.position, end)
        self.position = end
        return want


def _wanted(info: zipfile.ZipInfo) -> bool:
    name = info.filename
    if name.endswith("/") or ".so." in name or name.endswith(SKIPPED_SUFFIXES):
        return False
    return ".dist-info/" in name or name.endswith(".py") or info.file_size <= LARGEST_MEMBER


def _extract_python_members(url: str, into: Path) -> int:
    reader = _RangeReader(url)
    with zipfile.ZipFile(io.BufferedReader(reader, buffer_size=1 << 16)) as wheel:
        members = [info for info in wheel.infolist() if _wanted(info)]
        # a member's local header: 30 bytes, its name and an extra field (at most 64 KiB), then its data
        reader.prefetch([(m.header_offset, m.header_offset + 30 + len(m.filename.encode()) + 65536 + m.compress_size) for m in members])
        for member in members:
            wheel.extract(member, into)
    return len(members)


if __name__ == "__main__":
    import sys

    for spec in sys.argv[1:]:
        name, _, release = spec.partition("==")
        print(release_tree(name, release))
