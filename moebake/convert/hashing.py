"""Checksums of files: read in large blocks, computed from reads a conversion makes anyway, or known.

The manifest names the algorithm of every checksum it holds (:data:`CHECKSUM` for new ones):

  * an output file's record is ``{ALGORITHM: hex digest, "bytes": size}`` (:func:`file_record`;
    manifests before this change have ``sha256``), read back by :func:`record_checksum`;
  * a source file's checksum is the string ``"ALGORITHM:hex"`` (:func:`tagged`; older manifests
    hold a bare SHA-256 hex digest), read back by :func:`parse_tagged`.

xxh3-128 (non-cryptographic, ~16 GB/s per core against SHA-256's ~1.5 GB/s) guards against
corruption in transfer or storage; SHA-256 stays where something needs it. A source file in a
Hugging Face cache snapshot whose symlink points to ``blobs/<sha256>`` already has its SHA-256 as its
name (the Hub's LFS object id): it is taken from there, not computed (:func:`hub_blob_sha256`).
hashlib and xxhash release the GIL on large buffers, so hashing in a thread overlaps with the work.
"""

import hashlib
import os
import queue
import re
import threading
import time
from pathlib import Path

import xxhash

from moebake.convert.stages import STAGES

CHECKSUM = "xxh3-128"
"""The algorithm of the checksums a conversion writes into a new manifest."""
ALGORITHMS = {"xxh3-128": xxhash.xxh3_128, "sha256": hashlib.sha256}
"""Checksum algorithms a manifest may name, by name: a constructor of hashlib-style objects."""
_SHA256_NAME = re.compile(r"[0-9a-f]{64}")

READ_BLOCK = 8 << 20
_PENDING_PIECES = 2  # pieces queued for hashing; a reader blocks (and so bounds memory) beyond this


def _hash_range(digest, f, start: int, stop: int | None = None) -> int:
    """Update ``digest`` with bytes ``[start, stop)`` of open file ``f`` (to its end if None); returns bytes hashed."""
    buffer = memoryview(bytearray(READ_BLOCK))
    f.seek(start)
    total = 0
    while stop is None or start + total < stop:
        want = READ_BLOCK if stop is None else min(READ_BLOCK, stop - start - total)
        if not (n := f.readinto(buffer[:want])):
            break
        digest.update(buffer[:n])
        total += n
    return total


def file_digest(path: str | os.PathLike, algorithm: str = CHECKSUM) -> str:
    """Hex digest of the file ``path`` by ``algorithm`` (a key of :data:`ALGORITHMS`)."""
    digest = ALGORITHMS[algorithm]()
    with open(path, "rb", buffering=0) as f:
        _hash_range(digest, f, 0)
    return digest.hexdigest()


def file_record(path: str | os.PathLike, digest: str | None = None) -> dict:
    """The manifest record of an output file: ``{CHECKSUM: digest, "bytes": size}`` (``digest`` computed if None)."""
    return {CHECKSUM: digest or file_digest(path), "bytes": os.path.getsize(path)}


def record_checksum(record: dict) -> tuple[str, str]:
    """``(algorithm, hex digest)`` of an output file's manifest record; ValueError if it names none known."""
    for algorithm in ALGORITHMS:
        if isinstance(record.get(algorithm), str):
            return algorithm, record[algorithm]
    raise ValueError(f"no checksum of a known algorithm ({', '.join(ALGORITHMS)}) in {sorted(record)}")


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


def hub_blob_sha256(path: str | os.PathLike) -> str | None:
    """The SHA-256 of a file of a Hugging Face cache snapshot, from its blob's name, else None.

    Only where the cache's structure is there: ``path`` is a symlink in
    ``<repo>/snapshots/<revision>/`` resolving to ``<repo>/blobs/<64 hex digits>`` (LFS files;
    small git-stored files are named by their git SHA-1 and are not trusted here).
    """
    path = Path(path)
    if not path.is_symlink():
        return None
    blob = Path(os.path.realpath(path))
    snapshots = path.absolute().parent.parent
    if (snapshots.name != "snapshots" or blob.parent.name != "blobs" or not _SHA256_NAME.fullmatch(blob.name)
            or not blob.is_file() or blob.parent.parent != Path(os.path.realpath(snapshots.parent))):
        return None
    return blob.name


class StreamHash:
    """Checksum (:data:`CHECKSUM`) of one file, computed from the reads that a conversion makes of it anyway.

    :meth:`feed` takes bytes just read at a file offset: bytes that continue the file from where
    hashing stands go, in order, to a background thread; bytes read out of order are ignored.
    :meth:`hexdigest` waits for that thread, then reads and hashes whatever the feeds did not
    cover, from where hashing stands to the end of the file. So a file read front to back (as a
    conversion reads a shard) is read once, and any other reading order still gives the exact digest.
    The first ``prefix`` bytes (a safetensors header, which converters do not read) are hashed at once.
    """

    def __init__(self, path: str | os.PathLike, prefix: int = 0):
        self.path = str(path)
        self._digest = ALGORITHMS[CHECKSUM]()
        with open(self.path, "rb", buffering=0) as f:
            self._position = _hash_range(self._digest, f, 0, prefix)
        self._queue: queue.Queue = queue.Queue(maxsize=_PENDING_PIECES)
        self._closed = False
        self._thread = threading.Thread(target=self._hash_pieces, name="moebake-source-hash", daemon=True)
        self._thread.start()

    def feed(self, offset: int, data) -> None:
        """Bytes ``data`` (a uint8 array or tensor, not modified afterwards) were read at ``offset``."""
        end = offset + len(data)
        if offset <= self._position < end and not self._closed:
            self._queue.put(memoryview(data.numpy() if hasattr(data, "numpy") else data)[self._position - offset:])
            self._position = end

    def hexdigest(self) -> str:
        """The file's hex digest (call once)."""
        self.close()
        began, began_cpu = time.perf_counter(), time.thread_time()
        with open(self.path, "rb", buffering=0) as f:
            caught_up = _hash_range(self._digest, f, self._position)
        STAGES.add("hash", time.perf_counter() - began, time.thread_time() - began_cpu, caught_up)
        self._position += caught_up
        return self._digest.hexdigest()

    def close(self) -> None:
        """Hash what is queued and stop the thread (without :meth:`hexdigest`, on an error path)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()

    def _hash_pieces(self) -> None:
        while (piece := self._queue.get()) is not None:
            with STAGES.timing("hash", len(piece)):
                self._digest.update(piece)
