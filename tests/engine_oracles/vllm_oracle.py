"""vLLM 0.33.0's own load-time code, run on CPU: the oracle a vLLM-profile bake must equal byte for byte. The same
functions run any release from 0.26.0 on (``MOEBAKE_VLLM_RELEASE``, its tree first on ``PYTHONPATH``): where an older
release lacks a name this module uses, the release's own older equivalent is found by feature (``FusedMoE`` for
``FusedMoEFactory``, no ``_build_moe_kernel``, no streamed-expert loader helpers, ``gptq_marlin_repack`` still taking
``perm``, a CPU platform detected only from a ``+cpu`` build), never by version string.

GPT-OSS (:func:`gpt_oss_flashinfer_cutlass`): builds vLLM's real GPT-OSS ``MLPBlock`` (its
``FusedMoEFactory``, ``GptOssRoutedExperts`` and the MoE method vLLM's quantization config picks for
``--moe-backend``), loads the *source* checkpoint's expert tensors with vLLM's own GPT-OSS loader
(``GptOssForCausalLM.hf_to_vllm_mapper``, then ``GptOssModel.load_weights``) and runs the method's
``process_weights_after_loading``. ModelOpt NVFP4 (:func:`modelopt_nvfp4_cutedsl`): vLLM's
``FusedMoEFactory`` with ``ModelOptNvFp4Config``, each expert tensor through the parameters' own
``weight_loader`` (as vLLM's DeepSeek loader calls it), then ``process_weights_after_loading``.
DeepSeek-V4 MXFP4 (:func:`deepseek_v4_flashinfer_cutlass`): the same with ``DeepseekV4FP8Config`` (its
``get_quant_method`` picks the generic ``Mxfp4MoEMethod``), the checkpoint's ``experts.N.wK.scale`` renamed
``.weight_scale`` and E8M0 scales viewed as bytes as vLLM's DeepSeek-V4 mapper and loader do; the whole
``process_weights_after_loading`` runs, the FlashInfer CUTLASS kernel set-up included; with ``--moe-backend marlin``
(:func:`deepseek_v4_marlin`) the same load, then ``prepare_moe_mxfp4_layer_for_marlin``, its CUDA op
``gptq_marlin_repack`` stood in for by a CPU repack the caller gives; GPT-OSS with ``--moe-backend marlin``
(:func:`gpt_oss_marlin`) likewise, through vLLM's GPT-OSS loader. :func:`gpt_oss_stock_experts` and
:func:`deepseek_v4_stock_experts` give the layer itself, its ``process_weights_after_loading`` run on a device of the
caller's (the GPU tests run it on the GPU: FlashInfer's own CUDA interleave, nothing stood in for).
:func:`flashinfer_experts_apply` runs such a layer's vLLM ``FlashInferExperts.apply`` with a given ``cutlass_fused_moe``
(FlashInfer's on the GPU, a recorder on the CPU).

Only these things are not vLLM's:
  * the platform's answers about the GPU (vLLM picks MoE kernels from them): :func:`vllm_engine`
    makes the CPU platform answer as a CUDA GPU of the given compute capability (releases whose detection finds no
    platform here get vLLM's ``CpuPlatform``, :func:`_cpu_platform_where_undetected`);
  * FlashInfer's CUDA-only ``interleave_moe_weights_for_sm90_mixed_gemm``, replaced by the CPU
    emulation of its kernel (``tests/kernel_emulation.py``); FlashInfer's CPU helpers (its SM90 scale
    interleave among them) are used as-is;
  * on SM100 (:func:`deepseek_v4_sm100_trtllm`, :func:`gpt_oss_sm100_trtllm`): FlashInfer's CUDA-only ``nvfp4_block_scale_interleave``,
    replaced by FlashInfer's CPU helper of the same 128x4 layout (``kernel_emulation.block_scale_interleave_cpu``),
    and the kernel set-up after the weight conversion not run (vLLM's trtllm-gen experts ask for a CUDA device);
  * the model around the MoE blocks: a holder module gives vLLM's loader the parameter names
    ``layers.N.mlp.experts.routed_experts.*`` that ``GptOssModel`` has (attention needs a GPU);
  * for NVFP4 on CuteDSL: FlashInfer's CuteDSL MoE reported available (``nvidia-cutlass-dsl`` is a
    GPU package), ``Tensor.cuda`` kept on the CPU, and the kernel set-up after the weight conversion
    (``_build_moe_kernel``: FlashInfer's CuteDSL wrapper, which multiplies the input scales into the
    weight globals in place) not run: the oracle is the converted parameters.

vLLM needs a process group even at one rank: :func:`vllm_engine` makes a one-process gloo group once
per process.
"""

