"""Target ``cutedsl-deepep``: FlashInfer CuteDSL masked grouped GEMM behind DeepEP low-latency on Blackwell (SM100/SM103).

SGLang's ``--moe-runner-backend flashinfer_cutedsl --moe-a2a-backend deepep`` path (its "v1",
``flashinfer_cutedsl_moe_masked``). Tensors per layer are those of
:mod:`moebake.convert.targets.nvfp4_experts`, with:

  * W13 rows ``[gate; up]`` (halves, not interleaved), weights and block scales; the kernel reads
    the 128x4-swizzled ``w*_weight_scale`` bytes directly (SGLang's ``w*_blockscale_swizzled``).
  * derived F32 scalars of SGLang's ``process_weights_after_loading``, per expert, so any contiguous
    expert-parallel split of them is a rank's share:

    ``g1_alphas``              ``[E]``  ``max(w13_input_scale) * w13_weight_scale_2[:, 0]``  (``w1_alpha``)
    ``g2_alphas``              ``[E]``  ``w2_input_scale * w2_weight_scale_2``                (``w2_alpha``)
    ``w13_input_scale_quant``  ``[E]``  ``1 / max(w13_input_scale)``                          (``input_global_scale``)
    ``w2_input_scale_quant``   ``[E]``  ``1 / w2_input_scale``                                (``a2_global_scale``)
"""

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputTensor
from moebake.convert.targets.nvfp4_experts import W13Order, plan_layers, restore_layer
from moebake.convert.targets.nvfp4_scalars import load_time_scales
from moebake.formats.modelopt_nvfp4 import FORMAT_NAME
from moebake.layouts.gate_up import split_halves, stack_halves

NAME = "cutedsl-deepep"
LAYOUT_VERSION = 1  # bump when the bytes this target writes change for the same options
USES_FLASHINFER_SM90_LAYOUT = False  # --flashinfer-layout (the SM90 fp4 interleave version) does not apply
SOURCE_FORMATS = (FORMAT_NAME,)


def _rows(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return stack_halves(gate, up, tuple(gate.shape[1:]))


def _split(w13: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return split_halves(w13, (w13.shape[1] // 2, *w13.shape[2:]))


ORDER = W13Order("gate_up", _rows, _split)


def plan(model, options: ConvertOptions) -> tuple[list[OutputTensor], list[dict]]:
    """Output tensors and per-layer manifest records for every quantized MoE layer of a ModelOpt NVFP4 model."""
    return plan_layers(NAME, model, options, ORDER, load_time_scales)


def restore(record: dict, baked: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Exact inverse of :func:`plan` for one layer's experts (``layout``, the SM90 fp4 id, does not apply)."""
    return restore_layer(record, baked, ORDER)
