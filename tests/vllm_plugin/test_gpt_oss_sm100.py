"""The vLLM plugin serving a GPT-OSS ``sm100-trtllm`` bake (``--moe-backend flashinfer_trtllm`` on Blackwell), run inside
the real vLLM 0.33.0 package on CPU with the platform told it is an SM100 GPU.

vLLM's GPT-OSS MoE blocks are built over the bake (``tests/vllm_plugin/conftest.py``'s helpers), loaded by the plugin and
run through vLLM's post-load driver; every parameter then equals stock vLLM's conversion of the source
(``vllm_oracle.gpt_oss_sm100_trtllm``: ``GptOssMxfp4MoEMethod``, ``FLASHINFER_TRTLLM_MXFP4_BF16``), on one GPU and per
EP rank. vLLM's trtllm-gen kernel set-up (``make_mxfp4_moe_kernel``) asks for a CUDA device: it is recorded, not run
(the oracle does not run it either).
"""

from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from engine_oracles import vllm_oracle
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.engines.vllm.bake import GPT_OSS_SM100
from moebake.errors import MoebakeError
from moebake.synthetic import write_gpt_oss
from vllm_plugin.conftest import build_gpt_oss, experts_of, load, moebake_config, refusal
from vllm_plugin.conftest import post_load as vllm_post_load

EXPERTS, HIDDEN, INTERMEDIATE = 4, 160, 96  # pads to 256, 128 (I to 256 before vLLM 0.27.0)
SM100 = {"capability": 100, "moe_backend": "flashinfer_trtllm"}


def parameter_names() -> dict[str, str]:
    """Baked tensor short name -> vLLM parameter name (the installed vLLM's: read when a test runs, so that this module
    is collected without vLLM)."""
    return GPT_OSS_SM100.parameter_names


BAKE, SERVES = ConvertOptions("sm100-trtllm", engine=vllm_oracle.ENGINE), []


def write_source(directory: Path) -> Path:
    return write_gpt_oss(directory, num_layers=2, num_experts=EXPERTS, hidden=HIDDEN, intermediate=INTERMEDIATE, vocab=32)


@pytest.fixture(scope="module")
def stock(source):
    """Stock vLLM's converted parameters of each GPT-OSS layer of the source on SM100 (the oracle)."""
    layers = {layer: vllm_oracle.gpt_oss_sm100_trtllm(source, layer) for layer in (0, 1)}
    for params in layers.values():  # H and I padded (by how much, to 128 or 256, is the release's)
        hidden, intermediate = params.pop("hidden_dim"), params.pop("intermediate_size_per_partition")
        assert hidden == 256 and intermediate > INTERMEDIATE and intermediate % 128 == 0
    return layers


@contextmanager
def kernel_builds_recorded():
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4

    built = []
    kernel = SimpleNamespace(fused_experts=SimpleNamespace(process_weights_after_loading=lambda layer: None))
    with mock.patch.object(mxfp4, "make_mxfp4_moe_kernel", lambda **kwargs: built.append(kwargs) or kernel):
        yield built


def post_load(model, vllm_config, pre_processed=False):
    """vLLM's post-load driver on SM100, the trtllm-gen kernel builds recorded; returns them."""
    with kernel_builds_recorded() as built:
        vllm_post_load(model, vllm_oracle.vllm_engine(vllm_config.model_config.hf_config, vllm_config.quant_config, **SM100), pre_processed)
    return built


@pytest.mark.parametrize("pre_processed", [False, True])
def test_served_parameters_equal_stock_vllms_conversion_of_the_source(bake, stock, pre_processed):
    model, vllm_config = build_gpt_oss(bake, **SM100)
    load(bake, model)
    built = post_load(model, vllm_config, pre_processed)
    assert len(built) == 2 and all(b["mxfp4_backend"].value == "FLASHINFER_TRTLLM_MXFP4_BF16" for b in built)
    for layer in (0, 1):
        experts = experts_of(model, layer)
        params = dict(experts.named_parameters())
        assert sorted(params) == sorted(stock[layer]) == sorted(parameter_names().values())
        for name, expected in stock[layer].items():
            got = params[name].data
            assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"layer {layer} {name} differs"


@pytest.mark.parametrize("rank", [0, 1])
def test_each_ep_rank_holds_stock_vllms_parameters_of_its_experts(bake, stock, rank):
    model, vllm_config = build_gpt_oss(bake, tensor_parallel=(2, rank), expert_parallel=True, **SM100)
    load(bake, model)
    post_load(model, vllm_config)
    for layer in (0, 1):
        for name, expected in stock[layer].items():
            got, want = getattr(experts_of(model, layer), name).data, expected[2 * rank : 2 * rank + 2]
            assert got.shape == want.shape and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (rank, name)


def test_the_swiglu_constants_are_not_handed_to_the_model(bake):
    model, _ = build_gpt_oss(bake, **SM100)
    load(bake, model)
    assert not [name for name in model.handed if ".mlp.experts." in name]


def test_an_unpadded_sglang_bake_serves_vllm_too(tmp_path):
    # I 256: a multiple of what every release pads I to (128; 256 before vLLM 0.27.0), so no engine pads anything.
    source = write_gpt_oss(tmp_path / "src", num_layers=2, num_experts=EXPERTS, hidden=256, intermediate=256, vocab=32)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm100-trtllm"), progress=False)
    assert manifest.engine.name == "sglang" and [e.name for e in manifest.serves] == ["vllm"]
    model, vllm_config = build_gpt_oss(tmp_path / "out", **SM100)
    load(tmp_path / "out", model)
    post_load(model, vllm_config)
    expected = vllm_oracle.gpt_oss_sm100_trtllm(source, 1)
    for name in parameter_names().values():
        assert torch.equal(getattr(experts_of(model, 1), name).data.view(torch.uint8), expected[name].view(torch.uint8)), name


def test_refuses_a_padded_sglang_bake(source, tmp_path):
    """SGLang's bake leaves 127 in the scales' padding where vLLM has zeros: not vLLM's bytes."""
    out = tmp_path / "sglang"
    convert(source, out, ConvertOptions("sm100-trtllm"), progress=False)
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(out)
    assert "baked for sglang 0.5.23" in refusal(excinfo) and "--target sm100-trtllm --engine vllm" in refusal(excinfo)


def test_refuses_a_hopper_gpu(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build_gpt_oss(bake, capability=90, moe_backend="flashinfer_trtllm")
    assert "compute capability 9.0" in refusal(excinfo) and "SM100" in refusal(excinfo)


def test_refuses_another_moe_backend(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build_gpt_oss(bake, capability=100, moe_backend="marlin")
    assert "FLASHINFER_TRTLLM_MXFP4_BF16" in refusal(excinfo) and "--moe-backend flashinfer_trtllm" in refusal(excinfo)
