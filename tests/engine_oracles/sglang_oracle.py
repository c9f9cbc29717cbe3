"""SGLang 0.5.23's own load-time code, run on CPU: the oracle a bake must equal byte for byte.

Builds a real ``FusedMoE`` layer (SGLang's class, its quantization method chosen by SGLang's
``QuantizationConfig.get_quant_method``), feeds the source checkpoint's expert tensors through
SGLang's own loaders, and runs SGLang's ``process_weights_after_loading``. Only two things are not
SGLang's: the compiled modules SGLang imports but these paths never call (:mod:`standins`), and
FlashInfer's CUDA-only ``interleave_moe_weights_for_sm90_mixed_gemm``, replaced by the CPU
emulation of its kernel (``tests/kernel_emulation.py``); FlashInfer's CPU helpers are used as-is.

SGLang needs a process group and a published server configuration even at one rank:
:func:`sglang_engine` makes a one-process gloo group once per process and re-publishes the
server arguments (MoE runner backend, all-to-all backend) for each use, and says which GPU
generation the platform claims to be.
"""

import contextlib
import os
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from engine_oracles import standins
from kernel_emulation import block_scale_interleave_cpu

standins.install()
standins.tolerate_config_reregistration()

SGLANG_VERSION = os.environ.get("MOEBAKE_SGLANG_RELEASE", "0.5.23")
ENGINE = next((e for e in [os.environ.get("MOEBAKE_ORACLE_ENGINE", "")] if e.startswith("sglang")), "sglang")
"""``--engine`` for bakes the SGLang here serves: ``sglang==0.5.17`` in a release-matrix run (``tests/engine_releases``)."""


def sglang_installed() -> bool:
    try:
        import sglang
    except ImportError:
        return False
    finally:
        standins.hide()
    return sglang.__version__ == SGLANG_VERSION


def load_plugins_as_a_server_does() -> None:
    """What a server does before it builds a model: SGLang's ``mxfp4`` quantization registered (as SGLang registers it
    on a CUDA machine; its CPU import leaves it out), then its plugins loaded (moebake's ``moebake`` quantization,
    through the ``sglang.srt.plugins`` entry point)."""
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config
    from sglang.srt.plugins import load_plugins

    QUANTIZATION_METHODS.setdefault("mxfp4", Mxfp4Config)
    load_plugins()


@pytest.fixture(scope="module", autouse=True)
def plugins_loaded_for_the_module():
    """Autouse in the modules that import it: SGLang's plugins (moebake's among them) loaded once, as a server does at
    start (:func:`load_plugins_as_a_server_does`), and the stand-ins hidden again."""
    load_plugins_as_a_server_does()
    standins.hide()


@pytest.fixture(autouse=True)
def standins_hidden_after_each_test():
    """Autouse in the modules that import it: after each test, the stand-ins leave ``sys.modules``
    (:func:`standins.hide`), so the rest of the test session sees the real environment."""
    yield
    standins.hide()


def gpt_oss_bake(root: Path, **shape) -> Path:
    """``root/src``: a synthetic GPT-OSS source of ``shape`` (:func:`moebake.synthetic.write_gpt_oss`'s keywords), and
    ``root/out``: its ``sm90-cutlass`` bake for this oracle's SGLang release (:data:`ENGINE`); returns ``root/out``."""
    from moebake.convert.options import ConvertOptions
    from moebake.convert.run import convert
    from moebake.synthetic import write_gpt_oss

    source = write_gpt_oss(Path(root) / "src", **shape)
    convert(source, Path(root) / "out", ConvertOptions("sm90-cutlass", engine=ENGINE), progress=False)
    return Path(root) / "out"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_process_group(world_size: int = 1, rank: int = 0) -> None:
    from sglang.srt.distributed import parallel_state

    # SGLang's own world group, not torch's default group: the vLLM oracle may have made that one.
    if parallel_state._WORLD is None:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        parallel_state.init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank, backend="gloo")


