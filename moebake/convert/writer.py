"""Streaming safetensors writer: header first (from the planned shapes), then one chunk at a time.

``safetensors.torch.save_file`` needs every tensor of a shard in memory; here the header is
computed from the plan and each tensor's bytes are streamed from its producer. The caller's thread
produces chunk ``i + 1`` (reads and transforms) while a writer thread hashes and writes chunk ``i``
(hashing and file writes release the GIL, so the two run on separate cores). The file is written
with ``O_DIRECT`` where the file system allows it (:class:`moebake.convert.direct_io.OutputFile`). At most
:data:`QUEUE_DEPTH` finished chunks wait between them, so memory stays bounded by a few chunks.
The file's checksum (:data:`~moebake.convert.hashing.CHECKSUM`) is computed over exactly the bytes written.
"""

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from moebake.convert.direct_io import OutputFile
from moebake.convert.plan import OutputShard
from moebake.convert.stages import STAGES
from moebake.errors import InternalError
from moebake.formats.safetensors_file import encode_header
from moebake.layouts.parallel import helper_cpu_seconds
from moebake.schema.checksums import ALGORITHMS, CHECKSUM

SHARD_METADATA = {"format": "pt"}  # transformers refuses shards whose metadata lacks a known format
QUEUE_DEPTH = 2
SYNC_EVERY = 128 << 20
"""After every this many bytes written, a flusher thread flushes them to the disk (``fdatasync``)
while writing goes on: the disk writes while the CPU works, the final ``fsync`` is short, and
dirty pages stay few."""


def write_shard(shard: OutputShard, path: str | os.PathLike, on_bytes: Callable[[int], object] = lambda n: None) -> str:
    """Write ``shard`` to ``path`` (fsynced) and return the file's hex digest (:data:`CHECKSUM`).

    ``on_bytes(n)`` is called (from the writer thread) after each chunk with the number of data
    bytes just written. An OSError (a full disk) names ``path``.
    """
    try:
        return _write_shard(shard, path, on_bytes)
    except OSError as err:  # a failed write names no file: name the shard
        if err.filename is None:
            raise OSError(err.errno, err.strerror or str(err), str(path)) from None
        raise


def shard_file_bytes(shard: OutputShard) -> int:
    """The size of ``shard``'s file as :func:`write_shard` writes it: its safetensors header, then its tensors' bytes."""
    return len(_header(shard)) + shard.nbytes


def _header(shard: OutputShard) -> bytes:
    header, _ = encode_header([(t.name, t.dtype, t.shape) for t in shard.tensors], SHARD_METADATA)
    return header


def _write_shard(shard: OutputShard, path: str | os.PathLike, on_bytes: Callable[[int], object]) -> str:
    header = _header(shard)
    f = OutputFile(path)
    f.write(header)
    writer = _WriterThread(f, ALGORITHMS[CHECKSUM](header), on_bytes)
    try:
        for tensor in shard.tensors:
            written = 0
            for data in _timed_chunks(tensor.produce()):
                writer.put(data)
                written += len(data)
            if written != tensor.nbytes:
                raise InternalError(f"producer of {tensor.name} wrote {written} bytes, planned {tensor.nbytes}")
        return writer.finish()
    except BaseException:
        writer.stop()
        f.abandon()
        raise


def _timed_chunks(chunks: Iterator[torch.Tensor]) -> Iterator[memoryview]:
    """The producer's chunks as flat byte views; their production time, less this thread's reads
    (and waits for reads), counts as ``transform`` (CPU: this thread's and the layout helper threads')."""
    while True:
        began, (read_before, read_cpu_before) = time.perf_counter(), STAGES.own_reading()
        began_cpu = time.thread_time() + helper_cpu_seconds()
        chunk = next(chunks, None)
        if chunk is None:
            return
        data = memoryview(chunk.contiguous().view(-1).view(torch.uint8).numpy())
        read, read_cpu = STAGES.own_reading()
        STAGES.add(
            "transform",
            time.perf_counter() - began - (read - read_before),
            time.thread_time() + helper_cpu_seconds() - began_cpu - (read_cpu - read_cpu_before),
            len(data),
        )
        yield data


class _WriterThread:
    """Hashes and writes byte chunks to :class:`OutputFile` ``f``, in order, in a thread of its own."""

    def __init__(self, f: OutputFile, digest: Any, on_bytes: Callable[[int], object]):
        self._f, self._digest, self._on_bytes = f, digest, on_bytes
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_DEPTH)
        self._error: BaseException | None = None
        self._flusher = _Flusher(f.sync_written)
        self._thread = threading.Thread(target=self._run, name="moebake-writer", daemon=True)
        self._thread.start()

    def put(self, data: memoryview | None) -> None:
        """Queue ``data`` (waits while the queue is full); raises what the writer thread raised."""
        while True:
            if self._error is not None:
                raise self._error
            try:
                self._queue.put(data, timeout=0.1)
                return
            except queue.Full:
                continue

    def finish(self) -> str:
        """Write what is queued, close the file (fsynced), and return the digest; raises what the writer thread raised."""
        self.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        self._flusher.close()
        with STAGES.timing("write", 0):
            self._f.close()
        return self._digest.hexdigest()

    def stop(self) -> None:
        """Stop the thread without finishing (the caller is failing); drops what is queued."""
        self._error = self._error or InterruptedError("writer stopped")
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                pass
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            self._thread.join(timeout=0.1)
        self._flusher.close(raise_errors=False)

    def _run(self) -> None:
        unsynced = 0
        try:
            while (data := self._queue.get()) is not None and self._error is None:
                with STAGES.timing("hash", len(data)):
                    self._digest.update(data)
                with STAGES.timing("write", len(data)):
                    self._f.write(data)
                    unsynced += len(data)
                    if unsynced >= SYNC_EVERY:
                        self._flusher.request()
                        unsynced = 0
                self._on_bytes(len(data))
        except BaseException as err:  # handed to the producing thread by put/finish
            self._error = err


class _Flusher:
    """``sync()`` (an ``fdatasync``) in a thread of its own, whenever :meth:`request`-ed."""

    def __init__(self, sync: Callable[[], None]):
        self._sync, self._wanted, self._closing = sync, threading.Event(), False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="moebake-flusher", daemon=True)
        self._thread.start()

    def request(self) -> None:
        self._wanted.set()

    def close(self, raise_errors: bool = True) -> None:
        """Stop (after a flush under way); raises the error a flush met, if any."""
        self._closing = True
        self._wanted.set()
        self._thread.join()
        if self._error is not None and raise_errors:
            raise self._error

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            if self._closing:
                return
            try:
                with STAGES.timing("write", 0):
                    self._sync()
            except OSError as err:  # raised by close(), from the writing side
                self._error = err
                return
