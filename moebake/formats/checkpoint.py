"""A Hugging Face safetensors checkpoint directory, opened and validated without reading weights.

A checkpoint is a directory with ``config.json`` and either ``model.safetensors`` or a
``model.safetensors.index.json`` whose ``weight_map`` names each tensor's shard. Every shard's
header is parsed and checked up front (truncation, corrupt headers, index naming a missing file
or tensor), so a conversion fails before it writes anything.

A tensor stored in a listed shard but left out of the index is part of the checkpoint all the same:
transformers, vLLM and SGLang load every tensor of every shard the index lists, so it is carried
through (with a warning that the index is incomplete), never dropped. A tensor stored in two shards
is refused: which copy an engine ends up with depends on its loading order.
"""

import logging
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.constants import SAFETENSORS_INDEX_FILE, SAFETENSORS_SINGLE_FILE

from moebake.errors import CheckpointError
from moebake.formats.safetensors_file import SafetensorsFile, SourceReader, TensorEntry, read_header
from moebake.schema.config_values import ConfigValues, read_json_object
from moebake.schema.files import CONFIG_NAME, open_regular
from moebake.schema.index import read_index

# Files at the root with these suffixes are weights (or other formats of them) and are not copied.
WEIGHT_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack"}
# Stands for the expert index in a per-expert tensor name pattern, for models that store one tensor
# per expert (``model.layers.0.mlp.experts.*.gate_proj.weight``); see SourceCheckpoint.read_experts.
EXPERT_INDEX = "*"
LOG = logging.getLogger(__name__)


def per_expert_names(pattern: str, num_experts: int) -> tuple[str, ...]:
    """The tensor names a per-expert ``pattern`` (with :data:`EXPERT_INDEX`) stands for, by expert."""
    return tuple(pattern.replace(EXPERT_INDEX, str(e)) for e in range(num_experts))


def stored_names(names: tuple[str, ...], num_experts: int) -> tuple[str, ...]:
    """The real tensors behind ``names`` (stacked tensors, or per-expert patterns expanded), expert by
    expert: ``(a.*.gate, a.*.up)`` -> ``(a.0.gate, a.0.up, a.1.gate, ...)``."""
    expanded = [per_expert_names(n, num_experts) if EXPERT_INDEX in n else (n,) for n in names]
    return tuple(name for group in zip(*expanded) for name in group)


def first_missing_expert(present: Collection[int], num_experts: int) -> int | None:
    """The smallest expert index in ``[0, num_experts)`` not in ``present`` (None if all are),
    without materialising the range (``num_experts`` comes from an untrusted config)."""
    within = sorted({e for e in present if 0 <= e < num_experts})
    missing = next((position for position, expert in enumerate(within) if expert != position), len(within))
    return missing if missing < num_experts else None


@dataclass
class SourceCheckpoint:
    """Shards, tensors and side files of one checkpoint directory."""

    root: Path
    config: dict
    shards: dict[str, SafetensorsFile]  # shard file name -> parsed header, in shard-name order
    locations: dict[str, str]  # tensor name -> shard file name
    side_files: list[str]  # root-level non-weight files (config, tokenizer, ...)

    def entry(self, name: str) -> TensorEntry:
        return self.shards[self.locations[name]].tensors[name]

    def file_of(self, name: str) -> SafetensorsFile:
        return self.shards[self.locations[name]]

    def expert_row_bytes(self, name: str) -> int:
        """Bytes of one expert of ``name``: a tensor stacked over experts (dim 0), or a per-expert pattern."""
        if EXPERT_INDEX in name:
            return self.entry(name.replace(EXPERT_INDEX, "0")).nbytes
        return self.entry(name).row_bytes

    def read_experts(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Experts ``[start, stop)`` of ``name`` as one ``[stop - start, ...]`` tensor of the source dtype.

        ``name`` is a tensor stacked over experts (dim 0 = expert), or a per-expert pattern with
        :data:`EXPERT_INDEX`, whose tensors ``[...]`` are read one by one and stacked.
        """
        if EXPERT_INDEX not in name:
            return self.file_of(name).read_rows(name, start, stop)
        experts = []
        for expert_name in per_expert_names(name, stop)[start:]:
            entry = self.entry(expert_name)
            experts.append(self.file_of(expert_name).read_rows(expert_name, 0, entry.shape[0]))
        return torch.stack(experts)

    @property
    def values(self) -> ConfigValues:
        """``config.json`` behind typed getters (:mod:`moebake.schema.config_values`)."""
        return ConfigValues.of_file(self.config, self.root / CONFIG_NAME)

    def read_json(self, relative: str) -> ConfigValues | None:
        """A side JSON file of the checkpoint behind typed getters, or None if absent."""
        path = self.root / relative
        return ConfigValues.of_file(read_json_object(path), path) if os.path.lexists(path) else None


def open_checkpoint(root: str | os.PathLike, reader: SourceReader | None = None) -> SourceCheckpoint:
    """Open ``root`` and validate config, index and every shard header; shard data is read through
    ``reader`` if given (see :class:`~moebake.formats.safetensors_file.SafetensorsFile`)."""
    root = Path(root)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a checkpoint directory (does not exist or is not a directory)")
    if not os.path.lexists(root / CONFIG_NAME):
        raise CheckpointError(f"{root}: not a checkpoint (no {CONFIG_NAME})")
    config = read_json_object(root / CONFIG_NAME)
    index_path = root / SAFETENSORS_INDEX_FILE
    if os.path.lexists(index_path):
        weight_map = read_index(root).weight_map
        shard_names = sorted(set(weight_map.values()))
    elif os.path.lexists(root / SAFETENSORS_SINGLE_FILE):
        weight_map, shard_names = None, [SAFETENSORS_SINGLE_FILE]
    else:
        raise CheckpointError(f"{root}: not a checkpoint (no {SAFETENSORS_INDEX_FILE} and no {SAFETENSORS_SINGLE_FILE})")
    shards = {}
    for name in shard_names:
        if not os.path.lexists(root / name):
            raise CheckpointError(f"{index_path}: names shard {name}, which is missing")
        shards[name] = read_header(root / name, reader)
    locations: dict[str, str] = {}
    for name, shard in shards.items():
        for tensor in shard.tensors:
            if tensor in locations:
                raise CheckpointError(f"{root}: tensor {tensor} is stored twice, in {locations[tensor]} and in {name}")
            locations[tensor] = name
    if weight_map is not None:
        for tensor, shard_name in weight_map.items():
            if tensor not in shards[shard_name].tensors:
                raise CheckpointError(f"{index_path}: maps tensor {tensor} to {shard_name}, which does not contain it")
        unlisted = sorted(set(locations) - set(weight_map))
        if unlisted:
            LOG.warning(
                "%s: does not list %d tensor(s) its shards hold (first: %s in %s); they are carried through",
                index_path,
                len(unlisted),
                unlisted[0],
                locations[unlisted[0]],
            )
    side_files = sorted(
        p.name
        for p in root.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix not in WEIGHT_SUFFIXES and p.name != SAFETENSORS_INDEX_FILE
    )
    for name in side_files:  # copied into the output at the end: unreadable ones are refused now
        open_regular(root / name).close()
    return SourceCheckpoint(root, config, shards, locations, side_files)
