"""vLLM serving a bake on an SM90 GPU: the moebake plugin against stock vLLM, same FlashInfer CUTLASS path.

A GPT-OSS layer (H = I = 2880, padded by vLLM to 2944) is prepared two ways with vLLM 0.33.0's Python code
(``--moe-backend flashinfer_cutlass``, ``GptOssMxfp4MoEMethod`` with ``FLASHINFER_CUTLASS_MXFP4_BF16``):

* stock: vLLM's GPT-OSS loader on the *source*, the layer moved to the GPU, vLLM's
  ``process_weights_after_loading`` there (its weight conversion, FlashInfer's CUDA
  ``interleave_moe_weights_for_sm90_mixed_gemm`` included, then the kernel set-up);
* plugin: ``--quantization moebake --load-format moebake``: the plugin's method, the moebake loader copying
  the *bake*, the layer moved to the GPU, vLLM's post-load step (kernel set-up only).

Then (1) the plugin's parameters equal stock vLLM's byte for byte, (2) both layers' vLLM ``FlashInferExperts``
(the modular kernel's experts, whose ``apply`` calls FlashInfer's ``cutlass_fused_moe`` with vLLM's
arguments) give bit-identical outputs on the same routed tokens, (3) the output is close to a float32 reference
of the source's experts, (4) the start-up of both (build + load + post-load, synchronised) is printed.

What is not vLLM's: vLLM's compiled extension is not installed (built for torch 2.14; the device has 2.11),
so the platform is vLLM's CPU platform told it is an SM90 GPU (``vllm_oracle.vllm_engine``), routing is
``torch.topk`` (vLLM's router calls its CUDA ops), and activations are zero-padded to vLLM's hidden size here
(its prepare step does that). FlashInfer's kernels come from moebake's reduced fused-MoE module. Skipped
without an SM90 GPU, FlashInfer or the vllm package. Run by ``bin/gpu-harness vllm``.
"""

import os
import time
from unittest import mock

import pytest
import torch
from test_sm90_serve import dequantized_reference  # GPT-OSS's MoE in float32 from the source's experts

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.synthetic import write_gpt_oss

pytestmark = pytest.mark.gpu

SHAPE = {"num_experts": int(os.environ.get("MOEBAKE_GPU_VLLM_EXPERTS", "8")), "hidden": 2880, "intermediate": 2880}
TOP_K = 4
DEVICE = "cuda"


@pytest.fixture(scope="module")
def oracle(sm90_gpu):
    vllm_oracle = pytest.importorskip("engine_oracles.vllm_oracle")
    if not vllm_oracle.vllm_installed():
        pytest.skip("vllm 0.33.0 is not installed (bin/gpu-wheels --vllm, carry .whl-vllm)")
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    return vllm_oracle


@pytest.fixture(scope="module")
def bake(tmp_path_factory, oracle):
    root = tmp_path_factory.mktemp("vllm-gpu")
    source = write_gpt_oss(root / "src", num_layers=2, vocab=64, seed=3, **SHAPE)
    convert(source, root / "out", ConvertOptions("sm90-cutlass", engine="vllm"), progress=False)
    return source, root / "out"


