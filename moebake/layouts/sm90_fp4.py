"""FlashInfer's SM90 mixed-input FP4 weight interleave (W4A16: BF16 activations x MXFP4 weights).

Input and output are uint8 ``[E, n, k/2]``: ``n`` output rows of ``k`` packed E2M1 elements
(low nibble = even element), with ``n % 16 == 0`` and ``k % 64 == 0``. The transform equals
``flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")`` bit for bit, for
the FlashInfer release family named by the layout id (see :mod:`moebake.schema.flashinfer_versions`).

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
(``a, b, c`` are ``mma // 2, mma % 2, h`` of the names above.)

Both are byte permutations (v2 also moves bits inside each 4-byte word); the inverses are exact.
How it is computed, in numpy, one L2-sized run of 16-row blocks at a time (wide moves only, so the
CPU is not stuck in permutes of 1-byte elements):

1. *Lanes*: the 4-byte groups ``W[16G + 8*half + r0][32p + 8*mma + 4h : +4]`` (bytes ``j = 0..3``)
   are copied as uint32 into planes ``[half][h]``, lanes in output order ``(G, mma % 2, r0, p, mma // 2)``.
2. *Nibble transpose* of the two halves, bytewise: ``(A, B) -> (lo(A) | lo(B) << 4, hi(A) | hi(B) << 4)``,
   stored back in planes ``[0]`` (low nibbles) and ``[1]`` (high nibbles). It is its own inverse.
3. ``v1``: byte ``j`` of plane ``[nib][h]`` is output byte ``4j + 2h + nib`` of the lane: byte copies.
   ``v2``: the bit permutation takes the four low nibbles of a word (bytes ``t = 0..3``) to output
   bytes 0-1, and the four high nibbles to bytes 2-3 with the same pattern (checked at import). So
   output bytes ``2*nib, 2*nib + 1`` of word ``j`` = ``F[plane[nib][0][j] | plane[nib][1][j] << 8]``
   for one 65536-entry uint16 table ``F``: one gather per two output bytes, written in place.
The inverse runs the steps backwards (``F``'s inverse table, the same transpose, lanes back to rows).
Experts are shared out between threads (:func:`moebake.layouts.parallel.run_in_threads`).

The forward interleave runs a compiled kernel instead when one is available
(:func:`moebake.layouts.compiled.kernels`; same bytes, GIL-free; speed: ``bench/transform_bench.py``); the numpy steps above
are its oracle and the fallback.
"""

import functools
import threading
from collections.abc import Sequence

import numpy as np
import torch

from moebake.errors import InternalError, InvalidArgumentError
from moebake.layouts.compiled import kernels
from moebake.layouts.parallel import run_in_threads
from moebake.schema.flashinfer_versions import LAYOUTS

# (mask, shift) pairs of FlashInfer's interleave_fp4_weights_for_sm90_mixed_gemm_kernel (v2):
# each masked group of source bits moves left by `shift` (right when negative).
_V2_MASK_SHIFTS = (
    (0x80, 24),
    (0x70, 18),
    (0x08, 12),
    (0x07, 6),
    (0x8000, 13),
    (0x7000, 7),
    (0x0800, 1),
    (0x0700, -5),
    (0x800000, 2),
    (0x700000, -4),
    (0x080000, -10),
    (0x070000, -16),
    (0x80000000, -1),
    (0x10000000, 1),
    (0x60000000, -3),
    (0x08000000, -13),
    (0x01000000, -11),
    (0x06000000, -15),
)


