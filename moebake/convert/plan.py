"""What a conversion writes: output tensors (with lazy producers) grouped into output shards.

A target maps source expert tensors to output tensors; every other source tensor passes through
byte for byte under its own name and dtype. Each output tensor lands in the shard of its first
source tensor, in the source's byte order, so output shards mirror source shards.
"""

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from moebake.convert.prefetch import read_ahead
from moebake.formats.checkpoint import SourceCheckpoint
from moebake.formats.safetensors_file import tensor_nbytes

Producer = Callable[[], Iterator[torch.Tensor]]
"""Yields the tensor's bytes in order as contiguous CPU tensors (any dtype; bytes are what count)."""


@dataclass(frozen=True, kw_only=True)
class OutputTensor:
    """One tensor of the output: safetensors dtype code, shape, and how to produce its bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    sources: tuple[str, ...]
    produce: Producer = field(compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


@dataclass(frozen=True)
class OutputShard:
    file_name: str
    tensors: tuple[OutputTensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def passthrough(checkpoint: SourceCheckpoint, name: str, chunk_bytes: int) -> OutputTensor:
    """Copy of source tensor ``name``: same name, dtype, shape and bytes, read ``chunk_bytes`` at a time
    (the next chunk while the current one is written)."""
    entry = checkpoint.entry(name)
    source_file = checkpoint.file_of(name)

    def produce() -> Iterator[torch.Tensor]:
        yield from read_ahead(
            [
                functools.partial(source_file.read_bytes, entry, start, min(start + chunk_bytes, entry.nbytes))
                for start in range(0, entry.nbytes, chunk_bytes)
            ]
        )

    return OutputTensor(name=name, dtype=entry.dtype, shape=entry.shape, sources=(name,), produce=produce)


def assign_shards(checkpoint: SourceCheckpoint, converted: list[OutputTensor], chunk_bytes: int) -> list[OutputShard]:
    """Place converted tensors and pass-through copies of all other source tensors into shards."""
    consumed = {source for tensor in converted for source in tensor.sources}
    by_first_source: dict[str, list[OutputTensor]] = {tensor.sources[0]: [] for tensor in converted}
    for tensor in converted:
        by_first_source[tensor.sources[0]].append(tensor)
    shards = []
    for file_name, shard in checkpoint.shards.items():
        tensors: list[OutputTensor] = []
        for entry in sorted(shard.tensors.values(), key=lambda e: e.begin):
            if checkpoint.locations.get(entry.name) != file_name:
                continue
            if entry.name in consumed:
                tensors.extend(by_first_source.get(entry.name, ()))
            else:
                tensors.append(passthrough(checkpoint, entry.name, chunk_bytes))
        if tensors:
            shards.append(OutputShard(file_name, tuple(tensors)))
    return shards