@contextmanager
def sglang_engine(
    *,
    moe_runner_backend: str = "auto",
    moe_a2a_backend: str = "none",
    gpu: str = "sm90",
    ep: int = 1,
    rank: int = 0,
    role: str = "test",
    **server_args,
):
    """SGLang's process state as a server started with these arguments would have it in EP rank ``rank`` of
    ``ep`` (tp = ep; one process per rank, a gloo world of ``ep`` processes: ``MASTER_ADDR``/``MASTER_PORT``
    set by whoever starts them; one rank when ``ep`` is 1).

    ``gpu`` is the platform SGLang is told it runs on (``sm90``, ``sm100``, or anything else for
    neither): its quantization methods pick their kernel from it.
    """
    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.server_args import ServerArgs

    _init_process_group(ep, rank)
    runtime_context.reset_context()
    args = ServerArgs(
        model_path="dummy",
        tp_size=ep,
        ep_size=ep,
        pp_size=1,
        moe_runner_backend=moe_runner_backend,
        moe_a2a_backend=moe_a2a_backend,
        **server_args,
    )
    # Releases before 0.5.21 know no SpawnRanks (their ranks come from the process group), before 0.5.20 no
    # override_permanently (their parallel context reads parallel_state's groups directly).
    ranks = {"ranks": runtime_context.SpawnRanks(world_rank=rank)} if hasattr(runtime_context, "SpawnRanks") else {}
    runtime_context.publish(args, role=role, **ranks)
    parallel = runtime_context.get_parallel()
    if hasattr(parallel, "override_permanently"):
        parallel.override_permanently(world_group=parallel_state._WORLD)
    if not hasattr(parallel, "clear_stamp") and isinstance(getattr(parallel, "_overrides", None), dict):
        parallel._overrides.clear()  # what override_parallel set for the previous use (releases before stamps)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(backend="gloo")
    import inspect

    initialize_moe_config(*([args] if inspect.signature(initialize_moe_config).parameters else []))  # 0.5.17, 0.5.18: args
    facts = {"is_sm90": gpu == "sm90", "is_sm100": gpu == "sm100", "is_blackwell": gpu == "sm100", "is_sm120": False}
    platform = runtime_context.override_platform(**facts) if hasattr(runtime_context, "override_platform") else _platform_functions(facts)
    try:
        with platform:
            yield
    finally:
        standins.hide()


def override_parallel(**values) -> None:
    """Force parallel facts (``moe_ep_size=2``, ``tp_group=...``) until the next :func:`sglang_engine`, as a launcher with
    those arguments would have them: ``override_permanently`` where it exists (from 0.5.20; in 0.5.20 it holds derived
    widths only), and the context's live-value overrides where the release has them (``moe_ep_rank`` in 0.5.17-0.5.20)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if hasattr(parallel, "override_permanently"):
        parallel.override_permanently(**values)
    if hasattr(parallel, "clear_stamp") or not isinstance(getattr(parallel, "_overrides", None), dict):
        return  # releases with stamps (0.5.21+) hold every value override_permanently is given
    for key, value in values.items():
        current = getattr(parallel, key, None)
        if current is not value and current != value:  # a live value override_permanently does not reach (0.5.20)
            parallel._overrides[key] = value


_PLATFORM_FUNCTIONS = {
    "is_sm90_supported": "is_sm90",
    "is_sm100_supported": "is_sm100",
    "is_blackwell": "is_blackwell",
    "is_blackwell_supported": "is_blackwell",
    "is_sm120_supported": "is_sm120",
}
"""Releases before 0.5.19 (no ``override_platform``) ask ``sglang.srt.utils``' cached device checks, imported by name
into each module: these names, and the platform fact each answers."""


@contextmanager
def _platform_functions(facts: dict):
    """``override_platform`` for releases without it: every SGLang module's device-check function answers ``facts``
    (modules imported meanwhile included), and the originals return at exit."""
    import sys

    from sglang.srt.utils import common

    originals = {name: getattr(common, name) for name in _PLATFORM_FUNCTIONS if hasattr(common, name)}
    answers = {name: (lambda value=facts[fact]: value) for name, fact in _PLATFORM_FUNCTIONS.items() if name in originals}
    replaced = {id(f): name for name, f in originals.items()}

    def swap(table, back: bool):
        for module in [m for n, m in list(sys.modules.items()) if n.split(".")[0] == "sglang" and m is not None]:
            for name in _PLATFORM_FUNCTIONS:
                value = module.__dict__.get(name)
                if back and value is not None and value is answers.get(name):
                    setattr(module, name, originals[name])
                elif not back and value is not None and id(value) in replaced:
                    setattr(module, name, table[replaced[id(value)]])

    swap(answers, back=False)
    try:
        yield
    finally:
        swap(originals, back=True)


def read_tensors(source_dir: str | Path, names: list[str]) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of a safetensors checkpoint directory (through its index, or its one file)."""
    import json

    source_dir = Path(source_dir)
    index = source_dir / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"] if index.is_file() else {n: "model.safetensors" for n in names}
    out = {}
    for name in names:
        with safe_open(source_dir / weight_map[name], framework="pt", device="cpu") as f:
            out[name] = f.get_tensor(name)
    return out


