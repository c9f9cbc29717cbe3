"""moebake's SGLang plugin against the real sglang 0.5.23 package, on CPU.

The plugin is found through the ``sglang.srt.plugins`` entry point by SGLang's own ``load_plugins``;
a real ``FusedMoE`` layer built by SGLang with ``--quantization moebake`` gets the manifest's
parameters; SGLang's default loader call (``param.weight_loader(param, tensor)``) puts the files'
bytes in them untransformed (each expert-parallel rank its own experts); post-load only adds the
runner's SwiGLU scalars; every refusal is one line.
"""

import json
import shutil
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from conftest import load_all
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.schema.manifest import write_manifest
from moebake.synthetic import write_gpt_oss

sglang_oracle = pytest.importorskip("engine_oracles.sglang_oracle")
if not sglang_oracle.sglang_installed():
    pytest.skip("sglang 0.5.23 is not installed (bin/setup installs it)", allow_module_level=True)


from engine_oracles.sglang_oracle import plugins_loaded_for_the_module, standins, standins_hidden_after_each_test  # noqa: E402,F401  (autouse)

standins.hide()

PREFIX = "model.layers.0.mlp.experts."


@contextmanager
def serving(out, **engine):
    """SGLang's state for a one-GPU server of the bake ``out`` started with ``engine``'s flags. (The
    plugin finds the bake under ``--model-path``; resolving a real one here would probe for a GPU.)"""
    with (
        sglang_oracle.sglang_engine(**engine),
        mock.patch("moebake.engines.sglang.config.model_directory", return_value=out),
        mock.patch("sglang.srt.layers.quantization.mxfp4._FI_HAS_SM90_CUTLASS_MXFP4", True),
    ):  # FlashInfer on a GPU has it
        yield


@pytest.fixture(scope="module")
def gpt_oss_bake(tmp_path_factory):
    return sglang_oracle.gpt_oss_bake(tmp_path_factory.mktemp("plugin"), num_layers=1, num_experts=4, hidden=160, intermediate=96, vocab=32)


def _quant_config(out):
    return json.loads((out / "config.json").read_text())["quantization_config"]


def _gpt_oss_layer(out, quant_config=None):
    """SGLang's FusedMoE for the checkpoint's layer 0, as GptOssSparseMoeBlock builds it, with
    ``quant_config`` (default: --quantization moebake, from the bake's config.json)."""
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    config = json.loads((out / "config.json").read_text())
    if quant_config is None:
        quant_config = QUANTIZATION_METHODS["moebake"].from_config(config["quantization_config"])
    return FusedMoE(
        num_experts=config["num_local_experts"],
        top_k=config["num_experts_per_tok"],
        layer_id=0,
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        quant_config=quant_config,
        activation=config["hidden_act"],
        gemm1_alpha=1.702,
        gemm1_clamp_limit=config["swiglu_limit"],
        with_bias=True,
        prefix=PREFIX.rstrip("."),
        use_weight_loader_fused=quant_config.get_name() != "mxfp4",
    )


def test_plugin_is_found_through_the_entry_point():
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    from moebake.engines.sglang.config import MoebakeConfig
    from moebake.engines.sglang.internals import quantization_choices

    QUANTIZATION_CHOICES = quantization_choices()[0]

    assert QUANTIZATION_METHODS["moebake"] is MoebakeConfig and "moebake" in QUANTIZATION_CHOICES


def test_sglang_accepts_the_bake_with_the_plugin(gpt_oss_bake):
    from sglang.srt.configs.model_config import ModelConfig

    assert ModelConfig(str(gpt_oss_bake)).quantization == "moebake"


