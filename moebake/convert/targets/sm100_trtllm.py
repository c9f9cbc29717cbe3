"""Target ``sm100-trtllm``: FlashInfer ``trtllm_fp4_block_scale_moe`` (trtllm-gen, MXFP4 weights) on Blackwell (SM100).

Reproduces, on CPU, what SGLang builds for its SM100 ``flashinfer_mxfp4`` path: GPT-OSS
(``Mxfp4MoEMethod`` with ``_fi_kernel == "trtllm_sm100"``) and DeepSeek-V4
(``Mxfp4FlashinferTrtllmMoEMethod``), i.e. FlashInfer's ``_maybe_get_cached_w3_w1_permute_indices`` /
``get_w2_permute_indices_with_cache`` row permutations (``epilogue_tile_m = 128``) and
``block_scale_interleave``. Per MoE layer, under the layer's expert prefix, with ``E`` experts and
``H_pad``/``I_pad`` as for ``sm90-cutlass``:

  ``w13_weight``         U8/I8 ``[E, 2*I_pad, H_pad/2]``  rows ``(up_i, gate_i)`` pairs, then ``shuffle_matrix_a``
  ``w13_weight_scale``   F8_E4M3 ``[E, 2*I_pad, H_pad/32]``  E8M0 bytes: same rows, then the 128x4 swizzle
  ``w13_weight_bias``    F32 ``[E, 2*I_pad]``  same rows (sources with biases: GPT-OSS)
  ``w2_weight``          U8/I8 ``[E, H_pad, I_pad/2]``  ``shuffle_matrix_a`` rows
  ``w2_weight_scale``    F8_E4M3 ``[E, H_pad, I_pad/32]``  same rows, then the 128x4 swizzle
  ``w2_weight_bias``     F32 ``[E, H_pad]``  same rows (GPT-OSS)
  ``gemm1_alpha``, ``gemm1_beta``  F32 ``[E]``  GPT-OSS's SwiGLU 1.702 and 1.0 (absent for plain SwiGLU)
  ``gemm1_clamp_limit``  F32 ``[E]``  the SwiGLU limit (absent when the model has none)

Weights keep the source's dtype (GPT-OSS U8, DeepSeek-V4 I8) and scales are the E8M0 bytes in a
float8_e4m3fn container, as SGLang's parameters are, so an engine can ``copy_`` them byte for byte.
Each expert's 128x4-swizzled scales have exactly ``rows * K/32`` bytes (rows % 128 == 0 and
``K/32 % 4 == 0``), stored ``[E, rows, K/32]`` as SGLang reshapes them. Padding bytes are zero
(as SGLang's zero-initialised GPT-OSS buffers); sources whose engine path does not pad (DeepSeek-V4)
must have H and I multiples of the padding multiples. ``--flashinfer-layout`` (the SM90 interleave)
does not apply.
"""

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputTensor
from moebake.convert.targets.mxfp4_layers import Bake, plan_layers, restore_layer
from moebake.errors import MoebakeError
from moebake.formats.safetensors_file import DTYPES
from moebake.layouts.block_scale_swizzle import swizzle_128x4, unswizzle_128x4
from moebake.layouts.gate_up import merge_pairs, pad_to, split_pairs
from moebake.layouts.trtllm_gen import EPILOGUE_TILE_M, shuffle_rows, unshuffle_rows

NAME = "sm100-trtllm"
LAYOUT_VERSION = 1  # bump when the bytes this target writes change for the same options
USES_FLASHINFER_SM90_LAYOUT = False  # --flashinfer-layout (the SM90 fp4 interleave version) does not apply
SOURCE_FORMATS = ("gpt-oss", "deepseek-v4")
SCALE_DTYPE = "F8_E4M3"  # container dtype of the E8M0 scale bytes (what trtllm_fp4_block_scale_moe takes)


def _w13(gate: torch.Tensor, up: torch.Tensor, half_shape: tuple[int, ...]) -> torch.Tensor:
    """(gate, up) ``[e, I, ...]`` -> ``[e, 2*I_pad, ...]``: each half zero-padded, rows (up_i, gate_i), shuffled."""
    return shuffle_rows(merge_pairs(pad_to(up, half_shape), pad_to(gate, half_shape)), EPILOGUE_TILE_M)


def _swizzled(scales: torch.Tensor) -> torch.Tensor:
    """Row-ordered linear scales ``[e, rows, K/32]`` -> 128x4-swizzled bytes, kept as ``[e, rows, K/32]``."""
    return swizzle_128x4(scales).reshape(scales.shape)