class _Holder(torch.nn.Module):
    """Modules at the checkpoint's names (``model.layers.N.mlp.experts``), as SGLang's model has them."""

    def __init__(self, prefix: str, experts: torch.nn.Module, config):
        super().__init__()
        self.config = config
        node = self
        parts = prefix.rstrip(".").split(".")
        for part in parts[:-1]:
            child = torch.nn.Module()
            node.add_module(part, child)
            node = child
        node.add_module(parts[-1], experts)


def _humming_on_cpu(interleave_fp4_fp8):
    """FlashInfer's own ``preprocess_moe_weights_for_sm90_mixed_gemm_humming`` runnable on CPU tensors
    (``humming_oracle.cpu_helpers``), its CUDA ``"fp4_fp8"`` interleave stood in by ``interleave_fp4_fp8``."""
    from engine_oracles.humming_oracle import cpu_helpers

    def interleave(weight, quant_type):
        assert quant_type == "fp4_fp8", quant_type
        return interleave_fp4_fp8(weight)

    return cpu_helpers(interleave).preprocess


def _gpt_oss_layer(source_dir: str | Path, layer: int, expect) -> torch.nn.Module:
    """Inside an SGLang server context: GPT-OSS layer ``layer``'s experts as ``GptOssSparseMoeBlock`` builds them
    (``Mxfp4Config`` of the source), loaded from the source by SGLang's GPT-OSS expert loader, after SGLang's post-load
    step. ``expect(quant_method)`` must hold before loading (the kernel SGLang chose)."""
    import json

    import sglang.srt.layers.quantization.mxfp4 as mxfp4
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.models.gpt_oss import GptOssForCausalLM
    from transformers import PretrainedConfig

    config = PretrainedConfig(**json.loads((Path(source_dir) / "config.json").read_text()))
    prefix = f"model.layers.{layer}.mlp.experts."
    suffixes = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias", "down_proj_blocks", "down_proj_scales", "down_proj_bias")
    source = read_tensors(source_dir, [prefix + s for s in suffixes])
    experts = FusedMoE(  # as GptOssSparseMoeBlock builds it
        num_experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        layer_id=layer,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        quant_config=mxfp4.Mxfp4Config.from_config(config.quantization_config),
        activation=config.hidden_act,
        gemm1_alpha=getattr(config, "hidden_act_alpha", 1.702),
        gemm1_clamp_limit=config.swiglu_limit,
        with_bias=True,
        prefix=prefix.rstrip("."),
        use_weight_loader_fused=False,
    )
    assert expect(experts.quant_method)
    GptOssForCausalLM._load_mxfp4_experts_weights(_Holder(prefix, experts, config), iter(source.items()))
    experts.quant_method.process_weights_after_loading(experts)
    return experts


def _parameters(experts: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.data.clone() for name, p in experts.named_parameters()}


