"""The vLLM engine profile against vLLM 0.33.0's own code: a bake equals vLLM's post-load parameters byte for byte.

The oracle (``tests/engine_oracles/vllm_oracle.py``) builds vLLM's real GPT-OSS MoE block with the
method vLLM picks for ``--moe-backend flashinfer_cutlass`` on SM90, loads the *source* checkpoint
with vLLM's own GPT-OSS loader and runs its ``process_weights_after_loading`` on CPU.
"""

import pytest
import torch

from conftest import load_all
from kernel_emulation import kernel_interleave_v1, kernel_interleave_v2
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.synthetic import write_gpt_oss

vllm_oracle = pytest.importorskip("engine_oracles.vllm_oracle")
if not vllm_oracle.vllm_installed():
    pytest.skip(f"vllm {vllm_oracle.VLLM_VERSION} is not installed (bin/setup installs it)", allow_module_level=True)

KERNELS = {"v2": kernel_interleave_v2, "v1": kernel_interleave_v1}
VLLM_NAMES = {"w13_bias": "w13_weight_bias", "w2_bias": "w2_weight_bias"}


# H a multiple of 256: no hidden padding, so the bytes do not depend on the padding's fill or multiple
# (what the default engine profile chooses); padded hidden sizes are checked with the vLLM profile.
@pytest.mark.parametrize("hidden, intermediate", [(256, 96), (512, 64)])
def test_gpt_oss_flashinfer_cutlass_equals_vllm(tmp_path, hidden, intermediate):
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=intermediate, vocab=32)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm90-cutlass", engine="vllm"), progress=False)
    assert manifest["engine"]["name"] == "vllm" and manifest["engine"]["exact"] is True
    engine = vllm_oracle.gpt_oss_flashinfer_cutlass(source, 0, KERNELS["v2"])
    baked = load_all(tmp_path / "out")
    assert len(engine) == 6
    for name, expected in engine.items():
        got = baked["model.layers.0.mlp.experts." + VLLM_NAMES.get(name, name)]
        assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
        assert torch.equal(got.view(torch.uint8), expected.contiguous().view(torch.uint8)), f"{name} differs from vLLM's"
