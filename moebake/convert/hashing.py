"""SHA-256 of files, read in large blocks (hashlib releases the GIL, so threads overlap with work)."""

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor

READ_BLOCK = 8 << 20


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(READ_BLOCK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            digest.update(view[:n])
    return digest.hexdigest()


def hash_files_in_background(paths: dict[str, str | os.PathLike]) -> "Future[dict[str, str]]":
    """Start hashing ``{key: path}`` in one background thread; the future yields ``{key: sha256}``."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moebake-hash")
    future = pool.submit(lambda: {key: file_sha256(path) for key, path in paths.items()})
    pool.shutdown(wait=False)
    return future
