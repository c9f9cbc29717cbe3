"""A model's plain full-copy parameters read from a checkpoint's files straight into their storage.

An engine hands its model ``(name, tensor)`` pairs from lazy (mmap'd) safetensors views, and the model's
``load_weights`` copies each into its parameter. :class:`DirectParameterLoader` sits between them: its
:meth:`~DirectParameterLoader.filter` keeps back every tensor whose parameter a plain full copy would fill,
and reads those bytes itself with a :class:`~moebake.loading.staged_reader.StagedReader` (for a CUDA
device: ``preadv`` into a small pinned ring, asynchronous host-to-device copies into the parameter; no
pageable copy). Every other pair is yielded unchanged, for the engine's own path.

A name is kept back (read directly) only when all of these hold:

* ``name`` is a parameter of the model (``dict(model.named_parameters())``) and not in ``exclude``;
* the checkpoint stores ``name`` (its index, or its one ``model.safetensors``) with a dtype torch has
  at 8 bits or more per element;
* the stored tensor, the tensor the engine hands, and the parameter have the same shape and dtype; the
  parameter is contiguous and on the loader's device;
* ``plain_copy(name, param)`` (the engine's rule: its loader for this parameter copies the whole tensor
  unchanged, no sharding, no stacking, no conversion).

Or, for a parameter that holds one contiguous range of the stored tensor's rows (a vocabulary shard of a
tensor-parallel rank), all of these:

* ``name`` is a parameter, not excluded, stored with such a dtype, as above; the stored tensor and the handed
  one have the same shape and dtype, the parameter has that dtype, is contiguous and on the loader's device;
* ``row_shard(name, param)`` is a :class:`RowShard` (the engine's rule: its loader copies stored rows
  ``[start, stop)`` into the parameter's first ``stop - start`` rows and zero-fills every later row);
* the stored tensor has ``RowShard.rows`` rows along dim 0 and each of its rows has the parameter's row shape
  (``shape[1:]``), and ``stop - start`` is at most the parameter's row count.

Bytes: a safetensors tensor is C order, little-endian, at ``data_start + begin`` of its shard; a contiguous
parameter's storage has the same byte order, so the stored bytes are the parameter's bytes. In C order the
rows ``[start, stop)`` of a ``[rows, *row]`` tensor are the one byte range ``[start * row_bytes, stop *
row_bytes)`` (``row_bytes = prod(row) * element size``): it is read into the parameter's first bytes, and the
parameter's remaining bytes are set to 0 (all-zero bytes are ``0`` in every torch dtype: what ``fill_(0)``
writes). The handed tensor of a kept-back name is never read (only its ``shape`` and ``dtype``): its mmap'd
pages stay unread.

Reads are collected and issued in batches of at most ``batch_bytes`` (one ``StagedReader.read`` each, so
reads and copies overlap); the last batch is read when the engine's iterator is exhausted, before the
filter's generator ends. Host memory: the reader's ring (``slots * chunk_bytes``), whatever the sizes.

With a ``readahead`` (:class:`~moebake.loading.readahead.ReadAhead`), :meth:`DirectParameterLoader.filter` first
plans :meth:`~DirectParameterLoader.planned_ranges` on it, ahead of every range planned so far (the experts', which
are read after the iteration), and seals its plan: the ranges come from :meth:`~DirectParameterLoader.direct_range`,
the one rule the filter applies to each handed tensor.
"""

import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from moebake.errors import InternalError
from moebake.formats.safetensors_file import DTYPES
from moebake.loading.checkpoint_tensors import CheckpointTensors
from moebake.loading.staged_reader import ByteRange, StagedReader, own_reader

DEFAULT_BATCH_BYTES = 1 << 30

logger = logging.getLogger(__name__)

PlainCopy = Callable[[str, torch.nn.Parameter], bool]
"""``(name, param) -> bool``: the engine loads the whole checkpoint tensor into ``param`` by a plain copy."""


@dataclass(frozen=True)
class RowShard:
    """The engine fills a parameter from stored rows ``[start, stop)`` of a tensor of ``rows`` rows (dim 0): they go,
    unchanged, to the parameter's first ``stop - start`` rows; every later row of the parameter is set to zero."""

    start: int
    stop: int
    rows: int


ShardRule = Callable[[str, torch.nn.Parameter], "RowShard | None"]
"""``(name, param) -> RowShard | None``: the stored rows the engine's loader copies into ``param``, or None."""


