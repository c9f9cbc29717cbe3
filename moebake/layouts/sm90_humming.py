"""FlashInfer's SM90 Humming preprocess (MXFP4 weights x FP8 activations), on CPU.

Equals ``flashinfer.fused_moe.preprocess_moe_weights_for_sm90_mixed_gemm_humming(weight, scale)``
(FlashInfer 0.7.2, ``max_range=11``), which SGLang 0.5.23 runs at load time under
``--flashinfer-mxfp4-moe-precision fp8``. For one weight matrix of an expert, uint8 ``[n, k/2]``
(packed E2M1, low nibble = even element) with E8M0 scales uint8 ``[n, k/32]``:

1. *Range clamp* (:func:`humming_scales`), over all of the expert's scales (padding included):
   ``hi = max(s)``, ``lo = hi - min(hi - min(s), 11)``; ``clamped = max(s, lo)``,
   ``delta = clamped - s`` (per 32-element group), ``offset = (clamped - lo + 1) & 15`` (1..12, the
   pre-MMA FP4->E4M3 exponent offset) and ``residual = float32(2^(lo - 127)) / 2`` (one per expert).
2. *Payload rewrite* (:func:`rewrite_payload`): every FP4 code ``c`` of a group becomes
   ``LUT[delta][c]`` (:func:`rewrite_lut`): code 8 (-0) becomes 0, and for ``delta > 0`` the value is
   multiplied by ``2^-delta`` and rounded back to E2M1 (ties away from zero), as Humming's
   ``process_mxfp4_w4a8`` does. With ``delta = 0`` (every group whose scale was within range) only
   -0 changes.
3. *Weight interleave* (:func:`interleave_fp4_fp8`), FlashInfer's ``"fp4_fp8"`` quant type (2), a
   different permutation from the W4A16 ``"fp4"`` one of :mod:`moebake.layouts.sm90_fp4`: with
   ``W`` the rows as uint16 (4 codes each), ``row = 16G + 8*half + r0`` and uint16 column
   ``16p + 8*mma + 4*q + l`` (``q in {0, 1}``, ``l in [0, 4)``), the 32-bit word
   ``x = W[16G + r0][c] | W[16G + 8 + r0][c] << 16`` has its eight sign bits rotated among its
   nibbles (nibble ``i``'s sign goes to nibble ``2i + 1`` for ``i < 4`` and ``2(i - 4)``
   otherwise: :data:`SIGN_DESTINATION`), and is stored little-endian at row ``16G + 8q + r0``,
   uint16 columns ``16p + 8*mma + 2l``, ``+1``. Needs ``n % 16 == 0`` and ``k % 64 == 0``.
4. *Scale fold*: the offsets through :func:`moebake.layouts.sm90_scales.fold_scales` (the same fold
   as the W4A16 scales).

Steps 1-2 lose information (scales below ``hi - 11`` and the values of their groups, the sign of
zero), so there is no exact inverse of the whole; step 3 alone is a bit permutation
(:func:`deinterleave_fp4_fp8` inverts it). Experts are independent, so every step runs one expert
(or a few) at a time; the numpy work is vectorised and experts are shared out between threads. Steps 2-3
of the forward weight run as one compiled kernel when available (:mod:`moebake.layouts.compiled`), numpy its oracle.
"""

import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from moebake.errors import InvalidArgumentError
from moebake.layouts.compiled import kernels
from moebake.layouts.parallel import run_in_threads
from moebake.layouts.sm90_scales import fold_scales

MAX_RANGE = 11
"""The E8M0 exponent range FlashInfer keeps per expert for FP8 activations (its default, and SGLang's)."""

RESIDUAL_COMPENSATION = 64.0
"""SGLang stores ``residual * 64`` (Humming's fixed ``2^6`` FP4->FP8 exponent-bias compensation)."""

# Sign bit of nibble i (bit 4i + 3) -> bit 4 * SIGN_DESTINATION[i] + 3 of the word.
SIGN_DESTINATION = (1, 3, 5, 7, 0, 2, 4, 6)
_EXPONENT_MANTISSA = np.uint32(0x77777777)


