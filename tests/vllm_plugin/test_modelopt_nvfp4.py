"""The vLLM plugin on a ``cutedsl`` ModelOpt NVFP4 bake (``--engine vllm``), inside the real vLLM 0.33.0 Python
package on CPU, the platform answering as a Blackwell GPU (SM100) with FlashInfer's CuteDSL MoE available.

The MoE layers vLLM builds (its ``FusedMoEFactory``, as its DeepSeek model does) get the moebake NVFP4 method;
after the moebake loader and the post-load step (also in pre-processed mode), every parameter equals what
stock vLLM holds after converting the *source* (``vllm_oracle.modelopt_nvfp4_cutedsl``), per EP rank; the
post-load step builds vLLM's CuteDSL kernel; each refusal is one line.
"""

from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
import torch

from conftest import load_all
from engine_oracles import standins, vllm_oracle
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import MoebakeError
from moebake.reference.synthetic_sources import MODELOPT_MISMATCHES, write_modelopt_nvfp4
from vllm_plugin.conftest import baked_for_vllm, build_model, experts_of, load, moebake_config, refusal
from vllm_plugin.conftest import post_load as vllm_post_load

EXPERTS, HIDDEN, INTERMEDIATE, MOE_LAYERS = 4, 384, 128, (1, 2)  # H pads to 512 (from vLLM 0.32.0; before, not at all)
BAKE = ConvertOptions("cutedsl", engine=vllm_oracle.ENGINE, gate_up_globals="keep")


def write_source(directory: Path) -> Path:
    return write_modelopt_nvfp4(
        directory, num_layers=3, num_experts=EXPERTS, hidden=HIDDEN, intermediate=INTERMEDIATE, mismatches=MODELOPT_MISMATCHES
    )


@pytest.fixture(scope="module")
def stock(source):
    """Stock vLLM's converted parameters of each MoE layer of the source."""
    return {
        index: vllm_oracle.modelopt_nvfp4_cutedsl(source, f"model.layers.{index}.mlp.experts.", EXPERTS, HIDDEN, INTERMEDIATE)
        for index in MOE_LAYERS
    }


@pytest.fixture(scope="module")
def bake(source, stock):
    """The source baked for the vLLM under test: its ``serves`` names SGLang (which pads no NVFP4 H) exactly where stock
    vLLM's own conversion pads no H either."""
    unpadded = all(stock[index]["hidden_dim"] == HIDDEN for index in MOE_LAYERS)
    return baked_for_vllm(source, "out", BAKE, ["sglang"] if unpadded else [])


@contextmanager
def blackwell(directory, *, moe_backend="flashinfer_cutedsl", capability=100, tensor_parallel=(1, 0), expert_parallel=False):
    import vllm.model_executor.layers.fused_moe.experts.flashinfer_cutedsl_moe as cutedsl_experts

    with (
        vllm_oracle.vllm_engine(
            vllm_oracle.hf_config_of(directory),
            None,
            moe_backend=moe_backend,
            capability=capability,
            tensor_parallel=tensor_parallel,
            expert_parallel=expert_parallel,
        ) as vllm_config,
        mock.patch.object(cutedsl_experts, "has_flashinfer_cutedsl_moe_nvfp4", lambda: True),
        standins.cutedsl_utils(),
    ):
        yield vllm_config


def build(directory, *, load_format="moebake", **engine):
    """vLLM's MoE layers (``model.layers.N.mlp.experts``) of the bake at ``directory`` in a Spy model."""
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory

    class Block(torch.nn.Module):
        def __init__(self, index, vllm_config):
            super().__init__()
            self.mlp = torch.nn.Module()
            self.mlp.experts = FusedMoEFactory(
                num_experts=EXPERTS,
                top_k=2,
                hidden_size=HIDDEN,
                intermediate_size=INTERMEDIATE,
                quant_config=vllm_config.quant_config,
                prefix=f"model.layers.{index}.mlp.experts",
                params_dtype=torch.bfloat16,
            )

    def blocks(vllm_config):
        holder = torch.nn.Module()
        holder.layers = torch.nn.ModuleList([Block(i, vllm_config) if i in MOE_LAYERS else torch.nn.Identity() for i in range(3)])
        return holder

    return build_model(blackwell(directory, **engine), directory, blocks, load_format=load_format)


def post_load(model, directory, pre_processed=False):
    """vLLM's own post-load driver over ``model`` on the Blackwell platform."""
    vllm_post_load(model, blackwell(directory), pre_processed)


