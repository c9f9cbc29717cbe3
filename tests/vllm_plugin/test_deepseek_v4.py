"""The vLLM plugin serving a DeepSeek-V4 ``sm90-cutlass`` bake (and, below, ``sm100-trtllm`` and ``sm90-marlin``
bakes), run inside the real vLLM 0.33.0 package on CPU (``tests/engine_oracles/vllm_oracle.py`` makes the platform
answer as an SM90 GPU).

The module vLLM builds is its own DeepSeek-V4 MoE block (``vllm.models.deepseek_v4.nvidia.model.DeepseekV4MoE``,
what a CUDA worker builds at ``model.layers.N.ffn``: router, FP8 shared experts, ``FusedMoEFactory`` routed
experts), with the ``moebake`` quantization config made as vLLM makes it and handed the model's mappings by
vLLM's ``configure_quant_config``. After the plugin's loader and vLLM's post-load driver, every routed-expert
parameter equals stock vLLM's own preparation of the *source* (``vllm_oracle.deepseek_v4_flashinfer_cutlass``:
``DeepseekV4FP8Config`` -> ``Mxfp4MoEMethod``, the whole ``process_weights_after_loading``, FlashInfer's CUDA
weight interleave replaced by its proven CPU emulation), on one GPU and per EP rank; every other parameter of
the block is what stock vLLM creates for the source. One stand-in beyond the oracle's: vLLM's FP8 *linear*
kernel choice (``fp8.init_fp8_linear_kernel``, for the shared experts) finds no CPU kernel without AMX, and runs
after the parameters are created, so a kernel whose set-up does nothing stands in, for the stock build and the
plugin's alike (the shared experts' bytes are the source's, loaded by the model's own loader, not the plugin's).
"""

import inspect
import json
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from conftest import assert_parameters_equal, load_all
from engine_oracles import vllm_oracle
from kernel_emulation import gptq_marlin_repack_reference, kernel_interleave_here
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import MoebakeError
from moebake.reference.synthetic_sources import write_deepseek_v4
from vllm_plugin import conftest as plugin
from vllm_plugin.conftest import (
    baked_for_vllm,
    build_model,
    load,
    refusal,
    refusal_of_another_release,
    refusal_under_another_flashinfer_layout,
)

EXPERTS, HIDDEN, INTERMEDIATE, LAYERS = 4, 256, 128, 2
WEIGHTS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
BAKE, SERVES = ConvertOptions("sm90-cutlass", engine=vllm_oracle.ENGINE), ["sglang"]


def write_source(directory: Path, ignored_layers=None) -> Path:
    source = write_deepseek_v4(directory, num_layers=LAYERS, num_experts=EXPERTS, hidden=HIDDEN, intermediate=INTERMEDIATE, mtp_layers=1)
    if ignored_layers is not None:
        config = json.loads((source / "config.json").read_text())
        config["quantization_config"]["ignored_layers"] = ignored_layers
        (source / "config.json").write_text(json.dumps(config, indent=2))
    return source


@pytest.fixture(scope="module")
def stock(source):
    """Stock vLLM's post-load routed-expert parameters of each layer of the source (the oracle)."""
    return {
        layer: vllm_oracle.deepseek_v4_flashinfer_cutlass(
            source, f"layers.{layer}.ffn.experts.", EXPERTS, HIDDEN, INTERMEDIATE, kernel_interleave_here
        )
        for layer in range(LAYERS)
    }


def hf_config_of(directory: Path):
    """config.json as vLLM's hf_config (the synthetic checkpoint leaves out DeepSeek-V4's ``hidden_act: silu``)."""
    from transformers import PretrainedConfig

    config = PretrainedConfig(**json.loads((directory / "config.json").read_text()))
    config.hidden_act = "silu"
    return config


def moebake_config(directory: Path, hf_config=None):
    """The plugin's quantization config (:func:`vllm_plugin.conftest.moebake_config`) with this module's hf_config."""
    return plugin.moebake_config(directory, hf_config_of(directory) if hf_config is None else hf_config)


NO_FP8_LINEAR_KERNEL = SimpleNamespace(process_weights_after_loading=lambda layer: None)
"""Stands in for the FP8 linear kernel vLLM would pick for the shared experts (none on a CPU without AMX)."""


