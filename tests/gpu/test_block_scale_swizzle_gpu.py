"""128x4 swizzle vs FlashInfer's CUDA ``block_scale_interleave`` (the op SGLang calls at load time)."""

import pytest
import torch

from moebake.layouts.block_scale_swizzle import swizzle_128x4
from tests.conftest import random_u8

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("shape", [(1, 128, 4), (2, 100, 7), (3, 256, 90), (4, 5760, 90)])
def test_matches_block_scale_interleave(shape):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    flashinfer = pytest.importorskip("flashinfer")
    sf = random_u8(*shape, seed=3)
    expected = flashinfer.block_scale_interleave(sf.cuda()).cpu().reshape(shape[0], -1)
    assert torch.equal(swizzle_128x4(sf), expected)
