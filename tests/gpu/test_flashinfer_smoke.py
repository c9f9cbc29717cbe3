"""GPU smoke tests of FlashInfer's SM90 W4A16 (BF16 x MXFP4) path, run on the device machine.

1. FlashInfer's ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")`` (CUDA kernel) equals
   moebake's CPU port ``moebake.layouts.sm90_fp4.interleave_fp4(w, layout="v2")`` bit for bit.
2. One small ``cutlass_fused_moe`` W4A16 call matches a dequantized float reference.

Both go through FlashInfer's own Python wrappers; the compiled module behind them is moebake's
reduced (or prebuilt) one, installed by ``moebake.serve.jit.flashinfer_build.ensure_flashinfer_sm90_moe``
(set ``MOEBAKE_FLASHINFER_MOE_SO`` to load a prebuilt ``.so``). Skipped without CUDA, FlashInfer
or an SM90 GPU. Run with ``python3 -m pytest -m gpu tests/gpu`` (``bin/gpu-harness`` does).
"""

import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

# (E, n, k/2) uint8 weights: n % 16 == 0 and k % 64 == 0.
INTERLEAVE_SHAPES = [
    (3, 48, 128),  # k = 256
    (1, 2064, 96),  # more than 1024 row-pair blocks (kernel grid-stride over rows)
    (1, 64, 2240),  # k = 4480: more than 32 column partitions
    (8, 512, 1024),
    (2, 2944, 1472),  # n = k = 2944
]


@pytest.fixture(scope="module")
def flashinfer_moe():
    """FlashInfer's fused_moe package with moebake's reduced SM90 module (W4A16 and Humming W4A8) installed."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"needs an SM90 GPU, found sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    pytest.importorskip("flashinfer")
    import flashinfer.fused_moe as fused_moe

    from moebake.serve.jit.flashinfer_build import ensure_flashinfer_sm90_moe

    start = time.monotonic()
    spec = ensure_flashinfer_sm90_moe()
    # Load (or JIT-build) now, so that the tests below time only their own work.
    fused_moe.core.get_cutlass_fused_moe_module("90")
    print(f"\nFlashInfer fused-MoE module {spec.name} ready in {time.monotonic() - start:.1f} s")
    return fused_moe


@pytest.mark.parametrize("shape", INTERLEAVE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_interleave_matches_cpu_port(flashinfer_moe, shape):
    from moebake.layouts.sm90_fp4 import interleave_fp4

    generator = torch.Generator().manual_seed(sum(shape))
    weight = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    gpu = flashinfer_moe.interleave_moe_weights_for_sm90_mixed_gemm(weight.cuda(), "fp4").cpu()
    cpu = interleave_fp4(weight, layout="v2")
    assert gpu.dtype == torch.uint8 and gpu.shape == weight.shape
    mismatched = (gpu != cpu).sum().item()
    assert mismatched == 0, f"{mismatched} of {gpu.numel()} bytes differ"


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _dequant_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] (low nibble = even k) and E8M0 [..., K/32] -> float32 [..., K]."""
    lut = torch.tensor(E2M1, dtype=torch.float32, device=packed.device)
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2).long()
    return lut[codes] * torch.exp2(scales.float() - 127.0).repeat_interleave(32, dim=-1)


def test_cutlass_fused_moe_w4a16_matches_reference(flashinfer_moe):
    E, H, I, T, top_k = 4, 256, 256, 16, 2
    device = "cuda"
    g = torch.Generator(device=device).manual_seed(0)
    # Logical (un-interleaved) MXFP4 weights: W13 = [up; gate] rows [E, 2I, H], W2 [E, H, I].
    w1 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, device=device, generator=g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, device=device, generator=g)
    # E8M0 scales 2^-6 .. 2^-4 keep activations and outputs of order one, so the tolerance bites.
    s1 = torch.randint(121, 124, (E, 2 * I, H // 32), dtype=torch.uint8, device=device, generator=g)
    s2 = torch.randint(121, 124, (E, H, I // 32), dtype=torch.uint8, device=device, generator=g)
    x = torch.randn(T, H, device=device, generator=g).to(torch.bfloat16)
    logits = torch.randn(T, E, device=device, generator=g)
    topk_weights, topk_ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    topk_weights = (topk_weights / topk_weights.sum(-1, keepdim=True)).float()

    fm = flashinfer_moe
    w1_il = fm.interleave_moe_weights_for_sm90_mixed_gemm(w1, "fp4")
    w2_il = fm.interleave_moe_weights_for_sm90_mixed_gemm(w2, "fp4")
    s1_il = fm.interleave_moe_scales_for_sm90_mixed_gemm(s1)
    s2_il = fm.interleave_moe_scales_for_sm90_mixed_gemm(s2)
    out = torch.empty(T, H, dtype=torch.bfloat16, device=device)
    result = fm.cutlass_fused_moe(
        x,
        topk_ids.to(torch.int32),
        topk_weights,
        w1_il,
        w2_il,
        torch.bfloat16,
        quant_scales=[s1_il.view(torch.int32), s2_il.view(torch.int32)],
        use_w4_group_scaling=True,
        output=out,
    )
    if isinstance(result, (list, tuple)):
        result = result[0]
    torch.cuda.synchronize()

    w1_f = _dequant_mxfp4(w1, s1)  # [E, 2I, H]
    w2_f = _dequant_mxfp4(w2, s2)  # [E, H, I]
    xf = x.float()
    ref = torch.zeros(T, H, device=device)
    for t in range(T):
        for j in range(top_k):
            e = int(topk_ids[t, j])
            h1 = w1_f[e] @ xf[t]
            up, gate = h1[:I], h1[I:]
            act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).float()
            ref[t] += topk_weights[t, j] * (w2_f[e] @ act)

    got = result.float()
    assert torch.isfinite(got).all()
    assert ref.abs().mean() > 0.2, "reference too small for the tolerance to mean anything"
    close = torch.isclose(got, ref, rtol=0.1, atol=0.1).float().mean().item()
    rel = ((got - ref).norm() / ref.norm()).item()
    print(f"\nW4A16 MoE: |ref| mean {ref.abs().mean():.3f}, within 0.1: {close:.5f}, relative L2 error {rel:.4f}")
    assert close >= 0.999, f"only {close:.4%} of outputs within rtol=atol=0.1 (relative L2 error {rel:.4f})"
    assert rel < 0.03, f"relative L2 error {rel:.4f}"
