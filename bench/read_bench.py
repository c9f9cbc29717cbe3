"""Benchmark (not a test): how close a rank's reads of its byte ranges come to the limit, read several ways, and how
many bytes each way reads beyond those ranges: cold (``--cache cold``, the default), against the disk's limit, or warm
(``--cache warm``), against the page cache's.

A file (``make``: pseudo-random, non-zero bytes) stands for a bake's shards. It is cut into segments of
``--segment-mib`` S MiB (default 512: one baked tensor); rank K of R needs bytes ``[K*S/R, (K+1)*S/R)`` of each
segment (integer division), as a rank needs its rows of each expert tensor: one contiguous range per segment, the
next rank's rows right after it. A last, partial segment gives the same range clipped to the file's end, or none
where the file ends before it (the rank ranges: :func:`rank_ranges`). Each method below reads, from a cold page
cache, either the rank ranges into ONE preallocated uint8 tensor of the rank's bytes on ``--device`` (sliced per
range; made once, reused by every method; on the CPU device that is host RAM, fine for a test-sized file), or the
whole file (the limits, into a 16 MiB buffer per thread). No method holds the file in host RAM.

* ``limit-buffered``: the disk's limit measured in this run: 8 threads, each reading one eighth of the whole file
  sequentially with 16 MiB ``preadv`` and the kernel's default readahead (``startup_bench``'s buffered probe, over
  one file's eighths); the ratios are to its GB/s;
* ``limit-direct``: the same with ``O_DIRECT`` into page-aligned 16 MiB buffers (null, with the reason, where the
  file system refuses O_DIRECT, such as tmpfs);
* ``staged-8x16M``, ``staged-16x16M``, ``staged-8x64M``, ``staged-4x64M``, ``staged-8x8M``, ``staged-16x8M``,
  ``staged-8x4M``, ``staged-16x4M``: the rank ranges through moebake's own
  :class:`~moebake.loading.staged_reader.StagedReader` (``slots`` x ``chunk_bytes``: reading threads, each an
  ``os.preadv`` of one chunk into the pinned ring of ``slots`` buffers; descriptors with ``POSIX_FADV_RANDOM``, no
  readahead), as a loader reads them (``staged=True`` on the CPU device, so the ring's pipeline runs there too). The
  reader's ring and threads are made before the clock starts (a loader keeps its reader across its loads;
  ``ring_seconds``: how long pinning the ring took, the first pinning in the process the dearest: later rings may
  re-use the pages torch's pinned-memory cache kept);
* ``willneed-8x16M``: ``posix_fadvise(POSIX_FADV_WILLNEED)`` of every rank range first (on one ordinary
  descriptor), then ``staged-8x16M``'s read. Linux 6.x starts an asynchronous read of at most the readahead window
  (``read_ahead_kb``) from each range's start, not of the whole range (mincore on kernel 6.18: 7-8 MiB of a 256 MiB
  WILLNEED, with ``read_ahead_kb`` 8192), so this reads ahead only each range's first window;
* ``normal-8x16M``: ``staged-8x16M`` with the kernel's readahead left on (the reader's descriptors opened without
  ``POSIX_FADV_RANDOM``): how many bytes beyond the ranges readahead reads, and what it gains;
* ``per-range-8x16M``: ``staged-8x16M``'s reader called once per range, as the loaders call it once per MoE layer
  (each call returns when its bytes are on the device, so its last chunks drain with fewer threads reading): what
  those calls cost against one call;
* ``per-range-split-tail-8x16M``: the same with each call's last 8 chunks cut into 2 MiB pieces (a reader that keeps
  every thread reading until the call's end; only here, not in moebake);
* ``ring16-8x8M``, ``ring16-8x4M``, ``ring12-8x8M``: the reader with a ring of 16 (12) buffers for its 8 threads, so
  that a buffer's copy to the device has 8 (4) chunks' reads to finish in before the buffer is read into again;
* ``thread-copy-8x8M``, ``thread-copy-8x4M``: a candidate reader (here only, :func:`_thread_copy_reader`) whose 8
  threads each copy their own chunks to the device, on a stream of their own, through two buffers each;
* ``reads-only-8x8M``: that reader's reads alone, into its ring, no copy to the device: what the page cache (warm) or
  the disk (cold) gives 8 threads of 8 MiB reads, measured beside the readers that also copy;
* ``idle6s-8x8M``: ``staged-8x8M`` after 6 s with the device idle (off the clock), as a server's first read comes
  after its model build: what a device that lowered its clocks or link speed while idle costs the first reads.

Cold, before every method the page cache is dropped (root: ``sync``, then ``3`` to ``/proc/sys/vm/drop_caches``; where
refused, the file is evicted from it with ``posix_fadvise(DONTNEED)``, said once on stdout:
:func:`benchkit.drop_page_cache`). Warm, the whole file is read once before the first method (``limit-buffered``'s
read, untimed) and the cache is left as it is, so ``limit-buffered`` measures the page cache's limit: 8 threads copying
out of it into buffers of their own, no device. ``--rounds`` N (default 2): each round runs every method once, round i starting
at the i-th method (a rotated order), so a drift over the run weighs on all alike.

Each run (``--out``, ``{"runs": [...]}``, appended to; ``machine``: what ``--machine`` says, when given; one JSON line
per run on stdout as it ends): ``method``, ``round``, ``cache``, ``file`` (its path), ``file_bytes``, ``segment_bytes``,
``ranks``, ``rank``, ``device``, ``slots``, ``chunk_bytes`` and ``buffers`` (the method's threads, read size and
ring size; ``buffers`` null for the limits), ``ring_seconds``
(pinning the ring, off the clock; null for the limits), ``seconds``
(wall, until the bytes are on the device: CUDA synchronised), ``bytes_requested`` (the rank ranges' total; the limits:
the whole file), ``bytes_read`` (the process's ``read_bytes`` in ``/proc/self/io`` after the call less before: bytes
its threads had the block device read; null where unreadable), ``gbps`` (bytes_requested / seconds / 1e9), and
``error`` (why the method could not run; its seconds, bytes_read and gbps null). At the end, per method: the mean GB/s
over the rounds, its ratio to ``limit-buffered``'s, and bytes_read / bytes_requested (the over-read). ``table``
and ``plot`` group the runs by (cache, file, file size, segment, ranks, rank, device); a run without ``cache`` was cold.

    python bench/read_bench.py make --file /data/rb/f --gib 6
    python bench/read_bench.py run --file /data/rb/f --ranks 4 --rank 1 --rounds 2 \\
        --out bench/results/read_h200x2.json --machine "2 x H200, virtio /dev/vda"
    python bench/read_bench.py run --file /data/rb/f --ranks 1 --rank 0 --cache warm --rounds 4 \\
        --out bench/results/read_h200.json --machine "1 x H200"
    python bench/read_bench.py table bench/results/read_h200x2.json     # the .md beside it
    python bench/read_bench.py plot bench/results/read_h200x2.json      # the .png beside it
"""