import json
import os
import socket
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402

from conftest import load_all  # noqa: E402

VLLM_VERSION = __import__("os").environ.get("MOEBAKE_VLLM_RELEASE", "0.33.0")
ENGINE = next((e for e in [__import__("os").environ.get("MOEBAKE_ORACLE_ENGINE", "")] if e.startswith("vllm")), "vllm")
"""``--engine`` for bakes the vLLM here serves: ``vllm==0.32.0`` in a release-matrix run (``tests/engine_releases``)."""


def _cpu_platform_where_undetected() -> None:
    """vLLM's ``CpuPlatform`` as the platform where the release's detection finds none here: releases whose
    ``cpu_platform_plugin`` takes the CPU only from a ``+cpu`` build (it does not read ``VLLM_TARGET_DEVICE``) answer None
    and resolve ``UnspecifiedPlatform`` (no device type: ``VllmConfig()`` raises "Failed to infer device type").
    :func:`vllm_engine` then makes the platform answer as a GPU, as on every release."""
    try:
        from vllm import platforms
    except ImportError:
        return
    if not platforms.current_platform.device_type and platforms.cpu_platform_plugin() is None:
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()


_cpu_platform_where_undetected()


def vllm_installed() -> bool:
    try:
        import importlib.metadata

        return importlib.metadata.version("vllm") == VLLM_VERSION
    except importlib.metadata.PackageNotFoundError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_process_group() -> None:
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    if parallel_state._WORLD is not None:
        return
    with set_current_vllm_config(VllmConfig()):
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{_free_port()}"
        )
        parallel_state.initialize_model_parallel(1, 1, backend="gloo")


def _import_before_faking_the_gpu() -> None:
    """Modules that ask the platform at import time (CUDA ops probed in class bodies) are imported
    while it still answers as a CPU."""
    import vllm.model_executor.layers.fused_moe  # noqa: F401
    import vllm.model_executor.layers.quantization.mxfp4  # noqa: F401
    import vllm.model_executor.layers.quantization.online.fp8  # noqa: F401
    import vllm.model_executor.layers.quantization.online.moe_base  # noqa: F401
    import vllm.model_executor.models.gpt_oss  # noqa: F401


def _capability(cap) -> int:
    return cap if isinstance(cap, int) else cap[0] * 10 + cap[1]


