"""W13 halves interleaved in row groups: the CuteDSL MoE (FlashInfer ``CuteDslMoEWrapper``) GEMM1 layout.

A fused W13 ``[E, 2I, ...]`` made of two halves ``[first; second]`` (CuteDSL: ``[up; gate]``) becomes,
with ``g = group_size`` (64 for CuteDSL), rows::

    first[0:g], second[0:g], first[g:2g], second[g:2g], ...

The same permutation applies to every row-indexed tensor of W13 (packed FP4 weights, linear block
scales), whatever its dtype and trailing dims. Needs ``I % g == 0``. This equals FlashInfer's
``_interleave_linear_and_gate(x, group_size, dim=1)`` and SGLang's ``interleave_w13_halves``.
"""

import torch

from moebake.errors import InvalidArgumentError


def _groups(w13: torch.Tensor, group_size: int) -> int:
    if w13.dim() < 2 or w13.shape[1] % (2 * group_size):
        raise InvalidArgumentError(f"W13 rows must split into two halves of whole {group_size}-row groups, got shape {list(w13.shape)}")
    return w13.shape[1] // (2 * group_size)


def interleave_halves(w13: torch.Tensor, group_size: int = 64) -> torch.Tensor:
    """``[E, 2I, ...]`` halves ``[first; second]`` -> rows alternating ``group_size``-row groups of each half."""
    groups = _groups(w13, group_size)
    return w13.unflatten(1, (2, groups, group_size)).transpose(1, 2).flatten(1, 3).contiguous()


def deinterleave_halves(w13: torch.Tensor, group_size: int = 64) -> torch.Tensor:
    """Inverse of :func:`interleave_halves`: alternating groups -> ``[first; second]``, ``[E, 2I, ...]``."""
    groups = _groups(w13, group_size)
    return w13.unflatten(1, (groups, 2, group_size)).transpose(1, 2).flatten(1, 3).contiguous()