def gpt_oss_sm90_cutlass(source_dir: str | Path, layer: int, interleave_weights, humming_interleave=None) -> dict[str, torch.Tensor]:
    """SGLang's post-``process_weights_after_loading`` parameters of GPT-OSS layer ``layer`` on SM90
    with ``--moe-runner-backend flashinfer_mxfp4`` (``Mxfp4MoEMethod``, ``cutlass_sm90``).

    ``interleave_weights(uint8 [E, n, k/2]) -> same`` stands in for FlashInfer's CUDA
    ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")``. Returns ``{param name: tensor}``.
    With ``humming_interleave`` (the stand-in for the ``"fp4_fp8"`` interleave), the server runs
    ``--flashinfer-mxfp4-moe-precision fp8`` (``_use_sm90_humming``): FlashInfer's Humming preprocess,
    run on CPU by :func:`_humming_on_cpu`.
    """
    import flashinfer.fused_moe as fi_moe
    import sglang.srt.layers.quantization.mxfp4 as mxfp4

    saved = (
        mxfp4._FI_HAS_SM90_CUTLASS_MXFP4,
        getattr(mxfp4, "interleave_moe_weights_for_sm90_mixed_gemm", None),
        getattr(mxfp4, "interleave_moe_scales_for_sm90_mixed_gemm", None),
    )
    mxfp4._FI_HAS_SM90_CUTLASS_MXFP4 = True
    mxfp4.interleave_moe_weights_for_sm90_mixed_gemm = lambda w, quant_type: interleave_weights(w)
    mxfp4.interleave_moe_scales_for_sm90_mixed_gemm = fi_moe.interleave_moe_scales_for_sm90_mixed_gemm
    humming = {} if humming_interleave is None else {"flashinfer_mxfp4_moe_precision": "fp8"}
    preprocess = None if humming_interleave is None else _humming_on_cpu(humming_interleave)
    try:
        with sglang_engine(moe_runner_backend="flashinfer_mxfp4", gpu="sm90", **humming), contextlib.ExitStack() as stack:
            if preprocess is not None:
                from unittest import mock

                stack.enter_context(mock.patch.object(fi_moe, "preprocess_moe_weights_for_sm90_mixed_gemm_humming", preprocess))
            return _parameters(
                _gpt_oss_layer(
                    source_dir,
                    layer,
                    lambda method: (
                        method._fi_kernel == "cutlass_sm90" and getattr(method, "_use_sm90_humming", False) == (preprocess is not None)
                    ),
                )
            )
    finally:
        (
            mxfp4._FI_HAS_SM90_CUTLASS_MXFP4,
            mxfp4.interleave_moe_weights_for_sm90_mixed_gemm,
            mxfp4.interleave_moe_scales_for_sm90_mixed_gemm,
        ) = saved


def unquantized_deepep_bf16(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int, names: tuple[str, str, str]
) -> dict[str, torch.Tensor]:
    """SGLang's post-``process_weights_after_loading`` parameters of one BF16 MoE layer for the
    unquantized DeepEP low-latency + DeepGEMM path (``UnquantizedFusedMoEMethod``, ``deep_gemm`` runner).

    ``names``: the checkpoint's per-expert (gate, up, down) projection names (``gate_proj``... or
    Mixtral's ``w1, w3, w2``); each ``{prefix}{e}.{name}.weight`` goes through ``FusedMoE.weight_loader``
    as SGLang's model loaders call it (``make_expert_params_mapping``). The all-to-all backend is left
    at ``none`` (DeepEP's dispatcher needs a process group per rank): the post-load step's DeepEP
    branch only sets the dispatcher's output dtype and transforms no weight.
    """
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    gate, up, down = names
    mapping = FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name=gate, ckpt_down_proj_name=down, ckpt_up_proj_name=up, num_experts=num_experts
    )
    source = read_tensors(source_dir, [f"{prefix}{e}.{n}.weight" for e in range(num_experts) for n in names])
    with sglang_engine(moe_runner_backend="deep_gemm", gpu="sm90"):
        experts = FusedMoE(
            num_experts=num_experts,
            top_k=2,
            layer_id=0,
            hidden_size=hidden,
            intermediate_size=intermediate,
            params_dtype=torch.bfloat16,
            prefix=prefix.rstrip("."),
        )
        params = dict(experts.named_parameters())
        for name, tensor in source.items():
            for param_name, weight_name, expert_id, shard_id in mapping:
                if weight_name in name:
                    param = params[param_name.removeprefix("experts.") + "weight"]
                    experts.weight_loader(param, tensor, name, shard_id=shard_id, expert_id=expert_id)
                    break
        experts.quant_method.process_weights_after_loading(experts)
        return {name: p.data.clone() for name, p in experts.named_parameters()}