@contextmanager
def vllm_engine(
    hf_config,
    quant_config,
    *,
    moe_backend: str = "flashinfer_cutlass",
    capability: int = 90,
    tensor_parallel: tuple[int, int] = (1, 0),
    expert_parallel: bool = False,
):
    """vLLM's process state as one GPU worker started with ``--moe-backend moe_backend`` would have it.

    Yields the ``VllmConfig`` (current while inside). ``capability`` is the compute capability the
    platform reports (90 = Hopper): vLLM's MoE methods pick their kernel from it.
    ``tensor_parallel`` = (size, this worker's rank) is what vLLM's MoE layers are told of the
    tensor-parallel group (the process group itself stays one process); with ``expert_parallel``
    (``--enable-expert-parallel``) vLLM turns it into EP size and rank, and places experts by them.
    """
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    _import_before_faking_the_gpu()
    _init_process_group()
    config = VllmConfig()
    config.kernel_config.moe_backend = moe_backend
    object.__setattr__(
        config,
        "model_config",
        SimpleNamespace(hf_config=hf_config, quantization_config=None, dtype=torch.bfloat16, architectures=hf_config.architectures),
    )
    config.quant_config = quant_config
    config.parallel_config.enable_expert_parallel = expert_parallel
    size, rank = tensor_parallel
    platform = type(current_platform)
    facts = {
        "is_cuda": lambda *args: True,
        "is_device_capability": classmethod(lambda cls, cap, device_id=0: _capability(cap) == capability),
        "has_device_capability": classmethod(lambda cls, cap, device_id=0: _capability(cap) <= capability),
        "is_device_capability_family": classmethod(lambda cls, cap, device_id=0: _capability(cap) // 10 == capability // 10),
        "get_device_capability": classmethod(lambda cls, device_id=0: DeviceCapability(capability // 10, capability % 10)),
    }
    with (
        mock.patch.multiple(platform, **facts),
        set_current_vllm_config(config),
        mock.patch("vllm.model_executor.layers.fused_moe.layer.get_tensor_model_parallel_world_size", lambda: size),
        mock.patch("vllm.model_executor.layers.fused_moe.config.get_tensor_model_parallel_rank", lambda: rank),
    ):
        yield config


_NO_KERNEL = SimpleNamespace(fused_experts=SimpleNamespace(process_weights_after_loading=lambda layer: None))
"""What a stood-in kernel factory answers: a kernel whose own post-load step does nothing (it needs a CUDA device)."""


@contextmanager
def _without_kernel_set_up(method_cls, module, factory: str):
    """The MoE kernel set-up after the weight conversion not run: ``method_cls._build_moe_kernel`` where the release has
    it. Releases that set the kernel up inline, at the end of ``process_weights_after_loading`` (no such method), run
    the same two steps there, after the last parameter is replaced: ``get_fused_moe_quant_config`` (views of the
    converted scales for the kernel: CuteDSL's needs ``nvidia-cutlass-dsl``, a GPU package) is answered None and
    ``module.<factory>`` (``make_mxfp4_moe_kernel``, ``make_nvfp4_moe_kernel``) a kernel whose post-load step does
    nothing. Either way every weight conversion before it is the release's own."""
    if hasattr(method_cls, "_build_moe_kernel"):
        with mock.patch.object(method_cls, "_build_moe_kernel", lambda self, layer: None):
            yield
    else:
        with (
            mock.patch.object(method_cls, "get_fused_moe_quant_config", lambda self, layer: None),
            mock.patch.object(module, factory, lambda **kwargs: _NO_KERNEL),
        ):
            yield


def _fused_moe_factory():
    """vLLM's MoE layer factory: ``FusedMoEFactory``, or where the release has no such name its older name
    ``FusedMoE`` (the same factory function)."""
    from vllm.model_executor.layers.fused_moe import layer

    return getattr(layer, "FusedMoEFactory", None) or layer.FusedMoE


def hf_config_of(source_dir: str | Path):
    from transformers import PretrainedConfig

    config = PretrainedConfig(**json.loads((Path(source_dir) / "config.json").read_text()))
    config.architectures = getattr(config, "architectures", None) or ["GptOssForCausalLM"]
    return config


def gpt_oss_holder(vllm_config, layers: list[int]) -> torch.nn.Module:
    """vLLM's GPT-OSS MoE blocks (``MLPBlock``) of ``layers`` in a module that has ``GptOssModel``'s
    parameter names and the attributes its ``load_weights`` reads."""
    from vllm.model_executor.models import gpt_oss

    hf_config = vllm_config.model_config.hf_config

    class Block(torch.nn.Module):
        def __init__(self, index):
            super().__init__()
            self.mlp = gpt_oss.MLPBlock(vllm_config, index, prefix=f"model.layers.{index}.mlp")

    class Holder(torch.nn.Module):
        _load_weights_mxfp4 = gpt_oss.GptOssModel._load_weights_mxfp4
        _load_weights_other = gpt_oss.GptOssModel._load_weights_other
        load_weights = gpt_oss.GptOssModel.load_weights

        def __init__(self):
            super().__init__()
            self.config = hf_config
            self.parallel_config = vllm_config.parallel_config
            self.layers = torch.nn.ModuleList([Block(i) if i in layers else torch.nn.Identity() for i in range(max(layers) + 1)])

    # The loader's streamed-expert helpers, where the release's GptOssModel has them (releases before them load
    # without): its own functions, as load_weights calls them.
    for name in ("_try_load_streamed_expert", "_get_streamed_expert_info"):
        if name in gpt_oss.GptOssModel.__dict__:
            setattr(Holder, name, gpt_oss.GptOssModel.__dict__[name])
    return Holder()


@contextmanager
def flashinfer_sm90_interleave(interleave_weights):
    """FlashInfer's CUDA-only ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")`` stood in for by
    ``interleave_weights(uint8 [E, n, k/2]) -> same`` while inside."""
    import flashinfer.fused_moe as fi_moe

    def interleave(weight, quant_type):
        assert quant_type == "fp4", quant_type
        return interleave_weights(weight)

    with mock.patch.object(fi_moe, "interleave_moe_weights_for_sm90_mixed_gemm", interleave):
        yield


def flashinfer_experts_apply(experts, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, cutlass_fused_moe) -> torch.Tensor:
    """vLLM's ``FlashInferExperts.apply`` of a post-loaded FlashInfer CUTLASS layer on routed tokens (``x`` [T, H] bf16,
    ``ids`` and ``weights`` [T, k]): the modular kernel's experts call ``cutlass_fused_moe`` (FlashInfer's, or a
    stand-in) with vLLM's arguments. The activations are zero-padded to the layer's padded hidden size, as vLLM's
    prepare step pads them; the output, cut back to H, is returned."""
    import vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe as vllm_experts

    fused = experts.quant_method.moe_kernel.fused_experts
    assert type(fused).__name__ == "FlashInferExperts", type(fused).__name__
    padded = experts.w2_weight.shape[1]
    hidden = torch.nn.functional.pad(x, (0, padded - x.shape[1]))
    output = torch.empty(x.shape[0], padded, dtype=torch.bfloat16, device=x.device)
    with torch.no_grad(), mock.patch.object(vllm_experts, "flashinfer_cutlass_fused_moe", cutlass_fused_moe):
        fused.apply(
            output,
            hidden,
            experts.w13_weight,
            experts.w2_weight,
            weights,
            ids.to(torch.int32),
            experts.activation,
            experts.moe_config.num_experts,
            None,
            None,
            None,
            None,
            None,
            None,
            False,
        )
    return output[:, : x.shape[1]]


def gpt_oss_flashinfer_cutlass(source_dir: str | Path, layer: int, interleave_weights) -> dict[str, torch.Tensor]:
    """vLLM's post-``process_weights_after_loading`` parameters of GPT-OSS layer ``layer`` on SM90 with
    ``--moe-backend flashinfer_cutlass`` (``GptOssMxfp4MoEMethod``, ``FLASHINFER_CUTLASS_MXFP4_BF16``:
    ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format``).

    ``interleave_weights(uint8 [E, n, k/2]) -> same`` stands in for FlashInfer's CUDA
    ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")``. Returns ``{param name: tensor}`` with
    the names of vLLM's ``RoutedExperts`` parameters (``w13_weight``, ..., ``w13_bias``, ``w2_bias``).
    """
    with flashinfer_sm90_interleave(interleave_weights):
        experts = gpt_oss_stock_experts(source_dir, layer, "cpu")
    return {name: p.data.clone() for name, p in experts.named_parameters()}


def gpt_oss_sm100_trtllm(source_dir: str | Path, layer: int) -> dict[str, torch.Tensor]:
    """vLLM's parameters of GPT-OSS layer ``layer`` after ``GptOssMxfp4MoEMethod.process_weights_after_loading``'s
    conversion on SM100 with ``--moe-backend flashinfer_trtllm`` (``FLASHINFER_TRTLLM_MXFP4_BF16``, asserted:
    ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format``'s TRTLLM branch), loaded by vLLM's GPT-OSS loader.
    FlashInfer's CUDA-only ``nvfp4_block_scale_interleave`` is stood in for by its CPU helper of the same layout
    (``kernel_emulation.block_scale_interleave_cpu``); the kernel set-up after the conversion
    (``make_mxfp4_moe_kernel``: vLLM's trtllm-gen experts ask for a CUDA device) is not run. Returns
    ``{RoutedExperts parameter name: tensor}`` and the padded sizes under ``"hidden_dim"`` /
    ``"intermediate_size_per_partition"``."""
    import flashinfer.fp4_quantization as fp4_quantization
    import vllm.model_executor.layers.quantization.mxfp4 as mxfp4

    from kernel_emulation import block_scale_interleave_cpu

    no_kernel = SimpleNamespace(fused_experts=SimpleNamespace(process_weights_after_loading=lambda layer: None))
    with (
        mock.patch.object(fp4_quantization, "nvfp4_block_scale_interleave", block_scale_interleave_cpu),
        mock.patch.object(mxfp4, "make_mxfp4_moe_kernel", lambda **kwargs: no_kernel),
    ):
        experts = gpt_oss_stock_experts(
            source_dir, layer, "cpu", moe_backend="flashinfer_trtllm", capability=100, backend="FLASHINFER_TRTLLM_MXFP4_BF16"
        )
    return {name: p.data.clone() for name, p in experts.named_parameters()} | {
        "hidden_dim": experts.moe_config.hidden_dim,
        "intermediate_size_per_partition": experts.moe_config.intermediate_size_per_partition,
    }


def gpt_oss_stock_experts(
    source_dir: str | Path,
    layer: int,
    device: str,
    *,
    moe_backend: str = "flashinfer_cutlass",
    capability: int = 90,
    backend: str = "FLASHINFER_CUTLASS_MXFP4_BF16",
) -> torch.nn.Module:
    """Stock vLLM's ``RoutedExperts`` of GPT-OSS layer ``layer`` (``--moe-backend moe_backend`` on a GPU of compute
    capability ``capability``; vLLM must pick the MXFP4 backend named ``backend``; default: flashinfer_cutlass on
    SM90): the source's experts loaded by vLLM's GPT-OSS loader on the CPU, moved to ``device``, then its
    ``process_weights_after_loading`` there (the weight conversion and the kernel set-up)."""
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config
    from vllm.model_executor.models.gpt_oss import GptOssForCausalLM

    hf_config = hf_config_of(source_dir)
    prefix = f"model.layers.{layer}.mlp.experts."
    suffixes = ("gate_up_proj_blocks", "gate_up_proj_scales", "gate_up_proj_bias", "down_proj_blocks", "down_proj_scales", "down_proj_bias")
    source = {name: tensor for name, tensor in load_all(source_dir).items() if name.startswith(prefix)}
    with vllm_engine(hf_config, GptOssMxfp4Config(), moe_backend=moe_backend, capability=capability) as vllm_config:
        holder = gpt_oss_holder(vllm_config, [layer])
        experts = holder.layers[layer].mlp.experts.routed_experts
        assert experts.quant_method.mxfp4_backend == Mxfp4MoeBackend[backend], experts.quant_method.mxfp4_backend
        mapped = GptOssForCausalLM.hf_to_vllm_mapper.apply(source.items())
        loaded = holder.load_weights((name.removeprefix("model."), tensor) for name, tensor in mapped)
        assert len(loaded) == len(suffixes), sorted(loaded)
        experts.to(device)
        experts.quant_method.process_weights_after_loading(experts)
        return experts


def modelopt_nvfp4_cutedsl(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int
) -> dict[str, torch.Tensor]:
    """vLLM's parameters of one ModelOpt NVFP4 MoE layer (experts ``{prefix}{e}.{gate,up,down}_proj.*``) after
    ``ModelOptNvFp4FusedMoE.process_weights_after_loading``'s conversion for ``--moe-backend flashinfer_cutedsl``
    on Blackwell (``FLASHINFER_CUTEDSL``: ``prepare_nvfp4_moe_layer_for_flashinfer_cutedsl``), before its kernel
    set-up. The config is ``ModelOptNvFp4Config.from_config`` of the checkpoint's ``quantization_config``.
    Returns ``{RoutedExperts parameter name: tensor}`` and the layer's padded (hidden, intermediate) as
    vLLM's ``moe_config`` holds them, under ``"hidden_dim"`` / ``"intermediate_size_per_partition"`` (ints)."""
    import vllm.model_executor.layers.fused_moe.experts.flashinfer_cutedsl_moe as cutedsl_experts
    import vllm.model_executor.layers.quantization.modelopt as modelopt
    from transformers import PretrainedConfig
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    config = json.loads((Path(source_dir) / "config.json").read_text())
    source = {
        name: tensor
        for name, tensor in load_all(source_dir).items()
        if name.startswith(prefix) and name[len(prefix) :].split(".")[0].isdigit()
    }
    quant_config = modelopt.ModelOptNvFp4Config.from_config(config["quantization_config"])
    module = prefix.rstrip(".")
    with (
        vllm_engine(PretrainedConfig(**config), quant_config, moe_backend="flashinfer_cutedsl", capability=100),
        mock.patch.object(cutedsl_experts, "has_flashinfer_cutedsl_moe_nvfp4", lambda: True),
    ):
        runner = _fused_moe_factory()(
            num_experts=num_experts,
            top_k=2,
            hidden_size=hidden,
            intermediate_size=intermediate,
            quant_config=quant_config,
            prefix=module,
            params_dtype=torch.bfloat16,
        )
        experts = runner.routed_experts
        method = experts.quant_method
        assert type(method) is modelopt.ModelOptNvFp4FusedMoE and method.nvfp4_backend == NvFp4MoeBackend.FLASHINFER_CUTEDSL
        params = dict(runner.named_parameters())
        mapping = RoutedExperts.make_expert_params_mapping(runner, "gate_proj", "down_proj", "up_proj", num_experts)
        for name, tensor in source.items():
            param_name, weight_name, expert_id, shard_id = next(m for m in mapping if f".{m[1]}" in f".{name}")
            param = name.replace(weight_name, param_name).removeprefix(prefix)
            assert params[param].weight_loader(params[param], tensor, param, shard_id=shard_id, expert_id=expert_id, return_success=True), (
                name
            )
        with (
            mock.patch.object(torch.Tensor, "cuda", lambda tensor, *args, **kwargs: tensor),
            _without_kernel_set_up(modelopt.ModelOptNvFp4FusedMoE, modelopt, "make_nvfp4_moe_kernel"),
        ):
            method.process_weights_after_loading(experts)
        converted = {name: p.data.clone() for name, p in experts.named_parameters()}
        return converted | {
            "hidden_dim": experts.moe_config.hidden_dim,
            "intermediate_size_per_partition": experts.moe_config.intermediate_size_per_partition,
        }


def deepseek_v4_sm100_trtllm(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int
) -> dict[str, torch.Tensor]:
    """vLLM's parameters of one DeepSeek-V4 MXFP4 expert layer after ``Mxfp4MoEMethod.process_weights_after_loading``'s
    conversion on SM100 with ``--moe-backend flashinfer_trtllm`` (``select_deepseek_v4_mxfp4_moe_backend``:
    ``FLASHINFER_TRTLLM_MXFP4_BF16``, asserted; ``convert_weight_to_mxfp4_moe_kernel_format``'s TRTLLM branch), loaded
    as :func:`deepseek_v4_flashinfer_cutlass` loads them. FlashInfer's CUDA-only ``nvfp4_block_scale_interleave`` is
    stood in for by its CPU helper of the same layout (``kernel_emulation.block_scale_interleave_cpu``, as the SGLang
    oracle does); the kernel set-up after the conversion (``_build_moe_kernel``: vLLM's trtllm-gen
    experts ask for a CUDA device) is not run. Returns ``{RoutedExperts parameter name: tensor}`` and the layer's
    padded (hidden, intermediate) under ``"hidden_dim"`` / ``"intermediate_size_per_partition"`` (ints)."""
    import flashinfer.fp4_quantization as fp4_quantization
    import vllm.model_executor.layers.quantization.mxfp4 as mxfp4

    from kernel_emulation import block_scale_interleave_cpu

    with (
        mock.patch.object(fp4_quantization, "nvfp4_block_scale_interleave", block_scale_interleave_cpu),
        _without_kernel_set_up(mxfp4.Mxfp4MoEMethod, mxfp4, "make_mxfp4_moe_kernel"),
    ):
        experts = deepseek_v4_stock_experts(
            source_dir,
            prefix,
            num_experts,
            hidden,
            intermediate,
            "cpu",
            moe_backend="flashinfer_trtllm",
            capability=100,
            backend="FLASHINFER_TRTLLM_MXFP4_BF16",
        )
        return {name: p.data.clone() for name, p in experts.named_parameters()} | {
            "hidden_dim": experts.moe_config.hidden_dim,
            "intermediate_size_per_partition": experts.moe_config.intermediate_size_per_partition,
        }


def deepseek_v4_flashinfer_cutlass(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int, interleave_weights
) -> dict[str, torch.Tensor]:
    """vLLM's post-``process_weights_after_loading`` parameters of one DeepSeek-V4 MXFP4 expert layer (experts
    ``{prefix}{e}.{w1,w2,w3}.{weight,scale}``) on SM90 with ``--moe-backend flashinfer_cutlass``: the checkpoint's
    ``quantization_config`` read by ``DeepseekV4FP8Config`` (``expert_dtype`` fp4 in config.json), whose
    ``get_quant_method`` gives the generic ``Mxfp4MoEMethod``; ``select_deepseek_v4_mxfp4_moe_backend`` picks
    ``FLASHINFER_CUTLASS_MXFP4_BF16`` (asserted), and ``convert_weight_to_mxfp4_moe_kernel_format`` swaps the
    halves to ``[w3; w1]`` and applies FlashInfer's SM90 weight and scale interleaves. ``interleave_weights`` stands
    in for FlashInfer's CUDA weight interleave. Returns ``{RoutedExperts parameter name: tensor}``."""
    with flashinfer_sm90_interleave(interleave_weights):
        experts = deepseek_v4_stock_experts(source_dir, prefix, num_experts, hidden, intermediate, "cpu")
        return {name: p.data.clone() for name, p in experts.named_parameters()}


def _marlin_repack_stand_in(repack):
    """vLLM's CUDA ``gptq_marlin_repack`` (``b_q_weight, size_k, size_n, num_bits, is_a_8bit``; releases whose op has
    ``perm`` after ``b_q_weight``: that too, passed on) stood in for by ``repack`` (the CUDA op's arguments ``b_q_weight,
    perm, size_k, size_n, num_bits``), with no act-order permutation and BF16 activations (``is_a_8bit`` false,
    asserted)."""
    import inspect

    import vllm._custom_ops as ops

    def vllm_repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False):
        assert not is_a_8bit
        return repack(b_q_weight, torch.empty(0, dtype=torch.int32), size_k, size_n, num_bits)

    if "perm" in inspect.signature(ops.gptq_marlin_repack).parameters:  # releases whose op still takes act-order perm

        def vllm_repack(b_q_weight, perm, size_k, size_n, num_bits, is_a_8bit=False):  # noqa: F811
            assert not is_a_8bit
            return repack(b_q_weight, perm, size_k, size_n, num_bits)

    return mock.patch.object(ops, "gptq_marlin_repack", vllm_repack)


def gpt_oss_marlin(source_dir: str | Path, layer: int, repack) -> dict[str, torch.Tensor]:
    """vLLM's parameters of GPT-OSS layer ``layer`` after ``GptOssMxfp4MoEMethod.process_weights_after_loading`` on SM90
    with ``--moe-backend marlin`` (``Mxfp4MoeBackend.MARLIN``, asserted: ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format``'s
    Marlin branch, ``prepare_moe_mxfp4_layer_for_marlin``), loaded by vLLM's GPT-OSS loader; ``repack`` stands in for the
    CUDA ``gptq_marlin_repack`` as in :func:`deepseek_v4_marlin`. Returns ``{RoutedExperts parameter name: tensor}``, the
    padded sizes under ``"hidden_dim"`` / ``"intermediate_size_per_partition"`` and the MoE activation under ``"activation"``."""
    with _marlin_repack_stand_in(repack):
        experts = gpt_oss_stock_experts(source_dir, layer, "cpu", moe_backend="marlin", backend="MARLIN")
    config = experts.moe_config
    return {name: p.data.clone() for name, p in experts.named_parameters()} | {
        "hidden_dim": config.hidden_dim,
        "intermediate_size_per_partition": config.intermediate_size_per_partition,
        "activation": config.activation.value,
    }


def deepseek_v4_marlin(
    source_dir: str | Path, prefix: str, num_experts: int, hidden: int, intermediate: int, repack
) -> dict[str, torch.Tensor]:
    """The same with ``--moe-backend marlin`` (``Mxfp4MoeBackend.MARLIN``: ``prepare_moe_mxfp4_layer_for_marlin``).
    ``repack`` (moebake's or a reference's, with the CUDA op's arguments ``b_q_weight, perm, size_k, size_n,
    num_bits``) stands in for vLLM's CUDA ``gptq_marlin_repack`` (``b_q_weight, size_k, size_n, num_bits, is_a_8bit``),
    called with no act-order permutation and BF16 activations (``is_a_8bit`` false, asserted)."""
    with _marlin_repack_stand_in(repack):
        experts = deepseek_v4_stock_experts(
            source_dir, prefix, num_experts, hidden, intermediate, "cpu", moe_backend="marlin", backend="MARLIN"
        )
        return {name: p.data.clone() for name, p in experts.named_parameters()}


def deepseek_v4_stock_experts(
    source_dir: str | Path,
    prefix: str,
    num_experts: int,
    hidden: int,
    intermediate: int,
    device: str,
    *,
    moe_backend: str = "flashinfer_cutlass",
    capability: int = 90,
    backend: str = "FLASHINFER_CUTLASS_MXFP4_BF16",
) -> torch.nn.Module:
    """Stock vLLM's ``RoutedExperts`` of one DeepSeek-V4 layer (experts ``{prefix}{e}.{w1,w2,w3}.{weight,scale}``;
    ``--moe-backend moe_backend`` on a GPU of compute capability ``capability``, default flashinfer_cutlass on SM90):
    ``DeepseekV4FP8Config`` of the checkpoint's ``quantization_config`` (-> ``Mxfp4MoEMethod``, whose backend must be
    the ``Mxfp4MoeBackend`` named ``backend``), the source's experts through the parameters' weight loaders on the
    CPU, the layer moved to ``device``, then the whole ``process_weights_after_loading`` there (the weight conversion
    and the kernel set-up)."""
    from transformers import PretrainedConfig
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod
    from vllm.models.deepseek_v4.quant_config import DeepseekV4FP8Config

    config = json.loads((Path(source_dir) / "config.json").read_text())
    source = {
        name: tensor
        for name, tensor in load_all(source_dir).items()
        if name.startswith(prefix) and name[len(prefix) :].split(".")[0].isdigit()
    }
    quant_config = DeepseekV4FP8Config.from_config(config["quantization_config"])
    with vllm_engine(PretrainedConfig(**config), quant_config, moe_backend=moe_backend, capability=capability):
        runner = _fused_moe_factory()(
            num_experts=num_experts,
            top_k=2,
            hidden_size=hidden,
            intermediate_size=intermediate,
            quant_config=quant_config,
            prefix=prefix.rstrip("."),
            params_dtype=torch.bfloat16,
            ckpt_names=("w1", "w2", "w3"),
            renormalize=True,
            scoring_func=config["scoring_func"],
            routed_scaling_factor=config["routed_scaling_factor"],
            swiglu_limit=config.get("swiglu_limit"),
        )
        experts = runner.routed_experts
        method = experts.quant_method
        assert type(method) is Mxfp4MoEMethod and method.mxfp4_backend == Mxfp4MoeBackend[backend], method.mxfp4_backend
        params = dict(runner.named_parameters())
        mapping = RoutedExperts.make_expert_params_mapping(runner, "w1", "w2", "w3", num_experts)
        for name, tensor in source.items():
            if name.endswith(".scale"):  # _make_deepseek_v4_weights_mapper("fp4"): experts' .scale -> .weight_scale
                name = name.removesuffix(".scale") + ".weight_scale"
                if tensor.dtype == torch.float8_e8m0fnu:  # DeepseekV4Model.load_weights: the raw exponent bytes
                    tensor = tensor.view(torch.uint8)
            param_name, weight_name, expert_id, shard_id = next(m for m in mapping if f".{m[1]}" in f".{name}")
            param = name.replace(weight_name, param_name).removeprefix(prefix)
            assert params[param].weight_loader(params[param], tensor, param, shard_id=shard_id, expert_id=expert_id, return_success=True), (
                name
            )
        experts.to(device)
        method.process_weights_after_loading(experts)
        return experts
