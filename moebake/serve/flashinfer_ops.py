"""FlashInfer's SM90 fused-MoE entry points, with FlashInfer routed to moebake's reduced module first.

FlashInfer's stock ``fused_moe_90`` JIT module takes over half an hour to build;
:func:`moebake.serve.flashinfer_build.ensure_flashinfer_sm90_moe` makes FlashInfer build (or load a
prebuilt copy of) a module with only the BF16 x MXFP4 path. That must happen once per process,
before the first ``cutlass_fused_moe`` or ``interleave_moe_weights_for_sm90_mixed_gemm`` call
(a second call would reset FlashInfer's module cache), hence the cache here.
"""

import functools
from types import SimpleNamespace


@functools.cache
def sm90_moe_ops() -> SimpleNamespace:
    """``cutlass_fused_moe``, ``interleave_moe_weights_for_sm90_mixed_gemm``, ``interleave_moe_scales_for_sm90_mixed_gemm``."""
    from moebake.serve.flashinfer_build import ensure_flashinfer_sm90_moe

    ensure_flashinfer_sm90_moe()
    from flashinfer.fused_moe import (
        cutlass_fused_moe,
        interleave_moe_scales_for_sm90_mixed_gemm,
        interleave_moe_weights_for_sm90_mixed_gemm,
    )

    return SimpleNamespace(
        cutlass_fused_moe=cutlass_fused_moe,
        interleave_weights=interleave_moe_weights_for_sm90_mixed_gemm,
        interleave_scales=interleave_moe_scales_for_sm90_mixed_gemm,
    )