@contextmanager
def engine(hf_config, **kwargs):
    """vLLM's engine state (``vllm_oracle.vllm_engine``) with the FP8 linear kernel stood in for; before 0.29.0 vLLM's FP8
    linear method also asks a CUDA op whether CUTLASS block FP8 runs (``cutlass_block_fp8_supported``), answered no."""
    import vllm.model_executor.layers.quantization.fp8 as fp8

    with (
        vllm_oracle.vllm_engine(hf_config, None, **kwargs) as vllm_config,
        mock.patch.object(fp8, "init_fp8_linear_kernel", lambda **_: NO_FP8_LINEAR_KERNEL),
        (
            mock.patch.object(fp8, "cutlass_block_fp8_supported", lambda: False)
            if hasattr(fp8, "cutlass_block_fp8_supported")
            else nullcontext()
        ),
    ):
        yield vllm_config


def deepseek_v4_blocks(vllm_config) -> torch.nn.Module:
    """vLLM's DeepSeek-V4 MoE blocks at ``layers.N.ffn``, the quantization config first handed the model class's
    mappings as vLLM's ``configure_quant_config`` hands them."""
    from vllm.model_executor.model_loader.utils import configure_quant_config
    from vllm.models.deepseek_v4.nvidia.model import DeepseekV4ForCausalLM, DeepseekV4MoE

    configure_quant_config(vllm_config.quant_config, DeepseekV4ForCausalLM)
    config = vllm_config.model_config.hf_config
    # From 0.30.0 the block is told the model's hash-routed layers (num_hash_layers); before, it reads them from config.
    takes = inspect.signature(DeepseekV4MoE.__init__).parameters
    hash_layers = {"num_hash_layers": config.num_hash_layers} if "num_hash_layers" in takes else {}
    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList()
    for index in range(config.num_hidden_layers):
        block = torch.nn.Module()
        block.ffn = DeepseekV4MoE(vllm_config, prefix=f"model.layers.{index}.ffn", **hash_layers)
        holder.layers.append(block)
    return holder


def build(directory: Path, *, quant_config=None, hf_config=None, load_format="moebake", **kwargs):
    """vLLM's DeepSeek-V4 MoE blocks over ``directory`` (the plugin's config unless ``quant_config`` is given)."""
    hf_config = hf_config_of(directory) if hf_config is None else hf_config
    return build_model(
        engine(hf_config, **kwargs), directory, deepseek_v4_blocks, load_format=load_format, quant_config=quant_config, hf_config=hf_config
    )


def experts_of(model, layer):
    return plugin.experts_of(model, layer, "ffn")


def served_experts(directory: Path, layer: int, device: str):
    """The plugin's routed experts of ``layer`` as the GPU test prepares them (``tests/gpu/test_vllm_plugin_dsv4_gpu.py``,
    as vLLM's post-load driver treats a module on the GPU): vLLM's blocks over the bake, the moebake loader on the CPU,
    the experts moved to ``device``, then their method's ``process_weights_after_loading`` there."""
    model, vllm_config = build(directory)
    load(directory, model)
    experts = experts_of(model, layer)
    experts.to(device)
    with engine(vllm_config.model_config.hf_config):
        experts.quant_method.process_weights_after_loading(experts)
    return experts


def post_load(model, vllm_config, pre_processed=False):
    plugin.post_load(model, engine(vllm_config.model_config.hf_config), pre_processed)


@pytest.mark.parametrize("pre_processed", [False, True])
def test_served_parameters_equal_stock_vllms_preparation_of_the_source(bake, stock, pre_processed):
    """Loaded by the plugin, then vLLM's own post-load driver (also in pre-processed mode): each routed-expert
    parameter is stock vLLM's post-load parameter of the source, byte for byte, and vLLM's FlashInfer CUTLASS kernel
    is built over them."""
    from moebake.engines.vllm.quantization import MoebakeDeepseekV4Mxfp4MoEMethod

    model, vllm_config = build(bake)
    load(bake, model)
    post_load(model, vllm_config, pre_processed)
    for layer in range(LAYERS):
        experts = experts_of(model, layer)
        assert type(experts.quant_method) is MoebakeDeepseekV4Mxfp4MoEMethod
        params = dict(experts.named_parameters())  # layer 1's also holds the router's bias, which the model loads
        assert sorted(stock[layer]) == sorted(WEIGHTS)
        assert set(params) == {*WEIGHTS, *(["e_score_correction_bias"] if layer else [])}
        for name, expected in stock[layer].items():
            got = params[name].data
            assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
            assert torch.equal(got, expected), f"layer {layer} {name} differs from stock vLLM's"
        assert type(experts.quant_method.moe_kernel.fused_experts).__name__ == "FlashInferExperts"


