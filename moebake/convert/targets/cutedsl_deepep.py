"""Target ``cutedsl-deepep``: FlashInfer CuteDSL masked grouped GEMM behind DeepEP low-latency on Blackwell (SM100/SM103).

SGLang's ``--moe-runner-backend flashinfer_cutedsl --moe-a2a-backend deepep`` path (its "v1",
``flashinfer_cutedsl_moe_masked``). Tensors per layer are those of
:mod:`moebake.convert.targets.nvfp4_experts`, with:

  * W13 rows ``[gate; up]`` (halves, not interleaved), weights and block scales; the kernel reads
    the 128x4-swizzled ``w*_weight_scale`` bytes directly (SGLang's ``w*_blockscale_swizzled``).
  * derived scalars of SGLang's ``process_weights_after_loading`` (dtypes and shapes: the target spec's), per expert,
    so any contiguous expert-parallel split of them is a rank's share:

    ``g1_alphas``              ``max(w13_input_scale) * w13_weight_scale_2[:, 0]``  (``w1_alpha``)
    ``g1_alphas_up``           ``max(w13_input_scale) * w13_weight_scale_2[:, 1]``  (SGLang 0.5.23 derives it too)
    ``g2_alphas``              ``w2_input_scale * w2_weight_scale_2``                (``w2_alpha``)
    ``w13_input_scale_quant``  ``1 / max(w13_input_scale)``                          (``input_global_scale``)
    ``w2_input_scale_quant``   ``1 / w2_input_scale``                                (``a2_global_scale``)
"""

import torch

from moebake.convert.targets.base import register
from moebake.convert.targets.nvfp4_experts import Nvfp4Target, W13Order
from moebake.layouts.gate_up import split_halves, stack_halves
from moebake.layouts.nvfp4_scalars import load_time_scales
from moebake.schema.targets import CUTEDSL_DEEPEP


def _rows(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return stack_halves(gate, up, tuple(gate.shape[1:]))


def _split(w13: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return split_halves(w13, (w13.shape[1] // 2, *w13.shape[2:]))


@register
class CuteDslDeepEP(Nvfp4Target):
    spec = CUTEDSL_DEEPEP
    order = W13Order(_rows, _split)

    def derive(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return load_time_scales(raw)
