"""The SM90 Humming preprocess (FP8 activations x MXFP4): moebake's CPU port against FlashInfer's own code.

* the ``"fp4_fp8"`` weight interleave against an index-arithmetic emulation of FlashInfer's CUDA
  kernel (``tests/kernel_emulation.py``; on a GPU, against the kernel itself: ``bin/gpu-harness oracle``);
* the E8M0 range clamp, the rewrite table and the payload rewrite against FlashInfer's private
  torch helpers, run on CPU (``tests/engine_oracles/humming_oracle.py``);
* the whole ``preprocess_moe_weights_for_sm90_mixed_gemm_humming`` against FlashInfer's, its CUDA
  interleave stood in by the emulation.
"""

import numpy as np
import pytest
import torch

from conftest import random_u8
from kernel_emulation import kernel_interleave_fp4_fp8
from moebake.layouts.sm90_fp4 import interleave_fp4
from moebake.layouts.sm90_humming import (
    SIGN_DESTINATION,
    deinterleave_fp4_fp8,
    humming_preprocess,
    humming_scales,
    interleave_fp4_fp8,
    rewrite_lut,
)

SHAPES = [(1, 16, 32), (2, 32, 64), (3, 48, 128), (1, 2064, 96), (1, 64, 2240), (2, 2944, 1472)]


def _emulated_interleave(weight, quant_type):
    assert quant_type == "fp4_fp8"
    return kernel_interleave_fp4_fp8(weight)


@pytest.fixture(scope="module")
def flashinfer():
    pytest.importorskip("flashinfer.fused_moe")
    from engine_oracles.humming_oracle import cpu_helpers

    helpers = cpu_helpers(_emulated_interleave)
    # exactly the CUDA-residency checks were switched off: one in each private helper, none in the entry point
    assert helpers.checks == {"scale": 1, "payload": 1, "preprocess": 0}
    return helpers


def _scales(experts, rows, groups, low, high, seed):
    return torch.randint(low, high + 1, (experts, rows, groups), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_interleave_equals_kernel_emulation(shape):
    weight = random_u8(*shape, seed=sum(shape))
    assert torch.equal(interleave_fp4_fp8(weight), kernel_interleave_fp4_fp8(weight))


@pytest.mark.parametrize("shape", SHAPES)
def test_deinterleave_inverts(shape):
    weight = random_u8(*shape, seed=3 + sum(shape))
    assert torch.equal(deinterleave_fp4_fp8(interleave_fp4_fp8(weight)), weight)
    assert torch.equal(interleave_fp4_fp8(deinterleave_fp4_fp8(weight)), weight)


def test_fp4_fp8_is_not_the_w4a16_interleave():
    weight = random_u8(2, 32, 64, seed=11)
    assert not torch.equal(interleave_fp4_fp8(weight), interleave_fp4(weight, "v2"))
    assert sorted(SIGN_DESTINATION) == list(range(8))


@pytest.mark.parametrize("shape", [(1, 8, 32), (1, 16, 16)])
def test_interleave_rejects_unaligned_shapes(shape):
    with pytest.raises(ValueError, match="n % 16 == 0 and k % 64 == 0"):
        interleave_fp4_fp8(random_u8(*shape))


@pytest.mark.oracle
def test_rewrite_lut_equals_flashinfer(flashinfer):
    assert torch.equal(torch.from_numpy(rewrite_lut()), flashinfer.lut())  # all 256 deltas x 16 codes


# (low, high) scale ranges: within 11 (no clamp), real checkpoints' spread, everything (deltas past 127)
@pytest.mark.oracle
@pytest.mark.parametrize("low, high", [(120, 126), (100, 140), (0, 255), (127, 127), (250, 255), (0, 3)])
def test_scale_clamp_equals_flashinfer(flashinfer, low, high):
    scales = _scales(4, 64, 12, low, high, seed=low + high)
    scales[1] = high  # an expert of one value
    offset, residual, delta = flashinfer.scale(scales)
    mine = humming_scales(scales.numpy())
    assert torch.equal(torch.from_numpy(mine[0]), offset)
    assert torch.equal(torch.from_numpy(mine[1]).view(torch.int32), residual.view(torch.int32))
    assert torch.equal(torch.from_numpy(mine[2]), delta)


@pytest.mark.oracle
@pytest.mark.parametrize("low, high", [(120, 126), (100, 140), (0, 255)])
def test_logical_preprocess_equals_flashinfer(flashinfer, low, high):
    """interleave=False: the rewritten payload, the offsets and the residuals, every code x every delta."""
    weight = random_u8(3, 64, 256, seed=high)
    scales = _scales(3, 64, 16, low, high, seed=low)
    expected = flashinfer.preprocess(weight, scales, interleave=False)
    actual = humming_preprocess(weight, scales, interleave=False)
    for mine, theirs in zip(actual, expected, strict=True):
        assert mine.dtype == theirs.dtype and torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8))
    if (low, high) == (0, 255):  # the rewrite met deltas from 0 to past 127, and changed codes
        delta = flashinfer.scale(scales)[2]
        assert int(delta.max()) > 128 and int(delta.min()) == 0
        assert not torch.equal(actual[0], weight)


@pytest.mark.oracle
@pytest.mark.parametrize("shape", [(2, 64, 64), (3, 192, 192), (1, 2944, 1536)])
def test_preprocess_equals_flashinfer(flashinfer, shape):
    """The whole preprocess (interleaved weight, folded offsets, residual), CUDA interleave emulated."""
    E, rows, row_bytes = shape
    weight = random_u8(*shape, seed=rows)
    scales = _scales(E, rows, row_bytes // 16, 110, 135, seed=row_bytes)
    expected = flashinfer.preprocess(weight, scales)
    actual = humming_preprocess(weight, scales)
    for mine, theirs in zip(actual, expected, strict=True):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype
        assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8))


def test_residual_is_a_power_of_two_from_the_kept_minimum():
    scales = np.array([[[120, 140]], [[127, 130]]], np.uint8)
    offset, residual, delta = humming_scales(scales)
    assert residual.tolist() == [2.0 ** (129 - 128), 2.0 ** (127 - 128)]  # 140 - 11 = 129; range 3 kept whole
    assert offset.tolist() == [[[1, 12]], [[1, 4]]] and delta.tolist() == [[[9, 0]], [[0, 0]]]