def test_the_gpu_tests_preparation_on_the_cpu(bake, stock):
    """The GPU test's preparation (the plugin's layer moved, then post-loaded on the device: :func:`served_experts`)
    with the CPU as the device: every parameter is stock vLLM's, prepared the same way on the same device
    (``vllm_oracle.deepseek_v4_stock_experts``), byte for byte, and vLLM's FlashInfer CUTLASS experts are built."""
    experts = served_experts(bake, 0, "cpu")
    assert assert_parameters_equal(experts, stock[0], "stock vLLM's post-load parameters") == sorted(WEIGHTS)
    assert type(experts.quant_method.moe_kernel.fused_experts).__name__ == "FlashInferExperts"


def _same_argument(ours, theirs) -> bool:
    if isinstance(ours, torch.Tensor):
        return (
            isinstance(theirs, torch.Tensor)
            and (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
            and torch.equal(ours.reshape(-1).view(torch.uint8), theirs.reshape(-1).view(torch.uint8))
        )
    if isinstance(ours, (list, tuple)):
        return type(ours) is type(theirs) and len(ours) == len(theirs) and all(map(_same_argument, ours, theirs))
    return ours == theirs


def test_vllms_experts_hand_flashinfer_the_same_call_for_the_plugins_layer(source, bake):
    """The GPU test's forward up to FlashInfer's kernel, on the CPU (``vllm_oracle.flashinfer_experts_apply`` with a
    recorder for FlashInfer's ``cutlass_fused_moe``): vLLM's ``FlashInferExperts.apply`` of the plugin's layer hands
    the kernel the same call as stock vLLM's, every tensor byte for byte (the output buffer aside), and the call is
    DeepSeek-V4's: W4A16 group scaling, BF16 activations, no biases, SwiGLU with config.json's limit per expert."""
    with vllm_oracle.flashinfer_sm90_interleave(kernel_interleave_here):
        stock_experts = vllm_oracle.deepseek_v4_stock_experts(source, "layers.0.ffn.experts.", EXPERTS, HIDDEN, INTERMEDIATE, "cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, HIDDEN, generator=g).to(torch.bfloat16)
    weights, ids = torch.topk(torch.softmax(torch.randn(5, EXPERTS, generator=g), -1), 2)
    calls, plugin_experts = [], served_experts(bake, 0, "cpu")
    for experts in (plugin_experts, stock_experts):
        vllm_oracle.flashinfer_experts_apply(experts, x, ids, weights, lambda **kwargs: calls.append(kwargs))
    ours, theirs = ({name: value for name, value in call.items() if name != "output"} for call in calls)
    assert sorted(ours) == sorted(theirs)
    assert [name for name in ours if not _same_argument(ours[name], theirs[name])] == []
    assert torch.equal(ours["swiglu_limit"], torch.full((EXPERTS,), 10.0))
    assert (ours["swiglu_alpha"], ours["swiglu_beta"], ours["fc1_expert_biases"], ours["fc2_expert_biases"]) == (None,) * 4
    assert ours["use_w4_group_scaling"] and ours["input"].dtype == torch.bfloat16 and ours["input"].shape == (5, HIDDEN)
    assert ours["fc1_expert_weights"] is plugin_experts.w13_weight and ours["quant_scales"][1] is plugin_experts.w2_weight_scale


def assert_ep_rank_holds_stock_rows(bake, stock, rank, **flags):
    """EP 2 (``--enable-expert-parallel`` over 2 GPUs): rank ``rank`` holds experts [2r, 2r+2), each parameter equal
    to stock vLLM's post-load rows of those experts (``stock``: per layer, name -> tensor), dtype, shape and bytes."""
    model, vllm_config = build(bake, tensor_parallel=(2, rank), expert_parallel=True, **flags)
    load(bake, model)
    post_load(model, vllm_config)
    for layer in range(LAYERS):
        experts = experts_of(model, layer)
        assert experts.moe_config.moe_parallel_config.ep_size == 2
        for name, expected in stock[layer].items():
            got, want = getattr(experts, name).data, expected[2 * rank : 2 * rank + 2]
            assert (got.dtype, got.shape) == (want.dtype, want.shape), (rank, layer, name)
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (rank, layer, name)


@pytest.mark.parametrize("rank", [0, 1])
def test_each_ep_rank_holds_stock_vllms_parameters_of_its_experts(bake, stock, rank):
    assert_ep_rank_holds_stock_rows(bake, stock, rank)


def test_the_rest_goes_to_the_model_as_the_checkpoint_has_it(bake):
    model, _ = build(bake)
    load(bake, model)
    files, manifest = load_all(bake), json.loads((bake / "moebake.json").read_text())
    baked = {record["prefix"] + short for record in manifest["layers"] for short in record["tensors"]}
    assert {record["prefix"] for record in manifest["layers"]} == {"layers.0.ffn.experts.", "layers.1.ffn.experts.", "mtp.0.ffn.experts."}
    assert set(model.handed) == set(files) - baked
    for name, tensor in model.handed.items():
        assert torch.equal(tensor.view(torch.uint8), files[name].view(torch.uint8)), name


def test_every_other_parameter_is_what_stock_vllm_creates_for_the_source(tmp_path):
    """The router and FP8 shared experts get the source's DeepseekV4FP8Config, with the model's name mapper and fused-
    module mapping (configure_quant_config) and its weight_block_size (the shared experts' TP padding): an ignored
    fused shared-expert projection of the source (``layers.1.ffn.shared_experts.w1``/``w3``) stays BF16 in both."""
    from vllm.models.deepseek_v4.quant_config import DeepseekV4FP8Config

    source = write_source(tmp_path / "src", ignored_layers=["layers.1.ffn.shared_experts.w1", "layers.1.ffn.shared_experts.w3"])
    convert(source, tmp_path / "out", ConvertOptions("sm90-cutlass", engine=vllm_oracle.ENGINE), progress=False)
    original = json.loads((source / "config.json").read_text())["quantization_config"]
    # DeepseekV4MLP pads the shared experts' intermediate to whole weight_block_size blocks per TP rank: as a worker
    # of TP 2 sizes it (128 -> 256), where the config has a block size.
    with mock.patch("vllm.models.deepseek_v4.nvidia.model.get_tensor_model_parallel_world_size", lambda: 2):
        plugin, _ = build(tmp_path / "out")
        stock_model, _ = build(tmp_path / "out", quant_config=DeepseekV4FP8Config.from_config(original))

    def others(model):
        return {n: (p.dtype, tuple(p.shape)) for n, p in model.named_parameters() if ".routed_experts." not in n}

    assert others(plugin) == others(stock_model)
    shared = "model.layers.{}.ffn.shared_experts.gate_up_proj.weight"
    assert others(plugin)[shared.format(0)][0] == torch.float8_e4m3fn and shared.format(0) + "_scale_inv" in others(plugin)
    from vllm.models.deepseek_v4.nvidia.model import DeepseekV4ForCausalLM

    if "gate_up_proj" in getattr(DeepseekV4ForCausalLM, "packed_modules_mapping", {}):  # (before 0.29.0 vLLM maps no fused
        # projection to its parts: the source's ignore does not reach gate_up_proj, in stock vLLM as in the plugin)
        assert others(plugin)[shared.format(1)][0] != torch.float8_e4m3fn and shared.format(1) + "_scale_inv" not in others(plugin)
    assert plugin.model.layers[0].ffn.shared_experts.down_proj.weight.shape == (HIDDEN, 2 * INTERMEDIATE)


# --- refusals: one line each -------------------------------------------------------------------------


def test_refuses_a_gpu_that_is_not_sm90(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake, capability=100)
    assert "compute capability 10.0" in refusal(excinfo) and "SM90" in refusal(excinfo)


def test_refuses_another_vllm_version(bake, monkeypatch):
    """The plugin's private vLLM names are proven for the matrix's releases: another is refused in one line."""
    refusal_of_another_release(bake, build, monkeypatch)


def test_refuses_another_moe_backend(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake, moe_backend="marlin")
    assert "--moe-backend flashinfer_cutlass" in refusal(excinfo)


def test_refuses_another_load_format(bake):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake, load_format="auto")
    assert "--load-format moebake" in refusal(excinfo)


@pytest.mark.parametrize(
    "key, value, says",
    [
        ("moe_intermediate_size", 2 * INTERMEDIATE, "'intermediate': 128"),
        ("n_routed_experts", 2 * EXPERTS, "'experts': 4"),
        ("hidden_size", 2 * HIDDEN, "hidden size 256"),
        ("swiglu_limit", 7.0, "SwiGLU limit 10.0"),
        ("architectures", ["DeepseekV3ForCausalLM"], "DeepseekV4ForCausalLM"),
    ],
)
def test_refuses_a_config_that_disagrees_with_the_manifest(bake, key, value, says):
    hf_config = hf_config_of(bake)
    setattr(hf_config, key, value)
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(bake, hf_config)
    assert says in refusal(excinfo)


def test_refuses_the_mtp_draft_model(bake):
    """vLLM's speculative config builds DeepSeek-V4's MTP draft with architectures [DeepSeekV4MTPModel] and the same
    quantization: the plugin serves the main model only and says so."""
    hf_config = hf_config_of(bake)
    hf_config.architectures = ["DeepSeekV4MTPModel"]
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(bake, hf_config)
    assert "MTP draft model" in refusal(excinfo) and "without MTP speculative decoding" in refusal(excinfo)


def test_refuses_fp8_experts_by_config(bake):
    """config.json saying ``expert_dtype: fp8`` makes DeepseekV4FP8Config give the experts Fp8MoEMethod: not the bake's."""
    hf_config = hf_config_of(bake)
    hf_config.expert_dtype = "fp8"
    with pytest.raises(MoebakeError) as excinfo:
        build(bake, hf_config=hf_config)
    assert "Fp8MoEMethod" in refusal(excinfo) and "Mxfp4MoEMethod" in refusal(excinfo)


def test_refuses_a_manifest_changed_after_baking(bake, tmp_path):
    from moebake.schema.manifest import write_manifest

    directory = Path(shutil.copytree(bake, tmp_path / "bake"))
    manifest = json.loads((directory / "moebake.json").read_text())
    manifest["activation"]["limit"] = 8.0
    write_manifest(directory, manifest)
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(directory)
    assert "manifest_sha256" in refusal(excinfo)


def test_an_sglang_bake_that_serves_vllm_loads(source, stock, tmp_path):
    """One bake for both engines: SGLang's bake of the source (in the layout the vLLM under test reads) lists vLLM in
    ``serves`` and the plugin serves it, stock vLLM's bytes."""
    out = tmp_path / "sglang"
    options = ConvertOptions("sm90-cutlass", engine="sglang", flashinfer_layout=plugin.vllm_layout())
    manifest = convert(source, out, options, progress=False)
    assert manifest.engine.name == "sglang" and [e.name for e in manifest.serves] == ["vllm"]
    model, vllm_config = build(out)
    load(out, model)
    post_load(model, vllm_config)
    for name, expected in stock[1].items():
        assert torch.equal(getattr(experts_of(model, 1), name).data, expected), name


def test_refuses_another_flashinfer_layout(bake, monkeypatch):
    """A FlashInfer other than the release's pin, that reads the other SM90 layout (0.6.17: v1), is refused."""
    refusal_under_another_flashinfer_layout(bake, build, monkeypatch)


def test_refuses_a_target_it_does_not_serve(tmp_path):
    """A ModelOpt NVFP4 cutedsl-deepep bake (SGLang's bytes; vLLM 0.33.0 has no profile for it) is refused at start-up."""
    from moebake.reference.synthetic_sources import write_modelopt_nvfp4

    source = write_modelopt_nvfp4(tmp_path / "src")
    convert(source, tmp_path / "out", ConvertOptions("cutedsl-deepep", engine="sglang"), progress=False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    from vllm.model_executor.layers.quantization import get_quantization_config

    quant = get_quantization_config("moebake").from_config(config["quantization_config"])
    with pytest.raises(MoebakeError) as excinfo:
        quant.maybe_update_config(str(tmp_path / "out"), hf_config=config)
    assert (
        "target 'cutedsl-deepep' of source format 'modelopt-nvfp4'; the vLLM plugin serves sm90-cutlass bakes of "
        "gpt-oss; cutedsl bakes of modelopt-nvfp4; sm90-cutlass bakes of deepseek-v4; sm100-trtllm bakes of gpt-oss; "
        "sm100-trtllm bakes of deepseek-v4; sm90-marlin bakes of deepseek-v4"
    ) in refusal(excinfo)


# --- sm100-trtllm (Blackwell, --moe-backend flashinfer_trtllm) ----------------------------------------

SM100 = {"capability": 100, "moe_backend": "flashinfer_trtllm"}


SM100_INTERMEDIATE = 256
"""The SM100 source's expert I: a multiple of what every release's trtllm-gen path pads I to (128; 256 before vLLM
0.27.0), so no release pads it (moebake pads no DeepSeek-V4 expert)."""


@pytest.fixture(scope="module")
def source_sm100(tmp_path_factory):
    return write_deepseek_v4(
        tmp_path_factory.mktemp("vllm-plugin-sm100") / "src",
        num_layers=LAYERS,
        num_experts=EXPERTS,
        hidden=HIDDEN,
        intermediate=SM100_INTERMEDIATE,
        mtp_layers=1,
    )


@pytest.fixture(scope="module")
def bake_sm100(source_sm100):
    return baked_for_vllm(source_sm100, "out-sm100", ConvertOptions("sm100-trtllm", engine=vllm_oracle.ENGINE), ["sglang"])


@pytest.fixture(scope="module")
def stock_sm100(source_sm100):
    """Stock vLLM's converted routed-expert parameters of each layer of the source on SM100 (the oracle)."""
    params = {
        layer: vllm_oracle.deepseek_v4_sm100_trtllm(source_sm100, f"layers.{layer}.ffn.experts.", EXPERTS, HIDDEN, SM100_INTERMEDIATE)
        for layer in range(LAYERS)
    }
    for layer in params.values():
        assert (layer.pop("hidden_dim"), layer.pop("intermediate_size_per_partition")) == (HIDDEN, SM100_INTERMEDIATE)
    return params


@contextmanager
def kernel_builds_recorded():
    """vLLM's trtllm-gen kernel set-up (``Mxfp4MoEMethod._build_moe_kernel``) asks for a CUDA device: record the calls
    instead (the oracle does not run it either). Releases without that function (before 0.30.0) set the kernel up
    inline: its first step (``get_fused_moe_quant_config``) is recorded and answered None, so no kernel is built."""
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod

    built = []
    step = "_build_moe_kernel" if hasattr(Mxfp4MoEMethod, "_build_moe_kernel") else "get_fused_moe_quant_config"
    with mock.patch.object(Mxfp4MoEMethod, step, lambda self, layer: built.append(layer)):
        yield built


@pytest.mark.parametrize("pre_processed", [False, True])
def test_sm100_served_parameters_equal_stock_vllms_conversion_of_the_source(bake_sm100, stock_sm100, pre_processed):
    model, vllm_config = build(bake_sm100, **SM100)
    load(bake_sm100, model)
    with kernel_builds_recorded() as built:
        post_load(model, vllm_config, pre_processed)
    assert built == [experts_of(model, layer) for layer in range(LAYERS)]  # the kernel set-up, once per layer
    for layer in range(LAYERS):
        experts = experts_of(model, layer)
        assert experts.quant_method.mxfp4_backend.value == "FLASHINFER_TRTLLM_MXFP4_BF16"
        for name, expected in stock_sm100[layer].items():
            got = getattr(experts, name).data
            assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"layer {layer} {name} differs"
        assert not hasattr(experts, "gemm1_clamp_limit")


@pytest.mark.parametrize("rank", [0, 1])
def test_sm100_each_ep_rank_holds_stock_vllms_parameters_of_its_experts(bake_sm100, stock_sm100, rank):
    model, vllm_config = build(bake_sm100, tensor_parallel=(2, rank), expert_parallel=True, **SM100)
    load(bake_sm100, model)
    with kernel_builds_recorded():
        post_load(model, vllm_config)
    for layer in range(LAYERS):
        for name, expected in stock_sm100[layer].items():
            got, want = getattr(experts_of(model, layer), name).data, expected[2 * rank : 2 * rank + 2]
            assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (rank, layer, name)


def test_sm100_the_clamp_limit_is_not_handed_to_the_model(bake_sm100):
    model, _ = build(bake_sm100, **SM100)
    load(bake_sm100, model)
    assert not [name for name in model.handed if ".ffn.experts." in name]


def test_sm100_refuses_a_hopper_gpu(bake_sm100):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake_sm100, capability=90, moe_backend="flashinfer_trtllm")
    assert "compute capability 9.0" in refusal(excinfo) and "SM100" in refusal(excinfo)


def test_sm100_refuses_another_moe_backend(bake_sm100):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake_sm100, capability=100, moe_backend="marlin")
    assert "FLASHINFER_TRTLLM_MXFP4_BF16" in refusal(excinfo) and "--moe-backend flashinfer_trtllm" in refusal(excinfo)


