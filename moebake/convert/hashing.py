"""SHA-256 of files: read in large blocks, or computed from reads a conversion makes anyway.

hashlib releases the GIL on large buffers, so hashing in a thread overlaps with the work.
"""

import hashlib
import os
import queue
import threading
import time

from moebake.convert.stages import STAGES

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


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        _hash_range(digest, f, 0)
    return digest.hexdigest()


class StreamHash:
    """SHA-256 of one file, computed from the reads that a conversion makes of it anyway.

    :meth:`feed` takes bytes just read at a file offset: bytes that continue the file from where
    hashing stands go, in order, to a background thread; bytes read out of order are ignored.
    :meth:`hexdigest` waits for that thread, then reads and hashes whatever the feeds did not
    cover, from where hashing stands to the end of the file. So a file read front to back (as a
    conversion reads a shard) is read once, and any other reading order still gives the exact digest.
    The first ``prefix`` bytes (a safetensors header, which converters do not read) are hashed at once.
    """

    def __init__(self, path: str | os.PathLike, prefix: int = 0):
        self.path = str(path)
        self._digest = hashlib.sha256()
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
        """The file's SHA-256 (call once)."""
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
