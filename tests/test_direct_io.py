"""O_DIRECT reads and writes give the bytes plain I/O gives, and fall back where a file system refuses."""

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from moebake.convert import direct_io
from moebake.convert.direct_io import ALIGN, OutputFile, read_range
from moebake.convert.io_mode import IO_ENV, io_mode
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert


@pytest.fixture(autouse=True)
def fresh_refusals(monkeypatch):
    """No device remembered as refusing O_DIRECT; O_DIRECT tried whatever this machine's core count (``auto``
    picks plain I/O on 8+ cores), unless a test chooses otherwise."""
    monkeypatch.setattr(direct_io, "_refused_devices", set())
    monkeypatch.setenv(IO_ENV, "direct")


@pytest.mark.parametrize("cores, mode", [(2, "direct"), (7, "direct"), (8, "plain"), (16, "plain")])
def test_auto_picks_o_direct_on_few_cores_and_the_page_cache_on_many(monkeypatch, cores, mode):
    monkeypatch.setenv(IO_ENV, "auto")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert io_mode() == mode
    for chosen in ("direct", "plain"):
        monkeypatch.setenv(IO_ENV, chosen)
        assert io_mode() == chosen


@pytest.fixture(params=["direct", "plain"])
def io_path(request, monkeypatch, tmp_path):
    """Which path the test runs: O_DIRECT (skipped where tmp_path's file system refuses it) or forced plain."""
    monkeypatch.setenv(IO_ENV, request.param)
    if request.param == "direct":
        if not hasattr(os, "O_DIRECT"):
            pytest.skip("no O_DIRECT on this platform")
        with OutputFile(tmp_path / "probe") as probe:
            if not probe.direct:
                pytest.skip(f"{tmp_path}: the file system refuses O_DIRECT")
        direct_io._refused_devices.clear()
    return request.param