def test_layer_parameters_are_the_manifest_and_load_the_files_bytes_untransformed(gpt_oss_bake):
    manifest = json.loads((gpt_oss_bake / "moebake.json").read_text())
    record, baked = manifest["layers"][0], load_all(gpt_oss_bake)
    with serving(gpt_oss_bake, moe_runner_backend="flashinfer_mxfp4", gpu="sm90"):
        layer = _gpt_oss_layer(gpt_oss_bake)
        params = dict(layer.named_parameters())
        assert {name: (str(p.dtype), list(p.shape)) for name, p in params.items()} == {
            name: (str(baked[PREFIX + name].dtype), spec["shape"]) for name, spec in record["tensors"].items()
        }
        for name, param in params.items():
            param.data.view(torch.uint8).fill_(0xA5)
            # SGLang's default loader call for a named parameter, given a tensor without data (a meta tensor):
            # the plugin's loader reads only its shape and dtype, so SGLang's mmap'd pages are never touched
            param.weight_loader(param, baked[PREFIX + name].to("meta"))
            assert bool((param.data.view(torch.uint8) == 0xA5).all()), f"{name}: the weight loader wrote the parameter"
        layer.quant_method.process_weights_after_loading(layer)
        after = dict(layer.named_parameters())
        stats = layer.quant_method.load_stats
    for name in record["tensors"]:
        assert after[name].data_ptr() == params[name].data_ptr(), f"{name} was replaced at load"
        assert torch.equal(after[name].view(torch.uint8), baked[PREFIX + name].view(torch.uint8)), name
    assert stats.bytes == sum(t.numel() * t.element_size() for n, t in baked.items() if n.startswith(PREFIX))
    activation = manifest["activation"]
    for scalar in ("alpha", "beta", "limit"):
        assert torch.equal(getattr(layer, f"swiglu_{scalar}"), torch.full((4,), activation[scalar], dtype=torch.float32))
    assert layer.quant_method._padded_hidden == record["hidden_padded"] == 256


def test_each_expert_parallel_rank_loads_its_own_experts(gpt_oss_bake):
    baked = load_all(gpt_oss_bake)
    for rank in range(2):
        with serving(gpt_oss_bake, moe_runner_backend="flashinfer_mxfp4", gpu="sm90"):
            sglang_oracle.override_parallel(tp_size=2, attn_tp_size=2, moe_ep_size=2, moe_ep_rank=rank)
            layer = _gpt_oss_layer(gpt_oss_bake)
            for name, param in layer.named_parameters():
                param.weight_loader(param, baked[PREFIX + name].to("meta"))
            layer.quant_method._load_baked_rows(layer)  # the post-load step's read (the rest needs a real TP group)
            for name, param in layer.named_parameters():
                assert torch.equal(param.data.view(torch.uint8), baked[PREFIX + name][2 * rank : 2 * rank + 2].view(torch.uint8))
            assert layer.quant_method.load_stats.bytes == sum(
                t.numel() * t.element_size() // 2 for n, t in baked.items() if n.startswith(PREFIX)
            )  # this rank's half only


def _refusal(gpt_oss_bake, build=_gpt_oss_layer, **engine):
    from moebake.engines.sglang.refusals import MoebakeRefusal

    engine = {"moe_runner_backend": "flashinfer_mxfp4", "gpu": "sm90", **engine}
    with serving(gpt_oss_bake, **engine):
        with pytest.raises(MoebakeRefusal) as caught:
            build(gpt_oss_bake)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("moebake: ")
    return message


def test_refuses_the_wrong_gpu(gpt_oss_bake):
    assert "target sm90-cutlass runs on Hopper (SM90) GPUs only" in _refusal(gpt_oss_bake, gpu="sm100")


def test_refuses_the_wrong_runner_backend(gpt_oss_bake):
    message = _refusal(gpt_oss_bake, moe_runner_backend="triton")
    assert "this bake is for --moe-runner-backend flashinfer_mxfp4, the server runs --moe-runner-backend triton" in message


def test_refuses_another_flashinfer_layout(gpt_oss_bake, monkeypatch):
    import flashinfer

    baked = json.loads((gpt_oss_bake / "moebake.json").read_text())["flashinfer_layout"]["id"]
    other, reads = {"v2": ("0.6.17", "v1"), "v1": ("0.7.2", "v2")}[baked]  # a FlashInfer that reads the other layout
    monkeypatch.setattr(flashinfer, "__version__", other)
    message = _refusal(gpt_oss_bake)
    assert f"baked for FlashInfer SM90 fp4 layout {baked}, but the installed FlashInfer {other} reads fp4 layout {reads}" in message


