"""The SGLang-way baseline's preparation on CPU, with CPU stand-ins for FlashInfer's CUDA weight interleave.

On the GPU it runs with FlashInfer's own kernel (tests/gpu/test_sm90_serve.py); here the stand-in is
the independent kernel emulation, so the de-interleave, [up; gate] stacking, padding and slicing
of the baseline are checked against what moebake baked and serves, without a GPU.
"""

from types import SimpleNamespace

import pytest
import torch

import moebake.serve
from engine_oracles import sglang_baseline
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.serve import Platform
from moebake.synthetic import write_gpt_oss
from tests.kernel_emulation import kernel_interleave_v2

SHAPE = {"num_layers": 1, "num_experts": 4, "hidden": 160, "intermediate": 96, "vocab": 64}


@pytest.mark.parametrize("ep_rank, ep_size", [(0, 1), (1, 2)])
def test_prepared_like_sglang_equals_served(tmp_path, monkeypatch, ep_rank, ep_size):
    fold = pytest.importorskip("flashinfer.fused_moe").interleave_moe_scales_for_sm90_mixed_gemm
    stand_ins = SimpleNamespace(interleave_weights=lambda w, quant_type: kernel_interleave_v2(w), interleave_scales=fold)
    monkeypatch.setattr(sglang_baseline, "sm90_moe_ops", lambda: stand_ins)
    source = write_gpt_oss(tmp_path / "src", **SHAPE)
    convert(source, tmp_path / "out", ConvertOptions(target="sm90-cutlass"), progress=False)
    served = (
        moebake.serve.open(tmp_path / "out", platform=Platform(flashinfer_version="0.7.2.post1"))
        .load_experts(0, device="cpu", ep_rank=ep_rank, ep_size=ep_size)
        .parameters()
    )
    per_rank = SHAPE["num_experts"] // ep_size
    loaded = sglang_baseline.load_source_experts(source, 0, ep_rank * per_rank, (ep_rank + 1) * per_rank, "cpu")
    prepared = sglang_baseline.prepare_like_sglang(loaded, hidden_padded=256, intermediate_padded=128)
    assert sorted(prepared) == sorted(served)
    for name, tensor in prepared.items():
        assert tensor.dtype == served[name].dtype and torch.equal(tensor.reshape(served[name].shape), served[name]), name
        assert tensor.shape == served[name].shape, name
