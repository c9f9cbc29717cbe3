"""The vLLM engine profile against vLLM 0.33.0's own code: a bake equals vLLM's post-load parameters byte for byte.

The oracle (``tests/engine_oracles/vllm_oracle.py``) builds vLLM's real GPT-OSS MoE block with the
method vLLM picks for ``--moe-backend flashinfer_cutlass`` on SM90, loads the *source* checkpoint
with vLLM's own GPT-OSS loader and runs its ``process_weights_after_loading`` on CPU
(``tests/test_engine_profiles.py`` checks that every verified profile entry has such a test).
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
def _assert_bake_equals_vllm(out, layer_prefix, engine_params, parameter_names):
    baked = load_all(out)
    by_engine_name = {engine: short for short, engine in parameter_names.items()}
    assert len(engine_params) == 6
    for name, expected in engine_params.items():
        got = baked[layer_prefix + by_engine_name.get(name, name)]
        assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
        assert torch.equal(got.view(torch.uint8), expected.contiguous().view(torch.uint8)), f"{name} differs from vLLM's"


@pytest.mark.parametrize("hidden, intermediate", [
    (160, 96),     # pads H 160 -> 256, I 96 -> 128 (zeros)
    (2880, 128),   # GPT-OSS's H: 2880 -> 2944 (vLLM pads to 128, SGLang to 256)
    (256, 64),     # no hidden padding: the same bytes as SGLang 0.5.23's, so the bake serves both
])
def test_gpt_oss_flashinfer_cutlass_equals_vllm(tmp_path, hidden, intermediate):
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=intermediate, vocab=32)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm90-cutlass", engine="vllm"), progress=False)
    engine_record = manifest["engine"]
    assert (engine_record["name"], engine_record["version"], engine_record["exact"]) == ("vllm", "0.33.0", True)
    assert engine_record["parameter_names"] == {"w13_weight_bias": "w13_bias", "w2_weight_bias": "w2_bias"}
    engine = vllm_oracle.gpt_oss_flashinfer_cutlass(source, 0, KERNELS["v2"])
    _assert_bake_equals_vllm(tmp_path / "out", "model.layers.0.mlp.experts.", engine, engine_record["parameter_names"])
    served = [(e["name"], e["version"]) for e in manifest["serves"]]
    assert served == ([("sglang", "0.5.23")] if hidden % 256 == 0 else [])


def test_sglang_bake_of_an_unpadded_hidden_size_serves_vllm_too(tmp_path):
    """The other direction: the default (SGLang) profile's bake lists vLLM when its bytes are vLLM's."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=256, intermediate=96, vocab=32)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm90-cutlass"), progress=False)
    assert manifest["engine"]["name"] == "sglang"
    assert [(e["name"], e["exact"], e["parameter_names"]) for e in manifest["serves"]] == [
        ("vllm", True, {"w13_weight_bias": "w13_bias", "w2_weight_bias": "w2_bias"})]
    engine = vllm_oracle.gpt_oss_flashinfer_cutlass(source, 0, KERNELS["v2"])
    _assert_bake_equals_vllm(tmp_path / "out", "model.layers.0.mlp.experts.", engine, manifest["serves"][0]["parameter_names"])
