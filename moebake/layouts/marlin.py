"""Marlin's 4-bit weight tiling and its scale and bias orders (MXFP4 experts, ``gptq_marlin_repack``).

What SGLang's and vLLM's Marlin MXFP4 MoE preparation does to one expert, as byte permutations on CPU:

**Weights** (:func:`repack`, :func:`unrepack`). Input: uint8 ``[e, N, K/2]``, ``N`` output rows of
``K`` packed E2M1 elements (low nibble = even element), ``N % 64 == 0``, ``K % 16 == 0``. The engines
hand ``w.view(int32).T`` (``[K/8, N]``, 8 nibbles of consecutive ``k`` per word) to the CUDA op
``gptq_marlin_repack(..., size_k=K, size_n=N, num_bits=4)`` with an empty ``perm``; its output is int32
``[K/16, 2N]``, returned here as ``[e, K/16, 2N]`` int32. Element ``(n, k)`` with

  ``k = 16*kt + 8*b0 + 2*d + a``  (``b0, a in {0, 1}``, ``d in [0, 4)``),
  ``n = 64*g + 16*j + 8*b1 + c``  (``j in [0, 4)``, ``b1 in {0, 1}``, ``c in [0, 8)``)

goes to row ``kt``, int32 word ``128*g + 16*c + 4*d + j`` of that row, nibble ``4*a + 2*b1 + b0``
(little-endian, so byte ``2*a + b1`` of the word, high nibble when ``b0``). This is the 16x64 Marlin
tile of ``marlin_permute_weights`` / ``get_weight_perm(4)`` (vLLM's Python reference, which the tests
compare against) written as an 8-axis transpose: a source byte holds the ``a = 0, 1`` pair of one ``k``
pair, an output byte the ``b0 = 0, 1`` pair, so the step is a nibble transpose of the byte pairs
``(b0 = 0, b0 = 1)`` (``lo(X) | lo(Y) << 4``, ``hi(X) | hi(Y) << 4``; its own inverse) and one
byte transpose. Memory: about three copies of the chunk.
:func:`repack_padded` repacks parts stacked along ``N`` (the W13 halves), each zero-padded, without building
the padded stack: each 64-row group fills its own 512 bytes of every output row, so a part whose padded
row count is a multiple of 64 is a column range of the output. It runs a compiled kernel
(:func:`moebake.layouts.compiled.kernels`; same bytes, GIL-free, experts and parts shared out between
threads) when one is available; the numpy steps of :func:`repack` are its oracle and the fallback.

**Block scales** (:func:`permute_scales`, :func:`unpermute_scales`): E8M0 bytes ``[e, N, K/32]`` ->
``[e, K/32, N]`` (``N % 64 == 0``, ``K >= 64``): transposed (``s.T``), then ``marlin_permute_scales`` (group size 32
< K: each run of 64 scales along ``N`` is an 8x8 transpose) and the 16-bit-activation step of
``mxfp4_marlin_process_scales`` (in each run of 4, the middle two swapped). Column
``64*G + 32*j1 + 16*t0 + 8*t1 + i`` goes to ``64*G + 8*i + 4*j1 + 2*t1 + t0``. The engines convert the
bytes to BF16 values and back to E8M0 on the way: exact for all 256 bytes (checked in the tests).
:func:`permute_scales_padded` does the same to padded parts stacked along ``N`` without building the
stack (compiled kernel when available, these torch steps otherwise).

**Biases** (:func:`permute_bias`, :func:`unpermute_bias`): ``[e, N]`` (``N % 32 == 0``),
``marlin_permute_bias``: in each run of 32, index ``8*m1 + 2*i + m0`` goes to ``8*i + 2*m1 + m0``.
"""

import functools
from collections.abc import Sequence

import numpy as np
import torch

from moebake.errors import InvalidArgumentError
from moebake.layouts.compiled import kernels
from moebake.layouts.gate_up import pad_to
from moebake.layouts.parallel import run_in_threads

TILE_N, TILE_K = 64, 16


def _check(shape: tuple[int, ...], n: int, k2: int) -> None:
    if n % TILE_N or (2 * k2) % TILE_K:
        raise InvalidArgumentError(f"Marlin repack needs N % {TILE_N} == 0 and K % {TILE_K} == 0, got shape {list(shape)}")


