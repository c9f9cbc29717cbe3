"""Target ``cutedsl``: FlashInfer CuteDSL NVFP4 MoE (``CuteDslMoEWrapper``) on Blackwell (SM100/SM103).

SGLang's standard path (``--moe-runner-backend flashinfer_cutedsl``, no DeepEP; its "v2"). Tensors
per layer are those of :mod:`moebake.convert.targets.nvfp4_experts`, with:

  * W13 rows ``[up; gate]`` interleaved in 64-row groups (``up[0:64], gate[0:64], up[64:128], ...``),
    for the weights and for the linear block scales, before the scales are 128x4-swizzled. The
    kernel's ``w1_weight_sf`` / ``w2_weight_sf`` (SGLang's ``w*_blockscale_mma``) are
    ``convert_sf_to_mma_layout`` views of the swizzled ``w*_weight_scale`` bytes, made at load time.
  * derived scalars (dtypes and shapes: the target spec's), as SGLang computes them on the first forward (for one
    rank holding all experts):

    ``w1_alpha``               ``w13_weight_scale_2[:, 0] / min(w13_input_scale_quant)``
    ``w2_alpha``               ``w2_weight_scale_2 / fc2_input_scale``
    ``fc2_input_scale``        ``min(1 / w2_input_scale)``
    ``g1_alphas_up``           ``max(w13_input_scale) * w13_weight_scale_2[:, 1]`` (SGLang 0.5.23 derives it at load)
    ``w13_input_scale_quant``  ``1 / max(w13_input_scale)``: the scale activations are FP4-quantized with
"""

import torch

from moebake.convert.targets.base import register
from moebake.convert.targets.nvfp4_experts import Nvfp4Target, W13Order
from moebake.layouts.gate_up import split_halves, stack_halves
from moebake.layouts.group_interleave import deinterleave_halves, interleave_halves
from moebake.layouts.nvfp4_scalars import cutedsl_wrapper_scales, load_time_scales
from moebake.schema.targets import CUTEDSL

GROUP_ROWS = 64


def _rows(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return interleave_halves(stack_halves(up, gate, tuple(up.shape[1:])), GROUP_ROWS)


def _split(w13: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    up, gate = split_halves(deinterleave_halves(w13, GROUP_ROWS), (w13.shape[1] // 2, *w13.shape[2:]))
    return gate, up


@register
class CuteDsl(Nvfp4Target):
    spec = CUTEDSL
    order = W13Order(_rows, _split)

    def derive(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        load_time = load_time_scales(raw)
        return {
            **cutedsl_wrapper_scales(raw, load_time),
            "w13_input_scale_quant": load_time["w13_input_scale_quant"],
            "g1_alphas_up": load_time["g1_alphas_up"],
        }
