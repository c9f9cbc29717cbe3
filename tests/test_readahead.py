"""moebake.loading.readahead: it reads only planned bytes, stays within its window of the loader, never breaks a
load, and the loader's bytes are the same with it as without (StagedReader, staged pipeline on the CPU)."""

import threading
import time

import pytest
import torch

from moebake.loading import readahead
from moebake.loading.readahead import PlannedRange, ReadAhead
from moebake.loading.staged_reader import ByteRange, StagedReader

STEP = 4096


def _wait(predicate, seconds: float = 20.0) -> None:
    """Poll until ``predicate()`` (a condition, not a timing: fails only if it never holds)."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


class Recorder:
    """A read-ahead's ``fetch``: records each ``(path, offset, nbytes)`` (optionally after a real read)."""

    def __init__(self, fail_after: int | None = None):
        self.touched: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()
        self.fail_after = fail_after

    def __call__(self, path, offset, nbytes):
        with self.lock:
            if self.fail_after is not None and len(self.touched) >= self.fail_after:
                raise OSError("injected read error")
            self.touched.append((path, offset, nbytes))
        with open(path, "rb") as f:
            f.seek(offset)
            assert len(f.read(nbytes)) == nbytes


def inside(touched, ranges) -> list:
    """The touched pieces that lie in no range of ``ranges`` (``(path, offset, nbytes)``)."""
    return [t for t in touched if not any(t[0] == r[0] and r[1] <= t[1] and t[1] + t[2] <= r[1] + r[2] for r in ranges)]


@pytest.fixture
def shard(tmp_path):
    data = torch.randint(0, 256, (64 * STEP + 123,), dtype=torch.uint8)
    path = tmp_path / "shard.bin"
    path.write_bytes(data.numpy().tobytes())
    return str(path), data


def _ranges(path, data, spans):
    return [ByteRange(path, offset, torch.zeros(nbytes, dtype=torch.uint8), f"t{i}") for i, (offset, nbytes) in enumerate(spans)]


SPANS = [(0, 5 * STEP + 7), (8 * STEP, 3 * STEP), (20 * STEP + 1, 10 * STEP), (40 * STEP, 24 * STEP + 123)]
"""Ranges of the shard with gaps between them (bytes no loader asks for) and unaligned ends."""


@pytest.mark.parametrize("window", [2 * STEP, 1 << 30])
def test_loaded_bytes_equal_without_read_ahead_and_only_planned_bytes_are_read(shard, window):
    path, data = shard
    plain = _ranges(path, data, SPANS)
    StagedReader(torch.device("cpu"), chunk_bytes=STEP, slots=3, staged=True).read(plain)
    recorder = Recorder()
    ahead = ReadAhead(window_bytes=window, step_bytes=STEP, threads=3, fetch=recorder)
    reader = StagedReader(torch.device("cpu"), chunk_bytes=STEP, slots=3, staged=True)
    reader.on_consumed = ahead.consumed
    ranges = _ranges(path, data, SPANS)
    read = []
    ahead.add(ranges)
    ahead.seal()
    read_ranges = reader.read
    reader.read = lambda pieces: (read.extend((p.path, p.offset, p.dest.numel()) for p in pieces), read_ranges(pieces))[1]
    reader.read(ranges)
    stats = ahead.stop()
    for mine, theirs, (offset, nbytes) in zip(ranges, plain, SPANS, strict=True):
        assert torch.equal(mine.dest, theirs.dest) and torch.equal(mine.dest, data[offset : offset + nbytes])
    assert not inside(recorder.touched, read)  # nothing outside what the loader read
    assert stats.error is None and stats.max_ahead <= window and stats.bytes == sum(t[2] for t in recorder.touched)
    assert stats.bytes + stats.skipped_bytes <= sum(n for _, n in SPANS)


def test_a_stray_range_in_the_plan_is_read_and_seen(shard):
    """The check above fails when the plan holds a range the loader never reads (the test is not vacuous)."""
    path, data = shard
    recorder = Recorder()
    ahead = ReadAhead(window_bytes=1 << 20, step_bytes=STEP, threads=2, fetch=recorder)
    ahead.add(_ranges(path, data, SPANS) + [PlannedRange(path, 6 * STEP, STEP)])  # a gap's bytes
    ahead.seal()
    _wait(lambda: not ahead.running)
    assert inside(recorder.touched, [(path, o, n) for o, n in SPANS]) == [(path, 6 * STEP, STEP)]


