"""FlashInfer's SM90 mixed-input FP4 weight interleave (W4A16: BF16 activations x MXFP4 weights).

Input and output are uint8 ``[E, n, k/2]``: ``n`` output rows of ``k`` packed E2M1 elements
(low nibble = even element), with ``n % 16 == 0`` and ``k % 64 == 0``. The transform equals
``flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")`` bit for bit, for
the FlashInfer release family named by the layout id (see :mod:`moebake.layouts.flashinfer_versions`).

Index names used below, for one expert (bytes ``W[row][col]``):
  ``row = 16*G + 8*half + r0`` with ``r0 in [0, 8)``;
  ``col = 32*p + 8*mma + 4*h + j`` with ``mma in [0, 4)``, ``h in {0, 1}``, ``j in [0, 4)``.

Layout ``v2`` (FlashInfer 0.6.16-0.6.16.post2 and >= 0.6.18, kernel of PR #3738): the four bytes
``W[r][c], W[r+8][c], W[r][c+4], W[r+8][c+4]`` form a little-endian word (byte ``t = half + 2h``),
whose 32 bits are permuted (:data:`V2_BIT_PERMUTATION`) and stored as 4 bytes at row
``16G + 8*(mma % 2) + r0``, columns ``32p + 16*(mma // 2) + 4j + t``.

Layout ``v1`` (0.6.10-0.6.15.post1, 0.6.16.post3/.post4, 0.6.17, kernel of PR #3084): with
``col = 32p + 16a + 8b + 4c + j``, bytes ``A = W[16G+r0][col]`` and ``B = W[16G+8+r0][col]`` become
``D[16G+8b+r0][32p+16a+4j+2c] = lo(A) | lo(B) << 4`` and ``[... + 1] = hi(A) | hi(B) << 4``.

Both are byte permutations (v2 also moves bits inside each 4-byte word); the inverses are exact.
The bit permutation runs through four 256-entry uint32 lookup tables (one per source byte), so the
CPU cost is four table look-ups and three ORs per 32-bit word.
"""

import numpy as np
import torch

LAYOUTS = ("v2", "v1")

# (mask, shift) pairs of FlashInfer's interleave_fp4_weights_for_sm90_mixed_gemm_kernel (v2):
# each masked group of source bits moves left by `shift` (right when negative).
_V2_MASK_SHIFTS = (
    (0x80, 24), (0x70, 18), (0x08, 12), (0x07, 6), (0x8000, 13), (0x7000, 7), (0x0800, 1),
    (0x0700, -5), (0x800000, 2), (0x700000, -4), (0x080000, -10), (0x070000, -16),
    (0x80000000, -1), (0x10000000, 1), (0x60000000, -3), (0x08000000, -13),
    (0x01000000, -11), (0x06000000, -15),
)


def _bit_destinations(mask_shifts) -> tuple[int, ...]:
    """Destination bit of each of the 32 source bits; checks the result is a permutation."""
    destination = [-1] * 32
    for mask, shift in mask_shifts:
        for bit in range(32):
            if mask >> bit & 1:
                destination[bit] = bit + shift
    assert sorted(destination) == list(range(32)), "bit map is not a permutation"
    return tuple(destination)


V2_BIT_PERMUTATION = _bit_destinations(_V2_MASK_SHIFTS)
"""``V2_BIT_PERMUTATION[i]`` is the destination bit of source bit ``i`` in each 32-bit word."""


def _byte_tables(destination) -> np.ndarray:
    """uint32 ``[4, 256]``: ``table[t][b]`` = bits that byte value ``b`` at byte ``t`` sets."""
    tables = np.zeros((4, 256), dtype=np.uint32)
    values = np.arange(256, dtype=np.uint32)
    for t in range(4):
        for j in range(8):
            tables[t] |= ((values >> j) & 1) << np.uint32(destination[8 * t + j])
    return tables


_FORWARD_TABLES = _byte_tables(V2_BIT_PERMUTATION)
_INVERSE_TABLES = _byte_tables(tuple(V2_BIT_PERMUTATION.index(bit) for bit in range(32)))


