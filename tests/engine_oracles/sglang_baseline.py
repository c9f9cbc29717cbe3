"""The SGLang way: GPT-OSS source experts prepared on the GPU at load time with FlashInfer's helpers.

This is what moebake replaces, kept as the oracle of the GPU tests (baked bytes and outputs must
equal it bit for bit) and the baseline of ``bench/serve_bench.py``. It follows SGLang 0.5.23
(``Mxfp4MoEMethod._process_weights_for_sm90_cutlass`` and ``_fused_experts_flashinfer_mxfp4_cutlass``,
see ``sglang-consumers.md`` §1.3-1.6), written independently of moebake's layout code:

1. load: the rank's contiguous experts of the six source tensors, to the GPU;
2. W13 weights/scales/bias: de-interleave the pairs (even row = gate, odd row = up), write
   ``[up; gate]`` with each half zero-padded to ``I_pad`` rows (and K padded to ``H_pad``: zero
   weights, 127 scales);
3. W2 weights/scales/bias: pad to ``[H_pad, I_pad]`` (hidden rows of the scales 127, the rest zero);
4. ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")`` (CUDA kernel) and
   ``interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32)``;
5. forward: pad the input to ``H_pad``, ``cutlass_fused_moe(..., use_w4_group_scaling=True)`` with
   ``quant_scales=[s13.view(int32), s2.view(int32)]``, GPT-OSS ``swiglu_alpha=1.702``,
   ``swiglu_beta=1.0``, ``swiglu_limit=config.swiglu_limit``, then trim the output to ``H``.

SGLang 0.5.23 rounds GPT-OSS's hidden size to a multiple of 256 (3072) before creating its buffers,
whose scales start at 127 (E8M0 1.0) and keep it in the hidden padding; here the padded sizes are
parameters (a baked checkpoint's: 3072 by default, the same).
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from moebake.formats.safetensors_file import read_header
from moebake.schema.index import read_index
from moebake.serve.flashinfer_ops import sm90_moe_ops

SOURCE_SUFFIXES = (
    "gate_up_proj_blocks",
    "gate_up_proj_scales",
    "gate_up_proj_bias",
    "down_proj_blocks",
    "down_proj_scales",
    "down_proj_bias",
)
GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_BETA = 1.702, 1.0  # SGLang's GPT-OSS defaults


def load_source_experts(source_dir, layer: int, start: int, stop: int, device) -> dict[str, torch.Tensor]:
    """Experts ``[start, stop)`` of GPT-OSS layer ``layer``'s six expert tensors, on ``device``.

    Keys are the source suffixes (``gate_up_proj_blocks``, ...); shapes and dtypes as stored.
    """
    source_dir = Path(source_dir)
    weight_map = read_index(source_dir).weight_map
    out = {}
    for suffix in SOURCE_SUFFIXES:
        name = f"model.layers.{layer}.mlp.experts.{suffix}"
        out[suffix] = read_header(source_dir / weight_map[name]).read_rows(name, start, stop).to(device)
    return out


def _stack_up_gate(pairs: torch.Tensor, padded_rows: int, padded_cols: int) -> torch.Tensor:
    """SGLang's ``_stack_up_gate_w13``: ``[E, 2I, K]`` pair rows -> ``[E, 2*padded_rows, padded_cols]``
    as ``[up; gate]``, each half zero-padded (rows and columns at their ends)."""
    gate, up = pairs[:, 0::2], pairs[:, 1::2]
    rows, cols = gate.shape[1], gate.shape[2]
    out = torch.zeros(pairs.shape[0], 2 * padded_rows, padded_cols, dtype=pairs.dtype, device=pairs.device)
    out[:, :rows, :cols] = up
    out[:, padded_rows : padded_rows + rows, :cols] = gate
    return out


def _pad_last_two(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.zeros(x.shape[0], rows, cols, dtype=x.dtype, device=x.device)
    out[:, : x.shape[1], : x.shape[2]] = x
    return out


def _in_scale_buffer(scales: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The scales as SGLang's loader leaves them: copied into a ``[E, *shape]`` buffer created full of
    127 (``_UE8M0_ONE``, E8M0 1.0) that holds the hidden size padded to 256."""
    out = torch.full((scales.shape[0], *shape), 127, dtype=scales.dtype, device=scales.device)
    out[:, : scales.shape[1], : scales.shape[2]] = scales
    return out