def random_bytes(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def nothing_cached(monkeypatch):
    """Make ``read_range`` find none of the file in the page cache (its ``RWF_NOWAIT`` reads get nothing), as
    after ``drop_from_page_cache``: the kernel may keep a just-written page cached whatever fadvise asks (a
    page in another CPU's batch, say), so a test that needs the cold path does not leave it to the kernel."""
    monkeypatch.setattr(direct_io, "_read_cached", lambda path, view, offset: (0, False))


def drop_from_page_cache(path, start=0, length=0):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def counting_direct_opens(monkeypatch) -> list:
    opened, real_open = [], os.open

    def counting_open(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            opened.append(path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", counting_open)
    return opened


@pytest.mark.parametrize("cache", ["cold", "warm", "second-half-cold"])
@pytest.mark.parametrize(
    "offset, length",
    [
        (0, 1),
        (0, ALIGN),
        (1, ALIGN),
        (ALIGN - 1, 2),
        (5000, 70_000),
        (3 * ALIGN, 5 * ALIGN),
        (100_000, 5000),
        (99_000, 10_000),
        (100_000 - 1, 1),
        (100_000, 1),
        (0, 100_000),
        (7, 0),
        (49_000, 3000),
    ],
)
def test_read_range_equals_the_file(io_path, tmp_path, monkeypatch, cache, offset, length):
    data = random_bytes(100_000)  # not a multiple of ALIGN: the last block is partial
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    if cache != "warm":
        drop_from_page_cache(path, *((12 * ALIGN, 0) if cache == "second-half-cold" else ()))
    if cache == "cold":
        nothing_cached(monkeypatch)
    direct_opens = counting_direct_opens(monkeypatch)
    got = read_range(str(path), offset, length)
    assert got.dtype == np.uint8 and got.tobytes() == data[offset : offset + length]
    if io_path == "direct" and cache == "cold" and 0 < length and offset < len(data):
        assert direct_opens  # read from the disk, not the page cache
    if cache == "warm" or io_path == "plain":
        assert not direct_opens  # cached bytes come from the page cache


@pytest.mark.parametrize("depth", ["1", "4"])
@pytest.mark.parametrize("pieces", [[0], [1], [ALIGN], [100, 5000, 3, 70_000], [40_000] * 5, [12_345, 0, 65_536, 1]])
def test_output_file_writes_exactly_what_it_is_given(io_path, tmp_path, monkeypatch, pieces, depth):
    monkeypatch.setattr(direct_io, "WRITE_BLOCK", 4 * ALIGN)  # many full blocks and a partial last one
    monkeypatch.setenv(direct_io.WRITE_DEPTH_ENV, depth)
    data = random_bytes(sum(pieces), seed=len(pieces))
    path = tmp_path / "out.bin"
    with OutputFile(path) as f:
        assert f.direct == (io_path == "direct")
        position = 0
        for size in pieces:
            f.write(memoryview(data)[position : position + size])
            position += size
    assert path.read_bytes() == data


def refuse_o_direct_at_open(monkeypatch):
    real_open = os.open

    def fake_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", fake_open)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")
def test_a_refusal_at_open_falls_back_and_is_remembered(tmp_path, monkeypatch):
    data = random_bytes(50_000)
    (tmp_path / "data.bin").write_bytes(data)
    drop_from_page_cache(tmp_path / "data.bin")
    nothing_cached(monkeypatch)
    refuse_o_direct_at_open(monkeypatch)
    assert read_range(str(tmp_path / "data.bin"), 10, 40_000).tobytes() == data[10:40_010]
    assert not direct_io.direct_io_wanted(tmp_path / "data.bin")  # remembered for the device
    with OutputFile(tmp_path / "out.bin") as f:
        f.write(data)
        assert not f.direct
    assert (tmp_path / "out.bin").read_bytes() == data


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")
def test_a_refusal_at_the_first_write_falls_back_with_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(direct_io, "WRITE_BLOCK", 4 * ALIGN)
    real_write = os.write
    direct_fds = set()
    real_open = os.open

    def tracking_open(path, flags, *args):
        fd = real_open(path, flags, *args)
        (direct_fds.add if flags & os.O_DIRECT else direct_fds.discard)(fd)
        return fd

    def refusing_write(fd, data):
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", tracking_open)
    monkeypatch.setattr(os, "write", refusing_write)
    for size in (40_000, 100):  # several blocks; less than one (refused at the last, partial block)
        data = random_bytes(size)
        with OutputFile(tmp_path / "out.bin") as f:
            f.write(data[:100])
            f.write(data[100:])
        assert (tmp_path / "out.bin").read_bytes() == data
        direct_io._refused_devices.clear()


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")
def test_direct_writes_are_in_flight_together_and_their_errors_surface(tmp_path, monkeypatch):
    """At depth 4, several blocks are written at once (each at its offset): the same bytes. A block that
    fails on the disk raises at a later write or at close, and the file is closed either way."""
    import threading
    import time

    monkeypatch.setattr(direct_io, "WRITE_BLOCK", 4 * ALIGN)
    monkeypatch.setenv(direct_io.WRITE_DEPTH_ENV, "4")
    real_pwrite, lock, state = os.pwrite, threading.Lock(), {"now": 0, "most": 0, "fail_at": None}

    def slow_pwrite(fd, data, offset):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.02)
        try:
            if offset == state["fail_at"]:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_pwrite(fd, data, offset)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(os, "pwrite", slow_pwrite)
    data = random_bytes(40 * 4 * ALIGN + 123)
    with OutputFile(tmp_path / "out.bin") as f:
        if not f.direct:
            pytest.skip("this file system refuses O_DIRECT")
        f.write(data)
    assert (tmp_path / "out.bin").read_bytes() == data
    assert state["most"] >= 3
    state["fail_at"] = 5 * 4 * ALIGN
    with pytest.raises(OSError, match="No space left"):
        with OutputFile(tmp_path / "failing.bin") as f:
            f.write(data)
    assert f._fd == -1 and not f._in_flight


def tmpfs_dir() -> Path | None:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "tmpfs" and os.access(fields[1], os.W_OK) and fields[1] in ("/dev/shm", "/tmp", "/run/user"):
            return Path(fields[1])
    return None


@pytest.mark.skipif(tmpfs_dir() is None, reason="no writable tmpfs mount")
def test_tmpfs_gives_the_same_bytes(tmp_path):
    """tmpfs refused O_DIRECT before Linux 6.6 (EINVAL) and takes it since: the bytes are the same either way."""
    directory = tmpfs_dir() / f"moebake-test-{os.getpid()}"
    directory.mkdir()
    try:
        data = random_bytes(30_000)
        with OutputFile(directory / "out.bin") as f:
            f.write(data)
        drop_from_page_cache(directory / "out.bin")  # tmpfs keeps its pages: they are the file
        assert read_range(str(directory / "out.bin"), 3, 29_000).tobytes() == data[3:29_003]
    finally:
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()


def test_a_conversion_writes_the_same_files_with_and_without_o_direct(gpt_oss_tiny, tmp_path, monkeypatch):
    options = ConvertOptions("sm90-cutlass", chunk_bytes=1 << 16)
    monkeypatch.setenv(IO_ENV, "direct")
    direct = convert(gpt_oss_tiny, tmp_path / "direct", options, progress=False).to_json()
    monkeypatch.setenv(IO_ENV, "plain")
    plain = convert(gpt_oss_tiny, tmp_path / "plain", options, progress=False).to_json()
    assert direct["files"] == plain["files"] and direct["source"]["files"] == plain["source"]["files"]
    for name in direct["files"]:
        assert (tmp_path / "direct" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name
