"""Bulk file I/O that bypasses the page cache (``O_DIRECT``), with plain I/O where that is refused.

A conversion reads each source byte once and writes each output byte once: through the page cache
every byte is copied twice more by the kernel (disk -> cache -> process, process -> cache -> disk),
and the cache fills with pages nobody reads again. ``O_DIRECT`` moves the bytes between the disk and
the process's own buffers. Its rules: the file offset, the length and the buffer's address are
multiples of the device's block size (:data:`ALIGN` covers 512-byte and 4 KiB devices), so

  * :func:`read_range` reads the aligned span around the wanted bytes into an aligned buffer and
    returns a view of the wanted ones (at most ``2 * ALIGN`` bytes more are read); bytes the page
    cache already holds (a warm source) are copied from it instead of read from the disk again;
  * :class:`OutputFile` gathers written bytes in an aligned buffer of :data:`WRITE_BLOCK` bytes and
    writes it whole; the last, partial block is written zero-padded and the file truncated to its size.
    Each ``O_DIRECT`` write waits for the disk, so up to :func:`write_depth` blocks are in flight at
    once (each written at its own offset by a thread of the file's), as the kernel's write-back keeps
    several requests in flight for buffered writes; the bytes and their order on disk are the same.

Where a file system refuses ``O_DIRECT`` (tmpfs: ``EINVAL`` from ``open``; some refuse at the first
read or write) the same calls fall back to plain buffered I/O, remembered per device, with the same
bytes.

Which is faster depends on the machine: :func:`moebake.convert.io_mode.io_mode` chooses (``O_DIRECT``
on a few cores, plain I/O on many).
Memory stays bounded: one read's span, and :func:`write_depth` blocks of :data:`WRITE_BLOCK` bytes per
open output file.
"""

import errno
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

import numpy as np

from moebake.convert.io_mode import io_mode
from moebake.formats.safetensors_file import read_file_range

ALIGN = 4096
WRITE_BLOCK = 8 << 20
"""Bytes gathered per ``O_DIRECT`` write (a multiple of :data:`ALIGN`)."""
WRITE_DEPTH_ENV = "MOEBAKE_WRITE_DEPTH"
"""Blocks an output file keeps in flight (default :data:`WRITE_DEPTH`; ``1``: each write waits for the last)."""
WRITE_DEPTH = 4


def write_depth() -> int:
    """How many :data:`WRITE_BLOCK` writes an ``O_DIRECT`` output file keeps in flight (:data:`WRITE_DEPTH_ENV`)."""
    value = os.environ.get(WRITE_DEPTH_ENV, "")
    return max(1, int(value)) if value.isdigit() else WRITE_DEPTH


_O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none (macOS): plain I/O
_refused_devices: set[int] = set()  # st_dev of file systems that refused O_DIRECT


def direct_io_wanted(path: str | os.PathLike) -> bool:
    """Whether to try ``O_DIRECT`` for ``path`` (the file, or the directory it will be created in)."""
    if not _O_DIRECT or io_mode() == "plain":
        return False
    try:
        device = os.stat(path if os.path.exists(path) else os.path.dirname(os.path.abspath(path))).st_dev
    except OSError:
        return False
    return device not in _refused_devices


def _refused(path: str | os.PathLike) -> None:
    try:
        _refused_devices.add(os.stat(path if os.path.exists(path) else os.path.dirname(os.path.abspath(path))).st_dev)
    except OSError:
        pass


def aligned_empty(nbytes: int) -> np.ndarray:
    """uint8 ``[nbytes]`` whose first byte's address is a multiple of :data:`ALIGN` (uninitialised)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes]


def read_range(path: str, offset: int, length: int) -> np.ndarray:
    """uint8 bytes ``[offset, offset + length)`` of ``path`` (fewer at its end).

    Bytes already in the page cache are copied from it (a warm source is not read from the disk
    again: ``RWF_NOWAIT`` reads stop at the first page that is not cached); the rest are read with
    ``O_DIRECT`` where allowed, else plainly.
    """
    if length <= 0 or not direct_io_wanted(path):
        return read_file_range(path, offset, length)
    start = offset - offset % ALIGN
    buffer = aligned_empty(-(-(offset + length - start) // ALIGN) * ALIGN)
    view = memoryview(buffer)
    cached, at_end = _read_cached(path, view[offset - start : offset - start + length], offset)
    if cached == length or at_end:
        return buffer[offset - start : offset - start + cached]
    resume = offset + cached - (offset + cached) % ALIGN  # O_DIRECT from the block holding the first missing byte
    got = _read_direct(path, view[resume - start :], resume)
    if got is None:
        return read_file_range(path, offset, length)
    return buffer[offset - start : max(offset, resume + got) - start][:length]


_nowait_reads = hasattr(os, "RWF_NOWAIT")  # cleared if the kernel does not take the flag


def _read_cached(path: str, view: memoryview, offset: int) -> tuple[int, bool]:
    """Fill ``view`` from ``path`` at ``offset`` with page-cache bytes only: how many were there, in a
    row, and whether they reach the file's end."""
    global _nowait_reads
    if not _nowait_reads:
        return 0, False
    got, at_end = 0, False
    fd = os.open(path, os.O_RDONLY)
    try:
        while got < len(view):
            try:
                n = os.preadv(fd, [view[got:]], offset + got, os.RWF_NOWAIT)
            except BlockingIOError:  # the next page is not cached
                break
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                _nowait_reads = False
                break
            if n == 0:
                at_end = True
                break
            got += n
    finally:
        os.close(fd)
    return got, at_end