def prepare_like_sglang(source: dict[str, torch.Tensor], *, hidden_padded: int, intermediate_padded: int) -> dict[str, torch.Tensor]:
    """The six SGLang parameters (``w13_weight``, ...) from :func:`load_source_experts`' tensors, on their device."""
    ops = sm90_moe_ops()
    blocks13 = source["gate_up_proj_blocks"]
    E, two_i = blocks13.shape[:2]
    blocks2 = source["down_proj_blocks"]
    H = blocks2.shape[1]
    Hp, Ip = hidden_padded, intermediate_padded
    w13 = _stack_up_gate(blocks13.reshape(E, two_i, -1), Ip, Hp // 2)
    s13 = _stack_up_gate(_in_scale_buffer(source["gate_up_proj_scales"], (two_i, Hp // 32)), Ip, Hp // 32)
    b13 = _stack_up_gate(source["gate_up_proj_bias"].unsqueeze(-1), Ip, 1).squeeze(-1)
    w2 = _pad_last_two(blocks2.reshape(E, H, -1), Hp, Ip // 2)
    s2 = _pad_last_two(_in_scale_buffer(source["down_proj_scales"], (Hp, source["down_proj_scales"].shape[2])), Hp, Ip // 32)
    b2 = torch.zeros(E, Hp, dtype=torch.bfloat16, device=blocks2.device)
    b2[:, :H] = source["down_proj_bias"]
    return {
        "w13_weight": ops.interleave_weights(w13, "fp4"),
        "w13_weight_scale": ops.interleave_scales(s13, group_size=32),
        "w13_weight_bias": b13,
        "w2_weight": ops.interleave_weights(w2, "fp4"),
        "w2_weight_scale": ops.interleave_scales(s2, group_size=32),
        "w2_weight_bias": b2,
    }


def gpt_oss_swiglu(num_experts: int, swiglu_limit: float, device) -> dict[str, torch.Tensor]:
    """SGLang's per-expert fp32 ``swiglu_alpha/beta/limit [E]`` for GPT-OSS (made once, at load)."""
    values = {"swiglu_alpha": GPT_OSS_SWIGLU_ALPHA, "swiglu_beta": GPT_OSS_SWIGLU_BETA, "swiglu_limit": swiglu_limit}
    return {name: torch.full((num_experts,), value, dtype=torch.float32, device=device) for name, value in values.items()}


def sglang_moe_forward(
    params: dict[str, torch.Tensor],
    swiglu: dict[str, torch.Tensor],
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    ep_rank: int = 0,
    ep_size: int = 1,
) -> torch.Tensor:
    """SGLang's ``_fused_experts_flashinfer_mxfp4_cutlass`` call on :func:`prepare_like_sglang`'s parameters
    and :func:`gpt_oss_swiglu`'s tensors: pad to ``H_pad``, ``cutlass_fused_moe``, trim to ``H``."""
    H, Hp = hidden_states.shape[1], params["w2_weight"].shape[1]
    x = F.pad(hidden_states, (0, Hp - H))
    out = torch.empty(hidden_states.shape[0], Hp, dtype=torch.bfloat16, device=hidden_states.device)
    sm90_moe_ops().cutlass_fused_moe(
        input=x,
        token_selected_experts=topk_ids.to(torch.int32),
        token_final_scales=topk_weights,
        fc1_expert_weights=params["w13_weight"],
        fc2_expert_weights=params["w2_weight"],
        output_dtype=torch.bfloat16,
        quant_scales=[params["w13_weight_scale"].view(torch.int32), params["w2_weight_scale"].view(torch.int32)],
        input_sf=None,
        fc1_expert_biases=params["w13_weight_bias"],
        fc2_expert_biases=params["w2_weight_bias"],
        **swiglu,
        tp_size=1,
        tp_rank=0,
        ep_size=ep_size,
        ep_rank=ep_rank,
        use_w4_group_scaling=True,
        output=out,
    )
    return out[:, :H].contiguous()
