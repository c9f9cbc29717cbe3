"""A planned conversion, and baking one output shard of it (in this process or a worker process).

:func:`open_conversion` opens the source, hooks every source shard's reads, and plans the target.
The hook times each read (``read`` stage), asks the kernel to read the next range of the file
ahead (a conversion reads each shard front to back, so the disk works while the CPU transforms),
and, while a shard is being baked, hands the bytes read from the source shard of the same name to
a :class:`StreamHash`: the manifest's source SHA-256 is computed in the same pass as the
conversion, not by reading the source a second time.
"""

import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from moebake.convert.allocator import reuse_freed_buffers
from moebake.convert.hashing import StreamHash
from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputShard, assign_shards
from moebake.convert.stages import STAGES
from moebake.convert.targets import get_target
from moebake.formats import open_source
from moebake.formats.checkpoint import SourceCheckpoint


@dataclass
class Conversion:
    """The opened source, the target module, the output shards and the manifest's layer records."""

    model: object
    target: object
    shards: list[OutputShard]
    layers: list[dict]
    _hashing: dict[str, StreamHash] = field(default_factory=dict)
    _read_ahead: "ReadAhead" = field(default_factory=lambda: ReadAhead())

    @property
    def checkpoint(self) -> SourceCheckpoint:
        return self.model.checkpoint

    def observe_read(self, path: str, offset: int, data: torch.Tensor, seconds: float, cpu_seconds: float) -> None:
        """The :data:`~moebake.formats.safetensors_file.ReadObserver` hooked to every source shard."""
        STAGES.add("read", seconds, cpu_seconds, len(data))
        self._read_ahead.request(path, offset + len(data), len(data))
        if (stream := self._hashing.get(path)) is not None:
            stream.feed(offset, data)

    def bake(self, shard: OutputShard, path: str | os.PathLike, on_bytes: Callable[[int], None],
             write: Callable[[OutputShard, str | os.PathLike, Callable[[int], None]], str]) -> tuple[str, str | None]:
        """Write ``shard`` to ``path`` with ``write`` (:func:`moebake.convert.writer.write_shard`).

        Returns the written file's SHA-256 and that of the source shard of the same name (None if
        the source has no such shard), hashed from the bytes the conversion reads.
        """
        source = self.checkpoint.shards.get(shard.file_name)
        if source is None:
            return write(shard, path, on_bytes), None
        stream = self._hashing[source.path] = StreamHash(source.path, source.data_start)
        try:
            digest = write(shard, path, on_bytes)
        except BaseException:
            stream.close()
            raise
        finally:
            del self._hashing[source.path]
        return digest, stream.hexdigest()


class ReadAhead:
    """Asks the kernel (``posix_fadvise(WILLNEED)``) to read file ranges into the page cache, from a
    thread of its own: the call itself can block while the disk queue fills, so the reader must not make it."""

    def __init__(self):
        self._requests: queue.Queue = queue.Queue(maxsize=4)
        if hasattr(os, "posix_fadvise"):
            threading.Thread(target=self._run, name="moebake-read-ahead", daemon=True).start()

    def request(self, path: str, offset: int, length: int) -> None:
        """Read ``length`` bytes of ``path`` from ``offset`` ahead, if the thread is not behind (a hint only)."""
        try:
            self._requests.put_nowait((path, offset, length))
        except queue.Full:
            pass

    def _run(self) -> None:
        while True:
            path, offset, length = self._requests.get()
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)


def open_conversion(source: str | os.PathLike, options: ConvertOptions) -> Conversion:
    """Open and validate ``source`` and plan ``options.target`` on it (reads headers only).

    Also lets this process reuse freed chunk-sized buffers (:func:`reuse_freed_buffers`).
    """
    reuse_freed_buffers()
    target = get_target(options.target)
    model = open_source(source, getattr(target, "SOURCE_FORMATS", None))
    conversion = Conversion(model, target, [], [])
    shards = model.checkpoint.shards
    for name, shard in shards.items():  # before planning: producers may bind their source file now
        shards[name] = replace(shard, observer=conversion.observe_read)
    converted, conversion.layers = target.plan(model, options)
    conversion.shards = assign_shards(model.checkpoint, converted, options.chunk_bytes)
    return conversion
