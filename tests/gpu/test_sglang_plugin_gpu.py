"""SGLang itself serving a bake on an SM90 GPU: the moebake plugin against stock SGLang, same runner.

A GPT-OSS layer (H = I = 2880: H padded to 3072, I to 2944) is prepared two ways, both with SGLang
0.5.23's own code on the GPU:

* stock: ``--quantization mxfp4``, SGLang's ``FusedMoE`` + ``Mxfp4MoEMethod`` (``cutlass_sm90``)
  loading the *source* with its GPT-OSS expert loader and running its ``process_weights_after_loading``
  (FlashInfer's CUDA ``interleave_moe_weights_for_sm90_mixed_gemm``);
* plugin: ``--quantization moebake``, the same ``FusedMoE`` with the plugin's method loading the
  *bake*: its parameters' ``weight_loader`` reads only the shape and dtype of the (lazily mapped) tensors,
  and its post-load step reads the rank's rows from the files (``moebake.loading.rank_loader``), no transform.

Then (1) the plugin's parameters equal stock SGLang's byte for byte, (2) both layers' forward
through SGLang's ``flashinfer_mxfp4`` MoeRunner (FlashInfer ``cutlass_fused_moe``) give bit-identical
outputs, (3) the start-up (layer creation + loading + post-load step, synchronised) is printed for
both, with the ratio stock / plugin.

FlashInfer's kernels come from moebake's reduced fused-MoE module (``sm90_moe_ops``: the full JIT
module takes over half an hour to build); both paths call the same functions. SGLang's compiled
modules the layer never calls (``sgl_kernel``) are stood in for where absent (``tests/engine_oracles``).
Skipped without an SM90 GPU, FlashInfer, or the sglang package. Run by ``bin/gpu-harness sglang``.
"""

import json
import os
import time
from contextlib import contextmanager
from unittest import mock

import pytest
import torch

from conftest import assert_parameters_equal
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.synthetic import write_gpt_oss

pytestmark = pytest.mark.gpu

PREFIX = "model.layers.0.mlp.experts."
# MOEBAKE_GPU_SGLANG_EXPERTS sets the layer's expert count (default 8; GPT-OSS-120B has 128) to time start-up
# at a real layer's size: `MOEBAKE_GPU_SGLANG_EXPERTS=128 bin/gpu-harness sglang`.
SHAPE = {"num_experts": int(os.environ.get("MOEBAKE_GPU_SGLANG_EXPERTS", "8")), "hidden": 2880, "intermediate": 2880}
TOP_K = 4
DEVICE = "cuda"


def with_plugins(sglang_oracle):
    """``sglang_oracle`` once SGLang knows ``mxfp4`` and has loaded its plugins (moebake's ``moebake`` quantization)."""
    sglang_oracle.load_plugins_as_a_server_does()
    return sglang_oracle


@pytest.fixture(scope="module")
def oracle(sm90_gpu):
    sglang_oracle = pytest.importorskip("engine_oracles.sglang_oracle")
    if not sglang_oracle.sglang_installed():
        pytest.skip("sglang 0.5.23 is not installed (bin/gpu-wheels --sglang, carry .whl-sglang)")
    return with_plugins(sglang_oracle)


@pytest.fixture(scope="module")
def bake(tmp_path_factory, oracle):
    root = tmp_path_factory.mktemp("sglang-gpu")
    source = write_gpt_oss(root / "src", num_layers=1, vocab=64, seed=3, **SHAPE)
    convert(source, root / "out", ConvertOptions("sm90-cutlass"), progress=False)
    return source, root / "out"