@dataclass(frozen=True)
class DirectLoadStats:
    """What one :meth:`DirectParameterLoader.filter` pass did.

    ``loaded``: names read by moebake into their parameters (``loaded_bytes``: the bytes read from the files, of a
    row shard its rows only; ``zeroed_bytes``: the parameters' bytes set to zero after a row shard's rows);
    ``passed``: names yielded to the engine (``passed_bytes``: their ``numel * element_size``, from metadata);
    ``seconds``: wall clock of moebake's reads (until the bytes are on the device); ``finished``: the engine's
    iterator was exhausted and every kept-back tensor has been read; ``batches``: ``(seconds, bytes)`` of each read
    call in turn (the first also starts the reader: its threads, and its pinned ring on a CUDA device).
    """

    loaded: tuple[str, ...]
    loaded_bytes: int
    passed: tuple[str, ...]
    passed_bytes: int
    seconds: float
    finished: bool
    zeroed_bytes: int = 0
    batches: tuple[tuple[float, int], ...] = ()

    def __str__(self) -> str:
        return (
            f"{len(self.loaded)} tensors ({self.loaded_bytes} bytes) read directly in {self.seconds:.3f} s, "
            f"{len(self.passed)} ({self.passed_bytes} bytes) through the engine"
        )


def _tensor_bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


