"""What the vLLM GPU tests share (``test_vllm_plugin_gpu.py``: GPT-OSS, ``test_vllm_plugin_dsv4_gpu.py``: DeepSeek-V4).

Each test prepares one MoE layer twice with vLLM 0.33.0's Python code (stock vLLM on the source, the moebake
plugin on the bake), each ending with vLLM's ``process_weights_after_loading`` on the GPU. Here:
:func:`prepared` (a warm-up run of each, then both timed, then every parameter compared byte for byte) and
:func:`assert_forwards_equal` (both layers' vLLM ``FlashInferExperts.apply`` on the same routed tokens, bit for bit,
and close to a float32 reference). The fixture giving the vLLM oracle with moebake's plugin loaded is
``vllm_on_sm90`` (``tests/conftest.py``).
"""

import time

import torch

from conftest import assert_parameters_equal

DEVICE = "cuda"


def timed(prepare):
    """``prepare()`` and the seconds it took, the GPU synchronised before and after."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    result = prepare()
    torch.cuda.synchronize()
    return result, time.perf_counter() - began


def prepared(stock_layer, plugin_layer):
    """(stock layer, plugin layer, stock seconds, plugin seconds): each prepared once to warm up (CUDA context,
    kernels loaded, allocator), then once timed; every parameter of the plugin's layer is on the GPU and equal to
    stock vLLM's byte for byte, and it has no other."""
    stock_layer()
    plugin_layer()
    (stock, stock_seconds), (plugin, plugin_seconds) = timed(stock_layer), timed(plugin_layer)
    assert_parameters_equal(plugin, stock, "stock vLLM's")
    assert {p.device.type for p in plugin.parameters()} == {"cuda"}
    return stock, plugin, stock_seconds, plugin_seconds


def constants_to_gpu(fused) -> None:
    """Move to the GPU the small tensors vLLM's kernel set-up made on its platform's device (the CPU platform
    here, which stands in for CUDA): the per-expert SwiGLU constants of the experts, the same for both layers."""
    for holder in (fused, fused.quant_config):
        for name, value in list(vars(holder).items()):
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                setattr(holder, name, value.to(DEVICE))


def forward(experts, x, ids, weights):
    """vLLM's ``FlashInferExperts.apply`` of the layer's kernel (FlashInfer ``cutlass_fused_moe`` of moebake's reduced
    module) on routed tokens (``vllm_oracle.flashinfer_experts_apply``), the kernel's constants moved to the GPU first."""
    from engine_oracles.vllm_oracle import flashinfer_experts_apply
    from moebake.serve.flashinfer_ops import sm90_moe_ops

    constants_to_gpu(experts.quant_method.moe_kernel.fused_experts)
    output = flashinfer_experts_apply(experts, x, ids, weights, sm90_moe_ops().cutlass_fused_moe)
    torch.cuda.synchronize()
    return output


def assert_forwards_equal(
    plugin, stock, reference, *, hidden: int, num_experts: int, top_k: int, scale: float = 1.0, bound: float = 3e-2
) -> None:
    """At 1, 37 and 512 tokens (hidden states ``scale`` x N(0, 1) in bf16, ``top_k`` of ``num_experts`` experts by a
    softmax of random logits, weights renormalised): the plugin's output equals stock vLLM's bit for bit, and is within
    relative L2 error ``bound`` of ``reference(x, ids, weights)`` (float32)."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for tokens in (1, 37, 512):
        x = (torch.randn(tokens, hidden, generator=g, device=DEVICE) * scale).to(torch.bfloat16)
        weights, ids = torch.topk(torch.softmax(torch.randn(tokens, num_experts, generator=g, device=DEVICE), -1), top_k)
        weights = weights / weights.sum(-1, keepdim=True)
        ours, theirs = forward(plugin, x, ids, weights), forward(stock, x, ids, weights)
        assert ours.shape == (tokens, hidden) and ours.abs().max() > 0
        assert torch.equal(ours, theirs), f"{tokens} tokens: plugin output differs from stock vLLM's"
        want = reference(x, ids, weights)
        relative = ((ours.float() - want).norm() / want.norm()).item()
        print(f"\n{tokens} tokens: plugin == stock vLLM bit for bit; relative L2 error vs float32 reference {relative:.2e}")
        assert relative < bound
