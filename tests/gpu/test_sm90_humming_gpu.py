"""GPU proof of the SM90 Humming preprocess (``sm90-cutlass-w4a8``), run on the device machine.

1. FlashInfer's ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4_fp8")`` (CUDA kernel, quant type 2)
   equals moebake's CPU port :func:`moebake.layouts.sm90_humming.interleave_fp4_fp8` bit for bit;
2. FlashInfer's whole ``preprocess_moe_weights_for_sm90_mixed_gemm_humming`` (range clamp, residual,
   payload rewrite on the GPU, then that interleave and the scale fold) equals
   :func:`moebake.layouts.sm90_humming.humming_preprocess`: weight, folded offsets and residual,

at real sizes (``tests/gpu/humming_cases.py``). Each comparison prints a ``MATCH``/``MISMATCH`` line
(run with ``-s``; ``bin/gpu-harness`` does). The compiled module behind FlashInfer's wrappers is
moebake's reduced one (it holds ``moe_gemm_mixed_utils.cu`` and FlashInfer's binding unchanged), as in
``test_flashinfer_smoke.py``. Skipped without CUDA, FlashInfer or an SM90 GPU.
"""

import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
from humming_cases import REAL_SHAPES, SMALL_SHAPES, compare, scales, weights  # noqa: E402

pytestmark = pytest.mark.gpu
ALL_SHAPES = {**SMALL_SHAPES, **REAL_SHAPES}


@pytest.fixture(scope="module")
def flashinfer_moe(sm90_gpu):
    """FlashInfer's fused_moe package, its SM90 module routed to moebake's reduced one (``sm90_gpu``) and loaded."""
    import flashinfer.fused_moe as fused_moe

    fused_moe.core.get_cutlass_fused_moe_module("90")
    if not hasattr(fused_moe, "preprocess_moe_weights_for_sm90_mixed_gemm_humming"):
        pytest.skip("this FlashInfer has no preprocess_moe_weights_for_sm90_mixed_gemm_humming")
    return fused_moe


@pytest.mark.parametrize("name", list(ALL_SHAPES))
def test_fp4_fp8_interleave_matches_cpu_port(flashinfer_moe, name):
    from moebake.layouts.sm90_humming import interleave_fp4_fp8

    weight = weights(ALL_SHAPES[name], seed=len(name))
    gpu = flashinfer_moe.interleave_moe_weights_for_sm90_mixed_gemm(weight.cuda(), "fp4_fp8").cpu()
    assert compare(name, 'interleave "fp4_fp8" (quant type 2)', interleave_fp4_fp8(weight), gpu)


# FlashInfer's scale fold takes row counts that are multiples of 64 (every padded SGLang layer's): the others are
# for the interleave alone.
FOLDABLE_SHAPES = [name for name, (_, rows, _) in ALL_SHAPES.items() if rows % 64 == 0]


@pytest.mark.parametrize("name", FOLDABLE_SHAPES)
def test_humming_preprocess_matches_flashinfer(flashinfer_moe, name):
    from moebake.layouts.sm90_humming import humming_preprocess

    shape = ALL_SHAPES[name]
    weight, scale = weights(shape, seed=7 + len(name)), scales(shape, seed=len(name))
    start = time.monotonic()
    gpu = [t.cpu() for t in flashinfer_moe.preprocess_moe_weights_for_sm90_mixed_gemm_humming(weight.cuda(), scale.cuda())]
    middle = time.monotonic()
    cpu = humming_preprocess(weight, scale)
    print(f"  {name}: FlashInfer GPU {middle - start:.2f} s (with copies), moebake CPU {time.monotonic() - middle:.2f} s")
    results = [
        compare(name, f"Humming preprocess {what}", mine, theirs)
        for what, mine, theirs in zip(("weight", "folded offsets", "residual"), cpu, gpu, strict=True)
    ]
    assert all(results)
