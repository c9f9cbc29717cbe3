"""Marlin's weight repack, scale and bias orders (``moebake.layouts.marlin``) against independent references.

The weight repack is compared with vLLM 0.33.0's pure-Python reference of Marlin packing in its test
utilities (``marlin_utils_test.marlin_weights`` with ``get_weight_perm(4)``: unpacked values ``[K, N]``
permuted into 16x64 tiles and packed 8 per int32), which vLLM's own tests hold ``gptq_marlin_repack``
to; the scale and bias orders with vLLM's ``marlin_permute_scales`` + ``mxfp4_marlin_process_scales``
and ``marlin_permute_bias``. Random data, several shapes; each inverse exactly undoes its transform.
"""

import pytest
import torch

from conftest import random_u8
from moebake.errors import InvalidArgumentError
from moebake.layouts import marlin

vllm_oracle = pytest.importorskip("engine_oracles.vllm_oracle")
if not vllm_oracle.vllm_installed():
    pytest.skip(f"vllm {vllm_oracle.VLLM_VERSION} is not installed (bin/setup installs it)", allow_module_level=True)

SHAPES = [(64, 16), (64, 64), (128, 32), (192, 96), (256, 256), (320, 2880)]  # (N, K)


def _reference_repack(w: torch.Tensor) -> torch.Tensor:
    """vLLM's reference: one expert's uint8 ``[N, K/2]`` unpacked to values ``[K, N]``, then ``marlin_weights``."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils_test import get_weight_perm, marlin_weights

    n, k = w.shape[0], w.shape[1] * 2
    values = torch.stack([w & 0x0F, w >> 4], -1).reshape(n, k).T.contiguous().to(torch.int32)
    return marlin_weights(values, k, n, 4, get_weight_perm(4))


@pytest.mark.parametrize("n, k", SHAPES)
def test_repack_equals_vllms_python_reference(n, k):
    w = random_u8(3, n, k // 2, seed=n + k)
    mine = marlin.repack(w)
    assert (mine.dtype, tuple(mine.shape)) == (torch.int32, (3, k // 16, 2 * n))
    for e in range(3):
        assert torch.equal(mine[e], _reference_repack(w[e])), e
    assert torch.equal(marlin.unrepack(mine), w)


def test_repack_takes_int8_weights_and_refuses_untiled_shapes():
    w = random_u8(1, 64, 32)
    assert torch.equal(marlin.repack(w.view(torch.int8)), marlin.repack(w))
    for shape in ((1, 32, 32), (1, 64, 4)):
        with pytest.raises(InvalidArgumentError):
            marlin.repack(random_u8(*shape))
    with pytest.raises(InvalidArgumentError):  # K = 32: a single scale group, another order
        marlin.permute_scales(random_u8(1, 64, 1))


@pytest.mark.parametrize("n, k", [s for s in SHAPES if s[1] >= 64])
def test_scale_order_equals_vllms_marlin_scale_steps(n, k):
    """vLLM's steps on one expert: E8M0 bytes -> BF16 values, ``.T``, ``marlin_permute_scales`` (group 32),
    ``mxfp4_marlin_process_scales`` for BF16 activations (back to E8M0)."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_scales
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import mxfp4_marlin_process_scales

    s = random_u8(2, n, k // 32, seed=k)
    mine = marlin.permute_scales(s)
    for e in range(2):
        values = s[e].T.contiguous().view(torch.float8_e8m0fnu).to(torch.bfloat16)
        ref = mxfp4_marlin_process_scales(marlin_permute_scales(values, k, n, 32), input_dtype=torch.bfloat16)
        assert torch.equal(mine[e], ref.view(torch.uint8)), e
    assert torch.equal(marlin.unpermute_scales(mine), s)


def test_e8m0_bytes_survive_the_engines_bf16_round_trip():
    """The engines turn E8M0 scale bytes into BF16 values and back: every byte comes back (so the order is all)."""
    every = torch.arange(256, dtype=torch.uint8)
    back = every.view(torch.float8_e8m0fnu).to(torch.bfloat16).to(torch.float8_e8m0fnu).view(torch.uint8)
    assert torch.equal(back, every)


@pytest.mark.parametrize("n", [32, 64, 2944])
def test_bias_order_equals_vllms_marlin_permute_bias(n):
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_permute_bias

    b = torch.randn(2, n, generator=torch.Generator().manual_seed(n)).bfloat16()
    mine = marlin.permute_bias(b)
    for e in range(2):
        assert torch.equal(mine[e], marlin_permute_bias(b[e])), e
    assert torch.equal(marlin.unpermute_bias(mine), b)
