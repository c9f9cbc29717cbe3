"""File helpers of the kernels commands: hashed copies, walks that never follow links, all-or-nothing moves."""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from pathlib import Path

from moebake.schema.files import open_regular

BLOCK = 8 << 20


def sha256_file(path: Path) -> tuple[str, int]:
    """(sha256 hex, bytes) of the regular file ``path`` (MoebakeError for anything else)."""
    digest, total = hashlib.sha256(), 0
    with open_regular(path, buffering=0) as f:
        while chunk := f.read(BLOCK):
            digest.update(chunk)
            total += len(chunk)
    return digest.hexdigest(), total


def copy_hashed(source: Path, target: Path, mode: int = 0o644) -> tuple[str, int]:
    """Copy the regular file ``source`` to the new file ``target`` (which must not exist), fsynced; returns the sha256
    and size of the bytes written (read once: what was hashed is what was written)."""
    digest, total = hashlib.sha256(), 0
    with open_regular(source, buffering=0) as f, open(target, "xb") as out:
        while chunk := f.read(BLOCK):
            digest.update(chunk)
            out.write(chunk)
            total += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(target, mode)
    return digest.hexdigest(), total


def walk_regular(root: Path) -> tuple[list[str], list[str]]:
    """(regular files, other entries) under ``root``, as sorted ``/``-separated paths relative to it; symbolic links
    are reported, never followed."""
    found: list[str] = []
    other: list[str] = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        base = Path(folder)
        for name in list(dirs):
            if (base / name).is_symlink():
                other.append((base / name).relative_to(root).as_posix())
                dirs.remove(name)
        for name in names:
            path = base / name
            mode = os.lstat(path).st_mode
            (found if stat.S_ISREG(mode) else other).append(path.relative_to(root).as_posix())
    return sorted(found), sorted(other)


def temporary_name(target: Path, tag: str) -> Path:
    """A free name beside ``target`` for a file or folder being written: ``.<name>.<tag>-<random>``."""
    return target.with_name(f".{target.name}.{tag}-{secrets.token_hex(4)}")


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
