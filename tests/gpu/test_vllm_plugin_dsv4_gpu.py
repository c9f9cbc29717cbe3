"""vLLM serving a DeepSeek-V4 ``sm90-cutlass`` bake on an SM90 GPU: the moebake plugin against stock vLLM, same
FlashInfer CUTLASS path.

A DeepSeek-V4-sized expert layer (DeepSeek-V4-Pro's H = 7168, I = 3072, neither padded by vLLM; 8 experts, or
``MOEBAKE_GPU_VLLM_DSV4_EXPERTS``; the SwiGLU limit 10 of config.json) of a synthetic checkpoint
(``moebake.reference.synthetic_sources.write_deepseek_v4``) is prepared two ways with vLLM 0.33.0's Python code
(``--moe-backend flashinfer_cutlass``: ``DeepseekV4FP8Config`` gives the experts the generic ``Mxfp4MoEMethod`` with
``FLASHINFER_CUTLASS_MXFP4_BF16``):

* stock (``vllm_oracle.deepseek_v4_stock_experts``): vLLM's ``FusedMoEFactory`` experts, the *source*'s experts through
  the parameters' weight loaders as vLLM's DeepSeek-V4 loader hands them, the layer moved to the GPU, vLLM's
  ``process_weights_after_loading`` there (``convert_weight_to_mxfp4_moe_kernel_format``: the ``[w3; w1]`` swap,
  FlashInfer's CUDA ``interleave_moe_weights_for_sm90_mixed_gemm`` and its scale interleave; then the kernel set-up);
* plugin (``served_experts`` of ``tests/vllm_plugin/test_deepseek_v4.py``): ``--quantization moebake --load-format moebake``:
  vLLM's own DeepSeek-V4 MoE block (``DeepseekV4MoE``) with the plugin's method, the moebake loader copying the
  *bake*, the routed experts moved to the GPU, the method's post-load step there (kernel set-up only).

Then (1) the plugin's parameters equal stock vLLM's byte for byte, (2) both layers' vLLM ``FlashInferExperts``
(whose ``apply`` calls FlashInfer's ``cutlass_fused_moe`` with vLLM's arguments: no biases, the per-expert SwiGLU
limit) give bit-identical outputs on the same routed tokens, (3) the output is close to a float32 reference of the
source's experts (``test_sm90_deepseek_v4.dequantized_reference``: ``silu(min(x w1^T, L)) * clamp(x w3^T, -L, L)
@ w2^T``; hidden states 2 x N(0, 1), so that the clamps act), (4) the start-up of both is printed (not like for
like: the plugin's builds the whole block and reads the whole checkpoint, stock's the routed experts only). Both preparations
run on the CPU too, the device being the CPU and FlashInfer's weight interleave its CPU emulation
(``test_vllm_plugin_dsv4.test_the_gpu_tests_preparation_on_the_cpu``); only the GPU post-load and the forward are
this test's own.

What is not vLLM's: vLLM's compiled extension is not installed, so the platform is vLLM's CPU platform told it is
an SM90 GPU (``vllm_oracle.vllm_engine``); the FP8 linear kernel of the block's shared experts (not under test) is
stood in for by one whose set-up does nothing (``test_vllm_plugin_dsv4.engine``); routing is ``torch.topk`` of a
softmax (DeepSeek-V4's router and the routed scaling factor, applied outside the experts, are not run).
FlashInfer's kernels come from moebake's reduced fused-MoE module. Skipped without an SM90 GPU, FlashInfer or the
vllm package. Prepared, not yet run on a GPU; run by ``bin/gpu-harness vllm``.
"""

import os

import pytest
from test_sm90_deepseek_v4 import dequantized_reference  # DeepSeek-V4's routed experts in float32 from the source's
from vllm_gpu import DEVICE, assert_forwards_equal, prepared

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import write_deepseek_v4
from vllm_plugin.test_deepseek_v4 import served_experts

pytestmark = pytest.mark.gpu

SHAPE = {"num_experts": int(os.environ.get("MOEBAKE_GPU_VLLM_DSV4_EXPERTS", "8")), "hidden": 7168, "intermediate": 3072}
TOP_K = 4
INPUT_SCALE = 2.0  # gate and up pre-activations ~N(0, 8^2) with the synthetic experts: the limit 10 clamps a good share
PREFIX = "layers.0.ffn.experts."


@pytest.fixture(scope="module")
def bake(tmp_path_factory, vllm_on_sm90):
    root = tmp_path_factory.mktemp("vllm-dsv4-gpu")
    source = write_deepseek_v4(root / "src", num_layers=1, mtp_layers=0, seed=5, **SHAPE)
    convert(source, root / "out", ConvertOptions("sm90-cutlass", engine="vllm"), progress=False)
    return source, root / "out"


def test_deepseek_v4_plugin_equals_stock_vllm_on_flashinfer_cutlass(vllm_on_sm90, bake):
    source, out = bake
    stock, plugin, stock_seconds, plugin_seconds = prepared(
        lambda: vllm_on_sm90.deepseek_v4_stock_experts(
            source, PREFIX, SHAPE["num_experts"], SHAPE["hidden"], SHAPE["intermediate"], DEVICE
        ),
        lambda: served_experts(out, 0, DEVICE),
    )
    assert plugin.quant_method.mxfp4_backend.value == "FLASHINFER_CUTLASS_MXFP4_BF16"
    assert plugin.w2_weight.shape[1] == SHAPE["hidden"]  # not padded
    assert_forwards_equal(
        plugin,
        stock,
        lambda x, ids, weights: dequantized_reference(source, SHAPE, x, ids, weights),
        hidden=SHAPE["hidden"],
        num_experts=SHAPE["num_experts"],
        top_k=TOP_K,
        scale=INPUT_SCALE,
    )
    print(
        f"\nstart-up of one DeepSeek-V4 expert layer through vLLM (E={SHAPE['num_experts']}, H=7168, I=3072): stock vLLM "
        f"{stock_seconds:.3f} s (the routed experts alone), moebake plugin {plugin_seconds:.3f} s (the whole MoE block: "
        "router and FP8 shared experts too, the rest of the checkpoint read)"
    )
