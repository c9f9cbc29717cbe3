"""Streaming over the expert dimension: read a few experts, transform them, yield the bytes."""

from collections.abc import Callable, Iterator

import torch

from moebake.formats.checkpoint import SourceCheckpoint


def experts_per_chunk(checkpoint: SourceCheckpoint, names: tuple[str, ...], chunk_bytes: int) -> int:
    """How many experts of the source tensors ``names``, read together, fit in ``chunk_bytes`` (at least 1)."""
    return max(1, chunk_bytes // max(1, sum(checkpoint.expert_row_bytes(name) for name in names)))


def zip_expert_chunks(
    checkpoint: SourceCheckpoint, names: tuple[str, ...], num_experts: int, chunk_bytes: int,
    combine: Callable[..., torch.Tensor],
) -> Callable[[], Iterator[torch.Tensor]]:
    """Producer that reads the same few experts of every tensor in ``names`` and yields ``combine(*chunks)``.

    ``names`` are tensors stacked over experts (dim 0) or per-expert patterns (see
    :meth:`SourceCheckpoint.read_experts`); each chunk is ``[e, ...]`` in its source dtype.
    ``combine`` maps them to the output's rows ``[e, ...]``; the output is the concatenation of
    the combined chunks along dim 0.
    """
    step = experts_per_chunk(checkpoint, names, chunk_bytes)

    def produce() -> Iterator[torch.Tensor]:
        for start in range(0, num_experts, step):
            stop = min(start + step, num_experts)
            yield combine(*(checkpoint.read_experts(name, start, stop) for name in names)).contiguous()

    return produce


def map_expert_chunks(
    checkpoint: SourceCheckpoint, name: str, chunk_bytes: int, transform: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[], Iterator[torch.Tensor]]:
    """Producer that reads ``name`` (stacked over experts) a few experts at a time and yields ``transform(chunk)``.

    ``transform`` maps source rows ``[e, ...]`` (source dtype) to the output's rows ``[e, ...]``.
    """
    return zip_expert_chunks(checkpoint, (name,), checkpoint.entry(name).shape[0], chunk_bytes, transform)
