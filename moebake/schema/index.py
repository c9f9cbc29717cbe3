"""``model.safetensors.index.json``: the one reader and writer of a sharded checkpoint's index.

The file is a JSON object ``{"metadata": {"total_size": int, ...}, "weight_map": {tensor: shard
file name}}``; ``total_size`` is the tensors' payload bytes (headers excluded). Sources, baked
outputs, ``verify`` and the runtime all read it here, with one error policy: a missing or malformed
index raises :class:`~moebake.errors.CheckpointError` naming the file and the field, and so does
a shard name that is not a plain file name (:func:`shard_name_problem`).
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.constants import SAFETENSORS_INDEX_FILE

from moebake.errors import CheckpointError, MoebakeError
from moebake.schema.config_values import json_type, read_json_object, short_repr
from moebake.schema.files import plain_name_problem

SHARD_SUFFIX = ".safetensors"


@dataclass(frozen=True)
class SafetensorsIndex:
    """A parsed index: ``weight_map`` (tensor name -> shard file name) and ``total_size`` (None if absent)."""

    path: Path
    weight_map: dict[str, str]
    total_size: int | None

    @property
    def shard_names(self) -> list[str]:
        """The shard files the index names, sorted."""
        return sorted(set(self.weight_map.values()))

    def tensors_of(self, shard_name: str) -> set[str]:
        """The tensors the index places in ``shard_name``."""
        return {tensor for tensor, shard in self.weight_map.items() if shard == shard_name}


def shard_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a shard's file name (None if it can): shards are plain file names
    (:func:`moebake.schema.files.plain_name_problem`: no ``/``, ``\\``, ``..``, NUL) ending in ``.safetensors``,
    so a shard lies in its checkpoint, and the output shard made from it in the output."""
    problem = plain_name_problem(name)
    if problem is None and not name.endswith(SHARD_SUFFIX):
        problem = f"does not end in {SHARD_SUFFIX}"
    return problem


def read_index(directory: str | os.PathLike) -> SafetensorsIndex:
    """Read and check ``directory/model.safetensors.index.json``; CheckpointError naming the file and field."""
    path = Path(directory) / SAFETENSORS_INDEX_FILE
    if not os.path.lexists(path):
        raise CheckpointError(f"{path}: missing")
    try:
        data = read_json_object(path)
    except CheckpointError:
        raise
    except MoebakeError as err:
        raise CheckpointError(str(err)) from None
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path}: has no weight_map (expected a non-empty JSON object, found {json_type(weight_map)})")
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise CheckpointError(f"{path}: weight_map maps tensor {tensor} to {short_repr(shard)}, expected a shard file name")
        if (problem := shard_name_problem(shard)) is not None:
            raise CheckpointError(
                f"{path}: maps tensor {tensor} to shard {shard!r}, which is not a plain file name in the checkpoint ({problem})"
            )
    metadata = data.get("metadata")
    total_size = metadata.get("total_size") if isinstance(metadata, dict) else None
    if total_size is not None and (type(total_size) is not int or total_size < 0):
        raise CheckpointError(f"{path}: metadata.total_size is {short_repr(total_size)}, expected a non-negative integer")
    return SafetensorsIndex(path, dict(weight_map), total_size)


def write_index(directory: str | os.PathLike, weight_map: dict[str, str], total_size: int) -> Path:
    """Write ``directory/model.safetensors.index.json`` (tensors sorted by name, 2-space indent); returns its path."""
    path = Path(directory) / SAFETENSORS_INDEX_FILE
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    path.write_text(json.dumps(index, indent=2) + "\n")
    return path