def deepseek_v4_sm90_cutlass(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int, interleave_weights, humming_interleave=None
) -> dict[str, torch.Tensor]:
    """SGLang's post-``process_weights_after_loading`` parameters of one DeepSeek-V4 MXFP4 expert layer
    on SM90 with ``flashinfer_mxfp4`` (``Fp8Config`` with FP4 experts -> ``Mxfp4FlashinferCutlassMoEMethod``).
    ``interleave_weights`` stands in for FlashInfer's CUDA ``interleave_moe_weights_for_sm90_mixed_gemm``.
    With ``humming_interleave``: ``--flashinfer-mxfp4-moe-precision fp8``, as :func:`gpt_oss_sm90_cutlass`.
    Returns SGLang's names (see :func:`_deepseek_v4_layer`)."""
    from unittest import mock

    import sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe as dsv4

    humming = {} if humming_interleave is None else {"flashinfer_mxfp4_moe_precision": "fp8"}
    with (
        sglang_engine(moe_runner_backend="flashinfer_mxfp4", gpu="sm90", **humming),
        mock.patch.object(dsv4, "is_flashinfer_available", lambda: True),  # FlashInfer imports on CPU; SGLang asks CUDA
        mock.patch("flashinfer.fused_moe.interleave_moe_weights_for_sm90_mixed_gemm", lambda w, q: interleave_weights(w)),
        contextlib.ExitStack() as stack,
    ):
        if humming_interleave is not None:
            stack.enter_context(
                mock.patch("flashinfer.fused_moe.preprocess_moe_weights_for_sm90_mixed_gemm_humming", _humming_on_cpu(humming_interleave))
            )
        return _deepseek_v4_layer(source_dir, prefix, num_experts, hidden, intermediate, dsv4.Mxfp4FlashinferCutlassMoEMethod)


def deepseek_v4_sm100_trtllm(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int
) -> dict[str, torch.Tensor]:
    """The same on SM100 (``Mxfp4FlashinferTrtllmMoEMethod``: w3/w1 reorder, trtllm-gen row shuffles, scale swizzle)."""
    import sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe as dsv4

    with sglang_engine(moe_runner_backend="flashinfer_mxfp4", gpu="sm100"), _sm100_flashinfer(dsv4):
        return _deepseek_v4_layer(source_dir, prefix, num_experts, hidden, intermediate, dsv4.Mxfp4FlashinferTrtllmMoEMethod)


def _deepseek_v4_layer(source_dir, prefix: str, num_experts: int, hidden: int, intermediate: int, method) -> dict[str, torch.Tensor]:
    """One DeepSeek-V4 expert layer through SGLang, inside an engine context: each expert's ``w1/w2/w3``
    ``.weight`` and ``.scale`` through ``FusedMoE.weight_loader`` (shard ids from ``make_expert_params_mapping``;
    scales under SGLang's ``weight_scale_inv`` names, as its DeepSeek loader renames them), then the post-load
    step of ``method`` (asserted to be SGLang's pick). Returns SGLang's names: ``w13_weight`` (int8),
    ``w13_weight_scale_inv`` (float8_e8m0fnu or the E8M0 bytes as float8_e4m3fn), ..."""
    import json

    import sglang.srt.layers.quantization.fp8 as fp8
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    config = json.loads((Path(source_dir) / "config.json").read_text())
    names = [f"{prefix}{e}.{p}.{k}" for e in range(num_experts) for p in ("w1", "w2", "w3") for k in ("weight", "scale")]
    source = read_tensors(source_dir, names)
    mapping = FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name="w1", ckpt_down_proj_name="w2", ckpt_up_proj_name="w3", num_experts=num_experts
    )
    quant_config = fp8.Fp8Config.from_config(config["quantization_config"])
    quant_config.is_fp4_experts = True  # what SGLang's ModelConfig derives for DeepSeek-V4 (expert_dtype fp4)
    experts = FusedMoE(
        num_experts=num_experts,
        top_k=2,
        layer_id=0,
        hidden_size=hidden,
        intermediate_size=intermediate,
        quant_config=quant_config,
        prefix=prefix.rstrip("."),
        params_dtype=torch.bfloat16,
        swiglu_limit=config.get("swiglu_limit"),
    )
    assert type(experts.quant_method) is method, type(experts.quant_method)
    params = dict(experts.named_parameters())
    for name, tensor in source.items():
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name in name:
                param = param_name.removeprefix("experts.") + ("weight" if name.endswith(".weight") else "weight_scale_inv")
                experts.weight_loader(params[param], tensor, prefix + param, shard_id=shard_id, expert_id=expert_id)
                break
    experts.quant_method.process_weights_after_loading(experts)
    return {name: p.data.clone() for name, p in experts.named_parameters()}


