"""StagedReader on CPU: the chunked, ring-buffered pipeline (staged) and direct reads land every byte; its threads
and ring are kept between reads; a failed read waits for the others."""

import os
import threading
import time

import pytest
import torch

from moebake.errors import InvalidArgumentError, MoebakeError
from moebake.loading import staged_reader
from moebake.loading.staged_reader import ByteRange, StagedReader
from tests.conftest import benchkit, random_u8


@pytest.fixture()
def data_file(tmp_path):
    data = random_u8(50_000, seed=5)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.numpy().tobytes())
    return path, data


# (offset, length) pieces: one smaller than a chunk, one spanning several chunks plus a tail, one empty.
PIECES = [(7, 900), (1000, 20_001), (30_000, 0), (31_000, 19_000)]


@pytest.mark.parametrize("staged, chunk_bytes, slots", [(True, 1024, 3), (True, 4096, 1), (True, 1 << 20, 4), (False, 1000, 2)])
def test_every_byte_lands_where_asked(data_file, staged, chunk_bytes, slots):
    path, data = data_file
    dests = [torch.full((n,), 0xAA, dtype=torch.uint8) for _, n in PIECES]
    ranges = [ByteRange(str(path), offset, dest, f"t{i}") for i, ((offset, _), dest) in enumerate(zip(PIECES, dests))]
    reader = StagedReader(torch.device("cpu"), chunk_bytes=chunk_bytes, slots=slots, staged=staged)
    for _ in range(2):  # the ring is re-used by a second read
        stats = reader.read(ranges)
        for (offset, n), dest in zip(PIECES, dests):
            assert torch.equal(dest, data[offset : offset + n])
    assert stats.bytes == sum(n for _, n in PIECES) and stats.tensors == len(PIECES) and stats.device == "cpu"


@pytest.mark.parametrize("slots, ring", [(3, 3), (2, 5)])
def test_a_buffer_is_refilled_only_after_its_copy_and_at_most_slots_reads_run_at_once(data_file, monkeypatch, slots, ring):
    """``slots`` threads, a ring of ``ring`` buffers: every buffer is used, at most ``slots`` reads run at once, and
    each buffer's events go wait, read, copy, wait, read, copy... (its next read starts only after the wait on its last
    copy's event). The events are stand-ins that log (on CPU the copies are synchronous)."""
    path, data = data_file
    log, lock, running, peak, real = [], threading.Lock(), [0], [0], staged_reader._pread_into
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=slots, buffers=ring, staged=True)
    buffers, _ = reader._ring()
    assert len(buffers) == ring
    slot_of = {buffer.data_ptr(): slot for slot, buffer in enumerate(buffers)}

    class LoggingEvent:
        def __init__(self, slot):
            self.slot = slot

        def record(self):
            log.append(("copy", self.slot))

        def synchronize(self):
            log.append(("wait", self.slot))

    def counting(fd, buffer, offset, piece):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            log.append(("read", slot_of[buffer.data_ptr()]))
        time.sleep(0.001)
        real(fd, buffer, offset, piece)
        with lock:
            running[0] -= 1

    reader._events = [LoggingEvent(slot) for slot in range(ring)]
    monkeypatch.setattr(staged_reader, "_pread_into", counting)
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in PIECES]
    reader.read(_ranges(path, dests))
    reader.close()
    assert all(torch.equal(dest, data[offset : offset + n]) for (offset, n), dest in zip(PIECES, dests))
    assert peak[0] <= slots
    per_slot = {slot: [kind for kind, at in log if at == slot] for slot in range(ring)}
    chunks = sum(-(-n // 1024) for _, n in PIECES)
    assert sum(kinds.count("read") for kinds in per_slot.values()) == chunks
    for slot, kinds in per_slot.items():
        uses = kinds.count("read")
        assert uses >= chunks // ring and kinds == ["wait", "read", "copy"] * uses, (slot, kinds)


def test_a_ring_needs_a_buffer_for_each_reading_thread():
    with pytest.raises(InvalidArgumentError, match="a ring of 2 buffers for 3 reading threads"):
        StagedReader(torch.device("cpu"), slots=3, buffers=2)


@pytest.mark.parametrize("staged", [True, False])
def test_a_file_ending_early_names_the_tensor(data_file, staged):
    path, _ = data_file
    ranges = [ByteRange(str(path), 49_000, torch.empty(5000, dtype=torch.uint8), "model.layers.0.mlp.experts.w2_weight")]
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=2, staged=staged)
    with pytest.raises(
        MoebakeError, match=r"blob.bin: tensor model.layers.0.mlp.experts.w2_weight is truncated \(file ends at byte 50000\)"
    ):
        reader.read(ranges)


def _ranges(path, dests):
    return [ByteRange(str(path), offset, dest, f"t{i}") for i, ((offset, _), dest) in enumerate(zip(PIECES, dests))]


def test_the_reading_threads_and_the_ring_are_kept_between_reads_until_closed(data_file):
    path, data = data_file
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=3, staged=True)
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in PIECES]

    def readers():
        return {t for t in threading.enumerate() if t.name.startswith("moebake-read")}

    before = readers()
    reader.read(_ranges(path, dests))
    first, ring = readers() - before, [b.data_ptr() for b in reader._staging]
    reader.read(_ranges(path, dests))
    assert readers() - before == first and 0 < len(first) <= 3
    assert [b.data_ptr() for b in reader._staging] == ring
    reader.close()
    assert not any(t.is_alive() for t in first) and reader._staging == []
    reader.read(_ranges(path, dests))  # starts again after close
    assert all(torch.equal(dest, data[offset : offset + n]) for (offset, n), dest in zip(PIECES, dests))
    reader.close()


