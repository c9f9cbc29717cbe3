"""The Triton kernels of moebake.serve.masked_activation against their torch definitions, on a CUDA GPU.

1. ``silu_and_mul_masked`` equals torch's ``silu(gate.float()) * up.float()`` rounded to BF16 on
   every valid row (identical but for rare one-ulp differences of the exponential), whatever the
   padding rows hold, including an expert whose offsets pass 2^31 elements.
2. ``zero_rows_past`` zeroes exactly the rows at or past masked_m, leaves the others' bits alone,
   also on a cropped (strided) view.

Skipped without CUDA or Triton. Run by ``bin/gpu-harness``.
"""

import pytest
import torch

from moebake.serve.masked_activation import silu_and_mul, triton_kernels

pytestmark = pytest.mark.gpu
BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def kernels():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    module = triton_kernels()
    if module is None:
        pytest.skip("Triton is not installed")
    return module


def assert_same_up_to_exp_rounding(got, expected):
    """Equal within one BF16 ulp everywhere, and bit-identical for all but a tiny fraction."""
    torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=1e-6)
    assert (got != expected).float().mean() < 1e-3


@pytest.mark.parametrize("E, M, I", [(64, 256, 1024), (3, 100, 200)])
def test_silu_and_mul_masked_matches_torch_on_valid_rows(kernels, E, M, I):
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = (torch.randn(E, M, 2 * I, generator=g, device="cuda") * 3).to(BF16)
    masked_m = torch.randint(0, M + 1, (E,), generator=g, device="cuda", dtype=torch.int32)
    masked_m[0], masked_m[-1] = 0, M
    expected = silu_and_mul(gate_up)
    rows = torch.arange(M, device="cuda")[None, :, None]
    gate_up = gate_up.masked_fill(rows >= masked_m[:, None, None], float("nan"))  # DeepEP's garbage
    got = kernels.silu_and_mul_masked(gate_up, masked_m)
    for e in range(E):
        m = int(masked_m[e])
        if m:  # an expert without tokens has nothing to compare
            assert_same_up_to_exp_rounding(got[e, :m], expected[e, :m])


def test_silu_and_mul_masked_offsets_past_2_31_elements(kernels):
    E, M, I = 4, 131072, 2048  # gate_up has 2^31 elements; expert 3 starts at 3 * 2^29
    gate_up = torch.empty(E, M, 2 * I, dtype=BF16, device="cuda")
    tail = torch.randn(64, 2 * I, device="cuda").to(BF16)
    gate_up[3, -64:] = tail
    masked_m = torch.tensor([0, 0, 0, M], dtype=torch.int32, device="cuda")
    got = kernels.silu_and_mul_masked(gate_up, masked_m)
    assert_same_up_to_exp_rounding(got[3, -64:], silu_and_mul(tail))


def test_zero_rows_past_zeroes_exactly_the_padding_rows(kernels):
    E, M, N = 5, 300, 1000
    y = torch.randn(E, M, N + 24, device="cuda").to(BF16)
    view = y[:, :, :N]  # cropped: strided rows
    before = y.clone()
    masked_m = torch.tensor([0, 1, 299, 300, 37], dtype=torch.int32, device="cuda")
    assert kernels.zero_rows_past(view, masked_m) is view
    for e in range(E):
        m = int(masked_m[e])
        assert torch.equal(y[e, :m], before[e, :m])
        assert not y[e, m:, :N].any()
        assert torch.equal(y[e, m:, N:], before[e, m:, N:])  # outside the view: untouched