def test_refuses_moe_tensor_parallelism(gpt_oss_bake):
    def build(out):
        sglang_oracle.override_parallel(tp_size=2, attn_tp_size=2, moe_tp_size=2, moe_tp_rank=0)
        return _gpt_oss_layer(out)

    assert "MoE tensor parallelism (2) is not supported" in _refusal(gpt_oss_bake, build) and "--ep-size" in _refusal(gpt_oss_bake, build)


def test_refuses_experts_not_divisible_by_the_ep_size(gpt_oss_bake):
    def build(out):
        sglang_oracle.override_parallel(tp_size=3, attn_tp_size=3, moe_ep_size=3, moe_ep_rank=0)
        return _gpt_oss_layer(out)  # refused when SGLang builds the quantization config, before FusedMoE asserts

    assert "4 experts do not split evenly over 3 EP ranks; choose an --ep-size" in _refusal(gpt_oss_bake, build)


def test_refuses_a_config_that_disagrees_with_the_manifest(gpt_oss_bake, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(gpt_oss_bake, changed)
    manifest = json.loads((changed / "moebake.json").read_text())
    manifest["activation"]["limit"] = 9.0
    write_manifest(changed, manifest)
    assert "config.json and manifest disagree (manifest_sha256 differs" in _refusal(changed)
    config = json.loads((gpt_oss_bake / "config.json").read_text())
    config["hidden_size"] = 192
    (changed / "config.json").write_text(json.dumps(config))
    shutil.copyfile(gpt_oss_bake / "moebake.json", changed / "moebake.json")
    assert "config.json and manifest disagree on layer model.layers.0.mlp.experts." in _refusal(changed)


def test_refuses_a_baked_parameter_never_loaded(gpt_oss_bake):
    baked = load_all(gpt_oss_bake)

    def build(out):
        layer = _gpt_oss_layer(out)
        for name, param in layer.named_parameters():
            if name != "w2_weight_bias":
                param.weight_loader(param, baked[PREFIX + name])
        layer.quant_method.process_weights_after_loading(layer)

    assert "baked parameter model.layers.0.mlp.experts.w2_weight_bias was never loaded" in _refusal(gpt_oss_bake, build)


def test_refuses_a_tensor_whose_shape_is_not_the_manifests(gpt_oss_bake):
    baked = load_all(gpt_oss_bake)

    def build(out):
        layer = _gpt_oss_layer(out)
        layer.w13_weight.weight_loader(layer.w13_weight, baked[PREFIX + "w13_weight"][:, :-2])

    assert "checkpoint tensor model.layers.0.mlp.experts.w13_weight is torch.uint8" in _refusal(gpt_oss_bake, build)


def test_sglang_runner_calls_the_kernel_with_stock_sglangs_arguments(tmp_path):
    """SGLang's flashinfer_mxfp4 runner, given the plugin's layer and stock SGLang's layer (its
    Mxfp4MoEMethod preparing the source, FlashInfer's CUDA interleave emulated), calls
    ``cutlass_fused_moe`` with identical arguments (the kernel itself is recorded, not run: CPU)."""
    import sglang.srt.layers.moe.moe_runner.flashinfer_cutlass as runner
    import sglang.srt.layers.quantization.mxfp4 as mxfp4
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm
    from flashinfer.fused_moe.core import ActivationType
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    from sglang.srt.models.gpt_oss import GptOssForCausalLM
    from transformers import PretrainedConfig

    from kernel_emulation import kernel_interleave_here

    out = sglang_oracle.gpt_oss_bake(tmp_path, num_layers=1, num_experts=4, hidden=160, intermediate=96, vocab=32)
    source = tmp_path / "src"
    calls = []

    def recorded_kernel(**kwargs):
        calls.append(kwargs)
        kwargs["output"].zero_()
        return [kwargs["output"]]

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 160, generator=g).to(torch.bfloat16)
    weights, ids = torch.topk(torch.softmax(torch.randn(5, 4, generator=g), -1), 2)
    dispatch = StandardDispatchOutput(x, None, StandardTopKOutput(weights, ids.to(torch.int32), None))
    with (
        serving(out, moe_runner_backend="flashinfer_mxfp4", gpu="sm90"),
        mock.patch.object(mxfp4, "interleave_moe_weights_for_sm90_mixed_gemm", lambda w, q: kernel_interleave_here(w), create=True),
        mock.patch.object(mxfp4, "interleave_moe_scales_for_sm90_mixed_gemm", interleave_moe_scales_for_sm90_mixed_gemm, create=True),
        mock.patch.object(runner, "_flashinfer_cutlass_fused_moe", lambda: (recorded_kernel, ActivationType)),
    ):
        from sglang.srt.distributed import parallel_state

        sglang_oracle.override_parallel(tp_group=parallel_state._TP)  # the runner's output allocation reads it
        config = json.loads((source / "config.json").read_text())
        stock = _gpt_oss_layer(source, quant_config=mxfp4.Mxfp4Config.from_config(config["quantization_config"]))
        names = [
            PREFIX + s
            for s in (
                "gate_up_proj_blocks",
                "gate_up_proj_scales",
                "gate_up_proj_bias",
                "down_proj_blocks",
                "down_proj_scales",
                "down_proj_bias",
            )
        ]
        holder = sglang_oracle._Holder(PREFIX, stock, PretrainedConfig(**config))
        GptOssForCausalLM._load_mxfp4_experts_weights(holder, iter(sglang_oracle.read_tensors(source, names).items()))
        stock.quant_method.process_weights_after_loading(stock)
        plugin = _gpt_oss_layer(out)
        baked = load_all(out)
        for name, param in plugin.named_parameters():
            param.weight_loader(param, baked[PREFIX + name])
        plugin.quant_method.process_weights_after_loading(plugin)
        assert isinstance(QUANTIZATION_METHODS["moebake"].from_config(_quant_config(out)), QUANTIZATION_METHODS["moebake"])
        for layer in (plugin, stock):
            layer.quant_method.apply(layer, dispatch)
    ours, theirs = calls
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert (value.dtype, value.shape) == (ours[name].dtype, ours[name].shape), name
            assert torch.equal(value.view(torch.uint8), ours[name].view(torch.uint8)), name
        elif isinstance(value, list):
            assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(value, ours[name])), name
        else:
            assert value == ours[name], name
    assert ours["input"].shape == (5, 256) and ours["use_w4_group_scaling"] is True  # x padded to H_pad by SGLang