@contextmanager
def sm90_server(oracle, model_dir, **flags):
    """SGLang's state for one GPU with --moe-runner-backend flashinfer_mxfp4 (or ``flags``' backend, and ``flags``),
    FlashInfer routed to the reduced module (FlashInfer's Humming preprocess too: its weight interleave call). With
    ``moe_runner_backend="marlin"`` SGLang JIT-builds its own Marlin kernels (``sglang.kernels``) on first use."""
    import flashinfer.fused_moe.prepare as prepare
    import sglang.srt.layers.moe.moe_runner.flashinfer_cutlass as runner
    import sglang.srt.layers.quantization.mxfp4 as mxfp4
    from flashinfer.fused_moe.core import ActivationType

    from moebake.serve.flashinfer_ops import sm90_moe_ops

    ops = sm90_moe_ops()
    with (
        oracle.sglang_engine(gpu="sm90", **{"moe_runner_backend": "flashinfer_mxfp4", **flags}),
        mock.patch.object(prepare, "interleave_moe_weights_for_sm90_mixed_gemm", ops.interleave_weights),
        mock.patch.object(mxfp4, "_FI_HAS_SM90_CUTLASS_MXFP4", True),
        mock.patch.object(mxfp4, "interleave_moe_weights_for_sm90_mixed_gemm", ops.interleave_weights, create=True),
        mock.patch.object(mxfp4, "interleave_moe_scales_for_sm90_mixed_gemm", ops.interleave_scales, create=True),
        mock.patch.object(runner, "_flashinfer_cutlass_fused_moe", lambda: (ops.cutlass_fused_moe, ActivationType)),
        mock.patch("moebake.engines.sglang.config.model_directory", return_value=model_dir),
        torch.device(DEVICE),
    ):
        from sglang.srt.distributed import parallel_state
        from sglang.srt.runtime_context import get_parallel

        get_parallel().override_permanently(tp_group=parallel_state._TP)  # the runner's output allocation reads it
        yield


def _fused_moe(config: dict, quant_config):
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

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


def _peak_gib(before: int) -> float:
    """GPU memory the start-up needed at its peak beyond what was allocated before it, GiB."""
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def stock_layer(oracle, source, **flags):
    """Stock SGLang: Mxfp4MoEMethod, its GPT-OSS loader on the source, its post-load step (timed; peak GPU memory)."""
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config
    from sglang.srt.models.gpt_oss import GptOssForCausalLM
    from transformers import PretrainedConfig

    config = json.loads((source / "config.json").read_text())
    with sm90_server(oracle, source, **flags):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        began = time.perf_counter()
        layer = _fused_moe(config, Mxfp4Config.from_config(config["quantization_config"]))
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
        holder = oracle._Holder(PREFIX, layer, PretrainedConfig(**config))
        GptOssForCausalLM._load_mxfp4_experts_weights(holder, iter(oracle.read_tensors(source, names).items()))
        layer.quant_method.process_weights_after_loading(layer)
        torch.cuda.synchronize()
        return layer, time.perf_counter() - began, _peak_gib(before)


def plugin_layer(oracle, out, **flags):
    """SGLang with the moebake plugin: its method, the bake's tensors through the parameters' loaders (timed; peak GPU memory)."""
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    config = json.loads((out / "config.json").read_text())
    with sm90_server(oracle, out, **flags):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        began = time.perf_counter()
        layer = _fused_moe(config, QUANTIZATION_METHODS["moebake"].from_config(config["quantization_config"]))
        params = dict(layer.named_parameters())
        for name, tensor in oracle.read_tensors(out, [PREFIX + n for n in params]).items():
            params[name.removeprefix(PREFIX)].weight_loader(params[name.removeprefix(PREFIX)], tensor)
        layer.quant_method.process_weights_after_loading(layer)
        torch.cuda.synchronize()
        return layer, time.perf_counter() - began, _peak_gib(before)


def forward(oracle, layer, model_dir, x, ids, weights, **flags):
    """The layer's ``quant_method.apply`` (SGLang's MoeRunner: FlashInfer ``cutlass_fused_moe``, or Marlin with
    ``moe_runner_backend="marlin"``) on a standard dispatch."""
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    with sm90_server(oracle, model_dir, **flags):
        # Marlin's runner checks the router logits' token count (and reads nothing else of them)
        logits = torch.zeros(x.shape[0], SHAPE["num_experts"], device=x.device)
        topk = StandardTopKOutput(topk_weights=weights, topk_ids=ids.to(torch.int32), router_logits=logits)
        combined = layer.quant_method.apply(layer, StandardDispatchOutput(x, None, topk))
        torch.cuda.synchronize()
        return combined.hidden_states