def test_sm100_refuses_a_clamp_limit_other_than_config_json(bake_sm100):
    hf_config = hf_config_of(bake_sm100)
    hf_config.swiglu_limit = 7.0
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(bake_sm100, hf_config)
    assert "SwiGLU limit 10.0" in refusal(excinfo)


# --- sm90-marlin (Hopper, --moe-backend marlin) ---------------------------------------------------------

MARLIN = {"moe_backend": "marlin"}


@pytest.fixture(scope="module")
def bake_marlin(source):
    return baked_for_vllm(source, "out-marlin", ConvertOptions("sm90-marlin", engine=vllm_oracle.ENGINE), ["sglang"])


@contextmanager
def layer_additions_recorded(method_class):
    """What ``method_class.process_weights_after_loading`` adds to the layer beyond its parameters (attributes,
    buffers, submodules), per call: what the Marlin kernel could read off the layer besides the weights."""
    original = method_class.process_weights_after_loading
    added = []

    def recorded(self, layer):
        before = set(vars(layer)), set(dict(layer.named_buffers())), set(dict(layer.named_modules()))
        original(self, layer)
        added.append(
            (set(vars(layer)) - before[0], set(dict(layer.named_buffers())) - before[1], set(dict(layer.named_modules())) - before[2])
        )

    with mock.patch.object(method_class, "process_weights_after_loading", recorded):
        yield added


