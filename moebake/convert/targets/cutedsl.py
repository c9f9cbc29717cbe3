"""Target ``cutedsl``: FlashInfer CuteDSL NVFP4 MoE (``CuteDslMoEWrapper``) on Blackwell (SM100/SM103).

SGLang's standard path (``--moe-runner-backend flashinfer_cutedsl``, no DeepEP; its "v2"). Tensors
per layer are those of :mod:`moebake.convert.targets.nvfp4_experts`, with:

  * W13 rows ``[up; gate]`` interleaved in 64-row groups (``up[0:64], gate[0:64], up[64:128], ...``),
    for the weights and for the linear block scales, before the scales are 128x4-swizzled. The
    kernel's ``w1_weight_sf`` / ``w2_weight_sf`` (SGLang's ``w*_blockscale_mma``) are
    ``convert_sf_to_mma_layout`` views of the swizzled ``w*_weight_scale`` bytes, made at load time.
  * derived F32 scalars, as SGLang computes them on the first forward (for one rank holding all experts):

    ``w1_alpha``               ``[E]``  ``w13_weight_scale_2[:, 0] / min(w13_input_scale_quant)``
    ``w2_alpha``               ``[E]``  ``w2_weight_scale_2 / fc2_input_scale``
    ``fc2_input_scale``        ``[1]``  ``min(1 / w2_input_scale)``
    ``w13_input_scale_quant``  ``[E]``  ``1 / max(w13_input_scale)``: the scale activations are FP4-quantized with
"""

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputTensor
from moebake.convert.targets.nvfp4_experts import W13Order, plan_layers, restore_layer
from moebake.convert.targets.nvfp4_scalars import cutedsl_wrapper_scales, load_time_scales
from moebake.formats.modelopt_nvfp4 import FORMAT_NAME
from moebake.layouts.gate_up import split_halves, stack_halves
from moebake.layouts.group_interleave import deinterleave_halves, interleave_halves

NAME = "cutedsl"
LAYOUT_VERSION = 1  # bump when the bytes this target writes change for the same options
USES_FLASHINFER_SM90_LAYOUT = False  # --flashinfer-layout (the SM90 fp4 interleave version) does not apply
SOURCE_FORMATS = (FORMAT_NAME,)
GROUP_ROWS = 64


def _rows(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return interleave_halves(stack_halves(up, gate, tuple(up.shape[1:])), GROUP_ROWS)


def _split(w13: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    up, gate = split_halves(deinterleave_halves(w13, GROUP_ROWS), (w13.shape[1] // 2, *w13.shape[2:]))
    return gate, up


ORDER = W13Order("up_gate_interleaved_64", _rows, _split)


def _derive(raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    load_time = load_time_scales(raw)
    return {**cutedsl_wrapper_scales(raw, load_time), "w13_input_scale_quant": load_time["w13_input_scale_quant"]}


def plan(model, options: ConvertOptions) -> tuple[list[OutputTensor], list[dict]]:
    """Output tensors and per-layer manifest records for every quantized MoE layer of a ModelOpt NVFP4 model."""
    return plan_layers(NAME, model, options, ORDER, _derive)


def restore(record: dict, baked: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Exact inverse of :func:`plan` for one layer's experts (``layout``, the SM90 fp4 id, does not apply)."""
    return restore_layer(record, baked, ORDER)
