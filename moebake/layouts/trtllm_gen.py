"""Row order of FlashInfer's trtllm-gen MoE weights (SM100 ``trtllm_fp4_block_scale_moe``).

trtllm-gen's GEMMs take their ``A`` operand (the weight, ``[M, K]`` per expert) with rows
shuffled inside blocks of 32 (``epilogue_tile_m`` a multiple of 128; 16 otherwise), FlashInfer's
``shuffle_matrix_a`` / ``get_shuffle_matrix_a_row_indices``: within each block, output row ``k``
is input row ``4 * (k % 8) + k // 8`` for blocks of 32 (``2 * (k % 8) + k // 8`` for 16) -- the
block's rows seen as an ``8 x 4`` (``8 x 2``) matrix, transposed. ``shuffle_matrix_sf_a`` moves
the rows of the linear block scales the same way before its 128x4 swizzle
(:mod:`moebake.layouts.block_scale_swizzle`).

For the gated W13 GEMM the rows are first put in ``(up_i, gate_i)`` pairs
(``reorder_rows_for_gated_act_gemm`` of ``[up; gate]``, i.e. :func:`moebake.layouts.gate_up.merge_pairs`
of the halves), then shuffled.

Tensors here are ``[E, M, ...]``: the permutation acts on dim 1 (rows) of every expert; trailing
dims (bytes of a row, or none for a bias ``[E, M]``) move with their row.
"""

import torch

from moebake.errors import InvalidArgumentError

EPILOGUE_TILE_M = 128  # what SGLang and FlashInfer's own preparation pass for trtllm-gen FP4 MoE


def shuffle_block(epilogue_tile_m: int) -> int:
    """Rows per shuffle block: 32 when ``epilogue_tile_m % 128 == 0``, else 16."""
    return 32 if epilogue_tile_m % 128 == 0 else 16


def _row_blocks(x: torch.Tensor, epilogue_tile_m: int) -> tuple[int, int, int]:
    """``(E, M / block, block)``; ValueError unless ``x`` is ``[E, M, ...]`` with ``M % block == 0``."""
    block = shuffle_block(epilogue_tile_m)
    if x.dim() < 2 or x.shape[1] % block:
        raise InvalidArgumentError(f"row shuffle needs [E, M, ...] with M % {block} == 0, got shape {list(x.shape)}")
    return x.shape[0], x.shape[1] // block, block


def shuffle_rows(x: torch.Tensor, epilogue_tile_m: int = EPILOGUE_TILE_M) -> torch.Tensor:
    """``shuffle_matrix_a`` on every expert: ``[E, M, ...]`` -> same shape, rows shuffled per block."""
    E, blocks, block = _row_blocks(x, epilogue_tile_m)
    return x.reshape(E, blocks, 8, block // 8, *x.shape[2:]).transpose(2, 3).reshape(x.shape)


def unshuffle_rows(x: torch.Tensor, epilogue_tile_m: int = EPILOGUE_TILE_M) -> torch.Tensor:
    """Inverse of :func:`shuffle_rows`."""
    E, blocks, block = _row_blocks(x, epilogue_tile_m)
    return x.reshape(E, blocks, block // 8, 8, *x.shape[2:]).transpose(2, 3).reshape(x.shape)
