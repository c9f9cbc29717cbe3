"""Copy byte ranges of files into device tensors, through a small ring of pinned staging buffers.

Each range is cut into chunks of ``chunk_bytes``. For a CUDA destination, ``slots`` worker threads
read chunks from the file (``os.preadv``, no Python-level copy) straight into a ring of ``buffers``
pinned host buffers (``buffers >= slots``; chunk ``i`` goes to buffer ``i % buffers``), at most
``slots`` reads at a time; the calling thread then issues one asynchronous host-to-device copy per
chunk, in chunk order, into its place in the destination tensor and records an event, and a buffer
is refilled only after its copy has finished. With ``buffers == slots`` the buffer a read needs is
the one whose copy was issued just before, so the calling thread waits for each copy in turn; each
extra buffer lets one more copy run while the reads go on. Disk (or page cache) reads, H2D copies
and the next reads overlap; host memory is bounded by ``buffers * chunk_bytes`` whatever the tensor
sizes. For a CPU destination the threads read directly into the destination (no staging at all),
unless ``staged=True`` is asked for (tests use that to run the staged pipeline without a GPU).

Files are read with the kernel's readahead off (``POSIX_FADV_RANDOM`` on the reader's own descriptors): a rank
reads its slice of each tensor, and readahead past a slice's end would fetch the next rank's bytes from the disk
too. Each read is a whole chunk, so the reads stay large.

A reader keeps its ``slots`` reading threads and its ring between calls (one reader per device can serve every
load of a process: the experts' and the other tensors'); :meth:`StagedReader.close` ends the threads and frees
the ring. Every read a call started has ended before the call returns or raises. The first staged call allocates the
ring (``buffers`` pinned buffers of ``chunk_bytes``) inside its clock, unless :meth:`StagedReader.start_ring` began
pinning it earlier, in a reading thread (a loader calls it as the model is built, before its first read); then the
first call waits for that. :attr:`StagedReader.ring_seconds` says how long the allocations took, in all, and
:attr:`StagedReader.ring_wait_seconds` how long read calls spent on them (allocating, or waiting).

``on_consumed`` (None, or ``(path, range offset, nbytes)``): told of every chunk once its bytes have left the file
(staged: when the chunk's read has ended; unstaged: when the call's reads have); a
:class:`~moebake.loading.readahead.ReadAhead` counts the loader's progress through its plan with it.
"""

import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from moebake.errors import InvalidArgumentError, MoebakeError
from moebake.progress_bars import rate_text, size_text

DEFAULT_CHUNK_BYTES = 8 << 20
DEFAULT_SLOTS = 8


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``[offset, offset + dest.numel())`` of file ``path`` go to ``dest`` (1-D uint8, contiguous)."""

    path: str
    offset: int
    dest: torch.Tensor
    name: str  # the tensor these bytes belong to, for error messages


@dataclass(frozen=True)
class LoadStats:
    """What one load read and how long it took (wall clock, until the data is on the device)."""

    bytes: int
    seconds: float
    tensors: int
    device: str

    def __str__(self) -> str:
        """In the CLI's decimal units: ``6 tensors, 1.85 GB to cuda:0 in 0.064 s (28.9 GB/s)``."""
        speed = rate_text(self.bytes, self.seconds)
        return f"{self.tensors} tensors, {size_text(self.bytes)} to {self.device} in {self.seconds:.3f} s ({speed})"


def pread_fully(fd: int, view: memoryview, offset: int) -> int:
    """Fill ``view`` with the bytes of ``fd`` from ``offset`` on (``preadv`` until it is full); the bytes read, fewer
    than ``len(view)`` only where the file ends first."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done


def _pread_into(fd: int, buffer: torch.Tensor, offset: int, piece: ByteRange) -> None:
    """Fill 1-D uint8 CPU ``buffer`` with the file bytes at ``offset``; MoebakeError if the file ends early."""
    view = memoryview(buffer.numpy())
    done = pread_fully(fd, view, offset)
    if done < len(view):
        raise MoebakeError(f"{piece.path}: tensor {piece.name} is truncated (file ends at byte {offset + done})")


def _settle(futures: list[Future]) -> None:
    """Wait for every one of ``futures``, then raise the first one's error (in list order) if any failed."""
    wait(futures)
    for future in futures:
        future.result()


def open_without_readahead(path: str) -> int:
    """A read-only descriptor of ``path`` whose reads fetch only the bytes asked for (no readahead, where the
    platform has ``posix_fadvise``)."""
    fd = os.open(path, os.O_RDONLY)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


@dataclass(frozen=True)
class _Chunk:
    piece: ByteRange
    offset: int
    dest: torch.Tensor


