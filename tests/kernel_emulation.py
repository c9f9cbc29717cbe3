"""Independent oracles: FlashInfer's SM90 interleave CUDA kernels re-expressed as index arithmetic.

Written from the kernels' thread/index math (moe_gemm_mixed_utils.cu, see
shared/reference/flashinfer-layouts.md §1.3 and §1.6), one thread per (block, partition, lane),
vectorised with index grids. Deliberately unlike moebake's implementation (no reshapes/permutes,
no lookup tables): a bug in one is unlikely to be repeated in the other.
"""

import torch

# (mask, shift) pairs of interleave_fp4_weights_for_sm90_mixed_gemm_kernel; negative = right shift.
KERNEL_MASK_SHIFTS = [
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
]


def _grid(*sizes):
    return torch.meshgrid(*[torch.arange(s) for s in sizes], indexing="ij")


def kernel_interleave_v2(weight: torch.Tensor) -> torch.Tensor:
    """uint8 [E, n, k/2] -> what FlashInfer >= 0.6.18's fp4 interleave kernel writes."""
    E, rows, row_bytes = weight.shape
    out = torch.full_like(weight, 0xAA)
    block_id, partition_id, lane_id = _grid(rows // 2, row_bytes // 32, 16)
    row_id = block_id // 8 * 16 + block_id % 8
    mma_id = lane_id // 4
    dst_row = row_id + (mma_id % 2) * 8
    col = partition_id * 32 + mma_id * 8 + lane_id % 4
    dst_col = partition_id * 32 + lane_id // 8 * 16 + (lane_id % 4) * 4
    for e in range(E):
        w = weight[e].to(torch.int64)
        raw = w[row_id, col] | (w[row_id + 8, col] << 8) | (w[row_id, col + 4] << 16) | (w[row_id + 8, col + 4] << 24)
        mixed = torch.zeros_like(raw)
        for mask, shift in KERNEL_MASK_SHIFTS:
            mixed |= (raw & mask) << shift if shift >= 0 else (raw & mask) >> -shift
        for t in range(4):
            out[e, dst_row, dst_col + t] = ((mixed >> (8 * t)) & 0xFF).to(torch.uint8)
    return out


def kernel_interleave_v1(weight: torch.Tensor) -> torch.Tensor:
    """uint8 [E, n, k/2] -> what FlashInfer 0.6.10-0.6.17's (legacy) fp4 interleave kernel writes."""
    E, rows, row_bytes = weight.shape
    out = torch.full_like(weight, 0xAA)
    group, r0, partition, lane = _grid(rows // 16, 8, row_bytes // 32, 32)
    a, b, c, j = lane // 16, (lane // 8) % 2, (lane // 4) % 2, lane % 4
    row_a = 16 * group + r0
    col = 32 * partition + lane
    dst_row = 16 * group + 8 * b + r0
    dst_col = 32 * partition + 16 * a + 4 * j + 2 * c
    for e in range(E):
        A, B = weight[e][row_a, col], weight[e][row_a + 8, col]
        out[e, dst_row, dst_col] = (A & 0x0F) | ((B & 0x0F) << 4)
        out[e, dst_row, dst_col + 1] = (A >> 4) | ((B >> 4) << 4)
    return out


def block_scale_interleave_cpu(scales: torch.Tensor) -> torch.Tensor:
    """FlashInfer's CUDA-only ``block_scale_interleave`` (``nvfp4_block_scale_interleave``; uint8 scales
    ``[rows, K/32]`` -> the flat 128x4-swizzled bytes), by FlashInfer's own CPU helper of the same layout,
    ``_swizzle_cutile_fp4_scales`` (FlashInfer >= 0.7.1; the GPU test ``test_block_scale_swizzle_gpu.py`` checks the
    CUDA kernel against moebake's swizzle). Where the importable FlashInfer is older (an engine release's pin, whose
    CUDA kernel is the same), the 128x4 swizzle's index math, written out here: rows in 128-row tiles of 4 x 32,
    K groups in fours, ``out[t, kq, r32, r4, k4] = s[128 t + 32 r4 + r32, 4 kq + k4]``, zero-padded."""
    try:
        from flashinfer.fused_moe.prepare import _swizzle_cutile_fp4_scales
    except ImportError:
        rows, groups = scales.shape
        padded = scales.new_zeros((-(-rows // 128) * 128, -(-groups // 4) * 4), dtype=torch.uint8)
        padded[:rows, :groups] = scales.view(torch.uint8)
        tiles = padded.reshape(padded.shape[0] // 128, 4, 32, padded.shape[1] // 4, 4)
        return tiles.permute(0, 3, 2, 1, 4).contiguous().reshape(-1)
    return _swizzle_cutile_fp4_scales(scales.view(torch.uint8)[None], scale_block_size=32).reshape(-1)


def gptq_marlin_repack_reference(
    b_q_weight: torch.Tensor, perm: torch.Tensor, size_k: int, size_n: int, num_bits: int, **_
) -> torch.Tensor:
    """Stand-in for the CUDA op ``gptq_marlin_repack`` as the engines call it for MXFP4 (no act-order ``perm``,
    4 bits): int32 ``[K/8, N]`` (8 consecutive ``k`` per word) -> int32 ``[K/16, 2N]``, by vLLM's pure-Python
    reference of Marlin packing (``marlin_utils_test.marlin_weights`` with ``get_weight_perm(4)``), not by moebake."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils_test import get_weight_perm, marlin_weights

    assert perm.numel() == 0 and num_bits == 4 and tuple(b_q_weight.shape) == (size_k // 8, size_n), b_q_weight.shape
    shifts = torch.arange(8, dtype=torch.int32) * 4
    values = ((b_q_weight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF).reshape(size_k, size_n)  # row 8w + i: nibble i
    return marlin_weights(values, size_k, size_n, 4, get_weight_perm(4))


# preprocess_fp4x8_signs_for_fp8: (mask, shift) of each sign bit; the exponent/mantissa bits 0x77777777 stay.
KERNEL_FP8_SIGN_SHIFTS = [
    (0x00000008, 4),
    (0x00000080, 8),
    (0x00000800, 12),
    (0x00008000, 16),
    (0x00080000, -16),
    (0x00800000, -12),
    (0x08000000, -8),
    (0x80000000, -4),
]


def kernel_interleave_fp4_fp8(weight: torch.Tensor) -> torch.Tensor:
    """uint8 [E, n, k/2] -> what interleave_fp4_fp8_weights_for_sm90_mixed_gemm_kernel (quant type 2) writes.

    The kernel reads the rows as uint16 (``cols / 4`` per row, ``cols = k``), one thread per
    (block_id < n/2, partition_id < k/64, lane_id < 16).
    """
    E, rows, row_bytes = weight.shape
    out = torch.full((E, rows, row_bytes // 2), 0x5555, dtype=torch.int32)
    block_id, partition_id, lane_id = _grid(rows // 2, row_bytes // 32, 16)
    row_id = block_id // 8 * 16 + block_id % 8
    dst_row = row_id + (lane_id % 8) // 4 * 8
    interleaved_lane = lane_id // 8 * 8 + lane_id % 4 * 2
    col = partition_id * 16 + lane_id
    dst_col = partition_id * 16 + interleaved_lane
    for e in range(E):
        w = weight[e].to(torch.int64)
        u16 = w[:, 0::2] | (w[:, 1::2] << 8)  # little-endian uint16 view
        fp4x8 = u16[row_id, col] | (u16[row_id + 8, col] << 16)
        mixed = fp4x8 & 0x77777777
        for mask, shift in KERNEL_FP8_SIGN_SHIFTS:
            mixed |= (fp4x8 & mask) << shift if shift >= 0 else (fp4x8 & mask) >> -shift
        out[e, dst_row, dst_col] = (mixed & 0xFFFF).to(torch.int32)
        out[e, dst_row, dst_col + 1] = (mixed >> 16).to(torch.int32)
    lo, hi = (out & 0xFF).to(torch.uint8), (out >> 8).to(torch.uint8)
    return torch.stack([lo, hi], -1).reshape(E, rows, row_bytes)


def flashinfer_layout_here() -> str:
    """The SM90 fp4 layout of the FlashInfer importable here (a release's pin in a release-matrix run)."""
    import flashinfer

    from moebake.schema.flashinfer_versions import layout_for_flashinfer

    return layout_for_flashinfer(flashinfer.__version__)


def kernel_interleave_here(weight: torch.Tensor) -> torch.Tensor:
    """The CUDA weight interleave of the FlashInfer importable here, emulated (:func:`flashinfer_layout_here`)."""
    return {"v1": kernel_interleave_v1, "v2": kernel_interleave_v2}[flashinfer_layout_here()](weight)
