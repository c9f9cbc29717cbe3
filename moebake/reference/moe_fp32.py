"""An fp32 MoE layer computed from the SOURCE checkpoint, and reproducible decode-step inputs, to check a runtime against.

:func:`source_moe_fp32` reads one layer's BF16 experts from the Hugging Face source (fused
``gate_up_proj`` or per-expert tensors, through :mod:`moebake.formats.bf16_moe`) and computes

    ``out[t] = sum_j w[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))``,  ``e = topk_ids[t, j] >= 0``

in fp32 from the BF16 weights and inputs, with no intermediate rounding: what the baked path must
reproduce to BF16 accuracy. :func:`decode_inputs` makes one rank's hidden states and routing,
including tokens that select fewer than ``top_k`` experts (``-1`` ids) and one that selects none.
"""

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from moebake.errors import MoebakeError
from moebake.formats.bf16_moe import open_model
from moebake.formats.checkpoint import open_checkpoint


@dataclass(frozen=True)
class SourceExperts:
    """One layer's experts from the source: ``gate_up`` BF16 ``[E, 2I, H]`` (``[gate; up]``), ``down`` BF16 ``[E, H, I]``."""

    gate_up: torch.Tensor
    down: torch.Tensor


def read_source_experts(source: str | os.PathLike, prefix: str) -> SourceExperts:
    """All experts of the source layer whose tensors start with ``prefix`` (``...mlp.experts.``), on CPU."""
    model = open_model(open_checkpoint(source))
    layer = next((layer for layer in model.layers if layer.prefix == prefix), None)
    if layer is None:
        raise MoebakeError(
            f"{source}: no BF16 MoE layer with prefix {prefix!r} (layers: {', '.join(layer.prefix for layer in model.layers)})"
        )
    E = model.num_experts
    checkpoint = model.checkpoint
    gate_up = torch.cat([checkpoint.read_experts(name, 0, E) for name in layer.gate_up], 1)
    return SourceExperts(gate_up, checkpoint.read_experts(layer.down, 0, E))


def moe_fp32(experts: SourceExperts, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """``[T, H]`` fp32 MoE output of ``hidden [T, H]`` routed by ``topk_ids`` / ``topk_weights [T, k]``,
    computed on ``hidden``'s device in fp32 (weights upcast from BF16; nothing rounded in between)."""
    device = hidden.device
    x = hidden.float()
    out = torch.zeros_like(x)
    I = experts.down.shape[2]
    ids, weights = topk_ids.long().to(device), topk_weights.float().to(device)
    for e in torch.unique(ids[ids >= 0]).tolist():
        token, choice = (ids == e).nonzero(as_tuple=True)
        gate_up = x[token] @ experts.gate_up[e].to(device).float().T
        y = (F.silu(gate_up[:, :I]) * gate_up[:, I:]) @ experts.down[e].to(device).float().T
        out.index_add_(0, token, y * weights[token, choice][:, None])
    return out


def source_moe_fp32(
    source: str | os.PathLike, prefix: str, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """:func:`moe_fp32` with the experts of layer ``prefix`` read from source checkpoint ``source``."""
    return moe_fp32(read_source_experts(source, prefix), hidden, topk_ids, topk_weights)


def relative_l2(got: torch.Tensor, expected: torch.Tensor) -> float:
    """``||got - expected|| / ||expected||`` in fp64 (0 when both are zero)."""
    got, expected = got.double(), expected.double().to(got.device)
    norm = float(expected.norm())
    diff = float((got - expected).norm())
    return diff / norm if norm else diff


def decode_inputs(
    num_tokens: int, hidden: int, num_experts: int, top_k: int, seed: int, device: torch.device | str = "cpu", drop: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One rank's decode-step inputs: ``(hidden BF16 [T, H], topk_ids int64 [T, k], topk_weights fp32 [T, k])``.

    Each token picks ``top_k`` distinct experts uniformly; weights are a softmax over its choices.
    With ``drop``, every third token (t = 1, 4, ...) keeps only its first ``ceil(k/2)`` choices and
    token 2 (if any) none: their other ids are ``-1`` (and their weights 0). Reproducible from
    ``seed`` on any device (drawn on CPU).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=g).to(torch.bfloat16)
    topk_ids = torch.rand(num_tokens, num_experts, generator=g).argsort(dim=1)[:, :top_k]
    topk_weights = torch.softmax(torch.randn(num_tokens, top_k, generator=g), dim=1)
    if drop:
        keep = torch.full((num_tokens,), top_k)
        keep[1::3] = -(-top_k // 2)
        if num_tokens > 2:
            keep[2] = 0
        dropped = torch.arange(top_k)[None, :] >= keep[:, None]
        topk_ids = topk_ids.masked_fill(dropped, -1)
        topk_weights = topk_weights.masked_fill(dropped, 0.0)
    return x.to(device), topk_ids.to(device), topk_weights.to(device)