import argparse
import json
import mmap
import os
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import benchkit  # also puts the checkout first on sys.path (its moebake)

MIB, GIB = 2**20, 2**30
LIMIT = "limit-buffered"
THREADS, PROBE_BYTES = 8, 16 * MIB  # the limit probes'
MAKE_BLOCK = 64 * MIB
IDLE_SECONDS = 6.0  # idle6s-8x8M's wait before its read


# ----------------------------------------------------------------------------------------------- make
def make(path: Path, nbytes: int, say: Callable[[str], object] = lambda text: print(text, file=sys.stderr, flush=True)) -> Path:
    """Write ``nbytes`` pseudo-random non-zero bytes to ``path``: written to ``path.partial``, fsynced, renamed (the
    partial file removed if writing fails). Memory stays bounded: one 64 MiB random block (bytes 1-255), each 64 MiB
    of the file that block rotated by 4099 bytes more than the last (no two blocks of the file alike, not even on 4 KiB
    boundaries). Progress: a line per GiB."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    base = np.random.default_rng(20261128).integers(1, 256, size=min(nbytes, MAKE_BLOCK), dtype=np.uint8)
    began, written, said = time.perf_counter(), 0, 0
    try:
        with open(partial, "wb") as f:
            for index in range(-(-nbytes // MAKE_BLOCK)):
                block = np.roll(base, index * 4099)[: nbytes - written]
                f.write(memoryview(block))
                written += len(block)
                if written // GIB > said:
                    said = written // GIB
                    say(f"make: {said} GiB of {nbytes / GIB:.2f} written ({time.perf_counter() - began:.1f} s)")
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:  # a full disk, ^C: no half-written file stays behind
        partial.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    say(f"make: {path}: {nbytes} bytes in {time.perf_counter() - began:.1f} s")
    return path


# ------------------------------------------------------------------------------------------ the ranges
def rank_ranges(file_bytes: int, segment_bytes: int, ranks: int, rank: int) -> list[tuple[int, int]]:
    """``[(offset, length)]``: rank ``rank`` of ``ranks``'s bytes ``[rank*S//ranks, (rank+1)*S//ranks)`` of each
    segment of ``S = segment_bytes`` bytes of the file, in file order; a last partial segment's range is clipped to
    the file's end, and left out where that leaves it empty."""
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} is not one of {ranks} ranks")
    ranges = []
    for start in range(0, file_bytes, segment_bytes):
        low = start + rank * segment_bytes // ranks
        high = min(start + (rank + 1) * segment_bytes // ranks, file_bytes)
        if high > low:
            ranges.append((low, high - low))
    return ranges


@dataclass
class Job:
    """What every method reads: the file, its rank ranges, and the destination (``dest``: one uint8 tensor of the
    ranges' total bytes on ``device``, its slices in range order)."""

    path: Path
    file_bytes: int
    segment_bytes: int
    ranks: int
    rank: int
    device: object  # torch.device
    ranges: list[tuple[int, int]]
    dest: object  # torch.Tensor

    @classmethod
    def make(cls, path: Path, segment_bytes: int, ranks: int, rank: int, device: str) -> "Job":
        import torch

        file_bytes = path.stat().st_size
        ranges = rank_ranges(file_bytes, segment_bytes, ranks, rank)
        dest = torch.empty(sum(length for _, length in ranges), dtype=torch.uint8, device=device)
        return cls(path, file_bytes, segment_bytes, ranks, rank, torch.device(device), ranges, dest)

    @property
    def requested(self) -> int:
        return self.dest.numel()

    def pieces(self) -> list:
        """The rank ranges as the reader's ``ByteRange`` list, each onto its slice of ``dest``."""
        from moebake.loading.staged_reader import ByteRange

        pieces, at = [], 0
        for offset, length in self.ranges:
            pieces.append(ByteRange(str(self.path), offset, self.dest[at : at + length], f"segment@{offset}"))
            at += length
        return pieces


# ----------------------------------------------------------------------------------------- the methods
def _eighths(file_bytes: int, chunk: int) -> list[tuple[int, int]]:
    """The file cut at chunk boundaries into ``THREADS`` parts of (nearly) as many chunks each: ``[(start, end)]``."""
    chunks = -(-file_bytes // chunk)
    cuts = [min(t * chunks // THREADS * chunk, file_bytes) for t in range(THREADS + 1)]
    return [(cuts[t], cuts[t + 1]) for t in range(THREADS) if cuts[t + 1] > cuts[t]]


def _read_whole(job: Job, flags: int, buffer: Callable[[], object]) -> int:
    """Every byte of the file, each part of :func:`_eighths` sequentially in a thread of its own, ``PROBE_BYTES`` per
    ``preadv`` into the thread's ``buffer()``; the bytes read."""

    def read(part: tuple[int, int]) -> int:
        start, end = part
        fd, view = os.open(job.path, os.O_RDONLY | flags), memoryview(buffer())
        try:
            offset = start
            while offset < end:
                got = os.preadv(fd, [view], offset)
                if got == 0:
                    break
                offset += got
            return offset - start
        finally:
            view.release()
            os.close(fd)

    with ThreadPoolExecutor(THREADS) as pool:
        total = sum(pool.map(read, _eighths(job.file_bytes, PROBE_BYTES)))
    if total != job.file_bytes:
        raise OSError(f"read {total} of {job.file_bytes} bytes")
    return total


def limit_buffered(job: Job) -> None:
    """The whole file, 8 threads of 16 MiB ``preadv``, the kernel's readahead on: the disk's limit."""
    _read_whole(job, 0, lambda: bytearray(PROBE_BYTES))


def limit_direct(job: Job) -> None:
    """The whole file, 8 threads of 16 MiB ``preadv`` with ``O_DIRECT`` (``mmap`` buffers: page-aligned)."""
    if not hasattr(os, "O_DIRECT"):
        raise OSError("this platform has no O_DIRECT")
    _read_whole(job, os.O_DIRECT, lambda: mmap.mmap(-1, PROBE_BYTES))


def _split_tail_reader():
    """A :class:`StagedReader` whose every call cuts its last ``slots`` chunks into ``slots`` pieces each, so that all
    its threads read until the call's end instead of draining one by one (a candidate, measured here only)."""
    from moebake.loading.staged_reader import StagedReader, _Chunk

    class SplitTailReader(StagedReader):
        def _chunks(self, ranges):
            chunks = super()._chunks(ranges)
            head, tail = chunks[: -self.slots], chunks[-self.slots :]
            step = max(self.chunk_bytes // self.slots, 1)
            return head + [_Chunk(c.piece, c.offset + at, c.dest[at : at + step]) for c in tail for at in range(0, c.dest.numel(), step)]

    return SplitTailReader


THREAD_COPY_BUFFERS = 2
"""Buffers of the ring each thread of the thread-copy candidate owns: it reads into one while another's copy runs."""


def _thread_copy_reader(copy: bool = True):
    """A :class:`StagedReader` whose reading threads copy their own chunks to the device (a candidate, measured here
    only): each thread takes the next chunk, reads it into one of its buffers of the ring (``buffers =
    THREAD_COPY_BUFFERS * slots``), waiting first for that buffer's last copy, then issues the chunk's host-to-device
    copy on a CUDA stream of its own and records the buffer's event; no thread waits for a copy it has just issued, and
    no calling thread sits between the reads and the copies. ``copy=False``: the reads alone, into the ring, no copy (what the page
    cache gives a rank's reader without the device)."""
    import threading

    import torch

    from moebake.loading.staged_reader import StagedReader, _pread_into, _settle

    class ThreadCopyReader(StagedReader):
        def __init__(self, device, **options):
            super().__init__(device, **options)
            cuda = self.device.type == "cuda"
            self._streams = [torch.cuda.Stream(self.device) if cuda else None for _ in range(self.slots)]

        def _read_staged(self, chunks, fds, pool):
            buffers, events = self._ring()
            cuda = self.device.type == "cuda"
            taking, queue = threading.Lock(), iter(chunks)

            def work(thread: int) -> None:
                mine, used = range(THREAD_COPY_BUFFERS * thread, THREAD_COPY_BUFFERS * (thread + 1)), 0
                with torch.cuda.device(self.device) if cuda else nullcontext():
                    while True:
                        with taking:
                            chunk = next(queue, None)
                        if chunk is None:
                            break
                        slot = mine[used % THREAD_COPY_BUFFERS]
                        used += 1
                        if events[slot] is not None:
                            events[slot].synchronize()
                        staging = buffers[slot][: chunk.dest.numel()]
                        _pread_into(fds[chunk.piece.path], staging, chunk.offset, chunk.piece)
                        if not copy:
                            continue
                        with torch.cuda.stream(self._streams[thread]) if cuda else nullcontext():
                            chunk.dest.copy_(staging, non_blocking=cuda)
                            if events[slot] is not None:
                                events[slot].record(self._streams[thread])
                    for slot in mine:
                        if events[slot] is not None:
                            events[slot].synchronize()

            _settle([pool.submit(work, thread) for thread in range(self.slots)])

    return ThreadCopyReader


def _staged(
    job: Job,
    slots: int,
    chunk_bytes: int,
    before: Callable[[], None] | None = None,
    *,
    per_range: bool = False,
    split_tail: bool = False,
    buffers: int | None = None,
    thread_copy: bool = False,
    copy: bool = True,
    idle: bool = False,
) -> "Prepared":
    """The rank ranges into ``job.dest`` through a :class:`StagedReader` of ``slots`` x ``chunk_bytes`` (its ring:
    ``buffers``, default ``slots``); ``before()`` runs on the clock, before the read. ``per_range``: one ``read`` call
    per range (the loaders make one per MoE layer, and each call ends when its last chunk is on the device), not one
    for all; ``split_tail``: the reader of :func:`_split_tail_reader`; ``thread_copy``: the reader of
    :func:`_thread_copy_reader` (``copy``: its); ``idle``: the process then sleeps ``IDLE_SECONDS``, off the clock,
    with nothing running on the device, before the timed read."""
    from moebake.loading.staged_reader import StagedReader

    kind = _split_tail_reader() if split_tail else _thread_copy_reader(copy) if thread_copy else StagedReader
    reader = kind(job.device, slots=slots, chunk_bytes=chunk_bytes, buffers=buffers, staged=True)
    buffers, events = reader._ring()  # the ring and the threads before the clock: a loader keeps its reader across loads
    reader._pool()
    if events[0] is not None:  # CUDA's copy and event path (its libraries' pages) before the clock, as in a loader
        job.dest[:1].copy_(buffers[0][:1], non_blocking=True)
        events[0].record()
        events[0].synchronize()
    pieces = job.pieces()
    if idle:
        time.sleep(IDLE_SECONDS)

    def timed():
        if before is not None:
            before()
        for call in ([piece] for piece in pieces) if per_range else [pieces]:
            reader.read(call)
        return job.dest

    return Prepared(timed, reader.close, reader.ring_seconds)


def _willneed(job: Job) -> None:
    """``POSIX_FADV_WILLNEED`` of every rank range, on one ordinary descriptor (closed after): the kernel starts reading
    at most its readahead window from each range's start (the module docstring)."""
    fd = os.open(job.path, os.O_RDONLY)
    try:
        for offset, length in job.ranges:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


@contextmanager
def readahead_on():
    """moebake's reader opens its files without ``POSIX_FADV_RANDOM`` (the kernel's readahead on) inside."""
    from moebake.loading import staged_reader

    original = staged_reader.open_without_readahead
    staged_reader.open_without_readahead = lambda path: os.open(path, os.O_RDONLY)
    try:
        yield
    finally:
        staged_reader.open_without_readahead = original


@dataclass(frozen=True)
class Prepared:
    """What a method's ``prepare`` made, off the clock: ``timed()`` is the timed read (it returns ``job.dest``, or None
    for the limits), ``done()`` frees what prepare made; ``ring_seconds``: pinning the reader's ring (None: no ring)."""

    timed: Callable[[], object]
    done: Callable[[], None]
    ring_seconds: float | None = None


@dataclass(frozen=True)
class Method:
    """A way to read: ``prepare(job)`` (off the clock) gives its :class:`Prepared`; ``buffers``: its ring's size (None:
    no ring)."""

    slots: int
    chunk_bytes: int
    whole_file: bool
    prepare: Callable[[Job], Prepared]
    context: Callable[[], object] | None = None  # entered around the timed read
    buffers: int | None = None

    def read(self, job: Job):
        """One read, untimed (tests compare the bytes with the file's): ``job.dest`` for a rank method, else None."""
        prepared = self.prepare(job)
        try:
            with self.context() if self.context else nullcontext():
                return prepared.timed()
        finally:
            prepared.done()


def _whole(read: Callable[[Job], None]) -> Method:
    return Method(THREADS, PROBE_BYTES, True, lambda job: Prepared(lambda: read(job), lambda: None))


def _reader(slots: int, chunk_bytes: int, context: Callable[[], object] | None = None, willneed: bool = False, **options) -> Method:
    """A rank method through :func:`_staged` (``options``: its ``per_range``, ``split_tail``, ``buffers``,
    ``thread_copy`` and ``copy``; a thread-copy reader's ring is ``THREAD_COPY_BUFFERS`` a thread); ``willneed``:
    :func:`_willneed` on the clock first."""
    if options.get("thread_copy"):
        options["buffers"] = THREAD_COPY_BUFFERS * slots
    return Method(
        slots,
        chunk_bytes,
        False,
        lambda job: _staged(job, slots, chunk_bytes, (lambda: _willneed(job)) if willneed else None, **options),
        context,
        options.get("buffers") or slots,
    )


METHODS = {
    "limit-buffered": _whole(limit_buffered),
    "limit-direct": _whole(limit_direct),
    "staged-8x16M": _reader(8, 16 * MIB),
    "staged-16x16M": _reader(16, 16 * MIB),
    "staged-8x64M": _reader(8, 64 * MIB),
    "staged-4x64M": _reader(4, 64 * MIB),
    "staged-8x8M": _reader(8, 8 * MIB),
    "staged-16x8M": _reader(16, 8 * MIB),
    "staged-8x4M": _reader(8, 4 * MIB),
    "staged-16x4M": _reader(16, 4 * MIB),
    "ring16-8x8M": _reader(8, 8 * MIB, buffers=16),
    "ring16-8x4M": _reader(8, 4 * MIB, buffers=16),
    "ring12-8x8M": _reader(8, 8 * MIB, buffers=12),
    "thread-copy-8x8M": _reader(8, 8 * MIB, thread_copy=True),
    "thread-copy-8x4M": _reader(8, 4 * MIB, thread_copy=True),
    "reads-only-8x8M": _reader(8, 8 * MIB, thread_copy=True, copy=False),
    "idle6s-8x8M": _reader(8, 8 * MIB, idle=True),
    "willneed-8x16M": _reader(8, 16 * MIB, willneed=True),
    "normal-8x16M": _reader(8, 16 * MIB, readahead_on),
    "per-range-8x16M": _reader(8, 16 * MIB, per_range=True),
    "per-range-split-tail-8x16M": _reader(8, 16 * MIB, per_range=True, split_tail=True),
}


# ------------------------------------------------------------------------------------------------ run
def _synchronize(job: Job) -> None:
    if job.device.type == "cuda":
        import torch

        torch.cuda.synchronize(job.device)


def measure(job: Job, name: str, round_: int, cache: str = "cold") -> dict:
    """One run of method ``name``: cold, the page cache dropped first (warm, left as it is), the method prepared, then
    timed."""
    from moebake.errors import MoebakeError

    method = METHODS[name]
    run = {
        "method": name,
        "round": round_,
        "cache": cache,
        "file": str(job.path),
        "file_bytes": job.file_bytes,
        "segment_bytes": job.segment_bytes,
        "ranks": job.ranks,
        "rank": job.rank,
        "device": str(job.device),
        "slots": method.slots,
        "chunk_bytes": method.chunk_bytes,
        "buffers": method.buffers,
        "ring_seconds": None,
        "seconds": None,
        "bytes_requested": job.file_bytes if method.whole_file else job.requested,
        "bytes_read": None,
        "gbps": None,
    }
    if cache == "cold":
        benchkit.drop_page_cache([job.path])
    try:
        prepared = method.prepare(job)
        try:
            with method.context() if method.context else nullcontext():
                _synchronize(job)
                before, began = benchkit.io_read_bytes(), time.perf_counter()
                prepared.timed()
                _synchronize(job)
                seconds, after = time.perf_counter() - began, benchkit.io_read_bytes()
        finally:
            prepared.done()
    except (OSError, RuntimeError, MoebakeError) as err:  # refused (O_DIRECT), or out of memory: recorded
        return {**run, "error": f"{type(err).__name__}: {err}"}
    return {
        **run,
        "ring_seconds": prepared.ring_seconds,
        "seconds": seconds,
        "bytes_read": None if before is None or after is None else after - before,
        "gbps": run["bytes_requested"] / seconds / 1e9,
    }


def run_all(
    path: Path,
    segment_bytes: int,
    ranks: int,
    rank: int,
    device: str,
    methods: list[str],
    rounds: int,
    out: Path,
    machine: str | None,
    cache: str = "cold",
) -> list[dict]:
    """``rounds`` rounds of every method (round i from the i-th method on), each run appended to ``out`` as it ends
    and printed as a JSON line; then the summary. Warm: the file read whole once first. The runs."""
    job = Job.make(path, segment_bytes, ranks, rank, device)
    if cache == "warm":
        limit_buffered(job)
    results = json.loads(out.read_text()) if out.is_file() else {"runs": []}
    if machine is not None:
        results["machine"] = machine
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    for round_ in range(rounds):
        shift = round_ % len(methods)
        for name in methods[shift:] + methods[:shift]:
            run = measure(job, name, round_, cache)
            runs.append(run)
            results["runs"].append(run)
            out.write_text(json.dumps(results, indent=1) + "\n")
            print(json.dumps(run), flush=True)
    print(summary(runs))
    return runs


def _means(runs: list[dict]) -> dict[str, dict]:
    """Per method (in first-run order): its rounds, mean seconds and GB/s, and read / requested over its runs (None
    where no run has them), of the runs without an error; ``error``: the last error, where no run succeeded."""
    methods: dict[str, list[dict]] = {}
    for run in runs:
        methods.setdefault(run["method"], []).append(run)
    means = {}
    for name, of in methods.items():
        ok = [r for r in of if r.get("error") is None and r["seconds"]]
        read = [r for r in ok if r["bytes_read"] is not None]
        means[name] = {
            "rounds": len(ok),
            "seconds": statistics.mean(r["seconds"] for r in ok) if ok else None,
            "gbps": statistics.mean(r["gbps"] for r in ok) if ok else None,
            "gbps_range": (min(r["gbps"] for r in ok), max(r["gbps"] for r in ok)) if ok else None,
            "over_read": sum(r["bytes_read"] for r in read) / sum(r["bytes_requested"] for r in read) if read else None,
            "error": None if ok else of[-1].get("error"),
        }
    return means


def _ratio(mean: dict, limit: dict | None) -> float | None:
    if mean["gbps"] is None or not limit or not limit["gbps"]:
        return None
    return mean["gbps"] / limit["gbps"]


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def summary(runs: list[dict]) -> str:
    """Per method: mean GB/s over its rounds, its ratio to limit-buffered's mean, bytes read / requested."""
    means = _means(runs)
    lines = [f"{'method':16} {'rounds':>6} {'GB/s':>7} {'/ limit':>8} {'read/req':>9}"]
    for name, mean in means.items():
        ratio = _ratio(mean, means.get(LIMIT))
        lines.append(
            f"{name:16} {mean['rounds']:>6} {_fmt(mean['gbps'], '7.3f')} {_fmt(ratio, '7.2f', 'x')} "
            f"{_fmt(mean['over_read'], '8.3f', 'x')}" + (f"  {mean['error']}" if mean["error"] else "")
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ table, plot
GROUP = ("cache", "file", "file_bytes", "segment_bytes", "ranks", "rank", "device")


def _groups(runs: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault(tuple(run.get(key, "cold" if key == "cache" else None) for key in GROUP), []).append(run)
    return groups


def _group_title(key: tuple) -> str:
    cache, file, file_bytes, segment, ranks, rank, device = key
    return f"{cache}: {file} ({file_bytes / 1e9:.2f} GB), {segment / MIB:g} MiB segments, rank {rank} of {ranks}, {device}"


def table(results_path: Path, md: Path | None = None) -> Path:
    """The Markdown table of a results JSON (the ``.md`` beside it by default): per group and method, the rounds, the
    mean seconds and GB/s, the slowest and fastest round's GB/s, the ratio to the group's limit-buffered mean, and
    bytes read / requested; then the JSON's ``notes`` (a list of strings), if any."""
    results = json.loads(results_path.read_text())
    md = Path(md) if md else results_path.with_suffix(".md")
    lines = [
        f"# Reading a rank's byte ranges: {results_path.name}",
        "",
        f"Generated by `python bench/read_bench.py table {results_path}`; do not edit by hand. The method and "
        "the fields: `bench/read_bench.py`'s docstring.",
        "",
    ]
    if results.get("machine"):
        lines += [f"Machine: {results['machine']}.", ""]
    for key, runs in _groups(results["runs"]).items():
        means = _means(runs)
        lines += [
            f"## {_group_title(key)}",
            "",
            "| method | rounds | mean s | mean GB/s | GB/s, slowest-fastest round | / limit-buffered | read / requested |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, mean in means.items():
            if mean["error"]:
                lines.append(f"| {name} | 0 | not run: {mean['error']} | | | | |")
                continue
            low, high = mean["gbps_range"]
            lines.append(
                f"| {name} | {mean['rounds']} | {_fmt(mean['seconds'], '.3f')} | {_fmt(mean['gbps'], '.3f')} | "
                f"{low:.3f}-{high:.3f} | {_fmt(_ratio(mean, means.get(LIMIT)), '.2f', 'x')} | "
                f"{_fmt(mean['over_read'], '.3f', 'x')} |"
            )
        lines.append("")
    lines += [f"Note: {note}" for note in results.get("notes", [])]
    md.write_text("\n".join(lines) + "\n")
    return md


def plot(results_path: Path, png: Path | None = None) -> Path:
    """Bars of each method's mean GB/s (whiskers: its slowest and fastest round), one panel per group, limit-buffered's
    mean as a dashed line, each bar's bytes read / requested above it (the ``.png`` beside the JSON by default)."""
    plt = benchkit.pyplot()
    results = json.loads(results_path.read_text())
    png = Path(png) if png else results_path.with_suffix(".png")
    groups = {key: _means(runs) for key, runs in _groups(results["runs"]).items()}
    figure, axes = plt.subplots(1, len(groups), figsize=(1.2 + 1.1 * max(map(len, groups.values())) * len(groups), 4.5), squeeze=False)
    for ax, (key, means) in zip(axes[0], groups.items()):
        names, warm = list(means), key[0] == "warm"
        heights = [means[n]["gbps"] or 0.0 for n in names]
        ranges = [means[n]["gbps_range"] or (h, h) for n, h in zip(names, heights)]
        spread = [[h - low for h, (low, _) in zip(heights, ranges)], [high - h for h, (_, high) in zip(heights, ranges)]]
        bars = ax.bar(
            range(len(names)),
            heights,
            yerr=spread,
            capsize=3,
            error_kw={"elinewidth": 0.8},
            color=["0.6" if n.startswith("limit") else "tab:blue" for n in names],
        )
        for bar, name in zip(bars, names):
            over = means[name]["over_read"]
            label = "not run" if means[name]["error"] else f"{over:.3f}x read" if over is not None else "read n/a"
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
        if means.get(LIMIT, {}).get("gbps"):
            ax.axhline(
                means[LIMIT]["gbps"],
                color="tab:red",
                linestyle="--",
                linewidth=1,
                label=f"limit-buffered{' (page cache)' if warm else ''} {means[LIMIT]['gbps']:.2f} GB/s",
            )
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("GB/s (requested bytes / s)")
        cache, _, file_bytes, segment, ranks, rank, device = key
        ax.set_title(
            f"{cache}: {file_bytes / 1e9:.2f} GB file, rank {rank} of {ranks}\n{segment / MIB:g} MiB segments, {device}", fontsize=9
        )
    if results.get("machine"):  # wrapped to the figure's width (about 16 characters of 8-point text per inch)
        width = int(figure.get_size_inches()[0] * 16)
        figure.suptitle(textwrap.fill(results["machine"], width), fontsize=8)
    benchkit.save(figure, png, dpi=120)
    plt.close(figure)
    return png


# ----------------------------------------------------------------------------------------------- main
def _default_device() -> str:
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make", help="write a file of pseudo-random non-zero bytes")
    p.add_argument("--file", required=True)
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--gib", type=float, help="its size in GiB (fractions allowed)")
    size.add_argument("--mib", type=float, help="its size in MiB (tests: a tiny file)")
    p = sub.add_parser("run", help="time every method's reads of the rank's ranges (or the whole file), cold or warm")
    p.add_argument("--file", required=True)
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--segment-mib", type=float, default=512, help="segment (one baked tensor) size, MiB (default 512)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--cache",
        choices=("cold", "warm"),
        default="cold",
        help="cold: the page cache dropped before every method (default); warm: the file read once first",
    )
    p.add_argument("--device", help="the destination's device (default: cuda:0 with CUDA, else cpu)")
    p.add_argument("--out", required=True)
    p.add_argument("--machine", help="what the machine is (the JSON's top-level machine)")
    benchkit.add_report_commands(sub)
    args = parser.parse_args(argv)
    if benchkit.run_report_command(args, table, plot):
        return
    if args.command == "make":
        make(Path(args.file), int(args.gib * GIB) if args.gib is not None else int(args.mib * MIB))
    elif args.command == "run":
        if not 0 <= args.rank < args.ranks:
            parser.error(f"--rank must be in [0, {args.ranks})")
        run_all(
            Path(args.file),
            int(args.segment_mib * MIB),
            args.ranks,
            args.rank,
            args.device or _default_device(),
            args.methods,
            args.rounds,
            Path(args.out),
            args.machine,
            args.cache,
        )


if __name__ == "__main__":
    main()