class _DispatcherStandin:
    """The layer's token dispatcher, which the post-load step only tells its activation quantization
    (``set_quant_config``): DeepEP's dispatcher needs ``deep_ep`` and a process group per rank to be made."""

    def __init__(self):
        self.quant_config = None

    def set_quant_config(self, quant_config: dict) -> None:
        self.quant_config = quant_config


def modelopt_nvfp4_cutedsl(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int, a2a: str = "none"
) -> dict[str, torch.Tensor]:
    """SGLang's post-``process_weights_after_loading`` parameters of one ModelOpt NVFP4 MoE layer for
    ``--moe-runner-backend flashinfer_cutedsl`` on Blackwell (``ModelOptNvFp4FusedMoEMethod``): its standard
    ("v2") path with ``a2a="none"``, its DeepEP low-latency ("v1") path with ``a2a="deepep"``.

    Each expert's ``{gate,up,down}_proj.{weight, weight_scale, weight_scale_2, input_scale}`` goes through
    ``FusedMoE.weight_loader`` (shard ids from ``make_expert_params_mapping``, as SGLang's DeepSeek/Qwen
    loaders call it). The config is ``ModelOptFp4Config.from_config`` of the checkpoint's
    ``quantization_config``. Returns ``{param name: tensor}``, the MMA-layout scale views included.
    """
    import json
    from unittest import mock

    import sglang.srt.layers.moe.fused_moe_triton.layer as fused_moe_layer
    import sglang.srt.layers.quantization.modelopt_quant as modelopt
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    config = json.loads((Path(source_dir) / "config.json").read_text())
    names = [
        f"{prefix}{e}.{p}_proj.{k}"
        for e in range(num_experts)
        for p in ("gate", "up", "down")
        for k in ("weight", "weight_scale", "weight_scale_2", "input_scale")
    ]
    source = read_tensors(source_dir, names)
    mapping = FusedMoE.make_expert_params_mapping(
        ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj", ckpt_up_proj_name="up_proj", num_experts=num_experts
    )
    with (
        sglang_engine(moe_runner_backend="flashinfer_cutedsl", moe_a2a_backend=a2a, gpu="sm100"),
        standins.cutedsl_utils(),
        mock.patch.object(fused_moe_layer, "create_moe_dispatcher", lambda *args, **kwargs: _DispatcherStandin()),
        # 0.5.17-0.5.19's create_weights swizzles the block scales onto the GPU (swizzle_blockscale's .cuda()): kept here
        mock.patch.object(torch.Tensor, "cuda", lambda tensor, *args, **kwargs: tensor),
    ):
        quant_config = modelopt.ModelOptFp4Config.from_config(config["quantization_config"])
        experts = FusedMoE(
            num_experts=num_experts,
            top_k=2,
            layer_id=0,
            hidden_size=hidden,
            intermediate_size=intermediate,
            quant_config=quant_config,
            prefix=prefix.rstrip("."),
            params_dtype=torch.bfloat16,
        )
        assert type(experts.quant_method) is modelopt.ModelOptNvFp4FusedMoEMethod
        params = dict(experts.named_parameters())
        for name, tensor in source.items():
            for param_name, weight_name, expert_id, shard_id in mapping:
                if weight_name in name:
                    param = param_name.removeprefix("experts.") + name.rsplit(".", 1)[1]
                    experts.weight_loader(params[param], tensor, prefix + param, shard_id=shard_id, expert_id=expert_id)
                    break
        experts.quant_method.process_weights_after_loading(experts)
        return {name: p.data.clone() if p.is_contiguous() else p.data for name, p in experts.named_parameters()}