def test_the_window_bounds_how_far_it_reads_ahead_of_the_loader(shard):
    path, data = shard
    recorder = Recorder()
    window = 3 * STEP
    ahead = ReadAhead(window_bytes=window, step_bytes=STEP, threads=4, fetch=recorder)
    ranges = [PlannedRange(path, o, n) for o, n in SPANS]
    ahead.add(ranges)
    ahead.seal()
    _wait(lambda: ahead.stats.bytes == window)  # read up to its window, then waits for the loader
    time.sleep(0.05)
    assert ahead.stats.bytes == window and ahead.running
    consumed = 0
    for r in ranges:  # the loader consumes chunk by chunk; the read-ahead never gets more than the window ahead
        for start in range(0, r.nbytes, STEP):
            ahead.consumed(r.path, r.offset, min(STEP, r.nbytes - start))
            consumed += min(STEP, r.nbytes - start)
            assert ahead.stats.bytes <= consumed + window
    _wait(lambda: not ahead.running)
    stats = ahead.stop()
    assert stats.max_ahead <= window and stats.bytes + stats.skipped_bytes == sum(r.nbytes for r in ranges)
    assert not inside(recorder.touched, [(r.path, r.offset, r.nbytes) for r in ranges])


def test_ranges_the_loader_consumed_first_are_skipped_and_first_ranges_go_first(shard):
    path, data = shard
    recorder = Recorder()
    ahead = ReadAhead(window_bytes=STEP, step_bytes=STEP, threads=1, fetch=recorder)
    later = PlannedRange(path, 40 * STEP, 2 * STEP)
    ahead.add([later])
    _wait(lambda: ahead.stats.bytes == STEP)  # its window's worth of the later range, then waits
    ahead.add([PlannedRange(path, 0, 2 * STEP)], first=True)  # the other tensors: consumed before the experts
    ahead.consumed(path, 0, 2 * STEP)  # the loader read them itself
    ahead.consumed(path, later.offset, STEP)
    ahead.seal()
    _wait(lambda: not ahead.running)
    stats = ahead.stop()
    assert recorder.touched == [(path, 40 * STEP, STEP), (path, 41 * STEP, STEP)]
    assert stats.skipped_bytes == 2 * STEP


def test_an_error_in_the_read_ahead_does_not_break_the_load(shard):
    path, data = shard
    ahead = ReadAhead(window_bytes=1 << 20, step_bytes=STEP, threads=2, fetch=Recorder(fail_after=2))
    reader = StagedReader(torch.device("cpu"), chunk_bytes=STEP, slots=2, staged=True)
    reader.on_consumed = ahead.consumed
    ranges = _ranges(path, data, SPANS)
    ahead.add(ranges)
    ahead.seal()
    _wait(lambda: not ahead.running)
    reader.read(ranges)
    stats = ahead.stop()
    assert "injected read error" in stats.error and not ahead.running
    for piece, (offset, nbytes) in zip(ranges, SPANS, strict=True):
        assert torch.equal(piece.dest, data[offset : offset + nbytes])


def test_a_real_read_ahead_reads_the_file_and_stops(shard):
    """The default fetch (``preadv`` into a scratch buffer): every planned byte once, then the threads end."""
    path, data = shard
    ahead = ReadAhead(window_bytes=1 << 20, step_bytes=STEP, threads=2)
    ahead.add([PlannedRange(path, o, n) for o, n in SPANS])
    ahead.seal()
    _wait(lambda: not ahead.running)
    stats = ahead.stop()
    assert stats.error is None and stats.bytes == sum(n for _, n in SPANS)
    ahead.add([PlannedRange(path, 0, STEP)])  # after stop: ignored
    assert not ahead.running and ahead.stats.bytes == stats.bytes


def test_a_read_ahead_nobody_ends_ends_itself(shard):
    path, _ = shard
    ahead = ReadAhead(window_bytes=STEP, step_bytes=STEP, threads=1, fetch=Recorder(), idle_seconds=0.05)
    ahead.add([PlannedRange(path, 0, 4 * STEP)])  # never consumed, never sealed
    _wait(lambda: not ahead.running)
    assert "idle" in ahead.stop().error


def test_the_read_ahead_is_opt_in(monkeypatch):
    """Off unless ``MOEBAKE_READAHEAD=1`` (bench/results/startup_cpu_2core.md: it made cold loads slower on the CPU
    box, and no GPU run has shown a gain yet)."""
    monkeypatch.delenv(readahead.ENV, raising=False)
    assert not readahead.enabled()
    for value, on in (("1", True), ("0", False), ("yes", False)):
        monkeypatch.setenv(readahead.ENV, value)
        assert readahead.enabled() is on
