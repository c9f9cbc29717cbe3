"""Locate the first difference between two byte images of one tensor, in the tensor's own index space.

Both images are flat ``uint8`` tensors holding a contiguous run of the tensor's C-order,
little-endian bytes, starting ``byte_offset`` bytes into the tensor. The difference is reported
as the multi-dimensional index of the first differing element (for the safetensors dtype code
and shape of the tensor) and each side's element value in hex, e.g. ``index [1, 163, 5]
(0x00 != 0x5a)``. Sub-byte dtypes (``F4``: two elements per byte, low nibble first) are resolved
to the differing nibble.
"""

import numpy as np
import torch

from moebake.formats.safetensors_file import DTYPES


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    """C-order multi-index of element number ``flat`` in a tensor of ``shape``, as a plain list."""
    return [int(i) for i in np.unravel_index(flat, shape)]


def first_difference(actual: torch.Tensor, expected: torch.Tensor, dtype: str, shape: tuple[int, ...], byte_offset: int = 0) -> str | None:
    """``"index [...] (0xA != 0xE)"`` for the first element where the byte images differ, or None if equal.

    ``actual``/``expected``: flat uint8 tensors of equal length, bytes ``[byte_offset, byte_offset + n)``
    of a tensor of safetensors ``dtype`` and ``shape``; ``byte_offset`` and ``n`` are whole elements.
    """
    if torch.equal(actual, expected):
        return None
    position = int((actual != expected).nonzero()[0])
    bits = DTYPES[dtype][1]
    if bits < 8:  # two 4-bit elements per byte, the even element in the low nibble
        a, e = int(actual[position]), int(expected[position])
        high = (a & 0xF) == (e & 0xF)
        flat = 2 * (byte_offset + position) + high
        a, e = (a >> 4, e >> 4) if high else (a & 0xF, e & 0xF)
        return f"index {_index(flat, shape)} (0x{a:x} != 0x{e:x})"
    width = bits // 8
    flat = (byte_offset + position) // width
    start = position - position % width
    a = int.from_bytes(bytes(actual[start : start + width].tolist()), "little")
    e = int.from_bytes(bytes(expected[start : start + width].tolist()), "little")
    return f"index {_index(flat, shape)} (0x{a:0{2 * width}x} != 0x{e:0{2 * width}x})"
