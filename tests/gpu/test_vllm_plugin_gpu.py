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

import pytest
import torch
from test_sm90_serve import dequantized_reference  # GPT-OSS's MoE in float32 from the source's experts
from vllm_gpu import DEVICE, assert_forwards_equal, prepared

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.synthetic import write_gpt_oss

pytestmark = pytest.mark.gpu

SHAPE = {"num_experts": int(os.environ.get("MOEBAKE_GPU_VLLM_EXPERTS", "8")), "hidden": 2880, "intermediate": 2880}
TOP_K = 4


@pytest.fixture(scope="module")
def bake(tmp_path_factory, vllm_on_sm90):
    root = tmp_path_factory.mktemp("vllm-gpu")
    source = write_gpt_oss(root / "src", num_layers=2, vocab=64, seed=3, **SHAPE)
    convert(source, root / "out", ConvertOptions("sm90-cutlass", engine="vllm"), progress=False)
    return source, root / "out"


def plugin_layer(oracle, out):
    """The plugin's layer 0 (vLLM's MoE blocks over the bake, the moebake loader), moved to the GPU, post-loaded there."""
    import json
    from types import SimpleNamespace

    from vllm.config.load import LoadConfig
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.model_loader import get_model_loader

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
    return experts


def test_plugin_equals_stock_vllm_on_flashinfer_cutlass(vllm_on_sm90, bake):
    source, out = bake
    stock, plugin, stock_seconds, plugin_seconds = prepared(
        lambda: vllm_on_sm90.gpt_oss_stock_experts(source, 0, DEVICE), lambda: plugin_layer(vllm_on_sm90, out)
    )
    assert plugin.w2_weight.shape[1] == 2944
    assert_forwards_equal(
        plugin,
        stock,
        lambda x, ids, weights: dequantized_reference(source, SHAPE, x, ids, weights),
        hidden=SHAPE["hidden"],
        num_experts=SHAPE["num_experts"],
        top_k=TOP_K,
    )
    print(
        f"\nstart-up of one GPT-OSS layer through vLLM (E={SHAPE['num_experts']}, H=I=2880): stock vLLM {stock_seconds:.3f} s, "
        f"moebake plugin {plugin_seconds:.3f} s, ratio stock/plugin {stock_seconds / plugin_seconds:.2f}"
    )