def test_loaded_parameters_equal_stock_vllm(bake, stock):
    """Every parameter of every layer, after the moebake loader: stock vLLM's converted bytes, at its dtypes and shapes."""
    model, _ = build(bake)
    load(bake, model)
    for index in MOE_LAYERS:
        params = dict(experts_of(model, index).named_parameters())
        expected = {name: t for name, t in stock[index].items() if isinstance(t, torch.Tensor)}
        assert set(params) == set(expected)
        for name, tensor in expected.items():
            got = params[name].data
            assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), name
            assert torch.equal(got.view(torch.uint8), tensor.view(torch.uint8)), (index, name)
    files = load_all(bake)
    baked = {name for name in files if name.startswith(tuple(f"model.layers.{i}.mlp.experts." for i in MOE_LAYERS))}
    assert set(model.handed) == set(files) - baked  # the rest (dense MLP, shared experts, MTP layer) goes to the model


@pytest.mark.parametrize("pre_processed", [False, True])
def test_post_load_step_only_builds_the_kernel(bake, stock, pre_processed):
    """vLLM's post-load driver: no weight changes; the CuteDSL kernel is built over the parameters, and its own
    set-up (the input scales multiplied into the weight globals) gives what it gives in stock vLLM."""
    model, _ = build(bake)
    load(bake, model)
    post_load(model, bake, pre_processed)
    for index in MOE_LAYERS:
        experts = experts_of(model, index)
        assert type(experts.quant_method.moe_kernel.fused_experts).__name__ == "FlashInferCuteDSLExperts"
        padded = (stock[index]["hidden_dim"], stock[index]["intermediate_size_per_partition"])
        assert (experts.moe_config.hidden_dim, experts.moe_config.intermediate_size_per_partition) == padded
        assert experts.moe_config.hidden_dim_unpadded == HIDDEN
        for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale", "w13_input_scale"):
            assert torch.equal(getattr(experts, name).data.view(torch.uint8), stock[index][name].view(torch.uint8)), name
        fused = stock[index]["w13_weight_scale_2"] * stock[index]["w13_input_scale"]
        assert torch.equal(experts.w13_weight_scale_2.data, fused)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_ep_rank_holds_its_slice(bake, stock, rank):
    """EP 2: rank r holds experts [2r, 2r+2), stock vLLM's rows of them, and the scalars over every expert."""
    model, _ = build(bake, tensor_parallel=(2, rank), expert_parallel=True)
    load(bake, model)
    for index in MOE_LAYERS:
        experts = experts_of(model, index)
        assert experts.moe_config.moe_parallel_config.ep_size == 2
        for name, parameter in experts.named_parameters():
            want = stock[index][name][2 * rank : 2 * rank + 2]
            assert parameter.shape == want.shape and torch.equal(parameter.data.view(torch.uint8), want.view(torch.uint8)), name


def test_a_bake_without_hidden_padding_serves_both_engines(tmp_path):
    """H a multiple of 256 and gate/up globals that agree: the default (SGLang 0.5.23) bake lists vLLM 0.33.0 in ``serves``."""
    source = write_modelopt_nvfp4(tmp_path / "src", num_layers=2, num_experts=EXPERTS, hidden=256, intermediate=64, mismatches=())
    manifest = convert(source, tmp_path / "out", ConvertOptions("cutedsl"), progress=False).to_json()
    assert [(e["name"], e["exact"]) for e in manifest["serves"]] == [("vllm", True)]


# --- refusals: one line each -------------------------------------------------------------------------


def test_refuses_a_gpu_that_is_not_blackwell(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake, capability=90)
    assert "compute capability 9.0" in refusal(excinfo) and "Blackwell (SM100)" in refusal(excinfo)


def test_refuses_another_moe_backend(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake, moe_backend="flashinfer_cutlass")
    assert "--moe-backend flashinfer_cutedsl" in refusal(excinfo)


def test_refuses_moe_tensor_parallelism(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake, tensor_parallel=(2, 0))
    assert "MoE tensor parallelism (2)" in refusal(excinfo)


def test_refuses_a_bake_with_shared_gate_up_globals(source, tmp_path):
    """moebake's default shares differing gate/up globals: not vLLM's bytes, and the refusal says how to re-bake."""
    out = tmp_path / "shared"
    convert(source, out, ConvertOptions("cutedsl", engine=vllm_oracle.ENGINE), progress=False)
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(out)
    installed = __import__("vllm").__version__
    assert "global scales shared" in refusal(excinfo) and f"--engine vllm=={installed} --gate-up-globals keep" in refusal(excinfo)


def test_refuses_a_config_that_disagrees_with_the_manifest(bake):
    hf_config = vllm_oracle.hf_config_of(bake)
    hf_config.hidden_size = 512
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(bake, hf_config)
    assert "config.json and the manifest disagree" in refusal(excinfo)


def test_refuses_unloaded_parameters(bake):
    model, _ = build(bake)
    with pytest.raises(MoebakeError) as excinfo:
        post_load(model, bake)
    assert "was never loaded" in refusal(excinfo)
