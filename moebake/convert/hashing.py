"""Checksums computed from reads a conversion makes anyway (:class:`StreamHash`), or known from a Hub cache.

The algorithms and the manifest's checksum records live in :mod:`moebake.schema.checksums`. A
source file in a Hugging Face cache snapshot whose symlink points to ``blobs/<sha256>`` already has
its SHA-256 as its name (the Hub's LFS object id): it is taken from there, not computed
(:func:`hub_blob_sha256`). hashlib and xxhash release the GIL on large buffers, so hashing in a
thread overlaps with the work.
"""

import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from moebake.convert.stages import STAGES
from moebake.schema.checksums import ALGORITHMS, CHECKSUM, hash_range

if TYPE_CHECKING:
    import numpy as np
    import torch

_SHA256_NAME = re.compile(r"[0-9a-f]{64}")
_PENDING_PIECES = 2  # pieces queued for hashing; a reader blocks (and so bounds memory) beyond this


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
    if (
        snapshots.name != "snapshots"
        or blob.parent.name != "blobs"
        or not _SHA256_NAME.fullmatch(blob.name)
        or not blob.is_file()
        or blob.parent.parent != Path(os.path.realpath(snapshots.parent))
    ):
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
            self._position = hash_range(self._digest, f, 0, prefix)
        self._queue: queue.Queue = queue.Queue(maxsize=_PENDING_PIECES)
        self._closed = False
        self._thread = threading.Thread(target=self._hash_pieces, name="moebake-source-hash", daemon=True)
        self._thread.start()

    def feed(self, offset: int, data: "bytes | memoryview | np.ndarray | torch.Tensor") -> None:
        """Bytes ``data`` (a uint8 array or tensor, not modified afterwards) were read at ``offset``."""
        end = offset + len(data)
        if offset <= self._position < end and not self._closed:
            self._queue.put(memoryview(data.numpy() if hasattr(data, "numpy") else data)[self._position - offset :])
            self._position = end

    def hexdigest(self) -> str:
        """The file's hex digest (call once)."""
        self.close()
        began, began_cpu = time.perf_counter(), time.thread_time()
        with open(self.path, "rb", buffering=0) as f:
            caught_up = hash_range(self._digest, f, self._position)
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