def test_sglang_gpt_oss_model_loader_routes_every_baked_tensor_to_the_plugin(gpt_oss_bake):
    """SGLang's own GPT-OSS ``load_weights`` with ``--quantization moebake`` (quant name not ``mxfp4``:
    its ``_load_normal_weights``) hands each baked expert tensor, under its checkpoint name, to the
    plugin's parameter loader; nothing is left unloaded and the bytes are the files'."""
    from sglang.srt.models.gpt_oss import GptOssForCausalLM
    from transformers import PretrainedConfig

    baked = load_all(gpt_oss_bake)
    experts_tensors = {name: tensor for name, tensor in baked.items() if name.startswith(PREFIX)}
    with serving(gpt_oss_bake, moe_runner_backend="flashinfer_mxfp4", gpu="sm90"):
        layer = _gpt_oss_layer(gpt_oss_bake)
        config = json.loads((gpt_oss_bake / "config.json").read_text())
        # SGLang's model class with only this layer in it (its __init__ would build the whole network)
        model = GptOssForCausalLM.__new__(GptOssForCausalLM)
        torch.nn.Module.__init__(model)
        model.config, model.quant_config = PretrainedConfig(**config), layer.quant_method.moebake_config
        model.add_module("model", sglang_oracle._Holder(PREFIX.removeprefix("model."), layer, None))
        model.load_weights(iter(experts_tensors.items()))
        layer.quant_method.process_weights_after_loading(layer)  # refuses if a baked parameter was never loaded
        for name, tensor in experts_tensors.items():
            assert torch.equal(getattr(layer, name.removeprefix(PREFIX)).view(torch.uint8), tensor.view(torch.uint8)), name


