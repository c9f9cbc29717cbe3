"""Busy time per stage of a conversion (read, transform, hash, write), for ``moebake convert --profile``.

Every stage adds ``(seconds, cpu seconds, bytes)`` as it works, from whichever thread it runs in,
to the process-wide :data:`STAGES`; worker processes send theirs back with each shard
(:meth:`StageTimes.merge`). ``seconds`` is wall time spent in the stage (waiting for the disk, or
for a core when other processes compete, included); ``cpu`` is the CPU time of the thread doing it.
Stages run in parallel threads and processes, so their seconds add up to more than the wall time.

  * ``read``: source bytes: seconds the producing thread waited for them (reading them itself, or
    waiting for the reading thread that reads ahead), CPU of every thread reading them;
  * ``transform``: producing output chunks, less the reads inside it (layout transforms, padding);
  * ``hash``: checksums of source and output bytes (plus re-reads of source bytes not met in order);
  * ``write``: writing output bytes and flushing them to the disk (``fdatasync``/``fsync``).
"""

import threading
import time
from contextlib import contextmanager

NAMES = ("read", "transform", "hash", "write")


Times = tuple[float, float, int]
"""``(seconds, cpu seconds, bytes)`` of one stage."""


class StageTimes:
    """Thread-safe ``{stage: (seconds, cpu seconds, bytes)}`` accumulator."""

    def __init__(self):
        self._lock = threading.Lock()
        self._totals = {name: (0.0, 0.0, 0) for name in NAMES}
        self._thread = threading.local()  # per thread: ahead (bool), read (seconds, cpu seconds)

    def add(self, stage: str, seconds: float, cpu_seconds: float, nbytes: int) -> None:
        if getattr(self._thread, "ahead", False):
            seconds = 0.0
        with self._lock:
            total = self._totals[stage]
            self._totals[stage] = (total[0] + seconds, total[1] + cpu_seconds, total[2] + nbytes)
        if stage == "read":
            own = getattr(self._thread, "read", (0.0, 0.0))
            self._thread.read = (own[0] + seconds, own[1] + cpu_seconds)

    def off_critical_path(self) -> None:
        """Mark the calling thread as working ahead of the pipeline (reading ahead): its wall time is
        not added, only its CPU time (the pipeline's waits for it are timed where they happen)."""
        self._thread.ahead = True

    def own_reading(self) -> tuple[float, float]:
        """``(seconds, cpu seconds)`` of ``read`` added by the calling thread so far."""
        return getattr(self._thread, "read", (0.0, 0.0))

    @contextmanager
    def timing(self, stage: str, nbytes: int):
        """Add the wall and thread CPU time the ``with`` body takes to ``stage``, with ``nbytes``."""
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - start, time.thread_time() - start_cpu, nbytes)

    def snapshot(self) -> dict[str, Times]:
        with self._lock:
            return dict(self._totals)

    def merge(self, snapshot: dict[str, Times]) -> None:
        for name, times in snapshot.items():
            self.add(name, *times)

    def reset(self) -> None:
        with self._lock:
            self._totals = {name: (0.0, 0.0, 0) for name in NAMES}


STAGES = StageTimes()


def profile_lines(snapshot: dict[str, Times], wall_seconds: float) -> list[str]:
    """A table: per stage, bytes, busy and CPU seconds, and GB per busy / per CPU second."""
    lines = [f"profile: {'stage':9s} {'GB':>7s} {'busy s':>8s} {'cpu s':>8s} {'GB/busy s':>10s} {'GB/cpu s':>9s}"]
    for name in NAMES:
        seconds, cpu_seconds, nbytes = snapshot[name]
        rates = [f"{nbytes / 1e9 / t:.2f}" if t > 0 else "-" for t in (seconds, cpu_seconds)]
        lines.append(f"profile: {name:9s} {nbytes / 1e9:7.2f} {seconds:8.2f} {cpu_seconds:8.2f} {rates[0]:>10s} {rates[1]:>9s}")
    lines.append(f"profile: wall {wall_seconds:.2f} s; stages overlap in threads and processes")
    return lines