def stock_layer(oracle, source):
    """Stock vLLM's layer 0 on the GPU (timed)."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    experts = oracle.gpt_oss_stock_experts(source, 0, DEVICE)
    torch.cuda.synchronize()
    return experts, time.perf_counter() - began


def plugin_layer(oracle, out):
    """The plugin's layer 0 (vLLM's MoE blocks over the bake, the moebake loader), on the GPU (timed)."""
    import json
    from types import SimpleNamespace

    from vllm.config.load import LoadConfig
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.model_loader import get_model_loader

    torch.cuda.synchronize()
    began = time.perf_counter()
    hf_config = oracle.hf_config_of(out)
    quantization = json.loads((out / "config.json").read_text())["quantization_config"]
    with oracle.vllm_engine(hf_config, None) as vllm_config:
        vllm_config.quant_config = get_quantization_config("moebake").from_config(quantization)
        vllm_config.quant_config.maybe_update_config(str(out), hf_config=hf_config)
        vllm_config.load_config = LoadConfig(load_format="moebake")
        holder = oracle.gpt_oss_holder(vllm_config, [0])

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = holder

            def load_weights(self, weights):  # the rest of the checkpoint: GPT-OSS's attention etc. (not built here)
                return {name for name, _ in weights}

        model = Model()
        get_model_loader(vllm_config.load_config).load_weights(model, SimpleNamespace(model=str(out), revision=None))
        experts = holder.layers[0].mlp.experts.routed_experts
        experts.to(DEVICE)
        experts.quant_method.process_weights_after_loading(experts)
    torch.cuda.synchronize()
    return experts, time.perf_counter() - began


def on_cpu(fused) -> None:
    """Move to the GPU the small tensors vLLM's kernel set-up made on its platform's device (the CPU platform
    here, which stands in for CUDA): the per-expert SwiGLU constants of the quant config, the same for both layers."""
    for holder in (fused, fused.quant_config):
        for name, value in list(vars(holder).items()):
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                setattr(holder, name, value.to(DEVICE))


def forward(oracle, experts, x, ids, weights):
    """vLLM's ``FlashInferExperts.apply`` of the layer's kernel (FlashInfer ``cutlass_fused_moe``) on routed tokens."""
    import vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe as vllm_experts

    from moebake.serve.flashinfer_ops import sm90_moe_ops

    fused = experts.quant_method.moe_kernel.fused_experts
    assert type(fused).__name__ == "FlashInferExperts"
    on_cpu(fused)
    padded = experts.w2_weight.shape[1]
    hidden = torch.nn.functional.pad(x, (0, padded - x.shape[1]))
    output = torch.empty(x.shape[0], padded, dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad(), mock.patch.object(vllm_experts, "flashinfer_cutlass_fused_moe", sm90_moe_ops().cutlass_fused_moe):
        fused.apply(output, hidden, experts.w13_weight, experts.w2_weight, weights, ids.to(torch.int32), experts.activation,
                    SHAPE["num_experts"], None, None, None, None, None, None, False)
    torch.cuda.synchronize()
    return output[:, :x.shape[1]]


def test_plugin_equals_stock_vllm_on_flashinfer_cutlass(oracle, bake):
    source, out = bake
    stock_layer(oracle, source)  # warm-up: CUDA context, kernels loaded, allocator
    plugin_layer(oracle, out)
    stock, stock_seconds = stock_layer(oracle, source)
    plugin, plugin_seconds = plugin_layer(oracle, out)

    stock_params = dict(stock.named_parameters())
    assert set(dict(plugin.named_parameters())) == set(stock_params)
    for name, tensor in plugin.named_parameters():
        reference_param = stock_params[name]
        assert (tensor.dtype, tensor.shape, tensor.device.type) == (reference_param.dtype, reference_param.shape, "cuda"), name
        assert torch.equal(tensor.view(torch.uint8), reference_param.view(torch.uint8)), f"{name} differs from stock vLLM's"
    assert plugin.w2_weight.shape[1] == 2944

    g = torch.Generator(device=DEVICE).manual_seed(0)
    for tokens in (1, 37, 512):
        x = torch.randn(tokens, SHAPE["hidden"], generator=g, device=DEVICE).to(torch.bfloat16)
        weights, ids = torch.topk(torch.softmax(torch.randn(tokens, SHAPE["num_experts"], generator=g, device=DEVICE), -1), TOP_K)
        weights = weights / weights.sum(-1, keepdim=True)
        ours, theirs = forward(oracle, plugin, x, ids, weights), forward(oracle, stock, x, ids, weights)
        assert ours.shape == (tokens, SHAPE["hidden"]) and ours.abs().max() > 0
        assert torch.equal(ours, theirs), f"{tokens} tokens: plugin output differs from stock vLLM's"
        want = dequantized_reference(source, SHAPE, x, ids, weights)
        relative = ((ours.float() - want).norm() / want.norm()).item()
        print(f"\n{tokens} tokens: plugin == stock vLLM bit for bit; relative L2 error vs float32 reference {relative:.2e}")
        assert relative < 3e-2
    print(f"\nstart-up of one GPT-OSS layer through vLLM (E={SHAPE['num_experts']}, H=I=2880): stock vLLM {stock_seconds:.3f} s, "
          f"moebake plugin {plugin_seconds:.3f} s, ratio stock/plugin {stock_seconds / plugin_seconds:.2f}")