def test_refuses_a_sglang_release_the_matrix_does_not_hold(gpt_oss_bake, monkeypatch):
    """The plugin's private SGLang names are proven for the matrix's releases only: another installed release is refused
    in one line before a layer is built, naming the proven span and how to prove a new one."""
    import sglang

    monkeypatch.setattr(sglang, "__version__", "0.5.24")
    message = _refusal(gpt_oss_bake)
    from moebake.schema.profiles import release_span, serving_releases

    assert f"proven on sglang {release_span('sglang', serving_releases('sglang'))}" in message
    assert "sglang 0.5.24 is installed" in message
    assert "bin/prove-releases" in message


def test_a_bake_is_refused_on_a_proven_release_that_does_not_build_its_bytes(tmp_path, monkeypatch):
    """The v2 bake (the newest release's) lists 0.5.19-0.5.23; SGLang 0.5.17 (FlashInfer 0.6.15.post1, layout v1) is
    in the matrix but builds other bytes: refused, naming the releases that can and the convert command for 0.5.17."""
    import sglang

    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=4, hidden=160, intermediate=96, vocab=32)
    gpt_oss_bake = tmp_path / "out"
    convert(source, gpt_oss_bake, ConvertOptions("sm90-cutlass", engine="sglang"), progress=False)
    from moebake.schema.engine_release import EngineRelease
    from moebake.schema.profiles import release_span

    manifest = json.loads((gpt_oss_bake / "moebake.json").read_text())
    proven = manifest["engine"]["releases"]
    assert "0.5.23" in proven and "0.5.17" not in proven  # FlashInfer v2's releases; 0.5.17 pins a v1 FlashInfer
    monkeypatch.setattr(sglang, "__version__", "0.5.17")
    message = _refusal(gpt_oss_bake)
    span = release_span("sglang", [EngineRelease("sglang", v) for v in proven])
    assert f"proven for sglang {span} can serve it, not sglang 0.5.17" in message, message
    assert "moebake convert SRC OUT --target sm90-cutlass --engine sglang==0.5.17" in message


@pytest.mark.parametrize(
    "original, expected",
    [
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, {"NVFP4"}),
        ({"quantization": {"quant_algo": "nvfp4", "kv_cache_quant_algo": None}}, {"NVFP4"}),
        (
            {
                "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {"a.up_proj": {"quant_algo": "NVFP4"}, "b.q_proj": {"quant_algo": "FP8"}},
            },
            {"MIXED_PRECISION", "NVFP4", "FP8"},
        ),
        ({"config_groups": {"group_0": {"weights": {"quant_algo": "FP8"}}}}, {"FP8"}),
        ({"quant_method": "modelopt", "producer": {"name": "modelopt", "version": "NVFP4-ish"}}, set()),  # a name, not an algorithm
    ],
)
def test_the_source_config_s_modelopt_algorithms_are_read_from_their_keys(original, expected):
    from moebake.engines.sglang.config import modelopt_algorithms

    assert modelopt_algorithms(original) == expected


@pytest.mark.parametrize("flag, value", [(None, None), ("weight_loader_disable_mmap", True), ("weight_loader_prefetch_checkpoints", True)])
def test_says_when_sglang_would_read_the_baked_bytes_itself(gpt_oss_bake, caplog, flag, value):
    """SGLang's default iterator hands lazy mmap views, which the plugin's loaders never read; the flags that make
    it read whole shards get one warning line naming the flag (the bake still loads, byte for byte)."""
    engine = {"moe_runner_backend": "flashinfer_mxfp4", "gpu": "sm90", **({flag: value} if flag else {})}
    with caplog.at_level("WARNING", logger="moebake.engines.sglang.config"), serving(gpt_oss_bake, **engine):
        _gpt_oss_layer(gpt_oss_bake)
    warnings = [r.getMessage() for r in caplog.records if r.name == "moebake.engines.sglang.config"]
    if flag is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and "--" + flag.replace("_", "-") in warnings[0] and "read twice" in warnings[0]
