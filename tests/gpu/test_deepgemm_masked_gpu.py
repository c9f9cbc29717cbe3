"""DeepGEMM's BF16 masked grouped GEMM against the torch fallback, on an SM90/SM100 GPU.

Shapes are the Qwen3.5 MTP draft MoE GEMMs from SGLang PR 25540's DeepGEMM JIT log
(``GROUPED_GEMM_NT_BF16_MASKED N=2048,K=4096`` and ``N=4096,K=1024``, ``num_groups=64``): 64 local
experts, H = 4096, I = 1024. ``masked_m`` is random with 0 and T_max always among its values, and
the rows past it hold garbage (NaN / inf), as DeepEP leaves them.

1. The masked GEMM: DeepGEMM equals the torch fallback on every valid row (DeepGEMM's own
   ``calc_diff`` < 1e-5 and elementwise within BF16 rounding; 1e-4 through the two-GEMM chains).
2. ``forward_masked`` (GEMM, silu * up, GEMM) on DeepGEMM equals it on the torch fallback on valid
   rows and is exactly zero past ``masked_m``; with T_max a multiple of 128 and not (padded).
3. H and I that are not multiples of 64 (weights padded at load) give the same as the fallback.
4. The token-major ``forward`` (dispatch, experts, combine) agrees between the backends.

Skipped without CUDA, an SM90/SM100 GPU or an importable DeepGEMM. Run by ``bin/gpu-harness``.
"""

import pytest
import torch

from moebake.serve.deepep_bf16 import DeepEPBf16Experts
from moebake.serve.masked_gemm import DEEP_GEMM, DEEP_GEMM_ARCHS, TORCH, deep_gemm_status, default_backend

pytestmark = pytest.mark.gpu

E, H, I = 64, 4096, 1024  # Qwen3.5 draft: GEMM 1 is N=2I=2048, K=H=4096; GEMM 2 is N=H=4096, K=I=1024
BF16 = torch.bfloat16


@pytest.fixture(scope="module")
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability()[0] not in DEEP_GEMM_ARCHS:
        pytest.skip("DeepGEMM's masked kernels need SM90 or SM100")
    module, why = deep_gemm_status()
    if module is None:
        pytest.skip(why)
    return torch.device("cuda")


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's test metric: 1 - cosine-like similarity of two tensors, in float64."""
    x, y = x.double(), y.double()
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


def random_masked_m(E: int, t_max: int, seed: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    masked_m = torch.randint(0, t_max + 1, (E,), generator=g, dtype=torch.int32)
    masked_m[0], masked_m[1] = 0, t_max
    return masked_m.to(device)


def ll_input(E: int, t_max: int, H: int, masked_m: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator(device=masked_m.device).manual_seed(seed)
    x = torch.randn(E, t_max, H, generator=g, device=masked_m.device).to(BF16)
    rows = torch.arange(t_max, device=masked_m.device)[None, :, None]
    return x.masked_fill(rows >= masked_m[:, None, None], float("nan"))


def weights(E: int, H: int, I: int, device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g, device=device) / H**0.5).to(BF16)
    w2 = (torch.randn(E, H, I, generator=g, device=device) / I**0.5).to(BF16)
    return w13, w2


def assert_valid_rows_close(got, expected, masked_m, max_diff):
    """Rows below masked_m agree: ``calc_diff`` below ``max_diff`` per expert and elementwise within BF16 rounding."""
    for e in range(got.shape[0]):
        m = int(masked_m[e])
        if m:
            assert calc_diff(got[e, :m], expected[e, :m]) < max_diff, e
            torch.testing.assert_close(got[e, :m].float(), expected[e, :m].float(), rtol=2**-6, atol=2**-6)


def test_deep_gemm_is_the_default_backend(gpu):
    assert default_backend(gpu) is DEEP_GEMM


@pytest.mark.parametrize("N, K", [(2048, 4096), (4096, 1024)])
@pytest.mark.parametrize("expected_m", [8, 64, 256])
def test_masked_gemm_matches_the_fallback(gpu, N, K, expected_m):
    t_max = 256
    masked_m = random_masked_m(E, t_max, seed=expected_m, device=gpu)
    a = ll_input(E, t_max, K, masked_m, seed=1)
    b = (torch.randn(E, N, K, device=gpu) / K**0.5).to(BF16)
    got = DEEP_GEMM.run(a, b, masked_m, expected_m)
    assert got.dtype == BF16 and tuple(got.shape) == (E, t_max, N)
    assert_valid_rows_close(got, TORCH.run(a, b, masked_m, expected_m), masked_m, 1e-5)


@pytest.mark.parametrize("t_max", [256, 200])  # 200: zero-padded to 256 for DeepGEMM
def test_forward_masked_matches_the_fallback_on_qwen35_draft_shapes(gpu, t_max):
    w13, w2 = weights(E, H, I, gpu)
    masked_m = random_masked_m(E, t_max, seed=t_max, device=gpu)
    x = ll_input(E, t_max, H, masked_m, seed=2)
    deep = DeepEPBf16Experts(w13, w2, backend="deep_gemm")
    assert deep.w13.data_ptr() == w13.data_ptr()  # aligned: the baked tensors are used as they are
    got = deep.forward_masked(x, masked_m, expected_m=64)
    expected = DeepEPBf16Experts(w13, w2, backend="torch").forward_masked(x, masked_m, expected_m=64)
    assert tuple(got.shape) == (E, t_max, H)
    assert_valid_rows_close(got, expected, masked_m, 1e-4)
    past = torch.arange(t_max, device=gpu)[None, :] >= masked_m[:, None]
    assert not got[past].any() and not got.isnan().any()


def test_unaligned_hidden_and_intermediate_are_padded(gpu):
    e, h, i, t_max = 8, 1000, 200, 96  # K: 1000 -> 1024 and 200 -> 256; M: 96 -> 128
    w13, w2 = weights(e, h, i, gpu, seed=3)
    masked_m = random_masked_m(e, t_max, seed=3, device=gpu)
    x = ll_input(e, t_max, h, masked_m, seed=3)
    deep = DeepEPBf16Experts(w13, w2, backend="deep_gemm")
    assert tuple(deep.w13.shape) == (e, 512, 1024) and tuple(deep.w2.shape) == (e, 1024, 256)
    got = deep.forward_masked(x, masked_m, expected_m=32)
    expected = DeepEPBf16Experts(w13, w2, backend="torch").forward_masked(x, masked_m, expected_m=32)
    assert_valid_rows_close(got, expected, masked_m, 1e-4)
    assert not got[torch.arange(t_max, device=gpu)[None, :] >= masked_m[:, None]].any()


def test_token_major_forward_agrees_between_backends(gpu):
    T, k = 128, 8
    w13, w2 = weights(E, H, I, gpu, seed=4)
    g = torch.Generator(device=gpu).manual_seed(4)
    hidden = torch.randn(T, H, generator=g, device=gpu).to(BF16)
    topk_ids = torch.rand(T, E, generator=g, device=gpu).argsort(dim=1)[:, :k]
    topk_weights = torch.rand(T, k, generator=g, device=gpu)
    got = DeepEPBf16Experts(w13, w2, backend="deep_gemm").forward(hidden, topk_ids, topk_weights)
    expected = DeepEPBf16Experts(w13, w2, backend="torch").forward(hidden, topk_ids, topk_weights)
    assert calc_diff(got, expected) < 1e-4
    torch.testing.assert_close(got.float(), expected.float(), rtol=2**-5, atol=2**-5)
