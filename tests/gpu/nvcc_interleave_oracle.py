"""``bin/gpu-harness oracle``: FlashInfer's interleave kernels compiled alone with nvcc, against moebake's CPU ports.

Usage (on the GPU machine, from the repo root): ``python3 tests/gpu/nvcc_interleave_oracle.py LIB.so``, where
``LIB.so`` is ``moe_gemm_mixed_utils.cu`` plus the ``extern "C" moebake_interleave(src, dst, rows, cols,
quant_type)`` wrapper that ``bin/gpu-harness oracle`` builds. Compares, printing one MATCH/MISMATCH line each:

1. quant type 1 (``"fp4"``, W4A16) with :func:`moebake.layouts.sm90_fp4.interleave_fp4` (layout v2);
2. quant type 2 (``"fp4_fp8"``, Humming W4A8) with :func:`moebake.layouts.sm90_humming.interleave_fp4_fp8`,
   small and real sizes (``tests/gpu/humming_cases.py``);
3. when ``flashinfer.fused_moe`` imports: FlashInfer's own ``preprocess_moe_weights_for_sm90_mixed_gemm_humming``
   run on the GPU (its torch clamp / residual / LUT rewrite on CUDA tensors, its scale fold), with its weight
   interleave call served by this nvcc-built kernel (quant type 2), against
   :func:`moebake.layouts.sm90_humming.humming_preprocess`, at the real sizes.

Exits 1 if anything differs, 0 when everything matched.
"""

import ctypes
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).parent))
from humming_cases import REAL_SHAPES, SMALL_SHAPES, compare, scales, weights  # noqa: E402

from moebake.layouts.sm90_fp4 import interleave_fp4  # noqa: E402
from moebake.layouts.sm90_humming import humming_preprocess, interleave_fp4_fp8  # noqa: E402

QUANT_TYPES = {"fp4": 1, "fp4_fp8": 2}


def kernel_interleave(lib, weight: torch.Tensor, quant_type: str) -> torch.Tensor:
    """The nvcc-built kernel on ``weight`` uint8 ``[E, n, k/2]`` (CPU or CUDA), one expert per launch as FlashInfer's binding does."""
    src = weight.contiguous().cuda()
    dst = torch.empty_like(src)
    for e in range(src.shape[0]):
        rc = lib.moebake_interleave(
            ctypes.c_void_p(src[e].data_ptr()), ctypes.c_void_p(dst[e].data_ptr()), src.shape[1], 2 * src.shape[2], QUANT_TYPES[quant_type]
        )
        if rc != 0:
            raise RuntimeError(f"moebake_interleave returned CUDA error {rc}")
    return dst if weight.is_cuda else dst.cpu()


def main(library: str) -> int:
    lib = ctypes.CDLL(library)
    results = []
    for shape in [(3, 48, 128), (1, 2064, 96), (1, 64, 2240), (2, 2944, 1472)]:
        w = torch.randint(0, 256, shape, dtype=torch.uint8)
        results.append(
            compare(
                "x".join(map(str, shape)),
                'nvcc interleave "fp4" (quant type 1, layout v2)',
                interleave_fp4(w, layout="v2"),
                kernel_interleave(lib, w, "fp4"),
            )
        )
    for name, shape in {**SMALL_SHAPES, **REAL_SHAPES}.items():
        w = weights(shape, seed=len(name))
        results.append(
            compare(name, 'nvcc interleave "fp4_fp8" (quant type 2)', interleave_fp4_fp8(w), kernel_interleave(lib, w, "fp4_fp8"))
        )
    try:
        from flashinfer.fused_moe import prepare
    except Exception as err:  # FlashInfer absent or broken here: say so, the kernel comparisons above stand
        print(f"SKIPPED: the whole Humming preprocess (flashinfer.fused_moe does not import: {type(err).__name__}: {err})")
    else:

        def nvcc_interleave(weight, quant_type="fp4"):
            return kernel_interleave(lib, weight, quant_type)

        with mock.patch.object(prepare, "interleave_moe_weights_for_sm90_mixed_gemm", nvcc_interleave):
            for name, shape in REAL_SHAPES.items():
                w, s = weights(shape, seed=7 + len(name)), scales(shape, seed=len(name))
                start = time.monotonic()
                gpu = [t.cpu() for t in prepare.preprocess_moe_weights_for_sm90_mixed_gemm_humming(w.cuda(), s.cuda())]
                middle = time.monotonic()
                cpu = humming_preprocess(w, s)
                print(f"  {name}: FlashInfer on the GPU {middle - start:.2f} s, moebake CPU {time.monotonic() - middle:.2f} s")
                for what, mine, theirs in zip(("weight", "folded offsets", "residual"), cpu, gpu, strict=True):
                    results.append(compare(name, f"FlashInfer Humming preprocess (nvcc fp4_fp8 kernel) {what}", mine, theirs))
    matched = sum(results)
    print(f"{'ALL MATCHED' if matched == len(results) else 'SOME DIFFER'}: {matched} of {len(results)} comparisons equal byte for byte")
    return 0 if matched == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
