"""FlashInfer's SM90 mixed-input block-scale fold (``interleave_moe_scales_for_sm90_mixed_gemm``).

Input: scales ``[E, rows, K/group]`` (MXFP4: uint8 E8M0, group 32). Needs ``rows % 64 == 0`` and
``K % 128 == 0``. Each 64-row x 128-K block of scales becomes one contiguous tile of 16-byte lines.
For uint8 / group 32 the output is uint8 ``[E, rows/64, K/128, 16, 16]`` with

    out[e, R, Kb, f, 4*m + g] = s[e, 64*R + 16*m + f, 4*Kb + g]

i.e. each 16-byte line holds rows ``f, f+16, f+32, f+48`` of the block, four K-groups each.
The kernel reads the bytes as ``.view(torch.int32)``; only the byte order matters to it.

That is the fold of FlashInfer's layout ``v2`` releases. Its layout ``v1`` releases (the weight interleave of PR
#3084: 0.6.10-0.6.15.post1, 0.6.16.post3/.post4, 0.6.17) fold the scales the older way, :func:`fold_scales_v1`:
uint8 ``[E, K/128, 4*rows]`` with ``out[e, Kb, 4*r + g] = s[e, r, 4*Kb + g]`` (no row tiling).

:func:`fold_scales_padded` folds zero-padded parts stacked along rows (a W13's up and gate halves)
without building the stack; for 1-byte scales in groups of 32 it runs a compiled kernel when one is
available (:func:`moebake.layouts.compiled.kernels`), with :func:`fold_scales` as its oracle and fallback.
"""

import functools
from collections.abc import Sequence

import numpy as np
import torch

from moebake.errors import InvalidArgumentError
from moebake.layouts.compiled import kernels
from moebake.layouts.gate_up import pad_to
from moebake.layouts.parallel import run_in_threads


def _geometry(scales: torch.Tensor, group_size: int) -> tuple[int, int, int]:
    groups_per_k128 = 128 // group_size
    elements_per_line = 16 // scales.element_size()
    m_slices = elements_per_line // groups_per_k128
    return groups_per_k128, m_slices, 64 // m_slices


_INTEGER_OF_WIDTH = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _units(x: torch.Tensor, unit_bytes: int) -> tuple[torch.Tensor, int]:
    """``x``'s bytes as the widest integer dtype dividing ``unit_bytes``, and how many of those one unit holds.

    A unit (the scale groups of one 128-wide K block: 4 bytes for uint8 / group 32) never splits,
    so permuting whole units moves the same bytes as permuting elements, in wide, fast copies.
    """
    width = next(w for w in _INTEGER_OF_WIDTH if unit_bytes % w == 0)
    x = x.contiguous()
    if x.storage_offset() * x.element_size() % width:
        x = x.clone()
    return x.view(_INTEGER_OF_WIDTH[width]), unit_bytes // width


