"""The 128x4 block-scale swizzle of NVFP4/MXFP4 scale factors (FlashInfer ``block_scale_interleave``).

Input: scales ``[E, R, C]`` of any one dtype (E8M0 or E4M3 bytes as uint8, or bf16), ``R`` rows
(output channels) and ``C = K / sf_vec`` scale columns. Each expert is zero-padded to
``R_pad = round_up(R, 128)`` rows and ``C_pad = round_up(C, 4)`` columns and then stored as
``R_pad/128 x C_pad/4`` tiles of 512 elements, row tiles outer. Within a tile, row ``r`` and
column ``c`` sit at ``(r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``. The flat offset of
``(e, r, c)`` is (TensorRT-LLM ``computeSFIndex``, 128x4 layout)::

    e * R_pad * C_pad + (r // 128) * 128 * C_pad + (c // 4) * 512
                      + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4

Output: ``[E, R_pad * C_pad]`` of the input dtype, the bytes FlashInfer's ``block_scale_interleave``
writes for the same ``[E, R, C]`` input (its flat output, split per expert). The same bytes are
the CuteDSL "MMA layout" (a strided view of them) and what ``shuffle_matrix_sf_a`` ends with.
"""

import torch

from moebake.errors import InvalidArgumentError
from moebake.schema.sizes import round_up

ROW_TILE = 128
COL_TILE = 4


def padded_dims(rows: int, cols: int) -> tuple[int, int]:
    """``(R_pad, C_pad)``: rows rounded up to 128, columns to 4."""
    return round_up(rows, ROW_TILE), round_up(cols, COL_TILE)


def swizzle_128x4(sf: torch.Tensor) -> torch.Tensor:
    """Linear scales ``[E, R, C]`` -> swizzled ``[E, R_pad * C_pad]`` (same dtype, zero padding)."""
    if sf.dim() != 3:
        raise InvalidArgumentError(f"expected scales [E, R, C], got shape {list(sf.shape)}")
    E, R, C = sf.shape
    Rp, Cp = padded_dims(R, C)
    if (Rp, Cp) != (R, C):
        padded = sf.new_zeros(E, Rp, Cp)
        padded[:, :R, :C] = sf
        sf = padded
    tiles = sf.reshape(E, Rp // 128, 4, 32, Cp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    return tiles.reshape(E, Rp * Cp)


def unswizzle_128x4(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_128x4`: ``[E, R_pad * C_pad]`` -> ``[E, rows, cols]`` (padding dropped)."""
    Rp, Cp = padded_dims(rows, cols)
    if flat.dim() != 2 or flat.shape[1] != Rp * Cp:
        raise InvalidArgumentError(f"expected swizzled scales [E, {Rp * Cp}] for {rows}x{cols}, got shape {list(flat.shape)}")
    E = flat.shape[0]
    tiles = flat.reshape(E, Rp // 128, Cp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)
    return tiles.reshape(E, Rp, Cp)[:, :rows, :cols]
