"""A bounded background read-ahead: the byte ranges a rank's loader will read, brought into the page cache first.

A cold load reads its bytes from the disk, and everything else it does (the model's construction, the engine's
iteration over the checkpoint, the loader's own bookkeeping) waits. :class:`ReadAhead` walks the ranges the loader
will read, in the order it will read them (its plan: :meth:`ReadAhead.add`), with a few threads reading each range
in steps of :data:`STEP_BYTES` (``os.preadv`` into one scratch buffer per thread, on descriptors with the kernel's
readahead off, as the loader's own), so the disk stays busy while the rest runs; the loader's reads of the same
bytes then come out of the page cache.

Bounds. It reads only planned bytes, never a byte outside a planned range. It stays at most ``window_bytes``
(:data:`WINDOW_BYTES`) ahead of the loader: the bytes it has read or is reading that the loader has not yet
consumed (:meth:`ReadAhead.consumed`, called by the loader's :class:`~moebake.loading.staged_reader.StagedReader`
for every chunk it has read) never exceed it; a range the loader has consumed before the read-ahead got to it is
skipped. Host memory: ``threads * step_bytes`` of scratch, and the page cache's (reclaimable) pages.

It never raises into the loader: an error in a read ends the read-ahead (:attr:`ReadAheadStats.error`) and the loader
reads its bytes itself, as without one. :meth:`ReadAhead.stop` (at the load's end, or on its error) ends it and joins
its threads (a thread stuck in a read is abandoned: they are daemons, and each closes its own descriptors); so does
:data:`IDLE_SECONDS` without the loader consuming a byte or the plan growing. It is off unless
``MOEBAKE_READAHEAD=1`` (:data:`ENV`, :func:`enabled`): where a cold load is bound by the disk, the loader's own reads
already keep it busy, so the read-ahead has little to hide (``docs/benchmarks.md`` has the runs, on a GPU machine
and on the CPU box, with ``bench/startup_bench.py all --readahead both``).
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from moebake.loading.staged_reader import open_without_readahead, pread_fully

logger = logging.getLogger(__name__)

ENV = "MOEBAKE_READAHEAD"
"""Set to ``1`` to load with the read-ahead (off otherwise)."""

WINDOW_BYTES = 1 << 30
"""How far the read-ahead may run ahead of the loader: planned bytes read (or being read) and not yet consumed."""

STEP_BYTES = 8 << 20
"""One read of the read-ahead (and the size of each thread's scratch buffer)."""

THREADS = 8
"""Reads in flight at once (the loader's :data:`~moebake.loading.staged_reader.DEFAULT_SLOTS`)."""

IDLE_SECONDS = 120.0
"""The read-ahead ends itself after this long with nothing consumed and nothing added (a load that never ended it)."""


def enabled() -> bool:
    """Whether this process reads ahead (``MOEBAKE_READAHEAD=1``)."""
    return os.environ.get(ENV, "0") == "1"


@dataclass(frozen=True)
class PlannedRange:
    """Bytes ``[offset, offset + nbytes)`` of file ``path``: one range the loader will read whole."""

    path: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ReadAheadStats:
    """What a read-ahead did: ``bytes`` read into the page cache in ``seconds`` (from its first read to its end) over
    ``ranges`` planned ranges (``planned_bytes``); ``skipped_bytes``: planned bytes the loader consumed first;
    ``max_ahead``: the most bytes it was ever ahead of the loader; ``error``: why it ended early, if it did."""

    bytes: int
    seconds: float
    ranges: int
    planned_bytes: int
    skipped_bytes: int
    max_ahead: int
    error: str | None

    def __str__(self) -> str:
        text = (
            f"read-ahead: {self.bytes} of {self.planned_bytes} planned bytes ({self.ranges} ranges) in "
            f"{self.seconds:.3f} s, {self.skipped_bytes} consumed by the loader first, at most {self.max_ahead} ahead"
        )
        return text + (f"; ended early: {self.error}" if self.error else "")


class _Entry:
    __slots__ = ("range", "issued", "consumed")

    def __init__(self, planned: PlannedRange):
        self.range, self.issued, self.consumed = planned, 0, 0

    def ahead(self) -> int:
        return max(0, self.issued - self.consumed)


def _pread_scratch(fd: int, buffer: memoryview, offset: int, nbytes: int) -> None:
    """Read bytes ``[offset, offset + nbytes)`` of ``fd`` into ``buffer`` (discarded): they are in the page cache after."""
    done = pread_fully(fd, buffer[:nbytes], offset)
    if done < nbytes:
        raise OSError(f"file ends at byte {offset + done}")


def _as_planned(piece: Any) -> PlannedRange:
    """A :class:`PlannedRange` of a :class:`PlannedRange` or a loader's
    :class:`~moebake.loading.staged_reader.ByteRange` (its file bytes only; its destination is not kept)."""
    if isinstance(piece, PlannedRange):
        return piece
    return PlannedRange(str(piece.path), int(piece.offset), int(piece.dest.numel()))


Fetch = Callable[[str, int, int], None]
"""``(path, offset, nbytes)``: bring those bytes into the page cache (tests pass a recording one)."""


class ReadAhead:
    """The read-ahead of one loader (see the module docstring). ``add`` its plan, let the loader report what it has
    read to :meth:`consumed`, :meth:`seal` when the plan is whole, :meth:`stop` at the load's end.

    ``fetch``: the read of one step (default: ``preadv`` into a scratch buffer); ``window_bytes``, ``step_bytes``,
    ``threads``: the bounds."""

    def __init__(
        self,
        *,
        window_bytes: int = WINDOW_BYTES,
        step_bytes: int = STEP_BYTES,
        threads: int = THREADS,
        fetch: Fetch | None = None,
        idle_seconds: float = IDLE_SECONDS,
    ):
        self.window_bytes, self.step_bytes = window_bytes, max(1, min(step_bytes, window_bytes))
        self.threads, self.idle_seconds, self._fetch = threads, idle_seconds, fetch
        self._plan: list[_Entry] = []
        self._cursor = 0  # the plan before it is read (or consumed) whole: each step looks from here, not from the start
        self._by_start: dict[tuple[str, int], list[_Entry]] = {}
        self._lock = threading.Condition()
        self._workers: list[threading.Thread] = []
        self._stopped = self._sealed = False
        self._ahead = self._max_ahead = self._bytes = self._skipped = 0
        self._began: float | None = None
        self._ended: float | None = None
        self._error: str | None = None
        self._last_progress = time.monotonic()

    # -------------------------------------------------------------------------------------- the loader's side
    def add(self, ranges: Iterable, *, first: bool = False) -> None:
        """Plan ``ranges`` (:class:`PlannedRange` or ``ByteRange``) after the planned ones, or, ``first``, before every
        range not yet read (ranges the loader consumes before those planned so far). Starts the threads."""
        entries = [_Entry(_as_planned(piece)) for piece in ranges]
        entries = [e for e in entries if e.range.nbytes > 0]
        with self._lock:
            if self._stopped or not entries:
                return
            self._plan = entries + self._plan if first else self._plan + entries
            if first:
                self._cursor = 0
            for entry in entries:
                self._by_start.setdefault((entry.range.path, entry.range.offset), []).append(entry)
            self._last_progress = time.monotonic()
            self._lock.notify_all()
            if not self._workers:
                self._workers = [
                    threading.Thread(target=self._run, name=f"moebake-readahead-{i}", daemon=True) for i in range(self.threads)
                ]
                for worker in self._workers:
                    worker.start()

    def seal(self) -> None:
        """No range will be added: the threads end once every planned range is read or consumed."""
        with self._lock:
            self._sealed = True
            self._lock.notify_all()

    def consumed(self, path: str, offset: int, nbytes: int) -> None:
        """The loader has read ``nbytes`` more of the range that starts at byte ``offset`` of ``path`` (a chunk of a
        ``ByteRange`` whose ``offset`` this is). Bytes of no planned range are not counted. Never raises."""
        with self._lock:
            for entry in self._by_start.get((str(path), offset), ()):
                if entry.consumed < entry.range.nbytes:
                    before = entry.ahead()
                    entry.consumed = min(entry.range.nbytes, entry.consumed + nbytes)
                    self._ahead += entry.ahead() - before
                    self._last_progress = time.monotonic()
                    self._lock.notify_all()
                    return

    def stop(self, timeout: float = 10.0) -> ReadAheadStats:
        """End the read-ahead: no read starts after this; waits up to ``timeout`` s for the reads in flight."""
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join(max(0.0, deadline - time.monotonic()))
        return self.stats

    @property
    def stats(self) -> ReadAheadStats:
        with self._lock:
            end = self._ended if self._ended is not None else time.perf_counter()
            seconds = end - self._began if self._began is not None else 0.0
            return ReadAheadStats(
                self._bytes, seconds, len(self._plan), sum(e.range.nbytes for e in self._plan), self._skipped, self._max_ahead, self._error
            )

    @property
    def planned(self) -> list[PlannedRange]:
        """The plan, in the order it is read."""
        with self._lock:
            return [entry.range for entry in self._plan]

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def running(self) -> bool:
        return any(worker.is_alive() for worker in self._workers)

    # --------------------------------------------------------------------------------------------- threads
    def _next_step(self) -> tuple[_Entry, int, int] | None:
        """Under the lock: the next step to read (waiting for room in the window or for more plan), or None: end."""
        while True:
            if self._stopped or self._error is not None:
                return None
            pending = False
            while self._cursor < len(self._plan) and self._plan[self._cursor].issued >= self._plan[self._cursor].range.nbytes:
                self._cursor += 1
            for index in range(self._cursor, len(self._plan)):  # in plan order, from the first range not read whole
                entry = self._plan[index]
                if entry.consumed > entry.issued:  # the loader read these bytes before the read-ahead got to them
                    self._skipped += entry.consumed - entry.issued
                    entry.issued = entry.consumed
                start = entry.issued
                if start >= entry.range.nbytes:
                    continue
                pending = True
                length = min(self.step_bytes, entry.range.nbytes - start)
                if self._ahead + length <= self.window_bytes:
                    entry.issued = start + length
                    self._ahead += length
                    self._max_ahead = max(self._max_ahead, self._ahead)
                    return entry, start, length
                break  # in order: wait until the loader consumes
            if not pending and self._sealed:
                return None
            if time.monotonic() - self._last_progress > self.idle_seconds:
                self._error = self._error or f"idle for {self.idle_seconds:.0f} s (the load never ended it)"
                return None
            self._lock.wait(timeout=min(1.0, self.idle_seconds))

    def _run(self) -> None:
        fds: dict[str, int] = {}
        scratch = memoryview(bytearray(self.step_bytes)) if self._fetch is None else None

        def fetch(path: str, offset: int, nbytes: int) -> None:
            if self._fetch is not None:
                return self._fetch(path, offset, nbytes)
            if path not in fds:
                fds[path] = open_without_readahead(path)
            assert scratch is not None  # made whenever there is no injected fetch
            _pread_scratch(fds[path], scratch, offset, nbytes)

        try:
            while True:
                with self._lock:
                    step = self._next_step()
                    if step is None:
                        return
                    if self._began is None:
                        self._began = time.perf_counter()
                entry, start, length = step
                try:
                    fetch(entry.range.path, entry.range.offset + start, length)
                finally:
                    with self._lock:
                        self._bytes += length
                        self._ended = time.perf_counter()
        except Exception as err:  # never into the loader: it reads its bytes itself
            with self._lock:
                if self._error is None:
                    self._error = f"{type(err).__name__}: {err}"
                    logger.warning("moebake: the read-ahead stopped (%s); the loader reads its bytes itself", self._error)
                self._lock.notify_all()
        finally:
            for fd in fds.values():
                os.close(fd)