class StagedReader:
    """Reads :class:`ByteRange` lists to one device; re-usable (its staging buffers are kept)."""

    def __init__(
        self,
        device: torch.device,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        slots: int = DEFAULT_SLOTS,
        buffers: int | None = None,
        staged: bool | None = None,
    ):
        self.device = torch.device(device)
        self.chunk_bytes, self.slots = chunk_bytes, slots
        self.buffers = slots if buffers is None else buffers  # the ring's size
        if self.buffers < slots:
            raise InvalidArgumentError(f"a ring of {self.buffers} buffers for {slots} reading threads: it needs at least one each")
        self.staged = self.device.type != "cpu" if staged is None else staged
        self._staging: list[torch.Tensor] = []  # the ring: its pinned buffers
        self._events: list = []
        self._executor: ThreadPoolExecutor | None = None
        self.on_consumed: Callable[[str, int, int], None] | None = None
        self.ring_seconds = 0.0  # wall clock spent allocating the staging ring, every allocation (after close) summed
        self.ring_wait_seconds = 0.0  # of the read calls' wall clock, what they spent allocating it or waiting for it
        self._ring_started: Future | None = None  # start_ring's allocation, until a read (or close) takes it

    def _consumed(self, chunk: "_Chunk") -> None:
        if self.on_consumed is not None:
            self.on_consumed(chunk.piece.path, chunk.piece.offset, chunk.dest.numel())

    def _pool(self) -> ThreadPoolExecutor:
        """The reading threads (``slots`` of them), started on the first read and kept for the next."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="moebake-read")
        return self._executor

    def close(self) -> None:
        """End the reading threads and free the staging ring; a later :meth:`read` starts them again."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._executor, self._staging, self._events, self._ring_started = None, [], [], None

    def start_ring(self) -> None:
        """Begin pinning the staging ring now, in one of the reading threads (started here), so that the first read
        finds it ready or nearly: for a staged reader without a ring, else nothing. The thread pins with this
        reader's CUDA device current (no context on another device)."""
        if self.staged and not self._staging and self._ring_started is None:
            self._ring_started = self._pool().submit(self._allocate_ring)

    def _allocate_ring(self) -> tuple[list[torch.Tensor], list]:
        """``buffers`` buffers of ``chunk_bytes`` (pinned for a CUDA device) and their events; adds to ``ring_seconds``."""
        begin = time.perf_counter()
        pin = self.device.type == "cuda"
        with torch.cuda.device(self.device) if pin else nullcontext():
            buffers = [torch.empty(self.chunk_bytes, dtype=torch.uint8, device="cpu", pin_memory=pin) for _ in range(self.buffers)]
        events = [torch.cuda.Event() if pin else None for _ in range(self.buffers)]
        self.ring_seconds += time.perf_counter() - begin
        return buffers, events

    def _ring(self) -> tuple[list[torch.Tensor], list]:
        if not self._staging:
            begin = time.perf_counter()
            started, self._ring_started = self._ring_started, None
            self._staging, self._events = started.result() if started is not None else self._allocate_ring()
            self.ring_wait_seconds += time.perf_counter() - begin
        return self._staging, self._events

    def _chunks(self, ranges: list[ByteRange]) -> list[_Chunk]:
        chunks = []
        for piece in ranges:
            for start in range(0, piece.dest.numel(), self.chunk_bytes):
                dest = piece.dest[start : start + self.chunk_bytes]
                chunks.append(_Chunk(piece, piece.offset + start, dest))
        return chunks

    def read(self, ranges: list[ByteRange]) -> LoadStats:
        """Copy every range to its destination; returns when the bytes are on the device."""
        begin = time.perf_counter()
        chunks = self._chunks(ranges)
        fds = {}
        try:
            for piece in ranges:
                if piece.path not in fds:
                    fds[piece.path] = open_without_readahead(piece.path)
            if self.staged:
                self._read_staged(chunks, fds, self._pool())
            else:
                _settle([self._pool().submit(_pread_into, fds[c.piece.path], c.dest, c.offset, c.piece) for c in chunks])
                for chunk in chunks:
                    self._consumed(chunk)
        finally:
            for fd in fds.values():
                os.close(fd)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        total = sum(piece.dest.numel() for piece in ranges)
        return LoadStats(total, time.perf_counter() - begin, len({p.name for p in ranges}), str(self.device))

    def _read_staged(self, chunks: list[_Chunk], fds: dict[str, int], pool: ThreadPoolExecutor) -> None:
        buffers, events = self._ring()
        in_flight: deque = deque()

        def finish_oldest() -> None:
            chunk, slot, staging, future = in_flight.popleft()
            future.result()
            self._consumed(chunk)
            chunk.dest.copy_(staging, non_blocking=True)
            if events[slot] is not None:
                events[slot].record()

        try:
            for i, chunk in enumerate(chunks):
                slot = i % len(buffers)
                if len(in_flight) == self.slots:
                    finish_oldest()  # chunk i - slots: buffers >= slots, so the buffer's last chunk's copy is issued
                if events[slot] is not None:
                    events[slot].synchronize()  # the buffer's previous H2D copy has finished
                staging = buffers[slot][: chunk.dest.numel()]
                read = pool.submit(_pread_into, fds[chunk.piece.path], staging, chunk.offset, chunk.piece)
                in_flight.append((chunk, slot, staging, read))
            while in_flight:
                finish_oldest()
        finally:  # after an error: let running reads end before their file is closed or their buffer reused
            wait([future for _, _, _, future in in_flight])


def own_reader(
    device: torch.device | str, *, chunk_bytes: int | None = None, slots: int | None = None, staged: bool | None = None
) -> StagedReader:
    """A :class:`StagedReader` onto ``device``, with the defaults where an option is None."""
    options = {k: v for k, v in (("chunk_bytes", chunk_bytes), ("slots", slots)) if v is not None}
    return StagedReader(torch.device(device), staged=staged, **options)