def _read_direct(path: str, view: memoryview, offset: int) -> int | None:
    """Fill aligned ``view`` from ``path`` at aligned ``offset`` with ``O_DIRECT`` reads (whole
    blocks); the bytes read (fewer at the file's end), or None if the file system refuses."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECT)
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        _refused(path)
        return None
    got = 0
    try:
        while got < len(view):
            n = os.preadv(fd, [view[got:]], offset + got)
            got += n
            if n == 0 or n % ALIGN:  # a short read ends at the file's end
                break
    except OSError as err:
        if err.errno != errno.EINVAL:
            raise
        _refused(path)
        return None
    finally:
        os.close(fd)
    return got


class OutputFile:
    """A new file written front to back: ``O_DIRECT`` in aligned :data:`WRITE_BLOCK` writes where allowed.

    :meth:`write` takes any bytes-like object (from one thread); :meth:`close` waits for the blocks in
    flight, writes what is gathered, truncates the file to the bytes written and fsyncs it
    (:meth:`abandon` only waits and closes, on an error path; as a context manager it does one or the
    other). The first block is written before any other is started, so a file system that refuses
    ``O_DIRECT`` only at the first write is caught there and the file goes on plainly.
    :meth:`sync_written` asks the disk to flush what has been written so far (``fdatasync``).
    """

    def __init__(self, path: str | os.PathLike):
        self.path, self.size = str(path), 0
        self._buffer: np.ndarray | None = None
        self._filled = self._on_disk = 0
        self._free: list[np.ndarray] = []  # written blocks' buffers, to gather the next ones in
        self._in_flight: deque[tuple[Future, np.ndarray]] = deque()
        self._writers: ThreadPoolExecutor | None = None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        if direct_io_wanted(self.path):
            try:
                direct = os.open(self.path, os.O_WRONLY | _O_DIRECT)
            except OSError as err:
                if err.errno != errno.EINVAL:
                    os.close(self._fd)
                    raise
                _refused(self.path)
            else:
                os.close(self._fd)
                self._fd, self._buffer = direct, aligned_empty(WRITE_BLOCK)

    def __enter__(self) -> "OutputFile":
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()

    @property
    def direct(self) -> bool:
        """Whether the bytes go to the disk with ``O_DIRECT``."""
        return self._buffer is not None

    def write(self, data: bytes | memoryview) -> None:
        data = memoryview(data).cast("B")
        self.size += len(data)
        while len(data) and self._buffer is not None:
            take = min(len(data), WRITE_BLOCK - self._filled)
            self._buffer[self._filled : self._filled + take] = np.frombuffer(data[:take], np.uint8)
            self._filled += take
            data = data[take:]
            if self._filled == WRITE_BLOCK:
                self._write_block()
        if len(data):
            _write_all(self._fd, data)

    def sync_written(self) -> None:
        _fdatasync(self._fd)

    def close(self) -> None:
        """Write the last partial block, set the file's size and fsync; closes the file either way."""
        try:
            self._wait_all()
            if self._buffer is not None and self._filled:
                padded = -(-self._filled // ALIGN) * ALIGN
                self._buffer[self._filled : padded] = 0
                if self._on_disk:
                    _pwrite_all(self._fd, memoryview(self._buffer)[:padded], self._on_disk)
                else:
                    self._write_first(padded)
                os.ftruncate(self._fd, self.size)
            os.fsync(self._fd)
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Wait for the blocks in flight (their errors dropped: an error is being raised already) and close."""
        while self._in_flight:
            self._in_flight.popleft()[0].exception()
        if self._writers is not None:
            self._writers.shutdown()
            self._writers = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _write_block(self) -> None:
        """Send the full buffer to the disk at its offset and go on gathering in a free buffer. The first block
        is written here (a refusal turns the file plain); later ones in flight, up to :func:`write_depth`."""
        if self._on_disk == 0:
            self._write_first(WRITE_BLOCK)
            return
        if self._writers is None:
            self._writers = ThreadPoolExecutor(max(1, write_depth()), thread_name_prefix="moebake-direct-write")
        full = self._buffer
        assert full is not None  # a direct file holds a buffer until it turns plain
        future = self._writers.submit(_pwrite_all, self._fd, memoryview(full), self._on_disk)
        self._in_flight.append((future, full))
        self._on_disk += WRITE_BLOCK
        self._filled = 0
        if len(self._in_flight) >= write_depth():
            done, buffer = self._in_flight.popleft()
            done.result()
            self._free.append(buffer)
        self._buffer = self._free.pop() if self._free else aligned_empty(WRITE_BLOCK)

    def _write_first(self, length: int) -> None:
        """Write the buffer's first ``length`` bytes (the gathered ones, zero-padded to ``ALIGN``) as the file's
        first; where ``O_DIRECT`` is refused at this write, write the gathered bytes plainly and stay plain."""
        assert self._buffer is not None  # the first write of a direct file
        try:
            _write_all(self._fd, memoryview(self._buffer)[:length])
            self._on_disk += length
        except OSError as err:
            if err.errno != errno.EINVAL:
                raise
            _refused(self.path)  # refused at the first write: plain I/O from the file's start on
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY)
            _write_all(self._fd, memoryview(self._buffer)[: self._filled])
            self._buffer = None
        self._filled = 0

    def _wait_all(self) -> None:
        while self._in_flight:
            done, buffer = self._in_flight.popleft()
            done.result()
            self._free.append(buffer)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data) :]


_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
