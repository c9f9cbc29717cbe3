"""Target ``sm90-cutlass``: FlashInfer ``cutlass_fused_moe`` W4A16 (BF16 x MXFP4) on Hopper (SM90).

Reproduces, on CPU, what SGLang's ``Mxfp4MoEMethod._process_weights_for_sm90_cutlass`` builds on the
GPU. Per MoE layer, under the layer's expert prefix, with ``E`` experts, padded sizes
``H_pad = round_up(H, hidden_multiple)`` and ``I_pad = round_up(I, intermediate_multiple)``:

  ``w13_weight``        U8   ``[E, 2*I_pad, H_pad/2]``               halves [up; gate], zero-padded, SM90 fp4 interleave
  ``w13_weight_scale``  U8   ``[E, 2*I_pad/64, H_pad/128, 16, 16]``  E8M0, same halves, zero-padded, SM90 scale fold
  ``w13_weight_bias``   BF16 ``[E, 2*I_pad]``                       [up | gate], zero-padded
  ``w2_weight``         U8   ``[E, H_pad, I_pad/2]``                 zero-padded, SM90 fp4 interleave
  ``w2_weight_scale``   U8   ``[E, H_pad/64, I_pad/128, 16, 16]``    zero-padded, SM90 scale fold
  ``w2_weight_bias``    BF16 ``[E, H_pad]``                         zero-padded

All padding bytes are zero (a zero E8M0 scale times a zero weight is zero; padded intermediate
lanes have gate = 0 and so contribute nothing). The kernel reads the scales as ``.view(torch.int32)``.
"""

import torch

from moebake.convert.options import ConvertOptions, round_up
from moebake.convert.plan import OutputTensor
from moebake.convert.targets.expert_chunks import map_expert_chunks
from moebake.errors import MoebakeError
from moebake.layouts.gate_up import merge_pairs, pad_to, split_halves, split_pairs, stack_halves
from moebake.layouts.sm90_fp4 import deinterleave_fp4, interleave_fp4
from moebake.layouts.sm90_scales import fold_scales, unfold_scales

NAME = "sm90-cutlass"
LAYOUT_VERSION = 1  # bump when the bytes this target writes change for the same options


def _dims(model, options: ConvertOptions) -> dict:
    H, I = model.hidden_size, model.intermediate_size
    return {
        "experts": model.num_experts,
        "hidden": H, "hidden_padded": round_up(H, options.hidden_multiple),
        "intermediate": I, "intermediate_padded": round_up(I, options.intermediate_multiple),
    }


def plan(model, options: ConvertOptions) -> tuple[list[OutputTensor], list[dict]]:
    """Output tensors and per-layer manifest records for every MoE layer of a GPT-OSS model."""
    if model.format_name != "gpt-oss":
        raise MoebakeError(f"target {NAME} does not support source format {model.format_name}")
    dims = _dims(model, options)
    E, H, Hp, I, Ip = dims["experts"], dims["hidden"], dims["hidden_padded"], dims["intermediate"], dims["intermediate_padded"]
    layout = options.flashinfer_layout
    checkpoint, chunk = model.checkpoint, options.chunk_bytes

    def w13_weight(blocks):  # [e, 2I, H/32, 16] -> [e, 2Ip, Hp/2]
        gate, up = split_pairs(blocks.reshape(blocks.shape[0], 2 * I, H // 2))
        return interleave_fp4(stack_halves(up, gate, (Ip, Hp // 2)), layout)

    def w13_scale(scales):  # [e, 2I, H/32] -> [e, 2Ip/64, Hp/128, 16, 16]
        gate, up = split_pairs(scales)
        return fold_scales(stack_halves(up, gate, (Ip, Hp // 32)))

    def w13_bias(bias):  # [e, 2I] -> [e, 2Ip]
        gate, up = split_pairs(bias)
        return stack_halves(up, gate, (Ip,))

    def w2_weight(blocks):  # [e, H, I/32, 16] -> [e, Hp, Ip/2]
        return interleave_fp4(pad_to(blocks.reshape(blocks.shape[0], H, I // 2), (Hp, Ip // 2)), layout)

    def w2_scale(scales):  # [e, H, I/32] -> [e, Hp/64, Ip/128, 16, 16]
        return fold_scales(pad_to(scales, (Hp, Ip // 32)))

    def w2_bias(bias):  # [e, H] -> [e, Hp]
        return pad_to(bias, (Hp,))

    recipe = (
        ("w13_weight", "gate_up_proj_blocks", "U8", (E, 2 * Ip, Hp // 2), w13_weight, "up_gate"),
        ("w13_weight_scale", "gate_up_proj_scales", "U8", (E, 2 * Ip // 64, Hp // 128, 16, 16), w13_scale, "up_gate"),
        ("w13_weight_bias", "gate_up_proj_bias", "BF16", (E, 2 * Ip), w13_bias, "up_gate"),
        ("w2_weight", "down_proj_blocks", "U8", (E, Hp, Ip // 2), w2_weight, None),
        ("w2_weight_scale", "down_proj_scales", "U8", (E, Hp // 64, Ip // 128, 16, 16), w2_scale, None),
        ("w2_weight_bias", "down_proj_bias", "BF16", (E, Hp), w2_bias, None),
    )
    tensors, layers = [], []
    for layer in model.layers:
        record = {"index": layer.index, "prefix": layer.prefix, **dims, "tensors": {}}
        for out_name, source_suffix, dtype, shape, transform, order in recipe:
            source = layer.prefix + source_suffix
            name = layer.prefix + out_name
            tensors.append(OutputTensor(name, dtype, shape, (source,), map_expert_chunks(checkpoint, source, chunk, transform)))
            record["tensors"][out_name] = {
                "source": source, "dtype": dtype, "shape": list(shape),
                "gate_up_order": order, "source_gate_up_order": "pairs" if order else None,
            }
        layers.append(record)
    return tensors, layers


def restore(record: dict, baked: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Exact inverse of :func:`plan` for one layer: baked tensors (short names) -> source tensors.

    ``record`` is the layer's manifest record; returns ``{source tensor name: tensor}`` with the
    source's dtypes and shapes. Padding is dropped (its being zero is checked by the caller via
    a re-bake, not here).
    """
    E, H, I = baked["w13_weight"].shape[0], record["hidden"], record["intermediate"]
    out = {}
    up, gate = split_halves(deinterleave_fp4(baked["w13_weight"], layout), (I, H // 2))
    out["gate_up_proj_blocks"] = merge_pairs(gate, up).reshape(E, 2 * I, H // 32, 16)
    up, gate = split_halves(unfold_scales(baked["w13_weight_scale"]), (I, H // 32))
    out["gate_up_proj_scales"] = merge_pairs(gate, up)
    up, gate = split_halves(baked["w13_weight_bias"], (I,))
    out["gate_up_proj_bias"] = merge_pairs(gate, up)
    out["down_proj_blocks"] = deinterleave_fp4(baked["w2_weight"], layout)[:, :H, : I // 2].reshape(E, H, I // 32, 16)
    out["down_proj_scales"] = unfold_scales(baked["w2_weight_scale"])[:, :H, : I // 32]
    out["down_proj_bias"] = baked["w2_weight_bias"][:, :H]
    return {record["prefix"] + key: value.contiguous() for key, value in out.items()}