@pytest.fixture(scope="module")
def stock_marlin(source):
    """Stock vLLM's post-load routed-expert parameters of each layer of the source with ``--moe-backend marlin`` on SM90
    (the oracle: the whole ``process_weights_after_loading``, vLLM's CUDA ``gptq_marlin_repack`` stood in by vLLM's own
    pure-Python Marlin reference), and what that post-load step added to each layer besides the parameters."""
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod

    with layer_additions_recorded(Mxfp4MoEMethod) as added:
        params = {
            layer: vllm_oracle.deepseek_v4_marlin(
                source, f"layers.{layer}.ffn.experts.", EXPERTS, HIDDEN, INTERMEDIATE, gptq_marlin_repack_reference
            )
            for layer in range(LAYERS)
        }
    assert len(added) == LAYERS
    return params, added


@pytest.mark.parametrize("pre_processed", [False, True])
def test_marlin_served_parameters_equal_stock_vllms_preparation_of_the_source(bake_marlin, stock_marlin, pre_processed):
    """Loaded by the plugin, then vLLM's own post-load driver (also in pre-processed mode): each routed-expert
    parameter is stock vLLM's post-Marlin-preparation parameter of the source, byte for byte, the post-load step adds
    to the layer exactly what stock vLLM's adds (nothing: the Marlin workspace is taken at run time), and vLLM's
    Marlin kernel is built over the parameters."""
    from moebake.engines.vllm.quantization import MoebakeDeepseekV4Mxfp4MoEMethod

    stock, stock_added = stock_marlin
    model, vllm_config = build(bake_marlin, **MARLIN)
    load(bake_marlin, model)
    with layer_additions_recorded(MoebakeDeepseekV4Mxfp4MoEMethod) as added:
        post_load(model, vllm_config, pre_processed)
    assert added == stock_added
    for layer in range(LAYERS):
        experts = experts_of(model, layer)
        method = experts.quant_method
        assert type(method) is MoebakeDeepseekV4Mxfp4MoEMethod and method.mxfp4_backend.value == "MARLIN"
        params = dict(experts.named_parameters())  # layer 1's also holds the router's bias, which the model loads
        assert sorted(stock[layer]) == sorted(WEIGHTS)
        assert set(params) == {*WEIGHTS, *(["e_score_correction_bias"] if layer else [])}
        for name, expected in stock[layer].items():
            got = params[name].data
            assert (got.dtype, tuple(got.shape)) == (expected.dtype, tuple(expected.shape)), name
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), f"layer {layer} {name} differs"
        assert type(method.moe_kernel.fused_experts).__name__ == "MarlinExperts"
        assert method.moe_quant_config.w1_scale is experts.w13_weight_scale
        assert method.moe_quant_config.w2_scale is experts.w2_weight_scale


