"""128x4 block-scale swizzle: inverse, an emulation of TensorRT-LLM's computeSFIndex, FlashInfer's CPU port."""

import pytest
import torch

from moebake.layouts.block_scale_swizzle import swizzle_128x4, unswizzle_128x4
from tests.conftest import random_u8

# (E, R, C): aligned, both dims unaligned, a single partial tile, several row and column tiles.
SHAPES = [(1, 128, 4), (2, 100, 7), (3, 200, 9), (1, 1, 1), (2, 384, 16), (1, 256, 90)]


def compute_sf_index(r: int, c: int, cols: int) -> int:
    """TensorRT-LLM ``computeSFIndex`` (fp4Op.cpp), 128x4 layout, one expert, written out per element."""
    padded_cols = (cols + 3) // 4 * 4
    inner_col, col_tile = c % 4, c // 4
    inner_row, row_group, row_tile = r % 32, (r % 128) // 32, r // 128
    return inner_col + col_tile * 512 + inner_row * 16 + row_group * 4 + row_tile * 128 * padded_cols


def emulate_block_scale_interleave(sf: torch.Tensor) -> torch.Tensor:
    """Scatter every element to its computeSFIndex offset in a zeroed per-expert buffer."""
    E, R, C = sf.shape
    padded = ((R + 127) // 128 * 128) * ((C + 3) // 4 * 4)
    out = torch.zeros(E, padded, dtype=sf.dtype)
    for r in range(R):
        for c in range(C):
            out[:, compute_sf_index(r, c, C)] = sf[:, r, c]
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_compute_sf_index_emulation(shape):
    sf = random_u8(*shape, seed=sum(shape))
    assert torch.equal(swizzle_128x4(sf), emulate_block_scale_interleave(sf))


@pytest.mark.parametrize("shape", SHAPES)
def test_inverse(shape):
    sf = random_u8(*shape, seed=1)
    assert torch.equal(unswizzle_128x4(swizzle_128x4(sf), shape[1], shape[2]), sf)


def test_padding_is_zero_and_dtype_kept():
    sf = torch.full((2, 100, 7), 0x7F, dtype=torch.uint8)
    flat = swizzle_128x4(sf)
    assert flat.shape == (2, 128 * 8) and flat.dtype == torch.uint8
    assert int((flat == 0x7F).sum()) == 2 * 100 * 7 and int((flat == 0).sum()) == 2 * (128 * 8 - 700)
    bf16 = torch.randn(1, 130, 5).to(torch.bfloat16)
    assert torch.equal(unswizzle_128x4(swizzle_128x4(bf16), 130, 5), bf16)


def test_rejects_wrong_shapes():
    with pytest.raises(ValueError):
        swizzle_128x4(random_u8(128, 4))
    with pytest.raises(ValueError):
        unswizzle_128x4(random_u8(1, 512), 128, 8)


@pytest.mark.oracle
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_flashinfer_cpu_swizzle(shape):
    prepare = pytest.importorskip("flashinfer.fused_moe.prepare")
    if not hasattr(prepare, "_swizzle_cutile_fp4_scales"):
        pytest.skip("this FlashInfer has no _swizzle_cutile_fp4_scales (added in 0.7.x)")
    sf = random_u8(*shape, seed=7)
    expected = prepare._swizzle_cutile_fp4_scales(sf, scale_block_size=32).reshape(shape[0], -1)
    assert torch.equal(swizzle_128x4(sf), expected)