def _bit_destinations(mask_shifts: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """Destination bit of each of the 32 source bits; checks the result is a permutation."""
    destination = [-1] * 32
    for mask, shift in mask_shifts:
        for bit in range(32):
            if mask >> bit & 1:
                destination[bit] = bit + shift
    if sorted(destination) != list(range(32)):
        raise InternalError("SM90 fp4 bit map is not a permutation")
    return tuple(destination)


V2_BIT_PERMUTATION = _bit_destinations(_V2_MASK_SHIFTS)
"""``V2_BIT_PERMUTATION[i]`` is the destination bit of source bit ``i`` in each 32-bit word."""


def _nibble_table(destination: Sequence[int]) -> np.ndarray:
    """uint16 ``[65536]``: index bits ``4t + s`` (bit ``s`` of byte ``t``'s low nibble) -> destination bits.

    Valid because the permutation sends low-nibble bits to bits 0-15 and each high-nibble bit
    exactly 16 above its low-nibble twin (asserted), so the same table serves both nibble halves.
    """
    index = np.arange(1 << 16, dtype=np.uint32)
    table = np.zeros(1 << 16, dtype=np.uint32)
    for t in range(4):
        for s in range(4):
            low, high = destination[8 * t + s], destination[8 * t + 4 + s]
            if not (low < 16 and high == low + 16):
                raise InternalError("SM90 fp4 v2 bit map does not split into nibble halves")
            table |= ((index >> (4 * t + s)) & 1) << low
    return table.astype(np.uint16)


def _byte_tables(destination: Sequence[int]) -> np.ndarray:
    """uint32 ``[4, 256]``: ``[t][x]`` = the bits of byte value ``x`` at byte ``t`` of a word, permuted;
    a word's permutation is the OR of its four bytes' entries (the compiled kernel's form)."""
    values = np.arange(256, dtype=np.uint32)
    tables = np.zeros((4, 256), np.uint32)
    for t in range(4):
        for bit in range(8):
            tables[t] |= ((values >> bit) & 1) << destination[8 * t + bit]
    return tables


_FORWARD_TABLE = _nibble_table(V2_BIT_PERMUTATION)
_BYTE_TABLES = _byte_tables(V2_BIT_PERMUTATION)
_INVERSE_TABLE = np.argsort(_FORWARD_TABLE).astype(np.uint16)  # _FORWARD_TABLE is a permutation of 0..65535

_STEP_BYTES = 192 << 10  # source bytes per step: its scratch (about 7x this) stays in a 2 MiB L2
_LOW_NIBBLES, _HIGH_NIBBLES, _FOUR = np.uint32(0x0F0F0F0F), np.uint32(0xF0F0F0F0), np.uint32(4)
_LANE_ORDER = (1, 6, 0, 5, 2, 3, 4)  # rows [G, half, r0, p, mh, mq, h] -> planes [half, h, G, mq, r0, p, mh]


class _Scratch:
    """Reused buffers for steps of up to ``blocks`` 16-row blocks of ``partitions`` 32-byte partitions.

    ``planes`` uint32 ``[2, 2, lanes]`` (``[half or nibble half][h][lane]``), ``spare`` two more,
    ``index`` intp ``[lanes, 4, 2]`` (v2 table index per word ``j`` and nibble half; bytes 2-7 stay 0),
    ``words`` uint16 ``[lanes, 4, 2]`` (v2 inverse look-ups), ``staging`` uint8 ``[16 * blocks, 32 * partitions]``
    (source rows gathered and zero-padded, when the source is strided or smaller than the output).
    """

    def __init__(self, partitions: int, blocks: int):
        lanes = 32 * partitions * blocks
        self.partitions, self.blocks = partitions, blocks
        self.planes = np.empty((2, 2, lanes), np.uint32)
        self.spare = np.empty((2, 2, lanes), np.uint32)
        self.index = np.zeros((lanes, 4, 2), np.intp)
        self.words = np.empty((lanes, 4, 2), np.uint16)
        self.staging = np.zeros((16 * blocks, 32 * partitions), np.uint8)


_scratch = threading.local()


def _scratch_for(partitions: int) -> _Scratch:
    """This thread's scratch for rows of ``partitions`` partitions (one cached at a time)."""
    blocks = max(1, _STEP_BYTES // (512 * partitions))
    cached = getattr(_scratch, "value", None)
    if cached is None or (cached.partitions, cached.blocks) != (partitions, blocks):
        cached = _scratch.value = _Scratch(partitions, blocks)
    return cached


def _nibble_transpose(a: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """In place, bytewise: ``(a, b) <- (lo(a) | lo(b) << 4, hi(a) | hi(b) << 4)``; ``x, y`` are scratch."""
    np.left_shift(b, _FOUR, out=x)
    np.bitwise_xor(x, a, out=x)  # x = a ^ (b << 4)
    np.right_shift(x, _FOUR, out=y)
    np.bitwise_and(y, _LOW_NIBBLES, out=y)
    np.bitwise_xor(b, y, out=b)  # b = hi(a) | hi(b) << 4
    np.bitwise_and(x, _HIGH_NIBBLES, out=x)
    np.bitwise_xor(a, x, out=a)  # a = lo(a) | lo(b) << 4


def _block_view(rows: np.ndarray) -> np.ndarray:
    """uint8 ``[16 * count, 32 * P]`` (rows 4-byte aligned, any row stride) -> uint32 ``[count, half, r0, p, mh, mq, h]``."""
    return rows.view(np.uint32).reshape(-1, 2, 8, rows.shape[1] // 32, 2, 2, 2)


def _lanes_readable(source: np.ndarray) -> bool:
    """Whether :func:`_block_view` can view ``source``'s rows in place: whole partitions, 4-byte aligned rows."""
    return source.shape[1] % 32 == 0 and source.strides[1] == 1 and source.strides[0] % 4 == 0 and source.ctypes.data % 4 == 0


def _interleave_blocks(scratch: _Scratch, rows: np.ndarray, out: np.ndarray, layout: str, partitions: int) -> None:
    """One step forward: source blocks ``rows`` (:func:`_block_view`; partitions beyond its own are
    zero) -> ``out``, the uint16 output words of ``partitions``-partition rows."""
    count, given = rows.shape[0], rows.shape[3]
    lanes = 32 * partitions * count
    planes, spare = scratch.planes[:, :, :lanes], scratch.spare[:, :, :lanes]
    lane_view = planes.reshape(2, 2, count, 2, 8, partitions, 2)
    np.copyto(lane_view[:, :, :, :, :, :given], rows.transpose(_LANE_ORDER))
    lane_view[:, :, :, :, :, given:] = 0
    _nibble_transpose(planes[0], planes[1], spare[0], spare[1])
    plane_bytes = planes.view(np.uint8).reshape(2, 2, lanes, 4)  # [nib][h][lane][j]
    if layout == "v1":
        _copy_planes(plane_bytes, out.view(np.uint8).reshape(lanes, 4, 2, 2), to_planes=False)
        return
    index = scratch.index[:lanes]
    _copy_planes(plane_bytes, index.view(np.uint8).reshape(lanes, 4, 2, 8)[..., :2].swapaxes(2, 3), to_planes=False)
    np.take(_FORWARD_TABLE, index.reshape(-1), out=out, mode="clip")


def _deinterleave_blocks(scratch: _Scratch, words: np.ndarray, rows: np.ndarray, layout: str) -> None:
    """One step backwards: uint16 output words ``words`` -> source blocks ``rows`` (:func:`_block_view`)."""
    count, partitions = rows.shape[0], rows.shape[3]
    lanes = 32 * partitions * count
    planes, spare = scratch.planes[:, :, :lanes], scratch.spare[:, :, :lanes]
    plane_bytes = planes.view(np.uint8).reshape(2, 2, lanes, 4)
    if layout == "v1":
        _copy_planes(plane_bytes, words.view(np.uint8).reshape(lanes, 4, 2, 2), to_planes=True)
    else:
        index, looked_up = scratch.index[:lanes].reshape(-1), scratch.words[:lanes]
        np.copyto(index, words)
        np.take(_INVERSE_TABLE, index, out=looked_up.reshape(-1), mode="clip")
        _copy_planes(plane_bytes, looked_up.view(np.uint8).reshape(lanes, 4, 2, 2).swapaxes(2, 3), to_planes=True)
    _nibble_transpose(planes[0], planes[1], spare[0], spare[1])
    planes = planes.reshape(2, 2, count, 2, 8, partitions, 2)
    for half in range(2):  # one (half, h, mq) at a time, so that each copy runs along (p, mh) on both sides
        for h in range(2):
            for mq in range(2):
                np.copyto(rows[:, half, :, :, :, mq, h], planes[half, h, :, mq])


def _copy_planes(plane_bytes: np.ndarray, lane_bytes: np.ndarray, to_planes: bool) -> None:
    """Byte ``j`` of plane ``[nib][h]`` <-> ``lane_bytes[lane, j, h, nib]`` (one strided copy per plane)."""
    for nib in range(2):
        for h in range(2):
            if to_planes:
                np.copyto(plane_bytes[nib, h], lane_bytes[:, :, h, nib])
            else:
                np.copyto(lane_bytes[:, :, h, nib], plane_bytes[nib, h])


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise InvalidArgumentError(f"unknown SM90 fp4 layout {layout!r}; expected one of {LAYOUTS}")


def _check_shape(rows: int, row_bytes: int) -> None:
    if rows % 16 or row_bytes % 32:
        raise InvalidArgumentError(f"SM90 fp4 interleave needs n % 16 == 0 and k % 64 == 0, got n={rows}, k={2 * row_bytes}")


def _check_weight(weight: torch.Tensor) -> None:
    if weight.dtype != torch.uint8 or weight.dim() != 3:
        raise InvalidArgumentError(f"expected uint8 [E, n, k/2], got {weight.dtype} {list(weight.shape)}")


def interleave_fp4(weight: torch.Tensor, layout: str = "v2") -> torch.Tensor:
    """Row-major packed MXFP4 uint8 ``[E, n, k/2]`` (any strides) -> SM90 interleaved uint8 ``[E, n, k/2]``."""
    _check_weight(weight)
    return interleave_fp4_padded((weight,), (weight.shape[1], weight.shape[2]), layout)


def interleave_fp4_padded(parts: Sequence[torch.Tensor], part_shape: tuple[int, int], layout: str = "v2") -> torch.Tensor:
    """SM90 interleave of ``parts`` stacked along rows, each zero-padded at its ends to ``part_shape``.

    ``parts``: uint8 ``[E, r_i, c_i]`` tensors (any strides, e.g. the up and gate rows of a GPT-OSS
    W13), ``r_i <= rows`` and ``c_i <= row_bytes`` for ``part_shape = (rows, row_bytes)``. Returns uint8
    ``[E, len(parts) * rows, row_bytes]``, equal to ``interleave_fp4(torch.cat([pad_to(p, part_shape)
    for p in parts], 1), layout)``, without building that tensor: whole blocks of whole partitions
    are read in place (padding partitions are zero lanes), padding blocks are written as zeros (the
    interleave of zeros), and a block that is only partly source is gathered into a small buffer.
    """
    _check_layout(layout)
    rows, row_bytes = part_shape
    _check_shape(rows, row_bytes)
    if not parts:
        raise InvalidArgumentError("interleave_fp4_padded needs at least one part")
    for part in parts:
        _check_weight(part)
        if part.shape[0] != parts[0].shape[0] or part.shape[1] > rows or part.shape[2] > row_bytes:
            raise InvalidArgumentError(f"parts {[list(p.shape) for p in parts]} do not fit [E, {rows}, {row_bytes}] each")
    experts = parts[0].shape[0]
    out = np.empty((experts, len(parts) * rows, row_bytes), np.uint8)
    compiled = kernels()
    if compiled is not None:
        run_in_threads(
            [
                functools.partial(
                    compiled.interleave_fp4_part,
                    _rows_2d(part[e].numpy()),
                    out[e, index * rows : (index + 1) * rows].view(np.uint32),
                    _BYTE_TABLES,
                    layout == "v1",
                )
                for e in range(experts)
                for index, part in enumerate(parts)
            ]
        )
        return torch.from_numpy(out)

    def interleave_part(source: np.ndarray, target: np.ndarray) -> None:
        scratch = _scratch_for(row_bytes // 32)
        in_place = 16 * (source.shape[0] // 16) if _lanes_readable(source) else 0  # rows read in place
        for first in range(0, rows, 16 * scratch.blocks):
            stop = min(first + 16 * scratch.blocks, rows)
            if first >= source.shape[0]:
                target[first:stop] = 0
                continue
            block_rows = source[first:stop] if stop <= in_place else _stage_rows(scratch, source, first, stop)
            _interleave_blocks(scratch, _block_view(block_rows), target[first:stop].reshape(-1).view(np.uint16), layout, row_bytes // 32)

    run_in_threads(
        [
            functools.partial(interleave_part, part[e].numpy(), out[e, index * rows : (index + 1) * rows])
            for e in range(experts)
            for index, part in enumerate(parts)
        ]
    )
    return torch.from_numpy(out)


def _rows_2d(source: np.ndarray) -> np.ndarray:
    """``source`` uint8 ``[r, c]`` with unit column stride (copied if it has another)."""
    return source if source.strides[1] == 1 else np.ascontiguousarray(source)


def _stage_rows(scratch: _Scratch, source: np.ndarray, first: int, stop: int) -> np.ndarray:
    """Rows ``[first, stop)`` of ``source`` zero-padded to the scratch's row width, in ``scratch.staging``."""
    staging = scratch.staging[: stop - first]
    valid = max(0, min(stop, source.shape[0]) - first)
    np.copyto(staging[:valid, : source.shape[1]], source[first : first + valid])
    staging[:valid, source.shape[1] :] = 0
    staging[valid:] = 0
    return staging


def deinterleave_fp4(weight: torch.Tensor, layout: str = "v2") -> torch.Tensor:
    """Inverse of :func:`interleave_fp4`: SM90 interleaved -> row-major packed, uint8 ``[E, n, k/2]``."""
    _check_layout(layout)
    _check_weight(weight)
    experts, rows, row_bytes = weight.shape
    _check_shape(rows, row_bytes)
    source = weight.contiguous()
    if source.data_ptr() % 2:
        source = source.clone()
    words = source.numpy().reshape(experts, -1).view(np.uint16)
    out = np.empty((experts, rows, row_bytes), np.uint8)

    def deinterleave_expert(words: np.ndarray, target: np.ndarray) -> None:
        scratch = _scratch_for(row_bytes // 32)
        for first in range(0, rows, 16 * scratch.blocks):
            stop = min(first + 16 * scratch.blocks, rows)
            _deinterleave_blocks(scratch, words[first * row_bytes // 2 : stop * row_bytes // 2], _block_view(target[first:stop]), layout)

    run_in_threads([functools.partial(deinterleave_expert, words[e], out[e]) for e in range(experts)])
    return torch.from_numpy(out)