@pytest.mark.parametrize("rank", [0, 1])
def test_marlin_each_ep_rank_holds_stock_vllms_parameters_of_its_experts(bake_marlin, stock_marlin, rank):
    assert_ep_rank_holds_stock_rows(bake_marlin, stock_marlin[0], rank, **MARLIN)


def test_marlin_an_sglang_bake_that_serves_vllm_loads(source, stock_marlin, tmp_path):
    """SGLang 0.5.23's sm90-marlin bake of the source (I % 128 == 0) lists vLLM in ``serves``: the plugin serves it."""
    out = tmp_path / "sglang"
    manifest = convert(source, out, ConvertOptions("sm90-marlin", engine="sglang"), progress=False)
    assert manifest.engine.name == "sglang" and [e.name for e in manifest.serves] == ["vllm"]
    model, vllm_config = build(out, **MARLIN)
    load(out, model)
    post_load(model, vllm_config)
    for name, expected in stock_marlin[0][1].items():
        assert torch.equal(getattr(experts_of(model, 1), name).data.view(torch.uint8), expected.view(torch.uint8)), name


def test_marlin_refuses_a_gpu_that_is_not_sm90(bake_marlin):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake_marlin, capability=100, **MARLIN)
    assert "compute capability 10.0" in refusal(excinfo) and "SM90" in refusal(excinfo)


