"""Target ``sm90-cutlass``: FlashInfer ``cutlass_fused_moe`` W4A16 (BF16 x MXFP4) on Hopper (SM90).

Reproduces, on CPU, what SGLang builds on the GPU for GPT-OSS (``Mxfp4MoEMethod.
_process_weights_for_sm90_cutlass``) and DeepSeek-V4 (``Mxfp4FlashinferCutlassMoEMethod``), from the
canonical expert tensors of :mod:`moebake.formats.expert_source`. Per MoE layer, under the layer's
expert prefix, with ``H_pad = round_up(H, hidden_multiple)`` and ``I_pad = round_up(I, intermediate_multiple)`` (the
engine profile's multiples, :mod:`moebake.schema.profiles`); each tensor's dtype and shape, for either FlashInfer
layout, is the target spec's (:data:`moebake.schema.targets.SM90_CUTLASS`):

  ``w13_weight``        halves [up; gate], zero-padded, SM90 fp4 interleave
  ``w13_weight_scale``  E8M0, same halves, padded (below), SM90 scale fold (layout ``v1``: its older fold)
  ``w13_weight_bias``   [up | gate], zero-padded
  ``w2_weight``         zero-padded, SM90 fp4 interleave
  ``w2_weight_scale``   padded (below), SM90 scale fold
  ``w2_weight_bias``    zero-padded

The biases exist only for sources that have them (GPT-OSS; DeepSeek-V4 has none). Sources whose
engine path does not pad (DeepSeek-V4) must have H and I multiples of the padding multiples.
Padding bytes are zero, except the block scales' hidden padding next to real data, which holds the
profile's ``hidden_scale_fill`` (SGLang's GPT-OSS profile: 127 = E8M0 2^0, what its scale buffers are
created with: W13 scale columns ``H/32 .. H_pad/32`` of real rows, W2 scale rows ``H .. H_pad`` of
real columns). Either way the padded weights are zero, so the padding contributes nothing (padded
intermediate lanes have gate = 0). The kernel reads the scales as ``.view(torch.int32)``.
"""

from typing import Any

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.targets.base import register
from moebake.convert.targets.mxfp4_layers import Bake, Mxfp4Target, restore_layer
from moebake.layouts.gate_up import pad_to, split_halves, stack_halves
from moebake.layouts.sm90_fp4 import deinterleave_fp4, interleave_fp4_padded
from moebake.layouts.sm90_scales import FOLDS, fold_scales_for
from moebake.schema.manifest import LayerRecord
from moebake.schema.targets import SM90_CUTLASS, LayerDims


@register
class Sm90Cutlass(Mxfp4Target):
    spec = SM90_CUTLASS

    def bakes(self, model: Any, dims: LayerDims, options: ConvertOptions) -> dict[str, Bake]:
        layout, Hp, Ip = options.flashinfer_layout, dims.hidden_padded, dims.intermediate_padded
        assert layout is not None  # ConvertOptions resolves it for a target whose bytes depend on it
        fill = options.padding(model.format_name).hidden_scale_fill

        def w13_hidden_filled(scales: torch.Tensor) -> torch.Tensor:
            """W13 block scales ``[e, I, H/32]`` -> ``[e, I, Hp/32]``, the hidden padding at ``fill``."""
            return pad_to(scales, (scales.shape[1], Hp // 32), fill) if fill else scales

        def w2_hidden_filled(scales: torch.Tensor) -> torch.Tensor:
            """W2 block scales ``[e, H, I/32]`` -> ``[e, Hp, I/32]``, the hidden padding at ``fill``."""
            return pad_to(scales, (Hp, scales.shape[2]), fill) if fill else scales

        return {
            "w13_weight": Bake("w13_weight", lambda gate, up: interleave_fp4_padded((up, gate), (Ip, Hp // 2), layout)),
            "w13_weight_scale": Bake(
                "w13_scale", lambda gate, up: fold_scales_for(layout, (w13_hidden_filled(up), w13_hidden_filled(gate)), (Ip, Hp // 32))
            ),
            "w13_weight_bias": Bake("w13_bias", lambda gate, up: stack_halves(up, gate, (Ip,))),
            "w2_weight": Bake("w2_weight", lambda down: interleave_fp4_padded((down,), (Hp, Ip // 2), layout)),
            "w2_weight_scale": Bake("w2_scale", lambda down: fold_scales_for(layout, (w2_hidden_filled(down),), (Hp, Ip // 32))),
            "w2_weight_bias": Bake("w2_bias", lambda down: pad_to(down, (Hp,))),
        }

    def restore(self, record: LayerRecord, baked: dict[str, torch.Tensor], layout: str | None) -> dict[str, torch.Tensor]:
        """Padding is dropped here (the forward re-bake checks it)."""
        H, I = record.hidden, record.intermediate
        assert layout is not None  # an sm90-cutlass bake records its layout
        unfold_scales = FOLDS[layout][1]
        canonical: dict[str, tuple[torch.Tensor, ...]] = {}
        for name, unfold, row_bytes in (
            ("w13_weight", lambda w: deinterleave_fp4(w, layout), H // 2),
            ("w13_weight_scale", unfold_scales, H // 32),
        ):
            up, gate = split_halves(unfold(baked[name]), (I, row_bytes))
            canonical[name] = (gate, up)
        canonical["w2_weight"] = (deinterleave_fp4(baked["w2_weight"], layout)[:, :H, : I // 2],)
        canonical["w2_weight_scale"] = (unfold_scales(baked["w2_weight_scale"])[:, :H, : I // 32],)
        if "w13_weight_bias" in record.tensors:
            up, gate = split_halves(baked["w13_weight_bias"], (I,))
            canonical["w13_weight_bias"] = (gate, up)
            canonical["w2_weight_bias"] = (baked["w2_weight_bias"][:, :H],)
        return restore_layer(record, canonical)
