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

Where a file system refuses ``O_DIRECT`` (tmpfs: ``EINVAL`` from ``open``; some refuse at the first
read or write) the same calls fall back to plain buffered I/O, remembered per device, with the same
bytes. Setting :data:`DISABLE_ENV` to ``1`` forces the plain path (tests, benchmarks, comparisons).
Memory stays bounded: one read's span, and one :data:`WRITE_BLOCK` per open output file.
"""

import errno
import os

import numpy as np

from moebake.formats.safetensors_file import read_file_range

DISABLE_ENV = "MOEBAKE_NO_DIRECT_IO"
"""Set to ``1`` to read and write through the page cache (plain I/O)."""
ALIGN = 4096
WRITE_BLOCK = 16 << 20
"""Bytes gathered per ``O_DIRECT`` write (a multiple of :data:`ALIGN`)."""
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the platform has none (macOS): plain I/O
_refused_devices: set[int] = set()  # st_dev of file systems that refused O_DIRECT


def direct_io_wanted(path: str | os.PathLike) -> bool:
    """Whether to try ``O_DIRECT`` for ``path`` (the file, or the directory it will be created in)."""
    if not _O_DIRECT or os.environ.get(DISABLE_ENV) == "1":
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
    return raw[start:start + nbytes]


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
    cached, at_end = _read_cached(path, view[offset - start:offset - start + length], offset)
    if cached == length or at_end:
        return buffer[offset - start:offset - start + cached]
    resume = offset + cached - (offset + cached) % ALIGN  # O_DIRECT from the block holding the first missing byte
    got = _read_direct(path, view[resume - start:], resume)
    if got is None:
        return read_file_range(path, offset, length)
    return buffer[offset - start:max(offset, resume + got) - start][:length]


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

    :meth:`write` takes any bytes-like object; :meth:`close` writes what is gathered, truncates the
    file to the bytes written and fsyncs it (:meth:`abandon` only closes, on an error path; as a
    context manager it does one or the other).
    :meth:`sync_written` asks the disk to flush what has been written so far (``fdatasync``).
    """

    def __init__(self, path: str | os.PathLike):
        self.path, self.size = str(path), 0
        self._buffer: np.ndarray | None = None
        self._filled = self._on_disk = 0
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

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()

    @property
    def direct(self) -> bool:
        """Whether the bytes go to the disk with ``O_DIRECT``."""
        return self._buffer is not None

    def write(self, data) -> None:
        data = memoryview(data).cast("B")
        self.size += len(data)
        while len(data) and self._buffer is not None:
            take = min(len(data), WRITE_BLOCK - self._filled)
            self._buffer[self._filled:self._filled + take] = np.frombuffer(data[:take], np.uint8)
            self._filled += take
            data = data[take:]
            if self._filled == WRITE_BLOCK:
                self._write_buffer(WRITE_BLOCK)
        if len(data):
            _write_all(self._fd, data)

    def sync_written(self) -> None:
        _fdatasync(self._fd)

    def close(self) -> None:
        """Write the last partial block, set the file's size and fsync; closes the file either way."""
        try:
            if self._buffer is not None and self._filled:
                padded = -(-self._filled // ALIGN) * ALIGN
                self._buffer[self._filled:padded] = 0
                self._write_buffer(padded)
                os.ftruncate(self._fd, self.size)
            os.fsync(self._fd)
        finally:
            self.abandon()

    def abandon(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _write_buffer(self, length: int) -> None:
        """Write the first ``length`` bytes of the buffer (the gathered ones, zero-padded to ``ALIGN``)."""
        try:
            _write_all(self._fd, memoryview(self._buffer)[:length])
            self._on_disk += length
        except OSError as err:
            if err.errno != errno.EINVAL or self._on_disk:
                raise
            _refused(self.path)  # refused at the first write: plain I/O from the file's start on
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY)
            _write_all(self._fd, memoryview(self._buffer)[:self._filled])
            self._buffer = None
        self._filled = 0


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data):]


_fdatasync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync
