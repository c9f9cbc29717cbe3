"""Target ``sm100-trtllm``: FlashInfer ``trtllm_fp4_block_scale_moe`` (trtllm-gen, MXFP4 weights) on Blackwell (SM100).

Reproduces, on CPU, what SGLang builds for its SM100 ``flashinfer_mxfp4`` path: GPT-OSS
(``Mxfp4MoEMethod`` with ``_fi_kernel == "trtllm_sm100"``) and DeepSeek-V4
(``Mxfp4FlashinferTrtllmMoEMethod``), i.e. FlashInfer's ``_maybe_get_cached_w3_w1_permute_indices`` /
``get_w2_permute_indices_with_cache`` row permutations (``epilogue_tile_m = 128``) and
``block_scale_interleave``. Per MoE layer, under the layer's expert prefix, with ``H_pad``/``I_pad`` as for
``sm90-cutlass``; each tensor's dtype and shape is the target spec's (:data:`moebake.schema.targets.SM100_TRTLLM`):

  ``w13_weight``         rows ``(up_i, gate_i)`` pairs, then ``shuffle_matrix_a``
  ``w13_weight_scale``   E8M0 bytes: same rows, then the 128x4 swizzle
  ``w13_weight_bias``    same rows (sources with biases: GPT-OSS)
  ``w2_weight``          ``shuffle_matrix_a`` rows
  ``w2_weight_scale``    same rows, then the 128x4 swizzle
  ``w2_weight_bias``     same rows (GPT-OSS)
  ``gemm1_alpha``, ``gemm1_beta``  GPT-OSS's SwiGLU 1.702 and 1.0 (absent for plain SwiGLU)
  ``gemm1_clamp_limit``  the SwiGLU limit (absent when the model has none)

Weights keep the source's dtype (GPT-OSS U8, DeepSeek-V4 I8) and scales are the E8M0 bytes in a
float8_e4m3fn container, as SGLang's parameters are, so an engine can ``copy_`` them byte for byte.
Each expert's 128x4-swizzled scales have exactly ``rows * K/32`` bytes (rows % 128 == 0 and
``K/32 % 4 == 0``), stored in the linear shape SGLang reshapes them to. Padding: weights and biases
zero (SGLang's zero-initialised GPT-OSS buffers), block scales the engine profile's fills (SGLang's GPT-OSS
profile: 127 = E8M0 2^0 in H and I padding, what its scale buffers start at); sources whose engine path does not
pad (DeepSeek-V4) must have H and I multiples of the padding multiples. ``--flashinfer-layout`` (the SM90 interleave)
does not apply.
"""

from typing import Any

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.targets.base import register
from moebake.convert.targets.mxfp4_layers import Bake, Mxfp4Target, PaddedScales, restore_layer
from moebake.formats.safetensors_file import DTYPES
from moebake.layouts.block_scale_swizzle import swizzle_128x4, unswizzle_128x4
from moebake.layouts.gate_up import merge_pairs, pad_to, split_pairs
from moebake.layouts.trtllm_gen import EPILOGUE_TILE_M, shuffle_rows, unshuffle_rows
from moebake.schema.enums import ActivationKind
from moebake.schema.manifest import LayerRecord
from moebake.schema.targets import SM100_TRTLLM, LayerDims


def _w13(gate: torch.Tensor, up: torch.Tensor, half_shape: tuple[int, ...]) -> torch.Tensor:
    """(gate, up) ``[e, I, ...]`` -> ``[e, 2*I_pad, ...]``: each half zero-padded, rows (up_i, gate_i), shuffled."""
    return shuffle_rows(merge_pairs(pad_to(up, half_shape), pad_to(gate, half_shape)), EPILOGUE_TILE_M)


def _swizzled(scales: torch.Tensor) -> torch.Tensor:
    """Row-ordered linear scales ``[e, rows, K/32]`` -> 128x4-swizzled bytes, kept as ``[e, rows, K/32]``."""
    return swizzle_128x4(scales).reshape(scales.shape)


