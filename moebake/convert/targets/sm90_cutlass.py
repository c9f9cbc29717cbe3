"""Target ``sm90-cutlass``: FlashInfer ``cutlass_fused_moe`` W4A16 (BF16 x MXFP4) on Hopper (SM90).

Reproduces, on CPU, what SGLang builds on the GPU for GPT-OSS (``Mxfp4MoEMethod.
_process_weights_for_sm90_cutlass``) and DeepSeek-V4 (``Mxfp4FlashinferCutlassMoEMethod``), from the
canonical expert tensors of :mod:`moebake.formats.expert_source`. Per MoE layer, under the layer's
expert prefix, with ``E`` experts, padded sizes ``H_pad = round_up(H, hidden_multiple)`` and
``I_pad = round_up(I, intermediate_multiple)``:

  ``w13_weight``        U8   ``[E, 2*I_pad, H_pad/2]``               halves [up; gate], zero-padded, SM90 fp4 interleave
  ``w13_weight_scale``  U8   ``[E, 2*I_pad/64, H_pad/128, 16, 16]``  E8M0, same halves, zero-padded, SM90 scale fold
  ``w13_weight_bias``   BF16 ``[E, 2*I_pad]``                       [up | gate], zero-padded
  ``w2_weight``         U8   ``[E, H_pad, I_pad/2]``                 zero-padded, SM90 fp4 interleave
  ``w2_weight_scale``   U8   ``[E, H_pad/64, I_pad/128, 16, 16]``    zero-padded, SM90 scale fold
  ``w2_weight_bias``    BF16 ``[E, H_pad]``                         zero-padded

The biases exist only for sources that have them (GPT-OSS; DeepSeek-V4 has none). Sources whose
engine path does not pad (DeepSeek-V4) must have H and I multiples of the padding multiples.
All padding bytes are zero (a zero E8M0 scale times a zero weight is zero; padded intermediate
lanes have gate = 0 and so contribute nothing). The kernel reads the scales as ``.view(torch.int32)``.
"""

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputTensor
from moebake.convert.targets.mxfp4_layers import Bake, plan_layers, restore_layer
from moebake.errors import MoebakeError
from moebake.layouts.gate_up import pad_to, split_halves, stack_halves
from moebake.layouts.sm90_fp4 import deinterleave_fp4, interleave_fp4_padded
from moebake.layouts.sm90_scales import fold_scales_padded, unfold_scales

NAME = "sm90-cutlass"
LAYOUT_VERSION = 1  # bump when the bytes this target writes change for the same options
USES_FLASHINFER_SM90_LAYOUT = True  # the bytes depend on --flashinfer-layout (FlashInfer's SM90 fp4 interleave version)
SOURCE_FORMATS = ("gpt-oss", "deepseek-v4")


def plan(model, options: ConvertOptions) -> tuple[list[OutputTensor], list[dict]]:
    """Output tensors and per-layer manifest records for every MoE layer of an MXFP4 model."""
    if model.format_name not in SOURCE_FORMATS:
        raise MoebakeError(f"target {NAME} does not support source format {model.format_name}")
    layout = options.flashinfer_layout

    def bakes(dims: dict) -> list[Bake]:
        E, Hp, Ip = dims["experts"], dims["hidden_padded"], dims["intermediate_padded"]
        return [
            Bake("w13_weight", "w13_weight", "U8", (E, 2 * Ip, Hp // 2),
                 lambda gate, up: interleave_fp4_padded((up, gate), (Ip, Hp // 2), layout), "up_gate"),
            Bake("w13_weight_scale", "w13_scale", "U8", (E, 2 * Ip // 64, Hp // 128, 16, 16),
                 lambda gate, up: fold_scales_padded((up, gate), (Ip, Hp // 32)), "up_gate"),
            Bake("w13_weight_bias", "w13_bias", "BF16", (E, 2 * Ip), lambda gate, up: stack_halves(up, gate, (Ip,)), "up_gate"),
            Bake("w2_weight", "w2_weight", "U8", (E, Hp, Ip // 2), lambda down: interleave_fp4_padded((down,), (Hp, Ip // 2), layout)),
            Bake("w2_weight_scale", "w2_scale", "U8", (E, Hp // 64, Ip // 128, 16, 16), lambda down: fold_scales_padded((down,), (Hp, Ip // 32))),
            Bake("w2_weight_bias", "w2_bias", "BF16", (E, Hp), lambda down: pad_to(down, (Hp,))),
        ]

    return plan_layers(model, options, bakes, {}, NAME)


def restore(record: dict, baked: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Exact inverse of :func:`plan` for one layer and any run of experts ``[e, ...]`` of the baked tensors.

    ``record`` is the layer's manifest record; returns ``{source tensor name or per-expert pattern:
    [e, ...]}`` holding the source's bytes. Padding is dropped (the forward re-bake checks it).
    """
    H, I = record["hidden"], record["intermediate"]
    canonical = {}
    for name, unfold, row_bytes in (("w13_weight", lambda w: deinterleave_fp4(w, layout), H // 2),
                                    ("w13_weight_scale", unfold_scales, H // 32)):
        up, gate = split_halves(unfold(baked[name]), (I, row_bytes))
        canonical[name] = (gate, up)
    canonical["w2_weight"] = (deinterleave_fp4(baked["w2_weight"], layout)[:, :H, : I // 2],)
    canonical["w2_weight_scale"] = (unfold_scales(baked["w2_weight_scale"])[:, :H, : I // 32],)
    if "w13_weight_bias" in record["tensors"]:
        up, gate = split_halves(baked["w13_weight_bias"], (I,))
        canonical["w13_weight_bias"] = (gate, up)
        canonical["w2_weight_bias"] = (baked["w2_weight_bias"][:, :H],)
    return restore_layer(record, canonical)
