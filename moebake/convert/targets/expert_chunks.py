"""Streaming over the expert dimension: read a few experts, transform them, yield the bytes."""

from collections.abc import Callable, Iterator

import torch

from moebake.formats.checkpoint import SourceCheckpoint


def experts_per_chunk(checkpoint: SourceCheckpoint, name: str, chunk_bytes: int) -> int:
    """How many experts (dim-0 rows) of source tensor ``name`` fit in ``chunk_bytes`` (at least 1)."""
    return max(1, chunk_bytes // max(1, checkpoint.entry(name).row_bytes))


def map_expert_chunks(
    checkpoint: SourceCheckpoint, name: str, chunk_bytes: int, transform: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[], Iterator[torch.Tensor]]:
    """Producer that reads ``name`` a few experts at a time and yields ``transform(chunk)``.

    ``transform`` maps source rows ``[e, ...]`` (source dtype) to the output's rows ``[e, ...]``;
    the output is the concatenation of the transformed chunks along dim 0.
    """
    source_file = checkpoint.file_of(name)
    num_experts = checkpoint.entry(name).shape[0]
    step = experts_per_chunk(checkpoint, name, chunk_bytes)

    def produce() -> Iterator[torch.Tensor]:
        for start in range(0, num_experts, step):
            yield transform(source_file.read_rows(name, start, min(start + step, num_experts))).contiguous()

    return produce