def _constants(model: Any, experts: int) -> dict[str, Bake]:
    """Per-expert SwiGLU parameters SGLang registers for this path: alpha/beta for GPT-OSS's SwiGLU, the limit."""
    activation = model.activation()
    values = {"gemm1_clamp_limit": activation.limit}
    if activation.kind == ActivationKind.SWIGLU_OAI:
        values = {"gemm1_alpha": activation.alpha, "gemm1_beta": activation.beta, **values}
    return {
        name: Bake(None, lambda value=value: torch.full((experts,), value, dtype=torch.float32))
        for name, value in values.items()
        if value is not None
    }


@register
class Sm100Trtllm(Mxfp4Target):
    spec = SM100_TRTLLM

    def layer_facts(self, model: Any, layer: Any) -> dict:
        return {"epilogue_tile_m": EPILOGUE_TILE_M}

    def bakes(self, model: Any, dims: LayerDims, options: ConvertOptions) -> dict[str, Bake]:
        Hp, Ip = dims.hidden_padded, dims.intermediate_padded
        scales = PaddedScales(dims, options.padding(model.format_name))
        return {
            "w13_weight": Bake("w13_weight", lambda gate, up: _w13(gate, up, (Ip, Hp // 2))),
            "w13_weight_scale": Bake(
                "w13_scale", lambda gate, up: _swizzled(_w13(scales.w13_half(gate), scales.w13_half(up), (Ip, Hp // 32)))
            ),
            "w13_weight_bias": Bake("w13_bias", lambda gate, up: _w13(gate.float(), up.float(), (Ip,))),
            "w2_weight": Bake("w2_weight", lambda down: shuffle_rows(pad_to(down, (Hp, Ip // 2)), EPILOGUE_TILE_M)),
            "w2_weight_scale": Bake("w2_scale", lambda down: _swizzled(shuffle_rows(scales.w2(down), EPILOGUE_TILE_M))),
            "w2_weight_bias": Bake("w2_bias", lambda down: shuffle_rows(pad_to(down.float(), (Hp,)), EPILOGUE_TILE_M)),
            **_constants(model, dims.experts),
        }

    def restore(self, record: LayerRecord, baked: dict[str, torch.Tensor], layout: str | None) -> dict[str, torch.Tensor]:
        """Padding, the per-expert constants and the F32 biases' low bits (narrowed back to the source
        dtype here) are left to the forward re-bake check, which sees every byte."""
        H, I = record.hidden, record.intermediate
        canonical = {
            "w13_weight": _unw13(baked["w13_weight"].view(torch.uint8), (I, H // 2)),
            "w13_weight_scale": _unw13(_unswizzled(baked["w13_weight_scale"]), (I, H // 32)),
            "w2_weight": (unshuffle_rows(baked["w2_weight"].view(torch.uint8), EPILOGUE_TILE_M)[:, :H, : I // 2],),
            "w2_weight_scale": (unshuffle_rows(_unswizzled(baked["w2_weight_scale"]), EPILOGUE_TILE_M)[:, :H, : I // 32],),
        }
        if "w13_weight_bias" in record.tensors:
            source_dtype = record.tensors["w13_weight_bias"].source_dtype
            assert source_dtype is not None  # an MXFP4 layer's bias record names its source dtype
            bias_dtype = DTYPES[source_dtype][0]
            gate, up = _unw13(baked["w13_weight_bias"], (I,))
            canonical["w13_weight_bias"] = (gate.to(bias_dtype), up.to(bias_dtype))
            down = unshuffle_rows(baked["w2_weight_bias"], EPILOGUE_TILE_M)[:, :H]
            canonical["w2_weight_bias"] = (down.to(bias_dtype),)
        return restore_layer(record, canonical)


def _unw13(w13: torch.Tensor, half_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`_w13`: ``[e, 2*I_pad, ...]`` -> (gate, up) cropped to ``half_shape``."""
    up, gate = split_pairs(unshuffle_rows(w13, EPILOGUE_TILE_M))
    crop = (slice(None),) + tuple(slice(0, n) for n in half_shape)
    return gate[crop], up[crop]


def _unswizzled(baked: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_swizzled` (any one-byte container dtype) -> uint8 ``[e, rows, K/32]``."""
    e, rows, cols = baked.shape
    return unswizzle_128x4(baked.contiguous().view(torch.uint8).reshape(e, rows * cols), rows, cols)