def test_marlin_refuses_another_moe_backend(bake_marlin):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake_marlin, moe_backend="flashinfer_cutlass")
    assert (
        "vLLM selected MoE backend FLASHINFER_CUTLASS_MXFP4_BF16; the bake is for MARLIN: start vLLM with --moe-backend marlin"
    ) in refusal(excinfo)


def test_marlin_refuses_another_load_format(bake_marlin):
    with pytest.raises(MoebakeError) as excinfo:
        build(bake_marlin, load_format="auto", **MARLIN)
    assert "--load-format moebake" in refusal(excinfo)


def test_marlin_refuses_the_mtp_draft_model(bake_marlin):
    hf_config = hf_config_of(bake_marlin)
    hf_config.architectures = ["DeepSeekV4MTPModel"]
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(bake_marlin, hf_config)
    assert "MTP draft model" in refusal(excinfo)


def test_marlin_refuses_an_sglang_bake_that_vllm_would_pad_saying_no_vllm_bake_exists(tmp_path):
    """I = 192: SGLang's Marlin bake (I % 64 == 0) is not vLLM's bytes (vLLM pads I to 256), and ``convert --engine
    vllm`` refuses the model (DeepSeek-V4 is never padded): the refusal says so instead of a re-bake that cannot run."""
    from moebake.errors import UnsupportedError

    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=2, hidden=HIDDEN, intermediate=192, mtp_layers=0)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm90-marlin", engine="sglang"), progress=False)
    assert (manifest.engine.name, manifest.engine.exact, list(manifest.serves)) == ("sglang", True, [])
    with pytest.raises(UnsupportedError):  # the re-bake the generic refusal would suggest
        convert(source, tmp_path / "out-vllm", ConvertOptions("sm90-marlin", engine=vllm_oracle.ENGINE), progress=False)
    with pytest.raises(MoebakeError) as excinfo:
        moebake_config(tmp_path / "out")
    import vllm

    assert refusal(excinfo).endswith(
        f"baked for sglang 0.5.23, not vLLM {vllm.__version__}'s bytes, and no vLLM bake of this model exists: vLLM "
        f"{vllm.__version__} pads "
        "DeepSeek-V4's hidden size 256 and expert intermediate size 192 to multiples of 256 and 128 for --moe-backend "
        "marlin, and moebake pads no deepseek-v4 expert; serve this bake with sglang"
    )
    assert "re-bake" not in refusal(excinfo)


def test_marlin_refuses_a_gpt_oss_sm90_marlin_bake(tmp_path):
    """GPT-OSS sm90-marlin bakes are SGLang's only (no vLLM profile): the plugin refuses one at start-up, naming the
    kinds it serves (DeepSeek-V4 only for sm90-marlin) and why (``NOT_SERVABLE``), before any expert is read."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    from moebake.schema.serving import NOT_SERVABLE
    from moebake.synthetic import write_gpt_oss

    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=3, hidden=256, intermediate=128, vocab=32)
    convert(source, tmp_path / "out", ConvertOptions("sm90-marlin", engine="sglang"), progress=False)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    quant = get_quantization_config("moebake").from_config(config["quantization_config"])
    with pytest.raises(MoebakeError) as excinfo:
        quant.maybe_update_config(str(tmp_path / "out"), hf_config=config)
    assert "target 'sm90-marlin' of source format 'gpt-oss'; the vLLM plugin serves" in refusal(excinfo)
    assert "sm90-marlin bakes of deepseek-v4" in refusal(excinfo)
    assert f"({NOT_SERVABLE[('vllm', 'sm90-marlin', 'gpt-oss')]})" in refusal(excinfo)  # why, in the same line
