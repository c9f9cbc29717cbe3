"""Gate/up row orders of fused W13 tensors, and zero padding.

Orders (rows of W13 ``[E, 2I, ...]``):
  ``pairs``  -- GPT-OSS checkpoints: row ``2i`` = gate_i, row ``2i+1`` = up_i.
  ``gate_up`` -- halves ``[gate; up]`` (HF fused ``gate_up_proj``, DeepEP/DeepGEMM, CuteDSL masked).
  ``up_gate`` -- halves ``[up; gate]`` (FlashInfer CUTLASS and CuteDSL: first half is the linear/up).
Padded halves are each zero-padded to ``I_pad`` rows: ``[up_0..up_{I-1}, 0.., gate_0.., 0..]``.
"""

import torch


def split_pairs(w13: torch.Tensor, dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``pairs`` order along ``dim`` -> (gate, up), each with half the rows."""
    return w13.unflatten(dim, (-1, 2)).unbind(dim + 1)


def merge_pairs(gate: torch.Tensor, up: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """Inverse of :func:`split_pairs`: (gate, up) -> rows ``g0, u0, g1, u1, ...`` along ``dim``."""
    return torch.stack([gate, up], dim + 1).flatten(dim, dim + 1)


def pad_to(x: torch.Tensor, sizes: tuple[int, ...], fill: int = 0) -> torch.Tensor:
    """Pad the trailing dims of ``x`` (``len(sizes)`` of them) at their ends to ``sizes``, with ``fill``
    (zero unless an engine fills padding otherwise, e.g. SGLang's 127 = E8M0 1.0 scale buffers)."""
    lead = x.shape[: x.dim() - len(sizes)]
    if tuple(x.shape[len(lead) :]) == tuple(sizes):
        return x.contiguous()
    out = x.new_full((*lead, *sizes), fill)
    out[(...,) + tuple(slice(0, n) for n in x.shape[len(lead) :])] = x
    return out


def stack_halves(first: torch.Tensor, second: torch.Tensor, half_shape: tuple[int, ...]) -> torch.Tensor:
    """(first ``[E, I, ...]``, second ``[E, I, ...]``) -> ``[E, 2*I_pad, ...]``.

    Each half is zero-padded at its ends to ``half_shape = (I_pad, ...)`` before concatenation.
    """
    return torch.cat([pad_to(first, half_shape), pad_to(second, half_shape)], 1)


def split_halves(w13: torch.Tensor, half_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`stack_halves`: ``[E, 2*I_pad, ...]`` -> both halves cropped to ``half_shape``."""
    padded_rows = w13.shape[1] // 2
    crop = tuple(slice(0, n) for n in half_shape[1:])
    first, second = w13[:, :padded_rows], w13[:, padded_rows:]
    return first[(slice(None), slice(0, half_shape[0])) + crop], second[(slice(None), slice(0, half_shape[0])) + crop]
