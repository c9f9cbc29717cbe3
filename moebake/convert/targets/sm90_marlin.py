"""Target ``sm90-marlin``: the Marlin W4A16 MoE kernel (BF16 activations x MXFP4 weights) on Hopper (SM90).

Reproduces, on CPU, what SGLang builds with ``--moe-runner-backend marlin`` for GPT-OSS
(``Mxfp4MoEMethod``) and DeepSeek-V4 (``Mxfp4MarlinMoEMethod``): ``prepare_moe_mxfp4_layer_for_marlin``
after ``deinterleave_moe_mxfp4_w13_for_marlin``, with the CUDA op ``gptq_marlin_repack`` done by
:mod:`moebake.layouts.marlin`. Per MoE layer, under the layer's expert prefix, with ``H_pad``/``I_pad`` the engine
profile's padded sizes (H % 64 == 0 for every source; a source the engine does not pad must meet its multiples); each
tensor's dtype and shape is the target spec's (:data:`moebake.schema.targets.SM90_MARLIN`):

  ``w13_weight``        halves [gate; up] each zero-padded to ``I_pad`` rows (``[2*I_pad, H_pad/2]`` per expert),
                        Marlin-repacked
  ``w13_weight_scale``  the same halves' scales ``[2*I_pad, H_pad/32]``, transposed, Marlin order
  ``w13_weight_bias``   [gate | up], zero-padded, Marlin bias order (GPT-OSS)
  ``w2_weight``         ``[H_pad, I_pad/2]`` zero-padded, Marlin-repacked
  ``w2_weight_scale``   ``[H_pad, I_pad/32]``, transposed, Marlin scale order
  ``w2_weight_bias``    zero-padded, Marlin bias order (GPT-OSS)

Scale padding holds the profile's fills (SGLang's GPT-OSS profile: 127 = E8M0 1.0 in H and I padding,
what its scale buffers are created with); padded weights are zero, so padding contributes nothing.
"""

from typing import Any

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.targets.base import register
from moebake.convert.targets.mxfp4_layers import Bake, Mxfp4Target, restore_layer
from moebake.errors import UnsupportedError
from moebake.layouts.gate_up import pad_to, split_halves, stack_halves
from moebake.layouts.marlin import permute_bias, permute_scales_padded, repack_padded, unpermute_bias, unpermute_scales, unrepack
from moebake.schema.manifest import LayerRecord
from moebake.schema.targets import SM90_MARLIN, LayerDims


def _e8m0(scales: torch.Tensor) -> torch.Tensor:
    return scales.view(torch.float8_e8m0fnu)


@register
class Sm90Marlin(Mxfp4Target):
    spec = SM90_MARLIN

    def check(self, model: Any, options: ConvertOptions) -> None:
        """The engines' Marlin MXFP4 path takes hidden sizes that are multiples of 64 only (SGLang 0.5.23's
        ``check_moe_marlin_supports_layer`` with tile padding), whatever it pads them to."""
        super().check(model, options)
        if model.hidden_size % 64:
            raise UnsupportedError(
                f"{model.checkpoint.root / 'config.json'}: hidden size {model.hidden_size} is not a multiple "
                f"of 64, which target {self.spec.name} needs (the engines' Marlin MXFP4 MoE path refuses it)"
            )

    def bakes(self, model: Any, dims: LayerDims, options: ConvertOptions) -> dict[str, Bake]:
        Hp, Ip = dims.hidden_padded, dims.intermediate_padded
        fills = options.padding(model.format_name)  # the engine profile's scale padding bytes
        return {
            "w13_weight": Bake("w13_weight", lambda gate, up: repack_padded((gate, up), (Ip, Hp // 2))),
            "w13_weight_scale": Bake(
                "w13_scale",
                lambda gate, up: _e8m0(
                    permute_scales_padded((gate, up), (Ip, Hp // 32), fills.intermediate_scale_fill, fills.hidden_scale_fill)
                ),
            ),
            "w13_weight_bias": Bake("w13_bias", lambda gate, up: permute_bias(stack_halves(gate, up, (Ip,)))),
            "w2_weight": Bake("w2_weight", lambda down: repack_padded((down,), (Hp, Ip // 2))),
            "w2_weight_scale": Bake(
                "w2_scale",
                lambda down: _e8m0(permute_scales_padded((down,), (Hp, Ip // 32), fills.hidden_scale_fill, fills.intermediate_scale_fill)),
            ),
            "w2_weight_bias": Bake("w2_bias", lambda down: permute_bias(pad_to(down, (Hp,)))),
        }

    def restore(self, record: LayerRecord, baked: dict[str, torch.Tensor], layout: str | None) -> dict[str, torch.Tensor]:
        """Padding is dropped here (the forward re-bake checks it)."""
        H, I = record.hidden, record.intermediate
        w13 = unrepack(baked["w13_weight"].contiguous().view(torch.int32))
        w13_scales = unpermute_scales(baked["w13_weight_scale"].contiguous().view(torch.uint8))
        w2 = unrepack(baked["w2_weight"].contiguous().view(torch.int32))
        w2_scales = unpermute_scales(baked["w2_weight_scale"].contiguous().view(torch.uint8))
        canonical = {
            "w13_weight": split_halves(w13, (I, H // 2)),
            "w13_weight_scale": split_halves(w13_scales, (I, H // 32)),
            "w2_weight": (w2[:, :H, : I // 2],),
            "w2_weight_scale": (w2_scales[:, :H, : I // 32],),
        }
        if "w13_weight_bias" in record.tensors:
            canonical["w13_weight_bias"] = split_halves(unpermute_bias(baked["w13_weight_bias"]), (I,))
            canonical["w2_weight_bias"] = (unpermute_bias(baked["w2_weight_bias"])[:, :H],)
        return restore_layer(record, canonical)
