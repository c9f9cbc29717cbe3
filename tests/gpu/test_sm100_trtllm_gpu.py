"""``sm100-trtllm`` bytes vs FlashInfer's CUDA-only helpers, as SGLang's older SM100 path called them.

For every expert, FlashInfer's ``shuffle_matrix_a`` (weights) and ``shuffle_matrix_sf_a`` (the
same row shuffle, then the CUDA ``block_scale_interleave``) are run on the GPU on the
``reorder_rows_for_gated_act_gemm`` of ``[up; gate]`` (W13) or on the down projection (W2), built
here from the source tensors read with safetensors, and compared with the baked bytes. The helpers
JIT-build for the GPU present; an SM100 GPU is not needed (the trtllm-gen kernels are not run).
Skipped without CUDA or FlashInfer.
"""

import pytest
import torch

from conftest import load_all
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import write_deepseek_v4
from moebake.synthetic import write_gpt_oss

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def flashinfer():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return pytest.importorskip("flashinfer")


def gpt_oss_halves(src, prefix, e, H, I, Hp, Ip):
    """(W13 [up; gate] each padded to Ip rows, W2) for weights and scales of expert ``e``, uint8: weights with
    zeros, scales with 127 (E8M0 2^0, SGLang 0.5.23's SM100 scale buffers)."""

    def padded(x, rows, cols, fill=0):
        out = torch.full((rows, cols), fill, dtype=torch.uint8)
        out[: x.shape[0], : x.shape[1]] = x
        return out

    blocks = src[prefix + "gate_up_proj_blocks"][e].reshape(2 * I, H // 2)
    scales = src[prefix + "gate_up_proj_scales"][e]
    w13 = torch.cat([padded(blocks[1::2], Ip, Hp // 2), padded(blocks[0::2], Ip, Hp // 2)])
    s13 = torch.cat([padded(scales[1::2], Ip, Hp // 32, 127), padded(scales[0::2], Ip, Hp // 32, 127)])
    w2 = padded(src[prefix + "down_proj_blocks"][e].reshape(H, I // 2), Hp, Ip // 2)
    s2 = padded(src[prefix + "down_proj_scales"][e], Hp, Ip // 32, 127)
    return w13, s13, w2, s2


def dsv4_halves(src, prefix, e):
    def raw(name):
        return src[f"{prefix}{e}.{name}"].view(torch.uint8)

    return (
        torch.cat([raw("w3.weight"), raw("w1.weight")]),
        torch.cat([raw("w3.scale"), raw("w1.scale")]),
        raw("w2.weight"),
        raw("w2.scale"),
    )


def check_layer(flashinfer, baked, prefix, experts, halves):
    from flashinfer.fused_moe.core import reorder_rows_for_gated_act_gemm

    for e in range(experts):
        w13, s13, w2, s2 = halves(e)
        expected = {
            "w13_weight": flashinfer.shuffle_matrix_a(reorder_rows_for_gated_act_gemm(w13).cuda(), 128),
            "w13_weight_scale": flashinfer.shuffle_matrix_sf_a(reorder_rows_for_gated_act_gemm(s13).cuda(), 128),
            "w2_weight": flashinfer.shuffle_matrix_a(w2.cuda(), 128),
            "w2_weight_scale": flashinfer.shuffle_matrix_sf_a(s2.cuda(), 128),
        }
        for short, tensor in expected.items():
            got = baked[prefix + short][e].view(torch.uint8).reshape(-1)
            assert torch.equal(got, tensor.cpu().view(torch.uint8).reshape(-1)), (prefix, short, e)


def test_gpt_oss_padded_equals_cuda_helpers(flashinfer, tmp_path):
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=3, hidden=160, intermediate=96, vocab=32)
    convert(source, tmp_path / "out", ConvertOptions("sm100-trtllm"), progress=False)
    src, baked = load_all(source), load_all(tmp_path / "out")
    prefix = "model.layers.0.mlp.experts."
    check_layer(flashinfer, baked, prefix, 3, lambda e: gpt_oss_halves(src, prefix, e, 160, 96, 256, 128))


def test_deepseek_v4_equals_cuda_helpers(flashinfer, tmp_path):
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, hidden=512, intermediate=256, mtp_layers=0)
    convert(source, tmp_path / "out", ConvertOptions("sm100-trtllm"), progress=False)
    src, baked = load_all(source), load_all(tmp_path / "out")
    prefix = "layers.0.ffn.experts."
    check_layer(flashinfer, baked, prefix, 3, lambda e: dsv4_halves(src, prefix, e))