def _permute_word_bits(words: torch.Tensor, tables: np.ndarray) -> torch.Tensor:
    """uint8 ``[..., 4]`` little-endian words -> uint8 ``[..., 4]`` with bits permuted."""
    b = words.contiguous().numpy()
    out = tables[0][b[..., 0]]
    out |= tables[1][b[..., 1]]
    out |= tables[2][b[..., 2]]
    out |= tables[3][b[..., 3]]
    return torch.from_numpy(out.astype("<u4", copy=False).view(np.uint8).reshape(b.shape))


def _check(weight: torch.Tensor, layout: str) -> tuple[int, int, int]:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown SM90 fp4 layout {layout!r}; expected one of {LAYOUTS}")
    if weight.dtype != torch.uint8 or weight.dim() != 3:
        raise ValueError(f"expected uint8 [E, n, k/2], got {weight.dtype} {list(weight.shape)}")
    experts, rows, row_bytes = weight.shape
    if rows % 16 or row_bytes % 32:
        raise ValueError(f"SM90 fp4 interleave needs n % 16 == 0 and k % 64 == 0, got n={rows}, k={2 * row_bytes}")
    return experts, rows, row_bytes


def interleave_fp4(weight: torch.Tensor, layout: str = "v2") -> torch.Tensor:
    """Row-major packed MXFP4 uint8 ``[E, n, k/2]`` -> SM90 interleaved uint8 ``[E, n, k/2]``."""
    E, n, kb = _check(weight, layout)
    if layout == "v1":
        s = weight.reshape(E, n // 16, 2, 8, kb // 32, 2, 2, 2, 4)  # E G half r0 p a b c j
        lo, hi = s & 0x0F, s >> 4
        pair = torch.stack([lo[:, :, 0] | (lo[:, :, 1] << 4), hi[:, :, 0] | (hi[:, :, 1] << 4)], -1)
        return pair.permute(0, 1, 5, 2, 3, 4, 7, 6, 8).reshape(E, n, kb)  # E G b r0 p a j c x
    words = weight.reshape(E, n // 16, 2, 8, kb // 32, 4, 2, 4).permute(0, 1, 3, 4, 5, 7, 6, 2)
    mixed = _permute_word_bits(words.reshape(E, n // 16, 8, kb // 32, 4, 4, 4), _FORWARD_TABLES)
    mixed = mixed.reshape(E, n // 16, 8, kb // 32, 2, 2, 4, 4)  # E G r0 p mq mh j t
    return mixed.permute(0, 1, 5, 2, 3, 4, 6, 7).reshape(E, n, kb)


def deinterleave_fp4(weight: torch.Tensor, layout: str = "v2") -> torch.Tensor:
    """Inverse of :func:`interleave_fp4`: SM90 interleaved -> row-major packed, uint8 ``[E, n, k/2]``."""
    E, n, kb = _check(weight, layout)
    if layout == "v1":
        d = weight.reshape(E, n // 16, 2, 8, kb // 32, 2, 4, 2, 2)  # E G b r0 p a j c x
        pair = d.permute(0, 1, 3, 4, 5, 2, 7, 6, 8)  # E G r0 p a b c j x
        lo_pair, hi_pair = pair[..., 0], pair[..., 1]
        rows_a = (lo_pair & 0x0F) | ((hi_pair & 0x0F) << 4)
        rows_b = (lo_pair >> 4) | ((hi_pair >> 4) << 4)
        return torch.stack([rows_a, rows_b], 2).reshape(E, n, kb)  # E G half r0 p a b c j
    mixed = weight.reshape(E, n // 16, 2, 8, kb // 32, 2, 4, 4).permute(0, 1, 3, 4, 5, 2, 6, 7)
    words = _permute_word_bits(mixed.reshape(E, n // 16, 8, kb // 32, 4, 4, 4), _INVERSE_TABLES)
    words = words.reshape(E, n // 16, 8, kb // 32, 4, 4, 2, 2)  # E G r0 p mma j h half
    return words.permute(0, 1, 7, 2, 3, 4, 6, 5).reshape(E, n, kb)
