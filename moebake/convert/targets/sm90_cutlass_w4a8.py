"""Target ``sm90-cutlass-w4a8``: FlashInfer ``cutlass_fused_moe`` Humming W4A8 (FP8 activations x MXFP4) on Hopper.

Reproduces, on CPU, what SGLang 0.5.23 builds on the GPU when started with
``--moe-runner-backend flashinfer_mxfp4 --flashinfer-mxfp4-moe-precision fp8``: for GPT-OSS
``Mxfp4MoEMethod._process_weights_for_sm90_cutlass`` with ``_use_sm90_humming``, for DeepSeek-V4
``Mxfp4FlashinferCutlassMoEMethod`` with ``_use_sm90_humming``. Both pad (GPT-OSS only) and stack
``[up; gate]`` as ``sm90-cutlass`` does, then run FlashInfer's
``preprocess_moe_weights_for_sm90_mixed_gemm_humming`` on each of W13 and W2
(:mod:`moebake.layouts.sm90_humming`). Per MoE layer, with the padded sizes of ``sm90-cutlass``; each tensor's
dtype and shape is the target spec's (:data:`moebake.schema.targets.SM90_CUTLASS_W4A8`):

  ``w13_weight``                 [up; gate], zero-padded, rewritten, ``fp4_fp8`` interleave
  ``w13_weight_scale``           per-group exponent offsets 1..12, SM90 fold
  ``w13_weight_bias``            [up | gate], zero-padded (GPT-OSS only)
  ``w13_humming_residual_scale`` ``2^(lo - 127) / 2 * 64``, ``lo``: kept minimum
  ``w2_weight``                  zero-padded, rewritten, ``fp4_fp8`` interleave
  ``w2_weight_scale``            offsets, SM90 scale fold
  ``w2_weight_bias``             zero-padded (GPT-OSS only)
  ``w2_humming_residual_scale``  as W13's, of W2's scales

The range clamp runs over every scale of an expert's W13 (both halves) or W2, padding included.
SGLang fills the *scale* padding of this path with the expert's first scale (W13: gate row 0,
column 0; W2: row 0, column 0), so that padding cannot change the range; the weights' padding is
zero, so those scales are inert. SGLang's scalar ``humming_fc2_act_scale`` (1.0) is not baked: the
plugin makes it. The Humming rewrite loses information by design (:attr:`TargetSpec.lossy`), so this
target has no inverse: ``restore`` refuses and ``verify --source`` proves re-bake equality.
"""

from collections.abc import Sequence
from typing import Any

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.targets.base import register
from moebake.convert.targets.mxfp4_layers import Bake, Mxfp4Target
from moebake.errors import UnsupportedError
from moebake.layouts.gate_up import pad_to, stack_halves
from moebake.layouts.sm90_humming import RESIDUAL_COMPENSATION, humming_scale_outputs, humming_weight
from moebake.schema.manifest import LayerRecord
from moebake.schema.targets import SM90_CUTLASS_W4A8, LayerDims


def filled_scales(parts: Sequence[torch.Tensor], part_shape: tuple[int, int]) -> torch.Tensor:
    """Block-scale parts ``[e, r, g]`` (W13: up, gate; W2: down) stacked along rows, each padded to
    ``part_shape``; the padding holds each expert's first scale of the *last* part given (W13: the gate's,
    which is row 0 of SGLang's loaded pairs/halves buffer; W2: the only part), as SGLang's Humming path fills it."""
    rows, groups = part_shape
    first = parts[-1][:, :1, :1]
    out = first.expand(first.shape[0], len(parts) * rows, groups).clone()
    for index, part in enumerate(parts):
        out[:, index * rows : index * rows + part.shape[1], : part.shape[2]] = part
    return out


@register
class Sm90CutlassW4a8(Mxfp4Target):
    spec = SM90_CUTLASS_W4A8

    def bakes(self, model: Any, dims: LayerDims, options: ConvertOptions) -> dict[str, Bake]:
        Hp, Ip = dims.hidden_padded, dims.intermediate_padded

        def w13_scales(gate_scale: torch.Tensor, up_scale: torch.Tensor):
            return filled_scales((up_scale, gate_scale), (Ip, Hp // 32))

        def w2_scales(down_scale: torch.Tensor):
            return filled_scales((down_scale,), (Hp, Ip // 32))

        def residual(scales: torch.Tensor):
            return humming_scale_outputs(scales)[1] * RESIDUAL_COMPENSATION

        return {
            "w13_weight": Bake(
                "w13_weight",
                lambda gate, up, gate_scale, up_scale: humming_weight(
                    stack_halves(up, gate, (Ip, Hp // 2)), w13_scales(gate_scale, up_scale)
                ),
                also=("w13_scale",),
            ),
            "w13_weight_scale": Bake("w13_scale", lambda gate, up: humming_scale_outputs(w13_scales(gate, up))[0]),
            "w13_weight_bias": Bake("w13_bias", lambda gate, up: stack_halves(up, gate, (Ip,))),
            "w13_humming_residual_scale": Bake("w13_scale", lambda gate, up: residual(w13_scales(gate, up))),
            "w2_weight": Bake(
                "w2_weight", lambda down, down_scale: humming_weight(pad_to(down, (Hp, Ip // 2)), w2_scales(down_scale)), also=("w2_scale",)
            ),
            "w2_weight_scale": Bake("w2_scale", lambda down: humming_scale_outputs(w2_scales(down))[0]),
            "w2_weight_bias": Bake("w2_bias", lambda down: pad_to(down, (Hp,))),
            "w2_humming_residual_scale": Bake("w2_scale", lambda down: residual(w2_scales(down))),
        }

    def restore(self, record: LayerRecord, baked: dict[str, torch.Tensor], layout: str | None) -> dict[str, torch.Tensor]:
        raise UnsupportedError(f"target {self.spec.name} cannot be inverted to its source: {self.spec.lossy}")