def _sign_shifts(destination: Sequence[int]) -> tuple[tuple[np.uint32, int], ...]:
    return tuple((np.uint32(1 << (4 * i + 3)), 4 * (destination[i] - i)) for i in range(8))


_FORWARD_SIGNS = _sign_shifts(SIGN_DESTINATION)
_INVERSE_SIGNS = _sign_shifts(tuple(int(i) for i in np.argsort(SIGN_DESTINATION)))


def _move_signs(words: np.ndarray, shifts: Sequence[tuple[np.uint32, int]]) -> np.ndarray:
    """uint32 words with their nibbles' sign bits moved as ``shifts`` say (a new array)."""
    out = words & _EXPONENT_MANTISSA
    for mask, shift in shifts:
        moved = words & mask
        out |= (moved << np.uint32(shift)) if shift >= 0 else (moved >> np.uint32(-shift))
    return out


def _check_weight(weight: torch.Tensor) -> tuple[int, int, int]:
    if weight.dtype != torch.uint8 or weight.dim() != 3:
        raise InvalidArgumentError(f"expected uint8 [E, n, k/2], got {weight.dtype} {list(weight.shape)}")
    experts, rows, row_bytes = weight.shape
    if rows % 16 or row_bytes % 32:
        raise InvalidArgumentError(f"SM90 fp4_fp8 interleave needs n % 16 == 0 and k % 64 == 0, got n={rows}, k={2 * row_bytes}")
    return experts, rows, row_bytes


