"""GIL-free compiled kernels (numba) for the conversion's hot loops; numpy code stays the oracle.

Each kernel here writes exactly the bytes of a numpy/torch implementation elsewhere (tests compare
them on many shapes), and runs without the GIL, so threads share the cores:

  * :func:`interleave_fp4_part` -- :func:`moebake.layouts.sm90_fp4.interleave_fp4_padded` for one
    expert of one part (zero padding of rows and columns fused in);
  * :func:`fold_scales_part` -- :func:`moebake.layouts.sm90_scales.fold_scales_padded` (uint8, group
    32) for one expert of one part;
  * :func:`marlin_repack_part` -- :func:`moebake.layouts.marlin.repack_padded` (``gptq_marlin_repack``)
    for one expert of one part (zero padding of rows and columns fused in);
  * :func:`marlin_scales_part` -- :func:`moebake.layouts.marlin.permute_scales_padded` (1-byte scales) for
    one expert of one part (padding fills fused in);
  * :func:`humming_weight_expert` -- steps 2 and 3 of :func:`moebake.layouts.sm90_humming.humming_weight`
    (payload rewrite, then the ``fp4_fp8`` interleave) for one expert.

:func:`kernels` returns this module's kernels, or None when numba is not installed or the
environment variable :data:`DISABLE_ENV` is ``1`` (read at every call, so tests and benchmarks can
force the numpy path in one process). Compiled code is cached on disk (numba ``cache=True``: in
``$NUMBA_CACHE_DIR`` when set, else the ``__pycache__`` beside this file, else the user's cache
directory), and loaded at a kernel's first call for those argument types, or ahead of it by
:func:`load` (the fork server of ``--workers`` does, so that its workers share the machine code).
Where none of those locations is writable (a read-only install run by another user whose home is
not writable either), numba refuses ``cache=True`` outright; the kernels are then compiled in memory
for this process instead (the same machine code, so the same bytes; a second or two of compiling
per run), which :data:`IN_MEMORY` records and one ``-v`` line reports.
"""

import logging
import os
import types
from collections.abc import Callable
from typing import Any

DISABLE_ENV = "MOEBAKE_NO_COMPILED"
"""Set to ``1`` to run the numpy implementations instead of the compiled kernels."""

try:
    import numba
    import numpy as np
except ImportError:  # numba is a dependency, but a platform without its wheels still converts
    numba = None


def kernels() -> types.SimpleNamespace | None:
    """The compiled kernels, or None (numba missing, or ``MOEBAKE_NO_COMPILED=1``)."""
    if numba is None or os.environ.get(DISABLE_ENV) == "1":
        return None
    return _KERNELS


IN_MEMORY: str | None = None
"""Why the kernels are compiled in memory (numba found no writable cache location), or None: cached on disk."""


