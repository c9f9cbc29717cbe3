"""MXFP4 (OCP microscaling FP4) element encoding.

* Elements are E2M1 4-bit codes: bit 3 = sign, bits 2..0 = ``e e m``; code values are
  ``[+0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6]``.
* Two elements per byte: the **low nibble holds the even element** (k = 2i), the high nibble
  the odd element (k = 2i + 1). A row of K elements is ``K/2`` bytes.
* One E8M0 scale byte per 32 consecutive elements of a row: value ``2 ** (byte - 127)``.

These helpers decode to float32 for verification: a test oracle (the converter itself never decodes).
"""

import torch

BLOCK_SIZE = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., K/2]`` -> uint8 codes ``[..., K]`` (even k from the low nibble)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes ``[..., K]`` (values < 16) -> uint8 ``[..., K/2]``; inverse of unpack_nibbles."""
    pairs = codes.unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Decode MXFP4 to float32.

    packed: uint8 ``[..., K/2]``; scales: uint8 E8M0 ``[..., K/32]``; returns float32 ``[..., K]``.
    """
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    values = lut[unpack_nibbles(packed).long()]
    factors = torch.exp2(scales.float() - 127.0).repeat_interleave(BLOCK_SIZE, dim=-1)
    return values * factors