def _interleave_expert(source: np.ndarray, target: np.ndarray) -> None:
    """One expert, uint8 ``[n, k/2]`` -> ``target`` uint8 ``[n, k/2]`` (module docstring, step 3)."""
    rows, row_bytes = source.shape
    halves = source.view(np.uint16).reshape(rows // 16, 2, 8, row_bytes // 32, 2, 2, 4)  # [G, half, r0, p, mma, q, l]
    words = halves[:, 0].astype(np.uint32)
    words |= halves[:, 1].astype(np.uint32) << np.uint32(16)
    moved = _move_signs(words, _FORWARD_SIGNS)  # [G, r0, p, mma, q, l]
    out = target.view(np.uint32).reshape(rows // 16, 2, 8, row_bytes // 32, 2, 4)  # [G, q, r0, p, mma, l]
    np.copyto(out, moved.transpose(0, 4, 1, 2, 3, 5))


def _deinterleave_expert(source: np.ndarray, target: np.ndarray) -> None:
    rows, row_bytes = source.shape
    words = source.view(np.uint32).reshape(rows // 16, 2, 8, row_bytes // 32, 2, 4).transpose(0, 2, 3, 4, 1, 5)
    words = _move_signs(np.ascontiguousarray(words), _INVERSE_SIGNS)  # [G, r0, p, mma, q, l]
    halves = target.view(np.uint16).reshape(rows // 16, 2, 8, row_bytes // 32, 2, 2, 4)
    np.copyto(halves[:, 0], words.astype(np.uint16))
    np.copyto(halves[:, 1], (words >> np.uint32(16)).astype(np.uint16))


def _per_expert(function: Callable[[np.ndarray, np.ndarray], None], weight: torch.Tensor) -> torch.Tensor:
    experts, rows, row_bytes = _check_weight(weight)
    source = weight.contiguous()
    if source.data_ptr() % 4:
        source = source.clone()
    array = source.numpy()
    out = np.empty((experts, rows, row_bytes), np.uint8)
    run_in_threads([functools.partial(function, array[e], out[e]) for e in range(experts)])
    return torch.from_numpy(out)


def interleave_fp4_fp8(weight: torch.Tensor) -> torch.Tensor:
    """``interleave_moe_weights_for_sm90_mixed_gemm(weight, "fp4_fp8")``: uint8 ``[E, n, k/2]`` -> the same shape."""
    return _per_expert(_interleave_expert, weight)


def deinterleave_fp4_fp8(weight: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`interleave_fp4_fp8` (exact)."""
    return _per_expert(_deinterleave_expert, weight)


def _as_float(bits: np.ndarray) -> np.ndarray:
    """Integer float32 bit patterns -> their values as float64."""
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


@functools.cache
def rewrite_lut() -> np.ndarray:
    """uint8 ``[256, 16]``: ``[delta][code]`` is the E2M1 code Humming's payload rewrite stores for ``code``
    in a group whose scale was raised by ``delta``.

    Computed as Humming's CPU table is, in bit patterns: a code's value is the float32 whose bits are
    ``sign << 31 | (code & 7) << 22`` (the E2M1 value times 2^-126), multiplied in double precision by
    the float32 of bits ``0x3F800000 - (delta << 23)`` (mod 2^32: 2^-delta for delta < 128), rounded
    to float32, and rounded to the nearest E2M1 code (sign and bits 22-24), ties to the larger
    magnitude; ``delta = 0`` only maps -0 to 0.
    """
    delta = np.arange(256, dtype=np.int64)[:, None]
    code = np.arange(16, dtype=np.int64)[None, :]
    normalized = np.where(code == 8, 0, code)
    value_bits = ((normalized & 8) << 28) | ((normalized & 7) << 22)
    value = _as_float(value_bits)
    factor = _as_float((0x3F800000 - (delta << 23)) & 0xFFFFFFFF)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = value * factor
        bits = scaled.astype(np.float32).view(np.uint32).astype(np.int64)
        mask = 0x81C00000
        toward_zero = bits & mask
        away = (bits + 0x00200000) & mask
        rounded = np.where(np.abs(scaled - _as_float(toward_zero)) >= np.abs(scaled - _as_float(away)), away, toward_zero)
    quantized = ((rounded & 0x80000000) >> 28) | ((rounded & 0x01C00000) >> 22)
    return np.where(delta == 0, normalized, quantized).astype(np.uint8)


@functools.cache
def _byte_lut() -> np.ndarray:
    """uint8 ``[256 * 256]``: index ``delta << 8 | byte`` -> the byte with both its codes rewritten."""
    lut = rewrite_lut().astype(np.uint16)
    byte = np.arange(256)
    return (lut[:, byte & 15] | lut[:, byte >> 4] << 4).astype(np.uint8).reshape(-1)


def humming_scales(scales: np.ndarray, max_range: int = MAX_RANGE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 1 for experts ``scales`` uint8 ``[e, n, k/32]``: ``(offset uint8 [e, n, k/32],
    residual float32 [e], delta uint8 [e, n, k/32])``."""
    if scales.dtype != np.uint8 or scales.ndim != 3:
        raise InvalidArgumentError(f"expected uint8 E8M0 scales [E, n, k/32], got {scales.dtype} {list(scales.shape)}")
    if not 0 <= max_range <= 11:
        raise InvalidArgumentError(f"max_range must be in [0, 11]; got {max_range}")
    flat = scales.reshape(scales.shape[0], -1)
    high, low = flat.max(axis=1, keepdims=True), flat.min(axis=1, keepdims=True)
    low_kept = high - np.minimum(high - low, np.uint8(max_range))
    clamped = np.maximum(flat, low_kept)
    delta = clamped - flat
    offset = (clamped - low_kept + np.uint8(1)) & np.uint8(0x0F)
    with np.errstate(over="ignore"):  # E8M0 255 (NaN) kept as the minimum: 2^128 is inf in float32, as FlashInfer's
        residual = np.ldexp(np.float32(1.0), low_kept[:, 0].astype(np.int32) - 127).astype(np.float32) * np.float32(0.5)
    return offset.reshape(scales.shape), residual, delta.reshape(scales.shape)


REWRITE_ROWS = 64
"""Rows rewritten at a time by :func:`rewrite_payload` (its temporaries: ten bytes per weight byte of a block)."""


def rewrite_payload(weight: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Step 2: packed codes uint8 ``[e, n, k/2]`` rewritten by their groups' ``delta`` uint8 ``[e, n, k/32]``."""
    if weight.shape[:2] != delta.shape[:2] or weight.shape[2] != 16 * delta.shape[2]:
        raise InvalidArgumentError(f"weight {list(weight.shape)} and scale deltas {list(delta.shape)} do not match")
    lut, out = _byte_lut(), np.empty(weight.shape, np.uint8)
    groups = weight.reshape(weight.shape[:2] + (delta.shape[2], 16))
    target = out.reshape(groups.shape)
    for first in range(0, weight.shape[1], REWRITE_ROWS):  # rows in blocks: np.take makes an intp copy of its index
        rows = slice(first, first + REWRITE_ROWS)
        index = np.empty(groups[:, rows].shape, np.uint16)
        np.left_shift(delta[:, rows, :, None].astype(np.uint16), np.uint16(8), out=index)
        index |= groups[:, rows]
        np.take(lut, index, out=target[:, rows])
    return out


def _check_pair(weight: torch.Tensor, scales: torch.Tensor) -> None:
    experts, rows, row_bytes = _check_weight(weight)
    if scales.dtype != torch.uint8 or tuple(scales.shape) != (experts, rows, 2 * row_bytes // 32):
        raise InvalidArgumentError(f"scales {scales.dtype} {list(scales.shape)} do not fit weight {list(weight.shape)}")


def humming_weight(weight: torch.Tensor, scales: torch.Tensor, max_range: int = MAX_RANGE, interleave: bool = True) -> torch.Tensor:
    """Steps 1-3 for the weight: uint8 ``[E, n, k/2]`` rewritten by its scales' clamp (uint8 ``[E, n, k/32]``,
    padding included) and, with ``interleave``, in the ``"fp4_fp8"`` layout. One expert per thread task; steps 2-3
    in one compiled kernel when one is available (:func:`moebake.layouts.compiled.kernels`; same bytes, the numpy
    steps its oracle and fallback)."""
    _check_pair(weight, scales)
    weight_np, scales_np = weight.contiguous().numpy(), scales.contiguous().numpy()
    out = np.empty(weight_np.shape, np.uint8)
    compiled = kernels() if interleave else None

    def one(e: int) -> None:
        delta = humming_scales(scales_np[e : e + 1], max_range)[2]
        if compiled is not None:
            compiled.humming_weight_expert(weight_np[e], delta[0], _byte_lut(), out[e].view(np.uint32))
            return
        rewritten = rewrite_payload(weight_np[e : e + 1], delta)[0]
        if interleave:
            _interleave_expert(rewritten, out[e])
        else:
            out[e] = rewritten

    run_in_threads([functools.partial(one, e) for e in range(weight_np.shape[0])])
    return torch.from_numpy(out)


def humming_scale_outputs(scales: torch.Tensor, max_range: int = MAX_RANGE, fold: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1 and 4 for the scales uint8 ``[E, n, k/32]``: ``(offsets, folded with ``fold``; residual float32 [E])``."""
    offset, residual, _ = humming_scales(scales.contiguous().numpy(), max_range)
    offset_t = torch.from_numpy(offset)
    return (fold_scales(offset_t) if fold else offset_t), torch.from_numpy(residual)


def humming_preprocess(
    weight: torch.Tensor, scales: torch.Tensor, max_range: int = MAX_RANGE, interleave: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``preprocess_moe_weights_for_sm90_mixed_gemm_humming(weight, scales, max_range, interleave=...)`` on CPU:
    ``(weight_out, scale_out, residual)`` (module docstring); ``residual`` is FlashInfer's, before SGLang's x64.

    ``weight`` uint8 ``[E, n, k/2]``, ``scales`` uint8 ``[E, n, k/32]``; both whole (padding included:
    the range is taken over every scale of an expert).
    """
    return (humming_weight(weight, scales, max_range, interleave), *humming_scale_outputs(scales, max_range, interleave))