def test_ring_seconds_counts_each_allocation_of_the_ring_and_nothing_else(data_file, monkeypatch):
    """The first staged read pays for the ring (inside its clock); a second read re-uses it and adds nothing; a read
    after ``close`` allocates again. Unstaged reads have no ring."""
    path, _ = data_file
    clock = iter(range(100, 10_000, 10))  # each perf_counter call 10 s later: the count is of calls, not of speed
    monkeypatch.setattr(staged_reader.time, "perf_counter", lambda: next(clock))
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in PIECES]
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=3, staged=True)
    assert reader.ring_seconds == 0.0
    reader.read(_ranges(path, dests))
    assert reader.ring_seconds == 10
    reader.read(_ranges(path, dests))
    assert reader.ring_seconds == 10
    reader.close()
    reader.read(_ranges(path, dests))
    assert reader.ring_seconds == 20
    reader.close()
    direct = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=3, staged=False)
    direct.read(_ranges(path, dests))
    assert direct.ring_seconds == 0.0


@pytest.mark.parametrize("staged", [True, False])
def test_a_failed_read_returns_only_after_every_other_read_has_ended(data_file, monkeypatch, staged):
    """The reading threads outlive a call: a call that fails must still wait for its other reads, which would
    otherwise go on into a closed (or re-used) file descriptor and a staging buffer the next call refills."""
    path, _ = data_file
    running, lock, real = [0], threading.Lock(), staged_reader._pread_into

    def slow_or_failing(fd, buffer, offset, piece):
        with lock:
            running[0] += 1
        try:
            if offset == 1000:
                raise MoebakeError(f"{piece.path}: tensor {piece.name} planted failure")
            time.sleep(0.05)
            real(fd, buffer, offset, piece)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(staged_reader, "_pread_into", slow_or_failing)
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=4, staged=staged)
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in PIECES]
    with pytest.raises(MoebakeError, match=r"blob.bin: tensor t1 planted failure"):
        reader.read(_ranges(path, dests))
    assert running[0] == 0
    reader.close()