if numba is not None:

    def _jit(function: Callable[..., Any]):
        """``numba.njit`` (GIL-free, no bounds checks) with its on-disk cache, or without it where numba has no
        writable cache location (it raises ``RuntimeError: cannot cache function ...: no locator available``
        when the function is decorated): then this and every later kernel here compiles in memory."""
        global IN_MEMORY
        if IN_MEMORY is None:
            try:
                return numba.njit(nogil=True, cache=True, boundscheck=False)(function)
            except RuntimeError as err:
                if "no locator available" not in str(err):
                    raise
                IN_MEMORY = "no writable numba cache location (NUMBA_CACHE_DIR, the package's __pycache__, the user cache)"
                logging.getLogger(__name__).debug("compiled kernels: %s; compiling them in memory for this run", IN_MEMORY)
        return numba.njit(nogil=True, cache=False, boundscheck=False)(function)

    @_jit
    def _byte(source: np.ndarray, row: int, col: int):
        """``source[row, col]``, or 0 outside it (the padding)."""
        if row < source.shape[0] and col < source.shape[1]:
            return source[row, col]
        return np.uint8(0)

    @_jit
    def _v2_row_pair(
        a: np.ndarray,
        b: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        partitions: tuple[int, int],
        t0: np.ndarray,
        t1: np.ndarray,
        t2: np.ndarray,
        t3: np.ndarray,
    ):
        """v2 of source rows ``a = W[r]``, ``b = W[r + 8]`` (``r % 16 < 8``) into uint32 output rows
        ``low = D[r]``, ``high = D[r + 8]``: the permuted word of ``W[r][c], W[r+8][c], W[r][c+4],
        W[r+8][c+4]`` is ``t0[W[r][c]] | t1[W[r+8][c]] | t2[W[r][c+4]] | t3[W[r+8][c+4]]``. Partitions
        (32 source bytes) ``p`` in ``range(*partitions)``."""
        for p in range(*partitions):
            for half in range(2):  # mma // 2; mma % 2 picks the output row (low or high)
                for j in range(4):
                    c, w = 32 * p + 16 * half + j, 8 * p + 4 * half + j
                    low[w] = t0[a[c]] | t1[b[c]] | t2[a[c + 4]] | t3[b[c + 4]]
                    high[w] = t0[a[c + 8]] | t1[b[c + 8]] | t2[a[c + 12]] | t3[b[c + 12]]

    @_jit
    def _v1_row_pair(a: np.ndarray, b: np.ndarray, low: np.ndarray, high: np.ndarray, partitions: tuple[int, int]):
        """v1 of source rows ``a = W[r]``, ``b = W[r + 8]`` (``r % 16 < 8``) into uint8 output rows
        ``low = D[r]``, ``high = D[r + 8]``: ``A = a[32p + 16s + 8h + 4c + j]`` and ``B`` (same column of
        ``b``) go to row ``h`` (low/high), columns ``32p + 16s + 4j + 2c`` (``lo(A) | lo(B) << 4``) and ``+ 1``
        (``hi(A) | hi(B) << 4``). Partitions (32 source bytes) ``p`` in ``range(*partitions)``."""
        for p in range(*partitions):
            for s in range(2):
                for h in range(2):
                    out = high if h else low
                    for c in range(2):
                        for j in range(4):
                            col, out_col = 32 * p + 16 * s + 8 * h + 4 * c + j, 32 * p + 16 * s + 4 * j + 2 * c
                            x, y = a[col], b[col]
                            out[out_col] = (x & 0x0F) | (y << 4)
                            out[out_col + 1] = (x >> 4) | (y & 0xF0)

    @_jit
    def interleave_fp4_part(source: np.ndarray, target: np.ndarray, byte_tables: np.ndarray, v1: bool):
        """SM90 fp4 interleave of uint8 ``source [r, c]`` (unit column stride, any row stride),
        zero-padded to ``target``'s shape, into ``target``: the output bytes as C-contiguous uint32
        ``[rows, row_bytes / 4]`` (``rows % 16 == 0``, ``row_bytes % 32 == 0``).

        ``v1`` selects layout v1, else v2 (``byte_tables``: uint32 ``[4, 256]``, see :func:`_v2_row_pair`).
        Row blocks past the source are written as zeros (the interleave of zeros).
        """
        rows, given, partitions = source.shape[0], source.shape[1], target.shape[1] // 8
        whole = given // 32  # partitions read in place; one partial one (if any) from a zero-padded copy
        t0, t1, t2, t3 = byte_tables[0], byte_tables[1], byte_tables[2], byte_tables[3]
        zero_row = np.zeros(32 * partitions, np.uint8)  # rows past the source
        partial_a, partial_b = np.zeros(32 * partitions, np.uint8), np.zeros(32 * partitions, np.uint8)
        for block in range(target.shape[0] // 16):
            first = 16 * block
            if first >= rows:
                target[first : first + 16, :] = 0
                continue
            for r in range(first, first + 8):
                low, high = target[r], target[r + 8]
                a = source[r] if r < rows else zero_row[:given]
                b = source[r + 8] if r + 8 < rows else zero_row[:given]
                _interleave_row_pair(a, b, low, high, (0, whole), v1, t0, t1, t2, t3)
                if given % 32:
                    for col in range(32 * whole, given):
                        partial_a[col], partial_b[col] = a[col], b[col]
                    _interleave_row_pair(partial_a, partial_b, low, high, (whole, whole + 1), v1, t0, t1, t2, t3)
                padding = whole + (given % 32 > 0)
                low[8 * padding :] = 0  # padding partitions: the interleave of zeros
                high[8 * padding :] = 0

    @_jit
    def _interleave_row_pair(
        a: np.ndarray,
        b: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        partitions: tuple[int, int],
        v1: bool,
        t0: np.ndarray,
        t1: np.ndarray,
        t2: np.ndarray,
        t3: np.ndarray,
    ):
        if v1:
            _v1_row_pair(a, b, low.view(np.uint8), high.view(np.uint8), partitions)
        else:
            _v2_row_pair(a, b, low, high, partitions, t0, t1, t2, t3)

    @_jit
    def fold_scales_part(source: np.ndarray, target: np.ndarray, first_row: int, rows: int):
        """SM90 scale fold (uint8 E8M0, group 32) of rows ``[first_row, first_row + rows)`` of a stacked scale
        matrix whose rows ``first_row + r`` are ``source [r, :]`` zero-padded (``r`` past the source too).

        ``target``: uint8 ``[R, Kb, 16, 16]`` for the whole stack (``64 R`` rows, ``4 Kb`` groups);
        ``target[R, Kb, f, 4m + g] = stack[64R + 16m + f, 4Kb + g]``.
        """
        for r in range(rows):
            row = first_row + r
            big, m, f = row // 64, (row % 64) // 16, row % 16
            for kb in range(target.shape[1]):
                for g in range(4):
                    target[big, kb, f, 4 * m + g] = _byte(source, r, 4 * kb + g)

    @_jit
    def _marlin_nibbles(v: np.uint64):
        """8 source bytes as a little-endian word ``v`` (``X_d`` = byte ``d``, ``Y_d`` = byte ``4 + d``, ``d`` in
        ``[0, 4)``: the ``b0 = 0, 1`` halves of 16 ``k``) -> (lo, hi): byte ``d`` of lo is ``lo(X_d) | lo(Y_d) << 4``
        (``a = 0``), of hi ``hi(X_d) | hi(Y_d) << 4`` (``a = 1``)."""
        lo = (v & np.uint64(0x0F0F0F0F)) | ((v >> np.uint64(28)) & np.uint64(0xF0F0F0F0))
        hi = ((v >> np.uint64(4)) & np.uint64(0x0F0F0F0F)) | ((v >> np.uint64(32)) & np.uint64(0xF0F0F0F0))
        return np.uint32(lo), np.uint32(hi)

    @_jit
    def marlin_repack_part(source: np.ndarray, target: np.ndarray):
        """Marlin repack (``gptq_marlin_repack``, 4 bits) of ``source``, uint64 ``[r, c]`` (8 bytes of one row
        each, unit column stride, any row stride), zero-padded to ``[N, K/16]``, into uint32 ``target [K/16, 2N]``
        (unit column stride, any row stride: one part's column range of a stacked output). Element ``(n, k)``,
        ``k = 16kt + 8b0 + 2d + a``, ``n = 64g + 16j + 8b1 + c``, goes to ``target[kt]``, word
        ``128g + 16c + 4d + j``, byte ``2a + b1``, high nibble when ``b0`` (see :mod:`moebake.layouts.marlin`):
        per row pair ``b1 = 0, 1`` and ``kt``, the nibble step on each row's 8 bytes ``source[n, kt]``, then a
        4x4 byte transpose into the 4 words ``d``. Row pairs outer, ``kt`` inner: two source rows read in order."""
        rows, given = source.shape[0], source.shape[1]
        tiles_k, groups = target.shape[0], target.shape[1] // 128
        zero_row = np.zeros(given, np.uint64)  # rows past the source
        m8, m16 = np.uint32(0x00FF00FF), np.uint32(0xFFFF)
        for g in range(groups):
            if 64 * g >= rows:
                target[:, 128 * g :] = 0
                break
            for j in range(4):
                for c in range(8):
                    n, o = 64 * g + 16 * j + c, 128 * g + 16 * c + j
                    first = source[n] if n < rows else zero_row  # b1 = 0
                    second = source[n + 8] if n + 8 < rows else zero_row  # b1 = 1
                    for kt in range(given):
                        lo0, hi0 = _marlin_nibbles(first[kt])
                        lo1, hi1 = _marlin_nibbles(second[kt])
                        # bytes d of (lo0, lo1, hi0, hi1) -> word d, bytes 2a + b1 = 0, 1, 2, 3
                        p, q = (lo0 & m8) | ((lo1 & m8) << 8), ((lo0 >> 8) & m8) | (lo1 & ~m8)
                        s, t = (hi0 & m8) | ((hi1 & m8) << 8), ((hi0 >> 8) & m8) | (hi1 & ~m8)
                        target[kt, o] = (p & m16) | (s << 16)
                        target[kt, o + 4] = (q & m16) | (t << 16)
                        target[kt, o + 8] = (p >> 16) | (s & ~m16)
                        target[kt, o + 12] = (q >> 16) | (t & ~m16)
                    for kt in range(given, tiles_k):  # padding columns
                        for d in range(4):
                            target[kt, o + 4 * d] = 0

    @_jit
    def marlin_scales_part(source: np.ndarray, target: np.ndarray, row_fill: int, column_fill: int):
        """Marlin scale order of uint8 ``source [r, c]`` (any strides) padded to ``[N, G]`` (columns past ``c`` of
        its rows with ``column_fill`` first, then rows past ``r`` with ``row_fill``), into uint8 ``target [G, N]``
        (unit column stride, any row stride): ``target[kg, m] = padded[n, kg]`` where, in each run of 64,
        ``m = 8i + 4j1 + 2t1 + t0`` takes ``n = 32j1 + 16t0 + 8t1 + i`` (see :mod:`moebake.layouts.marlin`)."""
        rows, given = source.shape[0], source.shape[1]
        source_row = np.empty(64, np.int64)
        for r in range(64):
            source_row[r] = 32 * ((r >> 2) & 1) + 16 * (r & 1) + 8 * ((r >> 1) & 1) + (r >> 3)
        for kg in range(target.shape[0]):
            out = target[kg]
            for m in range(target.shape[1]):
                n = (m & ~63) + source_row[m & 63]
                if n >= rows:
                    out[m] = row_fill
                elif kg >= given:
                    out[m] = column_fill
                else:
                    out[m] = source[n, kg]

    @_jit
    def _humming_signs(x: np.uint32):
        """Nibble ``i``'s sign bit of ``x`` to nibble ``2i + 1`` (``i < 4``) or ``2(i - 4)`` (``SIGN_DESTINATION``)."""
        m = np.uint32
        return (
            (x & m(0x77777777))
            | ((x & m(0x8)) << m(4))
            | ((x & m(0x80)) << m(8))
            | ((x & m(0x800)) << m(12))
            | ((x & m(0x8000)) << m(16))
            | ((x & m(0x80000)) >> m(16))
            | ((x & m(0x800000)) >> m(12))
            | ((x & m(0x8000000)) >> m(8))
            | ((x & m(0x80000000)) >> m(4))
        )

    @_jit
    def humming_weight_expert(source: np.ndarray, delta: np.ndarray, byte_lut: np.ndarray, target: np.ndarray):
        """Humming payload rewrite and ``fp4_fp8`` interleave of one expert (see :mod:`moebake.layouts.sm90_humming`):
        uint8 ``source [n, k/2]`` (unit column stride), its scale deltas uint8 ``[n, k/32]``, ``byte_lut`` uint8
        ``[65536]`` (``delta << 8 | byte`` -> the byte rewritten) into uint32 ``target [n, k/8]``. Uint16 column
        ``c = 16p + 8mma + 4q + l`` of rows ``16G + r0`` and ``16G + 8 + r0``, rewritten, make the word
        ``x = lo | hi << 16``, stored with its signs moved (:func:`_humming_signs`) at row ``16G + 8q + r0``, word
        ``8p + 4mma + l``. One 16-byte scale group (``p, mma``) of a row pair at a time."""
        rows, row_bytes = source.shape[0], source.shape[1]
        for first in range(0, rows, 16):
            for r0 in range(8):
                low, high = first + r0, first + 8 + r0
                source_low, source_high = source[low], source[high]
                for group in range(row_bytes // 16):  # p = group // 2, mma = group % 2
                    lut_low = byte_lut[np.int64(delta[low, group]) << 8 :]
                    lut_high = byte_lut[np.int64(delta[high, group]) << 8 :]
                    for q in range(2):
                        out = target[first + 8 * q + r0]
                        for lane in range(4):
                            b = 16 * group + 8 * q + 2 * lane  # the uint16's first byte
                            x = (
                                np.uint32(lut_low[source_low[b]])
                                | (np.uint32(lut_low[source_low[b + 1]]) << 8)
                                | (np.uint32(lut_high[source_high[b]]) << 16)
                                | (np.uint32(lut_high[source_high[b + 1]]) << 24)
                            )
                            out[4 * group + lane] = _humming_signs(x)

    _KERNELS = types.SimpleNamespace(
        interleave_fp4_part=interleave_fp4_part,
        fold_scales_part=fold_scales_part,
        marlin_repack_part=marlin_repack_part,
        marlin_scales_part=marlin_scales_part,
        humming_weight_expert=humming_weight_expert,
    )

    _bytes, _words = numba.types.Array(numba.uint8, 2, "C"), numba.types.Array(numba.uint32, 2, "C")
    _longs, _any_longs = numba.types.Array(numba.uint64, 2, "C"), numba.types.Array(numba.uint64, 2, "A")  # A: any row stride
    _any_bytes, _any_words = numba.types.Array(numba.uint8, 2, "A"), numba.types.Array(numba.uint32, 2, "A")
    _SIGNATURES: dict[Any, list[tuple[Any, ...]]] = {
        interleave_fp4_part: [(_bytes, _words, _words, numba.boolean), (_any_bytes, _words, _words, numba.boolean)],
        fold_scales_part: [(_bytes, numba.types.Array(numba.uint8, 4, "C"), numba.int64, numba.int64)],
        marlin_repack_part: [(source, target) for source in (_longs, _any_longs) for target in (_words, _any_words)],
        marlin_scales_part: [
            (source, target, numba.uint8, numba.uint8) for source in (_bytes, _any_bytes) for target in (_bytes, _any_bytes)
        ],
        humming_weight_expert: [(_bytes, _bytes, numba.types.Array(numba.uint8, 1, "C"), _words)],
    }
    """The argument types conversions pass the kernels (a source part's rows contiguous, or strided; a Marlin target
    part the whole output row, or a column range of it); others load at first call."""


def load() -> None:
    """Load the kernels for every argument type in :data:`_SIGNATURES` now (from numba's cache on disk,
    else compiled), instead of at their first call; processes forked afterwards share their machine
    code. A no-op where :func:`kernels` is None."""
    if kernels() is None:
        return
    for kernel, signatures in _SIGNATURES.items():
        for signature in signatures:
            kernel.compile(signature)