def test_plugin_equals_stock_sglang_and_starts_faster(oracle, bake):
    source, out = bake
    stock_layer(oracle, source)  # warm-up: CUDA context, kernels loaded, allocator
    plugin_layer(oracle, out)
    stock, stock_seconds, stock_peak = stock_layer(oracle, source)
    plugin, plugin_seconds, plugin_peak = plugin_layer(oracle, out)

    stock_params = dict(stock.named_parameters())
    for name, tensor in plugin.named_parameters():
        assert name in stock_params, name
        reference = stock_params[name]
        assert (tensor.dtype, tensor.shape) == (reference.dtype, reference.shape), name
        assert torch.equal(tensor.view(torch.uint8), reference.view(torch.uint8)), f"{name} differs from stock SGLang's"
    assert plugin.quant_method._padded_hidden == stock.quant_method._padded_hidden == 3072

    g = torch.Generator(device=DEVICE).manual_seed(0)
    for tokens in (1, 37, 512):
        x = torch.randn(tokens, SHAPE["hidden"], generator=g, device=DEVICE).to(torch.bfloat16)
        weights, ids = torch.topk(torch.softmax(torch.randn(tokens, SHAPE["num_experts"], generator=g, device=DEVICE), -1), TOP_K)
        weights = weights / weights.sum(-1, keepdim=True)
        ours, theirs = forward(oracle, plugin, out, x, ids, weights), forward(oracle, stock, source, x, ids, weights)
        assert ours.shape == (tokens, SHAPE["hidden"]) and ours.abs().max() > 0
        assert torch.equal(ours, theirs), f"{tokens} tokens: plugin output differs from stock SGLang's"
    print(
        f"\nstart-up of one GPT-OSS layer (E={SHAPE['num_experts']}, H=I=2880): stock SGLang {stock_seconds:.3f} s, "
        f"moebake plugin {plugin_seconds:.3f} s, ratio stock/plugin {stock_seconds / plugin_seconds:.2f}; "
        f"peak GPU memory beyond the layer's start: stock {stock_peak:.2f} GiB, plugin {plugin_peak:.2f} GiB"
    )


def server_flags(target: str) -> dict[str, str]:
    """SGLang's server arguments for a GPT-OSS ``target`` bake, read from its SGLang engine profile: the MoE runner
    backend and the engine flags (``--flashinfer-mxfp4-moe-precision fp8`` -> ``flashinfer_mxfp4_moe_precision``)."""
    from moebake.schema.profiles import newest, release_profile

    entry = release_profile(newest("sglang")).target(target, "gpt-oss")
    words = entry.engine_flags.split()
    flags = {name.removeprefix("--").replace("-", "_"): value for name, value in zip(words[::2], words[1::2])}
    return {"moe_runner_backend": entry.runner_backend, **flags}


HUMMING = server_flags("sm90-cutlass-w4a8")


def _routed_inputs(seed: int):
    """For 1, 37 and 512 tokens: bf16 hidden states [T, H], expert ids [T, k], renormalised softmax weights [T, k]."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    for tokens in (1, 37, 512):
        x = torch.randn(tokens, SHAPE["hidden"], generator=g, device=DEVICE).to(torch.bfloat16)
        weights, ids = torch.topk(torch.softmax(torch.randn(tokens, SHAPE["num_experts"], generator=g, device=DEVICE), -1), TOP_K)
        yield x, ids, weights / weights.sum(-1, keepdim=True)


def test_humming_plugin_equals_stock_sglang(oracle, tmp_path):
    """``sm90-cutlass-w4a8`` under ``--flashinfer-mxfp4-moe-precision fp8``: stock SGLang's Humming preparation on the
    GPU (FlashInfer's real ``preprocess_moe_weights_for_sm90_mixed_gemm_humming``: its torch clamp / rewrite on CUDA, the
    CUDA ``"fp4_fp8"`` interleave of the reduced module) equals the plugin's parameters from the bake, byte for byte, on a
    GPT-OSS layer whose scales are widened so that the range clamp rewrites groups. Then SGLang's forward (FlashInfer's
    FP8 x MXFP4 Humming ``cutlass_fused_moe``, from the reduced module) is bit-identical on both layers, and so is
    ``moebake.serve``'s forward on the bake."""
    import moebake.serve
    from engine_oracles.humming_oracle import widen_mxfp4_scales

    source = write_gpt_oss(tmp_path / "src", num_layers=1, vocab=64, seed=5, **SHAPE)
    widen_mxfp4_scales(source, seed=5)
    convert(source, tmp_path / "out", ConvertOptions("sm90-cutlass-w4a8"), progress=False)
    stock, stock_seconds, _ = stock_layer(oracle, source, **HUMMING)
    plugin, plugin_seconds, _ = plugin_layer(oracle, tmp_path / "out", **HUMMING)
    assert stock.quant_method._use_sm90_humming and plugin.quant_method._use_sm90_humming
    checked = assert_parameters_equal(plugin, stock, "stock SGLang's Humming preparation")
    runtime = moebake.serve.open(tmp_path / "out").load_experts(0, device=DEVICE)
    assert runtime.humming
    for x, ids, weights in _routed_inputs(2):
        ours = forward(oracle, plugin, tmp_path / "out", x, ids, weights, **HUMMING)
        theirs = forward(oracle, stock, source, x, ids, weights, **HUMMING)
        assert ours.shape == (x.shape[0], SHAPE["hidden"]) and ours.abs().max() > 0
        assert torch.equal(ours, theirs), f"{x.shape[0]} tokens: Humming output through the plugin differs from stock SGLang's"
        assert torch.equal(runtime.forward(x, ids, weights), theirs), f"{x.shape[0]} tokens: moebake.serve differs"
    shape = f"E={SHAPE['num_experts']}, H={SHAPE['hidden']}, I={SHAPE['intermediate']}"
    print(
        f"\nMATCH: sm90-cutlass-w4a8 plugin == stock SGLang's Humming path on the GPU ({shape}): parameters "
        f"{', '.join(sorted(checked))}; forward at 1, 37, 512 tokens, and moebake.serve's forward; start-up stock "
        f"{stock_seconds:.3f} s, plugin {plugin_seconds:.3f} s (not warmed)"
    )