def _constants(model, experts: int) -> list[Bake]:
    """Per-expert SwiGLU parameters SGLang registers for this path: alpha/beta for GPT-OSS's SwiGLU, the limit."""
    activation = model.activation()
    values = {"gemm1_clamp_limit": activation["limit"]}
    if activation["kind"] == "swiglu_oai":
        values = {"gemm1_alpha": activation["alpha"], "gemm1_beta": activation["beta"], **values}
    return [Bake(name, None, "F32", (experts,), lambda value=value: torch.full((experts,), value, dtype=torch.float32))
            for name, value in values.items() if value is not None]


def plan(model, options: ConvertOptions) -> tuple[list[OutputTensor], list[dict]]:
    """Output tensors and per-layer manifest records for every MoE layer of an MXFP4 model."""
    if model.format_name not in SOURCE_FORMATS:
        raise MoebakeError(f"target {NAME} does not support source format {model.format_name}")
    weight_dtype = model.expert_sources(model.layers[0])["w13_weight"].source_dtype

    def bakes(dims: dict) -> list[Bake]:
        E, Hp, Ip = dims["experts"], dims["hidden_padded"], dims["intermediate_padded"]
        return [
            Bake("w13_weight", "w13_weight", weight_dtype, (E, 2 * Ip, Hp // 2),
                 lambda gate, up: _w13(gate, up, (Ip, Hp // 2)), "up_gate_pairs"),
            Bake("w13_weight_scale", "w13_scale", SCALE_DTYPE, (E, 2 * Ip, Hp // 32),
                 lambda gate, up: _swizzled(_w13(gate, up, (Ip, Hp // 32))), "up_gate_pairs"),
            Bake("w13_weight_bias", "w13_bias", "F32", (E, 2 * Ip),
                 lambda gate, up: _w13(gate.float(), up.float(), (Ip,)), "up_gate_pairs"),
            Bake("w2_weight", "w2_weight", weight_dtype, (E, Hp, Ip // 2),
                 lambda down: shuffle_rows(pad_to(down, (Hp, Ip // 2)), EPILOGUE_TILE_M)),
            Bake("w2_weight_scale", "w2_scale", SCALE_DTYPE, (E, Hp, Ip // 32),
                 lambda down: _swizzled(shuffle_rows(pad_to(down, (Hp, Ip // 32)), EPILOGUE_TILE_M))),
            Bake("w2_weight_bias", "w2_bias", "F32", (E, Hp),
                 lambda down: shuffle_rows(pad_to(down.float(), (Hp,)), EPILOGUE_TILE_M)),
            *_constants(model, E),
        ]

    return plan_layers(model, options, bakes, {"epilogue_tile_m": EPILOGUE_TILE_M}, NAME)


def _unw13(w13: torch.Tensor, half_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`_w13`: ``[e, 2*I_pad, ...]`` -> (gate, up) cropped to ``half_shape``."""
    up, gate = split_pairs(unshuffle_rows(w13, EPILOGUE_TILE_M))
    crop = (slice(None),) + tuple(slice(0, n) for n in half_shape)
    return gate[crop], up[crop]


def _unswizzled(baked: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_swizzled` (any one-byte container dtype) -> uint8 ``[e, rows, K/32]``."""
    e, rows, cols = baked.shape
    return unswizzle_128x4(baked.contiguous().view(torch.uint8).reshape(e, rows * cols), rows, cols)


def restore(record: dict, baked: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Exact inverse of :func:`plan` for one layer and any run of experts ``[e, ...]`` of the baked tensors.

    Returns ``{source tensor name or per-expert pattern: [e, ...]}`` holding the source's bytes.
    Padding, the per-expert constants and the F32 biases' low bits (narrowed back to the source
    dtype here) are left to the forward re-bake check, which sees every byte. ``layout`` does not apply.
    """
    H, I = record["hidden"], record["intermediate"]
    canonical = {
        "w13_weight": _unw13(baked["w13_weight"].view(torch.uint8), (I, H // 2)),
        "w13_weight_scale": _unw13(_unswizzled(baked["w13_weight_scale"]), (I, H // 32)),
        "w2_weight": (unshuffle_rows(baked["w2_weight"].view(torch.uint8), EPILOGUE_TILE_M)[:, :H, : I // 2],),
        "w2_weight_scale": (unshuffle_rows(_unswizzled(baked["w2_weight_scale"]), EPILOGUE_TILE_M)[:, :H, : I // 32],),
    }
    if "w13_weight_bias" in record["tensors"]:
        bias_dtype = DTYPES[record["tensors"]["w13_weight_bias"]["source_dtype"]][0]
        gate, up = _unw13(baked["w13_weight_bias"], (I,))
        canonical["w13_weight_bias"] = (gate.to(bias_dtype), up.to(bias_dtype))
        down = unshuffle_rows(baked["w2_weight_bias"], EPILOGUE_TILE_M)[:, :H]
        canonical["w2_weight_bias"] = (down.to(bias_dtype),)
    return restore_layer(record, canonical)
