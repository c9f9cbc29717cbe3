"""A planned conversion, and baking one output shard of it (in this process or a worker process).

:func:`open_conversion` opens the source, routes every source shard's reads through
:class:`SourceReads`, and plans the target. That reader times the reads (``read`` stage),
reads with ``O_DIRECT`` where the file system allows it (:mod:`moebake.convert.direct_io`; else
through the page cache, kept reading ahead by :class:`PageCacheReadAhead`) and, while a shard is being
baked, hands the bytes read from the source shard of the same name to a :class:`StreamHash`: the
manifest's source checksum is computed in the same pass as the conversion, not by reading the
source a second time; a Hugging Face cache blob is not hashed at all (its name is its SHA-256).
"""

import functools
import os
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from moebake.convert.direct_io import direct_io_wanted, read_range
from moebake.convert.hashing import StreamHash, hub_blob_sha256
from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputShard, assign_shards
from moebake.convert.stages import STAGES
from moebake.convert.targets import Target, fitting_targets, get_target, model_for_target
from moebake.errors import MoebakeError
from moebake.formats.checkpoint import SourceCheckpoint, open_checkpoint
from moebake.formats.source_model import SourceModel
from moebake.schema.checksums import CHECKSUM, tagged
from moebake.schema.manifest import LayerRecord


class SourceReads:
    """The :data:`~moebake.formats.safetensors_file.SourceReader` a conversion opens its source with:
    times the reads, keeps the page cache reading ahead, and feeds the :class:`StreamHash` of a shard
    being baked (``hashing``: source path -> its stream, while that shard is baked)."""

    def __init__(self):
        self.hashing: dict[str, StreamHash] = {}

    def __call__(self, path: str, offset: int, length: int) -> np.ndarray:
        with STAGES.timing("read", length):
            data = read_range(path, offset, length)
        if not direct_io_wanted(path):  # O_DIRECT reads skip the page cache: nothing to read ahead into it
            _page_cache_read_ahead().advance(path, offset + len(data))
        if (stream := self.hashing.get(path)) is not None:
            stream.feed(offset, data)
        return data


@dataclass
class Conversion:
    """The opened source (read through ``reads``), the target, the output shards and the manifest's layer records."""

    model: SourceModel
    target: Target
    shards: list[OutputShard]
    layers: list[LayerRecord]
    reads: SourceReads

    @property
    def checkpoint(self) -> SourceCheckpoint:
        return self.model.checkpoint

    def bake(
        self,
        shard: OutputShard,
        path: str | os.PathLike,
        on_bytes: Callable[[int], object],
        write: Callable[[OutputShard, str | os.PathLike, Callable[[int], object]], str],
    ) -> tuple[str, str | None]:
        """Write ``shard`` to ``path`` with ``write`` (:func:`moebake.convert.writer.write_shard`).

        Returns the written file's hex digest and the checksum of the source shard of the same name
        as the manifest holds it (:func:`~moebake.convert.hashing.tagged`; None if the source has no
        such shard), hashed from the bytes the conversion reads or read from a Hub-cache blob's name.
        """
        source = self.checkpoint.shards.get(shard.file_name)
        if source is None:
            return write(shard, path, on_bytes), None
        if (known := hub_blob_sha256(source.path)) is not None:
            return write(shard, path, on_bytes), tagged("sha256", known)
        stream = self.reads.hashing[source.path] = StreamHash(source.path, source.data_start)
        try:
            digest = write(shard, path, on_bytes)
        except BaseException:
            stream.close()
            raise
        finally:
            del self.reads.hashing[source.path]
        return digest, tagged(CHECKSUM, stream.hexdigest())


class PageCacheReadAhead:
    """Keeps the :data:`AHEAD` bytes after the last read of a file on their way into the page cache.

    A thread of its own asks the kernel to read them (``posix_fadvise(WILLNEED)``, in
    :data:`PIECE`-sized calls: on the benchmark machine one larger call prefetched little), so the
    disk keeps reading across tensor boundaries and through tensors copied as they are, while the
    CPU transforms. It costs no CPU time to speak of and no process memory (only page cache).
    """

    AHEAD = 256 << 20
    PIECE = 8 << 20

    def __init__(self):
        self._wanted = threading.Condition()
        self._position: tuple[str, int] | None = None
        if hasattr(os, "posix_fadvise"):
            threading.Thread(target=self._run, name="moebake-page-cache-read-ahead", daemon=True).start()

    def advance(self, path: str, position: int) -> None:
        """The file ``path`` has been read up to ``position``."""
        with self._wanted:
            self._position = (path, position)
            self._wanted.notify()

    def _run(self) -> None:
        path, fd, size, advised = None, -1, 0, 0
        while True:
            with self._wanted:
                while self._position is None or (self._position[0] == path and advised >= min(self._position[1] + self.AHEAD, size)):
                    self._wanted.wait()
                wanted_path, position = self._position
            try:
                if wanted_path != path:
                    if fd >= 0:
                        os.close(fd)
                    path, fd, size = wanted_path, -1, 0
                    fd = os.open(path, os.O_RDONLY)
                    size, advised = os.fstat(fd).st_size, position
                advised = max(advised, position)
                if advised < min(position + self.AHEAD, size):
                    os.posix_fadvise(fd, advised, self.PIECE, os.POSIX_FADV_WILLNEED)
                    advised += self.PIECE
            except OSError:  # a hint only: the reads themselves report the problem
                size = 0


@functools.cache
def _page_cache_read_ahead() -> PageCacheReadAhead:
    """The process's one read-ahead (and thread), made on first use."""
    return PageCacheReadAhead()


def transform_threads(workers: int) -> int:
    """Threads for layout transforms in each of ``workers`` converting processes: the cores shared out,
    less one per process for its reading, hashing and writing threads (on 2 cores and one process: 1;
    why not 2 there: docs/benchmarks.md, "Measurements without a results file")."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // workers - 1)


@contextmanager
def torch_threads(count: int):
    """Set torch's thread count for the ``with`` body, then restore it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def open_conversion(source: str | os.PathLike, options: ConvertOptions) -> Conversion:
    """Open and validate ``source`` (every shard read through one :class:`SourceReads`) and plan
    ``options.target`` on it (reads headers only). Changes nothing in the process: a caller that
    bakes sets the allocator up itself (:func:`~moebake.convert.allocator.reuse_freed_buffers`)."""
    target = get_target(options.target)
    reads = SourceReads()
    checkpoint = open_checkpoint(source, reads)
    model = model_for_target(checkpoint, options.target)
    try:
        converted, layers = target.plan(model, options)
    except MoebakeError as err:
        fits = [name for name in fitting_targets(checkpoint) if name != options.target]
        raise type(err)(f"{err} (targets that fit this model: {', '.join(fits)})" if fits else str(err)) from None
    return Conversion(model, target, assign_shards(checkpoint, converted, options.chunk_bytes), layers, reads)