_block_scale_interleave = block_scale_interleave_cpu


@contextmanager
def _sm100_flashinfer(*modules):
    """FlashInfer's trtllm-gen preparation helpers in SGLang's ``modules`` (which import them only where
    FlashInfer's CUDA side is available): its CPU permutation helpers as they are, ``block_scale_interleave``
    by :func:`_block_scale_interleave`; ``Tensor.cuda`` keeps a tensor where it is (SGLang moves its
    per-expert constants to the GPU)."""
    from unittest import mock

    import flashinfer.fused_moe.core as core

    helpers = {
        "get_w2_permute_indices_with_cache": core.get_w2_permute_indices_with_cache,
        "_maybe_get_cached_w3_w1_permute_indices": core._maybe_get_cached_w3_w1_permute_indices,
        "block_scale_interleave": _block_scale_interleave,
        "nvfp4_block_scale_interleave": _block_scale_interleave,
    }
    with contextlib.ExitStack() as stack:
        for module in modules:
            for name, helper in helpers.items():
                stack.enter_context(mock.patch.object(module, name, helper, create=True))
        stack.enter_context(mock.patch.object(torch.Tensor, "cuda", lambda tensor, *args, **kwargs: tensor))
        yield


def gpt_oss_sm100_trtllm(source_dir: str | Path, layer: int) -> dict[str, torch.Tensor]:
    """SGLang's post-``process_weights_after_loading`` parameters of GPT-OSS layer ``layer`` on SM100 with
    ``--moe-runner-backend flashinfer_mxfp4`` (``Mxfp4MoEMethod``, ``trtllm_sm100``). Returns ``{param name: tensor}``."""
    import sglang.srt.layers.quantization.mxfp4 as mxfp4

    with sglang_engine(moe_runner_backend="flashinfer_mxfp4", gpu="sm100"), _sm100_flashinfer(mxfp4):
        return _parameters(_gpt_oss_layer(source_dir, layer, lambda method: method._fi_kernel == "trtllm_sm100"))


@contextmanager
def _marlin_ops(repack):
    """SGLang's Marlin preparation on CPU: ``repack`` stands in for the CUDA op ``gptq_marlin_repack`` (which
    ``marlin_utils_fp4`` imports only on CUDA), and the kernel workspace (sized from the GPU's SM count) is empty."""
    from unittest import mock

    import sglang.srt.layers.quantization.marlin_utils_fp4 as marlin_fp4

    with (
        mock.patch.object(marlin_fp4, "gptq_marlin_repack", repack, create=True),
        mock.patch.object(marlin_fp4, "marlin_make_workspace", lambda device, *a: torch.zeros(0, dtype=torch.int)),
    ):
        yield


def gpt_oss_marlin(source_dir: str | Path, layer: int, repack) -> dict[str, torch.Tensor]:
    """SGLang's post-``process_weights_after_loading`` parameters of GPT-OSS layer ``layer`` on SM90 with
    ``--moe-runner-backend marlin`` (``Mxfp4MoEMethod`` with ``use_marlin``: ``deinterleave_moe_mxfp4_w13_for_marlin``,
    ``prepare_moe_mxfp4_layer_for_marlin``). ``repack`` stands in for ``gptq_marlin_repack``."""
    with sglang_engine(moe_runner_backend="marlin", gpu="sm90"), _marlin_ops(repack):
        experts = _gpt_oss_layer(source_dir, layer, lambda method: method.use_marlin)
        assert experts._mxfp4_backend == "marlin"
        return _parameters(experts)


def deepseek_v4_marlin(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int, repack
) -> dict[str, torch.Tensor]:
    """The same for one DeepSeek-V4 MXFP4 expert layer (``Fp8Config`` with FP4 experts -> ``Mxfp4MarlinMoEMethod``)."""
    import sglang.srt.layers.quantization.mxfp4_marlin_moe as dsv4

    with sglang_engine(moe_runner_backend="marlin", gpu="sm90"), _marlin_ops(repack):
        return _deepseek_v4_layer(source_dir, prefix, num_experts, hidden, intermediate, dsv4.Mxfp4MarlinMoEMethod)