def fold_scales(scales: torch.Tensor, group_size: int = 32) -> torch.Tensor:
    """``[E, rows, K/group]`` -> ``[E, rows/64, K/128, 64/m, 16/elsize]`` (uint8/32: ``[..., 16, 16]``)."""
    E, rows, groups = scales.shape
    gpk, m_slices, folded_m = _geometry(scales, group_size)
    if rows % 64 or groups % gpk:
        raise InvalidArgumentError(f"scale fold needs rows % 64 == 0 and K % 128 == 0, got rows={rows}, K={groups * group_size}")
    units, per_unit = _units(scales, gpk * scales.element_size())
    tiles = units.reshape(E, rows // 64, m_slices, folded_m, groups // gpk, per_unit).permute(0, 1, 4, 3, 2, 5)
    return tiles.contiguous().view(scales.dtype).reshape(E, rows // 64, groups // gpk, folded_m, m_slices * gpk)


def fold_scales_v1(scales: torch.Tensor, group_size: int = 32) -> torch.Tensor:
    """FlashInfer layout ``v1``'s fold: ``[E, rows, K/group]`` -> ``[E, K/128, rows * 128/group]``."""
    E, rows, groups = scales.shape
    per_k128 = 128 // group_size
    if groups % per_k128:
        raise InvalidArgumentError(f"scale fold needs K % 128 == 0, got K={groups * group_size}")
    return (
        scales.reshape(E, rows, groups // per_k128, per_k128)
        .permute(0, 2, 1, 3)
        .contiguous()
        .reshape(E, groups // per_k128, rows * per_k128)
    )


def unfold_scales_v1(folded: torch.Tensor, group_size: int = 32) -> torch.Tensor:
    """Inverse of :func:`fold_scales_v1`: ``[E, K/128, rows * 128/group]`` -> ``[E, rows, K/group]``."""
    E, k_blocks, line = folded.shape
    per_k128 = 128 // group_size
    return (
        folded.reshape(E, k_blocks, line // per_k128, per_k128)
        .permute(0, 2, 1, 3)
        .contiguous()
        .reshape(E, line // per_k128, k_blocks * per_k128)
    )


def fold_scales_padded(parts: Sequence[torch.Tensor], part_shape: tuple[int, int], group_size: int = 32) -> torch.Tensor:
    """``fold_scales(torch.cat([pad_to(p, part_shape) for p in parts], 1), group_size)``.

    ``parts``: ``[E, r_i, g_i]`` scale tensors of one dtype (any strides), ``r_i <= rows`` and
    ``g_i <= groups`` for ``part_shape = (rows, groups)``; each is zero-padded at its ends.
    """
    rows, groups = part_shape
    compiled = kernels()
    if compiled is None or group_size != 32 or parts[0].element_size() != 1 or len(parts) * rows % 64 or groups % 4:
        return fold_scales(torch.cat([pad_to(part, part_shape) for part in parts], 1), group_size)
    if any(p.shape[0] != parts[0].shape[0] or p.shape[1] > rows or p.shape[2] > groups or p.dtype != parts[0].dtype for p in parts):
        raise InvalidArgumentError(f"scale parts {[list(p.shape) for p in parts]} do not fit [E, {rows}, {groups}] each")
    experts = parts[0].shape[0]
    out = np.empty((experts, len(parts) * rows // 64, groups // 4, 16, 16), np.uint8)
    run_in_threads(
        [
            functools.partial(compiled.fold_scales_part, part[e].view(torch.uint8).numpy(), out[e], index * rows, rows)
            for e in range(experts)
            for index, part in enumerate(parts)
        ]
    )
    return torch.from_numpy(out).view(parts[0].dtype)


def unfold_scales(folded: torch.Tensor, group_size: int = 32) -> torch.Tensor:
    """Inverse of :func:`fold_scales`: ``[E, rows/64, K/128, fm, line]`` -> ``[E, rows, K/group]``."""
    E, row_blocks, k_blocks, folded_m, _ = folded.shape
    gpk, m_slices, _ = _geometry(folded, group_size)
    units, per_unit = _units(folded, gpk * folded.element_size())
    tiles = units.reshape(E, row_blocks, k_blocks, folded_m, m_slices, per_unit).permute(0, 1, 4, 3, 2, 5)
    return tiles.contiguous().view(folded.dtype).reshape(E, row_blocks * 64, k_blocks * gpk)


FOLDS = {"v2": (fold_scales, unfold_scales), "v1": (fold_scales_v1, unfold_scales_v1)}
"""FlashInfer SM90 layout id -> (fold, unfold) of its block scales."""


def fold_scales_for(layout: str, parts: Sequence[torch.Tensor], part_shape: tuple[int, int]) -> torch.Tensor:
    """The scales of ``parts`` (stacked along rows, each zero-padded to ``part_shape``) folded as FlashInfer layout
    ``layout`` reads them (uint8 E8M0, groups of 32)."""
    if layout == "v2":
        return fold_scales_padded(parts, part_shape)
    return FOLDS[layout][0](torch.cat([pad_to(part, part_shape) for part in parts], 1))
