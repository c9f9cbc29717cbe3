"""SM90 fp4 weight interleave and scale fold: oracles and inverses."""

import pytest
import torch

from conftest import random_u8
from kernel_emulation import kernel_interleave_v1, kernel_interleave_v2
from moebake.layouts.sm90_fp4 import V2_BIT_PERMUTATION, deinterleave_fp4, interleave_fp4
from moebake.layouts.sm90_scales import fold_scales, unfold_scales

SHAPES = [(1, 16, 32), (2, 32, 64), (3, 48, 128), (1, 2064, 96), (1, 64, 2240), (2, 2944, 1472)]
KERNELS = {"v2": kernel_interleave_v2, "v1": kernel_interleave_v1}


@pytest.mark.parametrize("layout", ["v2", "v1"])
@pytest.mark.parametrize("shape", SHAPES)
def test_interleave_equals_kernel_emulation(shape, layout):
    weight = random_u8(*shape, seed=sum(shape))
    expected = KERNELS[layout](weight)
    assert torch.equal(interleave_fp4(weight, layout), expected)


@pytest.mark.parametrize("layout", ["v2", "v1"])
@pytest.mark.parametrize("shape", SHAPES)
def test_deinterleave_inverts(shape, layout):
    weight = random_u8(*shape, seed=1 + sum(shape))
    assert torch.equal(deinterleave_fp4(interleave_fp4(weight, layout), layout), weight)
    assert torch.equal(interleave_fp4(deinterleave_fp4(weight, layout), layout), weight)


def test_layouts_differ_and_move_every_byte_class():
    weight = random_u8(2, 32, 64, seed=7)
    assert not torch.equal(interleave_fp4(weight, "v1"), interleave_fp4(weight, "v2"))
    assert not torch.equal(interleave_fp4(weight, "v2"), weight)


def test_bit_permutation_is_a_permutation():
    assert sorted(V2_BIT_PERMUTATION) == list(range(32))


@pytest.mark.parametrize("shape", [(1, 8, 32), (1, 16, 16), (1, 16, 48)])
def test_interleave_rejects_unaligned_shapes(shape):
    with pytest.raises(ValueError, match="n % 16 == 0 and k % 64 == 0"):
        interleave_fp4(random_u8(*shape))


def test_interleave_rejects_unknown_layout_and_dtype():
    with pytest.raises(ValueError, match="unknown SM90 fp4 layout"):
        interleave_fp4(random_u8(1, 16, 32), "v3")
    with pytest.raises(ValueError, match="uint8"):
        interleave_fp4(torch.zeros(1, 16, 32, dtype=torch.int8))


@pytest.mark.oracle
@pytest.mark.parametrize("shape", [(1, 64, 4), (3, 192, 92), (2, 5888, 92), (2, 2944, 92)])
def test_fold_scales_equals_flashinfer(shape):
    prepare = pytest.importorskip("flashinfer.fused_moe")
    scales = random_u8(*shape, seed=shape[1])
    expected = prepare.interleave_moe_scales_for_sm90_mixed_gemm(scales, group_size=32)
    folded = fold_scales(scales)
    assert folded.shape == expected.shape and torch.equal(folded, expected)
    assert torch.equal(unfold_scales(folded), scales)


@pytest.mark.oracle
def test_fold_scales_bf16_group128_equals_flashinfer():
    prepare = pytest.importorskip("flashinfer.fused_moe")
    scales = torch.randn(2, 128, 8).to(torch.bfloat16)
    expected = prepare.interleave_moe_scales_for_sm90_mixed_gemm(scales, group_size=128)
    assert torch.equal(fold_scales(scales, 128).view(torch.int16), expected.view(torch.int16))
    assert torch.equal(unfold_scales(fold_scales(scales, 128), 128).view(torch.int16), scales.view(torch.int16))


def test_fold_scales_rejects_unaligned():
    with pytest.raises(ValueError, match="rows % 64 == 0 and K % 128 == 0"):
        fold_scales(random_u8(1, 96, 4))
    with pytest.raises(ValueError, match="rows % 64 == 0 and K % 128 == 0"):
        fold_scales(random_u8(1, 64, 6))