MARLIN = server_flags("sm90-marlin")


def test_marlin_plugin_equals_stock_sglang_and_its_start_up_memory(oracle, tmp_path):
    """``sm90-marlin`` under ``--moe-runner-backend marlin``: stock SGLang's Marlin preparation on the GPU (its own
    JIT-built ``gptq_marlin_repack``, scale and bias permutations) equals the plugin's parameters from the bake byte
    for byte, and SGLang's Marlin MoE GEMM (its JIT-built ``moe_wna16_marlin``) gives bit-identical outputs on both.
    Prints each path's start-up and peak GPU memory beyond the layer's start (issue target for the plugin: 0.25 GiB)."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, vocab=64, seed=7, **SHAPE)
    convert(source, tmp_path / "out", ConvertOptions("sm90-marlin"), progress=False)
    stock_layer(oracle, source, **MARLIN)  # warm-up: SGLang's JIT kernels built, allocator
    plugin_layer(oracle, tmp_path / "out", **MARLIN)
    stock, stock_seconds, stock_peak = stock_layer(oracle, source, **MARLIN)
    plugin, plugin_seconds, plugin_peak = plugin_layer(oracle, tmp_path / "out", **MARLIN)
    assert stock.quant_method.use_marlin and stock._mxfp4_backend == plugin._mxfp4_backend == "marlin"
    checked = assert_parameters_equal(plugin, stock, "stock SGLang's Marlin preparation")
    exact, spreads = [], {}
    for x, ids, weights in _routed_inputs(1):
        ours = forward(oracle, plugin, tmp_path / "out", x, ids, weights, **MARLIN)
        theirs = forward(oracle, stock, source, x, ids, weights, **MARLIN)
        # SGLang's Marlin runner returns the padded hidden width (H 2880 -> 3072); its model code trims it
        assert ours.shape[0] == x.shape[0] and ours.shape[1] >= SHAPE["hidden"] and ours[:, : SHAPE["hidden"]].abs().max() > 0
        again = forward(oracle, stock, source, x, ids, weights, **MARLIN)
        if torch.equal(again, theirs):
            assert torch.equal(ours, theirs), f"{x.shape[0]} tokens: Marlin output through the plugin differs from stock SGLang's"
            exact.append(x.shape[0])
        else:  # stock SGLang's own Marlin call is not reproducible at this size: the plugin must be within its spread
            spread = (again.float() - theirs.float()).abs().max().item()
            assert (ours.float() - theirs.float()).abs().max().item() <= spread, f"{x.shape[0]} tokens"
            spreads[x.shape[0]] = spread
    parameters = sum(p.numel() * p.element_size() for p in plugin.parameters()) / 2**30
    print(
        f"\nMATCH: sm90-marlin plugin == stock SGLang (parameters {', '.join(sorted(checked))}; forward bit for bit at "
        f"{exact} tokens; where stock SGLang's own Marlin forward differs between two identical calls (max abs "
        f"{spreads}), the plugin's differs from it by no more); start-up of one GPT-OSS layer "
        f"(E={SHAPE['num_experts']}, H=I=2880): stock {stock_seconds:.3f} s, plugin {plugin_seconds:.3f} s; peak GPU "
        f"memory beyond the layer's start: stock {stock_peak:.2f} GiB, plugin {plugin_peak:.2f} GiB, of which the "
        f"parameters are {parameters:.2f} GiB"
    )
    assert plugin_peak - parameters <= 0.25, "issue #28's target: at most 0.25 GiB of GPU memory beyond the parameters"