def test_staged_reads_go_through_the_ring_only(data_file, monkeypatch):
    """Host memory of a staged read is the ring (``slots`` buffers of ``chunk_bytes``), whatever the sizes: every
    read lands in one of its buffers."""
    path, data = data_file
    seen, real = [], staged_reader._pread_into

    def recording(fd, buffer, offset, piece):
        seen.append((buffer.data_ptr(), buffer.numel()))
        real(fd, buffer, offset, piece)

    monkeypatch.setattr(staged_reader, "_pread_into", recording)
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=3, staged=True)
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in PIECES]
    reader.read(_ranges(path, dests))
    ring = [(b.data_ptr(), b.numel()) for b in reader._staging]
    assert len(ring) == 3 and all(size == 1024 for _, size in ring)
    assert len(seen) == sum(-(-n // 1024) for _, n in PIECES)
    assert all(any(start <= ptr and ptr + n <= start + size for start, size in ring) for ptr, n in seen)
    assert all(torch.equal(dest, data[offset : offset + n]) for (offset, n), dest in zip(PIECES, dests))
    reader.close()


def _block_device_bytes_read() -> int:
    """Bytes this process has had read from block devices (``benchkit.io_read_bytes``); skips where unaccounted."""
    read = benchkit().io_read_bytes()
    if read is None:
        pytest.skip("no I/O accounting (/proc/self/io) here")
    return read


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
def test_a_slice_of_each_tensor_reads_no_bytes_beyond_the_slices(tmp_path):
    """A rank reads one quarter of each of 8 tensors: from the disk (the file's pages evicted), the block device gives
    exactly those bytes, not the kernel's readahead past each slice (25% more here before the reader turned
    readahead off)."""
    tensor_bytes, count = 8 << 20, 8
    path = tmp_path / "tensors.bin"
    path.write_bytes(random_u8(tensor_bytes * count, seed=5).numpy().tobytes())
    slices = [(t * tensor_bytes + tensor_bytes // 4, tensor_bytes // 4) for t in range(count)]
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in slices]
    data = path.read_bytes()
    benchkit().evict_from_page_cache([path])  # written back, then out of the page cache: its bytes come from the disk
    before = _block_device_bytes_read()
    StagedReader(torch.device("cpu"), staged=True, chunk_bytes=1 << 20).read(
        [ByteRange(str(path), offset, dest, f"t{i}") for i, ((offset, _), dest) in enumerate(zip(slices, dests))]
    )
    read, asked = _block_device_bytes_read() - before, sum(n for _, n in slices)
    assert all(dest.numpy().tobytes() == data[offset : offset + n] for (offset, n), dest in zip(slices, dests))
    if read < asked:
        pytest.skip(
            f"{read} of the {asked} bytes came from the disk: this filesystem (tmpfs, or one that ignores "
            "POSIX_FADV_DONTNEED) kept the file in memory"
        )
    assert read == asked


def test_the_readers_descriptors_have_readahead_off(data_file, monkeypatch):
    advised = []
    monkeypatch.setattr(staged_reader.os, "posix_fadvise", lambda fd, offset, length, advice: advised.append(advice), raising=False)
    monkeypatch.setattr(staged_reader.os, "POSIX_FADV_RANDOM", 1, raising=False)
    path, data = data_file
    dest = torch.empty(1000, dtype=torch.uint8)
    StagedReader(torch.device("cpu")).read([ByteRange(str(path), 10, dest, "t")])
    assert advised == [1]


def test_start_ring_pins_the_ring_in_a_reading_thread_and_the_first_read_takes_it(data_file, monkeypatch):
    """``start_ring`` returns at once and the ring is allocated in one of the reader's threads; the first read takes
    that ring (no second allocation), and waits for it only while it is being made: a read after the allocation
    ended (0.2 s after it began here) spends next to nothing on the ring (``ring_wait_seconds``); ``ring_seconds``
    counts the allocation.
    Calling it again, or with a ring already there, allocates nothing more."""
    path, data = data_file
    real, calls, release = StagedReader._allocate_ring, [], threading.Event()

    def slow(self):
        calls.append(threading.current_thread().name)
        release.wait(timeout=20)
        time.sleep(0.2)
        return real(self)

    monkeypatch.setattr(StagedReader, "_allocate_ring", slow)
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=3, staged=True)
    reader.start_ring()
    reader.start_ring()  # one allocation, not two
    release.set()
    reader._ring_started.result(timeout=20)
    assert calls and calls[0].startswith("moebake-read") and reader.ring_seconds > 0
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in PIECES]
    reader.read(_ranges(path, dests))
    assert len(calls) == 1 and len(reader._staging) == 3 and reader.ring_wait_seconds < 0.1
    assert all(torch.equal(dest, data[offset : offset + n]) for (offset, n), dest in zip(PIECES, dests))
    reader.start_ring()  # the ring is there: nothing to do
    assert len(calls) == 1 and reader._ring_started is None
    reader.close()


def test_a_read_without_start_ring_spends_the_allocation_on_its_clock_and_an_unstaged_reader_has_no_ring(data_file):
    path, _ = data_file
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in PIECES]
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=3, staged=True)
    reader.read(_ranges(path, dests))
    assert 0 < reader.ring_seconds <= reader.ring_wait_seconds
    reader.close()
    direct = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=3, staged=False)
    direct.start_ring()
    assert direct._ring_started is None and direct._executor is None
    direct.read(_ranges(path, dests))
    assert direct.ring_seconds == direct.ring_wait_seconds == 0.0


def test_close_drops_a_ring_being_pinned_and_a_later_read_makes_its_own(data_file):
    path, data = data_file
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=3, staged=True)
    reader.start_ring()
    reader.close()  # waits for the threads (the allocation among them), then drops what they made
    assert reader._ring_started is None and reader._staging == []
    dests = [torch.empty(n, dtype=torch.uint8) for _, n in PIECES]
    reader.read(_ranges(path, dests))
    assert all(torch.equal(dest, data[offset : offset + n]) for (offset, n), dest in zip(PIECES, dests))
    reader.close()