def _nibble_transpose(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bytes ``(X, Y)`` -> ``(lo(X) | lo(Y) << 4, hi(X) | hi(Y) << 4)``; its own inverse."""
    return (x & 0x0F) | (y << 4), (x >> 4) | (y & 0xF0)


def repack(w: torch.Tensor) -> torch.Tensor:
    """uint8 ``[e, N, K/2]`` (any 1-byte dtype) -> int32 ``[e, K/16, 2N]``, ``gptq_marlin_repack``'s bytes per expert."""
    return repack_padded((w,), (w.shape[1], w.shape[2]))


def repack_padded(parts: Sequence[torch.Tensor], part_shape: tuple[int, int]) -> torch.Tensor:
    """:func:`repack` of ``parts`` (``[e, r_i, c_i]``, any 1-byte dtype, any strides) stacked along rows,
    each zero-padded at its ends to ``part_shape = (rows, row_bytes)`` (``rows % 64 == 0``): equal to
    ``repack(torch.cat([pad_to(p, part_shape) for p in parts], 1))``, the padded stack never built
    when the compiled kernel runs."""
    rows, k2 = part_shape
    _check((len(parts) * rows, k2), rows, k2)
    for part in parts:
        if part.element_size() != 1 or part.dim() != 3 or part.shape[0] != parts[0].shape[0] or part.shape[1] > rows or part.shape[2] > k2:
            raise InvalidArgumentError(f"parts {[list(p.shape) for p in parts]} do not fit [e, {rows}, {k2}] bytes each")
    compiled = kernels()
    if compiled is None:
        return _repack_numpy(torch.cat([pad_to(p, part_shape) for p in parts], 1))
    e = parts[0].shape[0]
    out = np.empty((e, k2 // 8, 2 * len(parts) * rows), np.uint32)
    run_in_threads(
        [
            functools.partial(
                compiled.marlin_repack_part,
                _words8(part[x].view(torch.uint8).numpy()),
                out[x, :, 2 * rows * index : 2 * rows * (index + 1)],
            )
            for x in range(e)
            for index, part in enumerate(parts)
        ]
    )
    return torch.from_numpy(out.view(np.int32))


def _words8(source: np.ndarray) -> np.ndarray:
    """uint8 ``[r, c]`` -> uint64 ``[r, ceil(c / 8)]`` (8 bytes of a row each, little-endian): a view where the rows
    allow one, else a copy zero-padded to whole words (what the repack pads them with anyway)."""
    if (
        source.strides[1] == 1
        and source.shape[1] % 8 == 0
        and source.strides[0] % 8 == 0
        and source.ctypes.data % 8 == 0
        and source.shape[0] > 0
    ):
        return source.view(np.uint64)
    words = np.zeros((source.shape[0], -(-source.shape[1] // 8)), np.uint64)
    words.view(np.uint8)[:, : source.shape[1]] = source
    return words


def _repack_numpy(w: torch.Tensor) -> torch.Tensor:
    e, n, k2 = w.shape
    _check(tuple(w.shape), n, k2)
    src = w.contiguous().view(torch.uint8).numpy().reshape(e, n // 64, 4, 2, 8, k2 // 8, 2, 4)  # e g j b1 c kt b0 d
    lo, hi = _nibble_transpose(src[..., 0, :], src[..., 1, :])  # e g j b1 c kt d (a = 0, 1)
    out = np.empty((e, k2 // 8, n // 64, 8, 4, 4, 2, 2), np.uint8)  # e kt g c d j a b1
    for a, half in enumerate((lo, hi)):
        out[..., a, :] = half.transpose(0, 5, 1, 4, 6, 2, 3)
    return torch.from_numpy(out.reshape(e, k2 // 8, 8 * n)).view(torch.int32)


def unrepack(q: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`repack`: int32 ``[e, K/16, 2N]`` -> uint8 ``[e, N, K/2]``."""
    e, kt, n2 = q.shape
    n, k2 = n2 // 2, kt * 8
    _check(tuple(q.shape), n, k2)
    out_bytes = q.contiguous().view(torch.uint8).numpy().reshape(e, kt, n // 64, 8, 4, 4, 2, 2)  # e kt g c d j a b1
    x, y = _nibble_transpose(out_bytes[..., 0, :], out_bytes[..., 1, :])  # e kt g c d j b1 (b0 = 0, 1)
    src = np.empty((e, n // 64, 4, 2, 8, kt, 2, 4), np.uint8)  # e g j b1 c kt b0 d
    for b0, half in enumerate((x, y)):
        src[..., b0, :] = half.transpose(0, 2, 5, 6, 3, 1, 4)
    return torch.from_numpy(src.reshape(e, n, k2))


def permute_scales(s: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes ``[e, N, K/32]`` -> ``[e, K/32, N]`` in Marlin's order (same dtype)."""
    e, n, groups = s.shape
    if n % 64 or groups < 2:  # one group (K = 32) takes marlin_permute_scales' other ("single") order
        raise InvalidArgumentError(f"Marlin scales need N % 64 == 0 and K >= 64, got shape {list(s.shape)}")
    t = s.transpose(1, 2).reshape(e, groups, n // 64, 2, 2, 2, 8)  # e kg G j1 t0 t1 i
    return t.permute(0, 1, 2, 6, 3, 5, 4).reshape(e, groups, n).contiguous()


def permute_scales_padded(parts: Sequence[torch.Tensor], part_shape: tuple[int, int], row_fill: int, column_fill: int) -> torch.Tensor:
    """:func:`permute_scales` of 1-byte ``parts`` (``[e, r_i, c_i]``, any strides) stacked along rows, each padded to
    ``part_shape = (rows, groups)`` (``rows % 64 == 0``): columns past ``c_i`` with ``column_fill`` first, then rows past
    ``r_i`` with ``row_fill`` (``pad_to`` twice, in that order; fills are bytes). Returns ``[e, groups, len(parts) * rows]``, ``parts``'
    dtype; the padded stack is never built when the compiled kernel runs."""
    rows, groups = part_shape
    for part in parts:
        if (
            part.element_size() != 1
            or part.dim() != 3
            or part.shape[0] != parts[0].shape[0]
            or part.shape[1] > rows
            or part.shape[2] > groups
            or part.dtype != parts[0].dtype
        ):
            raise InvalidArgumentError(f"parts {[list(p.shape) for p in parts]} do not fit [e, {rows}, {groups}] each")
    compiled = kernels()
    if compiled is None or rows % 64 or groups < 2:
        padded = [pad_to(pad_to(p.view(torch.uint8), (p.shape[1], groups), column_fill), part_shape, row_fill) for p in parts]
        return permute_scales(torch.cat(padded, 1)).view(parts[0].dtype)
    e = parts[0].shape[0]
    out = np.empty((e, groups, len(parts) * rows), np.uint8)
    run_in_threads(
        [
            functools.partial(
                compiled.marlin_scales_part,
                part[x].view(torch.uint8).numpy(),
                out[x, :, rows * index : rows * (index + 1)],
                np.uint8(row_fill),
                np.uint8(column_fill),
            )
            for x in range(e)
            for index, part in enumerate(parts)
        ]
    )
    return torch.from_numpy(out).view(parts[0].dtype)


def unpermute_scales(s: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`permute_scales`: ``[e, K/32, N]`` -> ``[e, N, K/32]``."""
    e, groups, n = s.shape
    t = s.reshape(e, groups, n // 64, 8, 2, 2, 2)  # e kg G i j1 t1 t0
    return t.permute(0, 1, 2, 4, 6, 5, 3).reshape(e, groups, n).transpose(1, 2).contiguous()


def permute_bias(b: torch.Tensor) -> torch.Tensor:
    """``[e, N]`` -> ``[e, N]`` in Marlin's bias order (``N % 32 == 0``)."""
    e, n = b.shape
    return b.reshape(e, n // 32, 4, 4, 2).transpose(2, 3).reshape(e, n).contiguous()


def unpermute_bias(b: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`permute_bias` (the swap is its own inverse)."""
    return permute_bias(b)
