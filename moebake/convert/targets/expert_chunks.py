"""Streaming over the expert dimension: read a few experts, transform them, yield the bytes.

While one chunk is transformed, the next is read by the reading thread
(:func:`moebake.convert.prefetch.read_ahead`), so at most two chunks of source bytes are held at a
time. Reads keep their order.
"""

import functools
from collections.abc import Callable, Iterator

import torch

from moebake.convert.prefetch import read_ahead
from moebake.formats.checkpoint import SourceCheckpoint


def experts_per_chunk(checkpoint: SourceCheckpoint, names: tuple[str, ...], chunk_bytes: int) -> int:
    """How many experts of the source tensors ``names``, read together, fit in ``chunk_bytes`` (at least 1)."""
    return max(1, chunk_bytes // max(1, sum(checkpoint.expert_row_bytes(name) for name in names)))


def zip_expert_chunks(
    checkpoint: SourceCheckpoint,
    names: tuple[str, ...],
    num_experts: int,
    chunk_bytes: int,
    combine: Callable[..., torch.Tensor],
) -> Callable[[], Iterator[torch.Tensor]]:
    """Producer that reads the same few experts of every tensor in ``names`` and yields ``combine(*chunks)``.

    ``names`` are tensors stacked over experts (dim 0) or per-expert patterns (see
    :meth:`SourceCheckpoint.read_experts`); each chunk is ``[e, ...]`` in its source dtype.
    ``combine`` maps them to the output's rows ``[e, ...]``; the output is the concatenation of
    the combined chunks along dim 0.
    """
    step = experts_per_chunk(checkpoint, names, chunk_bytes)

    def read(start: int) -> list[torch.Tensor]:
        return [checkpoint.read_experts(name, start, min(start + step, num_experts)) for name in names]

    def produce() -> Iterator[torch.Tensor]:
        for chunks in read_ahead([functools.partial(read, start) for start in range(0, num_experts, step)]):
            yield combine(*chunks).contiguous()

    return produce
