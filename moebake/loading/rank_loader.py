"""One EP rank's rows of a bake's expert tensors, read once from the shard files into their final tensors.

Every baked expert tensor is stored C-order with the expert index first, so the rows of experts
``[a, b)`` are one contiguous byte range of its shard: ``data_start + begin + a * row_bytes`` for
``(b - a) * row_bytes`` bytes. :class:`RankLoader` turns "these experts of these tensors go to
these rows of these destination tensors" into such ranges and reads them with a
:class:`~moebake.loading.staged_reader.StagedReader`: for a CUDA destination through a small ring of
pinned host buffers (``slots * chunk_bytes`` bytes, whatever the model's size) with overlapped
host-to-device copies straight into the destination, so there is no transient copy on the GPU
and no byte of another rank's experts is read.

Used by the SGLang plugin (from its MoE methods' post-load step), the vLLM plugin (its
``--load-format moebake`` loader) and ``moebake.serve``. Destinations are the engine's own
parameters: ``[rows, *trailing]`` of the manifest's dtype and trailing shape, contiguous.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from moebake.errors import CheckpointError, IntegrityError, InvalidArgumentError
from moebake.formats.safetensors_file import SafetensorsFile, TensorEntry
from moebake.loading.checkpoint_tensors import CheckpointTensors
from moebake.loading.staged_reader import ByteRange, LoadStats, StagedReader, own_reader
from moebake.schema.enums import DType
from moebake.schema.index import read_index
from moebake.schema.manifest import MANIFEST_NAME, LayerRecord, Manifest


@dataclass(frozen=True, kw_only=True)
class ExpertRun:
    """Global experts ``[first, first + count)`` of a layer go to destination rows ``[slot, slot + count)``."""

    first: int
    slot: int
    count: int


def rank_runs(experts: int, ep_rank: int, ep_size: int) -> list[ExpertRun]:
    """The one run of the contiguous split: EP rank ``ep_rank`` of ``ep_size`` holds experts
    ``[ep_rank * E / ep_size, (ep_rank + 1) * E / ep_size)`` in rows ``0 ..``.

    InvalidArgumentError unless ``ep_size`` divides ``experts`` and ``0 <= ep_rank < ep_size``."""
    if ep_size < 1 or experts % ep_size or not 0 <= ep_rank < ep_size:
        raise InvalidArgumentError(
            f"has {experts} experts, which EP rank {ep_rank} of {ep_size} cannot split evenly "
            f"(need ep_size dividing {experts} and 0 <= ep_rank < ep_size)"
        )
    local = experts // ep_size
    return [ExpertRun(first=ep_rank * local, slot=0, count=local)]


def runs_from_slots(slots: Iterable[int]) -> list[ExpertRun]:
    """Runs from an expert map: ``slots[e]`` is the row global expert ``e`` goes to, negative where this
    rank does not hold it (vLLM's ``expert_map`` convention). Adjacent experts in adjacent rows join one run."""
    runs: list[ExpertRun] = []
    for expert, slot in enumerate(slots):
        if slot < 0:
            continue
        last = runs[-1] if runs else None
        if last is not None and last.first + last.count == expert and last.slot + last.count == slot:
            runs[-1] = ExpertRun(first=last.first, slot=last.slot, count=last.count + 1)
        else:
            runs.append(ExpertRun(first=expert, slot=slot, count=1))
    return runs


def all_experts(experts: int) -> list[ExpertRun]:
    """Every expert, in order (a tensor every rank holds whole)."""
    return [ExpertRun(first=0, slot=0, count=experts)]


class BakeFiles(CheckpointTensors):
    """Where a bake's tensors lie: its index (a bake always has one), and each shard's header, parsed once when
    first needed."""

    def __init__(self, root: str | Path, manifest: Manifest):
        super().__init__(root)
        self.manifest = manifest

    def _read_weight_map(self) -> dict[str, str]:
        return read_index(self.root).weight_map

    def shard_of(self, name: str) -> SafetensorsFile:
        """The parsed header of the shard holding tensor ``name``; CheckpointError if the index lacks it."""
        shard_name = self.weight_map.get(name)
        if shard_name is None:
            raise CheckpointError(
                f"{self.root}: baked tensor {name} is not in the index (the manifest lists it); run `moebake verify {self.root}`"
            )
        return self.header(shard_name)

    def stored(self, record: LayerRecord, short: str) -> tuple[SafetensorsFile, TensorEntry]:
        """Shard and header entry of ``record.prefix + short``, checked against the manifest's dtype and shape."""
        name = record.prefix + short
        shard = self.shard_of(name)
        entry = shard.tensors.get(name)
        expected = record.tensors[short]
        if entry is None:
            raise CheckpointError(f"{shard.path}: baked tensor {name} is not in this shard (the index says it is)")
        if entry.dtype != expected.dtype or tuple(entry.shape) != tuple(expected.shape):
            raise IntegrityError(
                f"{shard.path}: tensor {name} is {entry.dtype} {list(entry.shape)}, the manifest says "
                f"{expected.dtype} {list(expected.shape)} ({self.root / MANIFEST_NAME})"
            )
        return shard, entry


class RankLoader:
    """Reads rows of a bake's expert tensors into destination tensors on one device (see the module docstring).

    ``files``: the bake's index and headers, shared with whoever else reads them (parsed once). Re-usable
    across layers (its pinned ring is allocated once); ``total`` sums every load's bytes and time. ``reader``: a
    :class:`StagedReader` onto ``device`` shared with the process's other loads (one ring, one set of threads);
    else one of its own, of ``chunk_bytes``, ``slots`` and ``staged``.
    """

    def __init__(
        self,
        files: BakeFiles,
        device: torch.device | str,
        *,
        chunk_bytes: int | None = None,
        slots: int | None = None,
        staged: bool | None = None,
        reader: StagedReader | None = None,
    ):
        self.files = files
        self.reader = reader or own_reader(device, chunk_bytes=chunk_bytes, slots=slots, staged=staged)
        self.total = LoadStats(0, 0.0, 0, str(self.reader.device))

    def byte_ranges(
        self, record: LayerRecord, destinations: dict[str, torch.Tensor], runs: Sequence[ExpertRun], whole: Iterable[str] = ()
    ) -> list[ByteRange]:
        """The file ranges that fill ``destinations`` (``{short name: tensor}``) with ``runs`` of each tensor's
        experts; tensors named in ``whole`` (or not per expert) get every row. InvalidArgumentError if a
        destination's dtype, trailing shape or row count is not the manifest's."""
        whole = set(whole)
        ranges = []
        for short, dest in destinations.items():
            shard, entry = self.files.stored(record, short)
            spec = record.tensors[short]
            per_expert = spec.shape[:1] == (record.experts,) and short not in whole
            tensor_runs = list(runs) if per_expert else all_experts(spec.shape[0] if spec.shape else 1)
            rows = sum(run.count for run in tensor_runs)
            want = DType(spec.dtype).torch
            if dest.dtype != want or tuple(dest.shape) != (rows, *spec.shape[1:]) or not dest.is_contiguous():
                raise InvalidArgumentError(
                    f"{record.prefix}{short}: destination is {dest.dtype} {list(dest.shape)}"
                    f"{'' if dest.is_contiguous() else ' (not contiguous)'}, expected contiguous {want} "
                    f"{[rows, *spec.shape[1:]]} for these experts"
                )
            row_bytes = entry.row_bytes if spec.shape else entry.nbytes
            for run in tensor_runs:
                if run.count == 0 or row_bytes == 0:
                    continue
                target = dest[run.slot : run.slot + run.count] if spec.shape else dest
                offset = shard.data_start + entry.begin + run.first * row_bytes
                ranges.append(ByteRange(shard.path, offset, target.reshape(-1).view(torch.uint8), record.prefix + short))
        return ranges

    def load(
        self, record: LayerRecord, destinations: dict[str, torch.Tensor], runs: Sequence[ExpertRun], whole: Iterable[str] = ()
    ) -> LoadStats:
        """Fill ``destinations`` (see :meth:`byte_ranges`); returns when the bytes are on the device."""
        stats = self.reader.read(self.byte_ranges(record, destinations, runs, whole))
        self.total = LoadStats(
            self.total.bytes + stats.bytes, self.total.seconds + stats.seconds, self.total.tensors + stats.tensors, stats.device
        )
        return stats