class DirectParameterLoader:
    """Reads ``model``'s plain full-copy parameters from checkpoint ``directory`` onto ``device`` (see the module
    docstring). Use once per load: ``weights = loader.filter(weights)``, hand ``weights`` to the model's
    ``load_weights``, then read :attr:`stats`.

    ``plain_copy``: the engine's rule (default: every parameter counts as a plain copy; engines pass theirs);
    ``row_shard``: the engine's rule for parameters that hold a range of the stored rows (default: none do);
    ``exclude``: names always yielded unchanged (e.g. baked expert tensors); ``files``: ``directory``'s
    :class:`CheckpointTensors` where the caller has parsed them already; ``staged``, ``chunk_bytes``, ``slots``: the
    :class:`StagedReader`'s (``staged=True`` runs the pinned pipeline on a CPU device), or ``reader``: one onto
    ``device`` shared with the process's other loads; ``readahead``: the read-ahead of that reader (module docstring).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        directory: str | Path,
        device: torch.device | str,
        *,
        plain_copy: PlainCopy | None = None,
        row_shard: ShardRule | None = None,
        exclude: Collection[str] = (),
        files: CheckpointTensors | None = None,
        batch_bytes: int = DEFAULT_BATCH_BYTES,
        staged: bool | None = None,
        chunk_bytes: int | None = None,
        slots: int | None = None,
        reader: StagedReader | None = None,
        readahead: Any = None,
    ):
        self.params = dict(model.named_parameters())
        self.files = files or CheckpointTensors(directory)
        self.device = torch.device(device)
        self.plain_copy = plain_copy or (lambda name, param: True)
        self.row_shard = row_shard or (lambda name, param: None)
        self.exclude = frozenset(exclude)
        self.batch_bytes = batch_bytes
        self.reader = reader or own_reader(self.device, chunk_bytes=chunk_bytes, slots=slots, staged=staged)
        self._loaded: list[str] = []
        self._passed: list[str] = []
        self._loaded_bytes = self._passed_bytes = self._zeroed_bytes = 0
        self._batches: list[tuple[float, int]] = []  # each read call's (seconds, bytes): stats.seconds is their sum
        self._pending: list[ByteRange] = []
        self._pending_bytes = 0
        self._finished = False
        self.readahead = readahead

    @property
    def stats(self) -> DirectLoadStats:
        return DirectLoadStats(
            tuple(self._loaded),
            self._loaded_bytes,
            tuple(self._passed),
            self._passed_bytes,
            sum((seconds for seconds, _ in self._batches), 0.0),
            self._finished,
            self._zeroed_bytes,
            tuple(self._batches),
        )

    def _same_device(self, param: torch.Tensor) -> bool:
        if param.device.type != self.device.type:
            return False
        return self.device.index is None or param.device.index == self.device.index

    def direct_range(self, name: str, tensor: Any) -> ByteRange | None:
        """The file range that fills parameter ``name`` with the stored tensor, or None when ``name`` keeps the
        engine's path (see the module docstring). Reads metadata only: of ``tensor``, its shape and dtype. For a
        row shard, the range fills the parameter's first bytes (:meth:`filter` sets the rest to zero)."""
        found = self._stored(name, tensor)
        if found is None:
            return None
        shard, entry, param = found
        dest = param.data.reshape(-1).view(torch.uint8)
        if tuple(entry.shape) == tuple(param.shape) and self.plain_copy(name, param):
            if dest.numel() != entry.nbytes:
                raise InternalError(f"{name}: parameter holds {dest.numel()} bytes, its stored tensor {entry.nbytes}")
            return ByteRange(shard.path, shard.data_start + entry.begin, dest, name)
        rows = self.row_shard(name, param)
        if rows is None or not entry.shape or param.dim() != len(entry.shape) or entry.shape[0] != rows.rows:
            return None
        if (
            tuple(entry.shape[1:]) != tuple(param.shape[1:])
            or not 0 <= rows.start <= rows.stop <= rows.rows
            or rows.stop - rows.start > param.shape[0]
        ):
            return None
        row_bytes = math.prod(param.shape[1:]) * param.element_size()
        if row_bytes * rows.rows != entry.nbytes:
            raise InternalError(f"{name}: {rows.rows} rows of {row_bytes} bytes, its stored tensor {entry.nbytes}")
        offset = shard.data_start + entry.begin + rows.start * row_bytes
        return ByteRange(shard.path, offset, dest[: (rows.stop - rows.start) * row_bytes], name)

    def _stored(self, name: str, tensor: Any):
        """``(shard, entry, param)`` where ``name`` is a parameter (not excluded) stored with the dtype and shape of
        the handed ``tensor`` and the parameter's dtype, the parameter contiguous on the loader's device; else None."""
        param = self.params.get(name)
        if param is None or name in self.exclude or not isinstance(tensor, torch.Tensor):
            return None
        found = self.files.find(name)
        if found is None:
            return None
        shard, entry = found
        torch_dtype, bits = DTYPES[entry.dtype]
        if torch_dtype is None or bits < 8 or not (torch_dtype == tensor.dtype == param.dtype):
            return None
        if tuple(entry.shape) != tuple(tensor.shape) or not param.is_contiguous() or not self._same_device(param):
            return None
        return shard, entry, param

    def planned_ranges(self) -> list[ByteRange]:
        """The ranges :meth:`filter` reads when the engine hands every stored tensor as stored (its name, shape and
        dtype; :meth:`direct_range` of a meta tensor of each), in the order an engine's safetensors iterator hands them:
        shards in name order, names sorted within each. Reads headers only."""
        shards: dict[str, list[str]] = {}
        for name, shard in self.files.weight_map.items():
            shards.setdefault(shard, []).append(name)
        ranges = []
        for shard in sorted(shards):
            for name in sorted(shards[shard]):
                if name not in self.params or name in self.exclude:
                    continue
                found = self.files.find(name)
                torch_dtype = DTYPES[found[1].dtype][0] if found is not None else None
                if found is None or torch_dtype is None:
                    continue
                piece = self.direct_range(name, torch.empty(found[1].shape, dtype=torch_dtype, device="meta"))
                if piece is not None and piece.dest.numel():
                    ranges.append(piece)
        return ranges

    def _plan_readahead(self) -> None:
        """Put :meth:`planned_ranges` first in the read-ahead's plan and seal it; never raises (the filter reads
        every byte itself either way)."""
        if self.readahead is None:
            return
        try:
            self.readahead.add(self.planned_ranges(), first=True)
        except Exception as err:  # the filter meets (and reports) whatever made the plan fail
            logger.debug("moebake: no read-ahead of the other tensors (%s)", err)
        finally:
            self.readahead.seal()

    def filter(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """The pairs of ``weights`` the engine must still load; reads the others (see the class docstring)."""
        self._plan_readahead()
        for name, tensor in weights:
            piece = self.direct_range(name, tensor)
            if piece is None:
                self._passed.append(name)
                self._passed_bytes += _tensor_bytes(tensor)
                yield name, tensor
                continue
            del tensor  # never read: its pages stay unmapped
            tail = self.params[name].data.reshape(-1).view(torch.uint8)[piece.dest.numel() :]
            tail.zero_()  # a row shard's later rows, as the engine's loader leaves them (none for a full copy)
            self._zeroed_bytes += tail.numel()
            self._loaded.append(name)
            self._loaded_bytes += piece.dest.numel()
            self._pending.append(piece)
            self._pending_bytes += piece.dest.numel()
            if self._pending_bytes >= self.batch_bytes:
                self.flush()
        self.flush()
        self._finished = True

    def flush(self) -> None:
        """Read every kept-back tensor not yet read; returns when the bytes are on the device."""
        pending = [piece for piece in self._pending if piece.dest.numel()]
        self._pending, self._pending_bytes = [], 0
        if pending:
            begin = time.perf_counter()
            self.reader.read(pending)
            self._batches.append((time.perf_counter() - begin, sum(piece.dest.numel() for piece in pending)))
