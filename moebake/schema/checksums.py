"""Checksums the manifest names: algorithms, file digests, output file records, source file tags.

The manifest names the algorithm of every checksum it holds (:data:`CHECKSUM` for new ones):

  * an output file's record is ``{ALGORITHM: hex digest, "bytes": size}`` (:func:`file_record`;
    manifests before named checksums have ``sha256``), read back by :func:`record_checksum`;
  * a source file's checksum is the string ``"ALGORITHM:hex"`` (:func:`tagged`; older manifests
    hold a bare SHA-256 hex digest), read back by :func:`parse_tagged`.

The converter, ``verify`` and the runtime all check files through :func:`checksum_problem`.
"""

import hashlib
import os
from collections.abc import Callable
from io import RawIOBase
from typing import Any, BinaryIO, cast

import xxhash

from moebake.errors import InvalidArgumentError
from moebake.schema.files import open_regular

CHECKSUM = "xxh3-128"
"""The algorithm of the checksums a conversion writes into a new manifest."""
ALGORITHMS: dict[str, Callable[..., Any]] = {"xxh3-128": xxhash.xxh3_128, "sha256": hashlib.sha256}
"""Checksum algorithms a manifest may name, by name: a constructor of hashlib-style objects."""

READ_BLOCK = 8 << 20


def hash_range(digest: Any, f: BinaryIO, start: int, stop: int | None = None) -> int:
    """Update ``digest`` with bytes ``[start, stop)`` of open file ``f`` (to its end if None); returns bytes hashed."""
    buffer = memoryview(bytearray(READ_BLOCK))
    readinto = cast(RawIOBase, f).readinto  # the files opened here (open_regular) are binary file objects
    f.seek(start)
    total = 0
    while stop is None or start + total < stop:
        want = READ_BLOCK if stop is None else min(READ_BLOCK, stop - start - total)
        if not (n := readinto(buffer[:want])):
            break
        digest.update(buffer[:n])
        total += n
    return total


def file_digest(path: str | os.PathLike, algorithm: str = CHECKSUM) -> str:
    """Hex digest of the regular file ``path`` by ``algorithm`` (a key of :data:`ALGORITHMS`);
    MoebakeError for anything else (a FIFO would block the read)."""
    digest = ALGORITHMS[algorithm]()
    with open_regular(path, buffering=0) as f:
        hash_range(digest, f, 0)
    return digest.hexdigest()


def file_record(path: str | os.PathLike, digest: str | None = None) -> dict:
    """The manifest record of an output file: ``{CHECKSUM: digest, "bytes": size}`` (``digest`` computed if None)."""
    return {CHECKSUM: digest or file_digest(path), "bytes": os.path.getsize(path)}


def record_checksum(record: dict) -> tuple[str, str]:
    """``(algorithm, hex digest)`` of an output file's manifest record; ValueError if it names none known."""
    for algorithm in ALGORITHMS:
        if isinstance(record.get(algorithm), str):
            return algorithm, record[algorithm]
    raise InvalidArgumentError(f"no checksum of a known algorithm ({', '.join(ALGORITHMS)}) in {sorted(record)}")


def checksum_problem(path: str | os.PathLike, record: dict) -> str | None:
    """One line if the file ``path`` does not match its manifest record's checksum, else None."""
    try:
        algorithm, expected = record_checksum(record)
    except ValueError as err:
        return f"{path}: {err}"
    if file_digest(path, algorithm) != expected:
        return f"{path}: {algorithm} mismatch (manifest {expected[:16]}...)"
    return None


def tagged(algorithm: str, digest: str) -> str:
    """A source file's checksum as the manifest holds it: ``"ALGORITHM:hex"``."""
    return f"{algorithm}:{digest}"


def parse_tagged(value: str) -> tuple[str, str]:
    """Inverse of :func:`tagged`; a bare hex digest (manifests before checksums were named) is SHA-256."""
    algorithm, separator, digest = value.rpartition(":")
    return (algorithm, digest) if separator else ("sha256", value)
