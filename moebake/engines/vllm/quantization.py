"""vLLM's ``moebake`` quantization: the config a baked checkpoint's ``quant_method: "moebake"`` selects,
and the MoE methods that hold its experts exactly as each vLLM release of the matrix's own methods hold them after
``process_weights_after_loading`` (see :mod:`moebake.engines.vllm.bake`).

:class:`MoebakeConfig` reads ``moebake.json`` once vLLM knows the model (``maybe_update_config``) and
refuses, in one line, a GPU of another family than the bake's, a FlashInfer that reads another SM90 fp4
layout, a bake that is not the running release's bytes, and a config.json that disagrees with the manifest. Every
layer that is not a baked MoE layer gets what the source's own quantization config gives it (GPT-OSS:
``gpt_oss_mxfp4``; ModelOpt NVFP4: ``modelopt_fp4`` or ``modelopt_mixed``; DeepSeek-V4: ``deepseek_v4_fp8``,
from config.json's ``quantization_config.original``), exactly as in stock vLLM; what vLLM's models read of
the config itself (``weight_block_size``, which DeepSeek-V4's shared experts are padded by) and the model's
``apply_vllm_mapper`` are the source config's.

The MoE methods (:class:`MoebakeMxfp4MoEMethod`, :class:`MoebakeDeepseekV4Mxfp4MoEMethod` here,
:class:`~moebake.engines.vllm.nvfp4.MoebakeNvfp4MoEMethod`)
are vLLM's own (same backend selection, kernel, forward) with three differences: their parameters are
created at the bake's final shapes for this EP rank's experts; they are filled by
:class:`moebake.engines.vllm.loader.MoebakeModelLoader`, never by vLLM's weight loaders; and
``process_weights_after_loading`` transforms no weight, only builds the kernel
(``supports_pre_processed_weights``: it runs the same under ``weights_already_processed()``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config, GptOssMxfp4MoEMethod, Mxfp4MoEMethod

from moebake.engines.layer_type import EngineLayer
from moebake.engines.quantization_identity import MoebakeQuantization
from moebake.engines.release_check import installed_release
from moebake.engines.vllm import internals
from moebake.engines.vllm.bake import (
    DEEPSEEK_V4_KINDS,
    ENGINE,
    GPT_OSS_KINDS,
    MODELOPT_NVFP4,
    VllmBake,
    hf_config_dict,
    locate_checkpoint,
    parameter_specs,
    read_bake,
    refuse,
)
from moebake.engines.vllm.loader_filled_experts import LoaderFilledExperts
from moebake.loading.refusals import flashinfer_layout_refusal, gpu_refusal
from moebake.schema.enums import GpuFamily

if TYPE_CHECKING:
    from moebake.engines.vllm.bake import Served

LOAD_FORMAT = "moebake"


def check_platform(bake: VllmBake) -> None:
    """Refuse a GPU of another family than the bake's, and (SM90 fp4 bakes) a FlashInfer that reads another layout."""
    from vllm.platforms import current_platform

    capability = current_platform.get_device_capability()
    present = None if capability is None else GpuFamily.of_capability(capability.major)
    device = (
        f"{current_platform.device_name}: no CUDA GPU"
        if capability is None
        else f"device {current_platform.device_name} (compute capability {capability.major}.{capability.minor})"
    )
    if refusal := gpu_refusal(bake.manifest.target, present, device):
        raise refuse(refusal)
    if bake.flashinfer_layout is not None:
        import flashinfer

        if refusal := flashinfer_layout_refusal(bake.flashinfer_layout, flashinfer.__version__, str(bake.directory / "moebake.json")):
            raise refuse(refusal)


def source_quantization_config(bake: VllmBake, quantization_config: dict) -> QuantizationConfig:
    """What stock vLLM builds from the source checkpoint's own quantization config (for every layer but the baked experts)."""
    if bake.served in GPT_OSS_KINDS:
        return GptOssMxfp4Config()
    original = quantization_config.get("original") or {}
    if bake.served in DEEPSEEK_V4_KINDS:
        from vllm.models.deepseek_v4.quant_config import DeepseekV4FP8Config

        # What vLLM's config parsing does for config.json's quantization_config of a model_type deepseek_v4 model.
        if DeepseekV4FP8Config.override_quantization_method(original, None, SimpleNamespace(model_type="deepseek_v4")) is None:
            raise refuse(
                f"{bake.directory}: config.json's quantization_config.original is not DeepSeek-V4's FP8 config "
                f"(quant_method {original.get('quant_method')!r}; vLLM {installed_release(ENGINE).version} reads "
                "'fp8' or 'deepseek_v4_fp8' with DeepseekV4FP8Config)"
            )
        return DeepseekV4FP8Config.from_config(original)
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig, ModelOptNvFp4Config

    for config_class in (ModelOptNvFp4Config, ModelOptMixedPrecisionConfig):
        if config_class.override_quantization_method(original, None):
            return config_class.from_config(original)
    raise refuse(
        f"{bake.directory}: config.json's quantization_config.original is not a ModelOpt NVFP4 config "
        f"(quant_algo {original.get('quant_algo', (original.get('quantization') or {}).get('quant_algo'))!r})"
    )


class MoebakeConfig(MoebakeQuantization, QuantizationConfig):
    """``quantization_config`` of a baked checkpoint (``quant_method: "moebake"``, written by ``moebake convert``)."""

    def __init__(self, quantization_config: dict):
        super().__init__()
        self.quantization_config = quantization_config
        self.bake: VllmBake | None = None
        self.source_config: QuantizationConfig | None = None  # what stock vLLM builds for the source checkpoint

    @classmethod
    def from_config(cls, config: dict) -> MoebakeConfig:
        return cls(dict(config))

    def maybe_update_config(self, model_name: str, hf_config: Any = None, revision: str | None = None):
        """Read and check the bake's manifest (vLLM calls this once the model's config is known)."""
        internals.check_version()
        directory = locate_checkpoint(model_name, revision)
        self.bake = read_bake(directory, self.quantization_config, hf_config_dict(hf_config or {}))
        check_platform(self.bake)
        self.source_config = source_quantization_config(self.bake, self.quantization_config)
        self.source_config.packed_modules_mapping = self.packed_modules_mapping

    @property
    def packed_modules_mapping(self) -> dict:
        return self._packed_modules_mapping

    @packed_modules_mapping.setter
    def packed_modules_mapping(self, mapping: dict) -> None:
        """vLLM hands the model's fused-module mapping to the config (``configure_quant_config``); the source config's
        ``get_quant_method`` matches ignored layers through it, so it gets the same mapping."""
        self._packed_modules_mapping = mapping
        source_config = getattr(self, "source_config", None)
        if source_config is not None:
            source_config.packed_modules_mapping = mapping

    @property
    def weight_block_size(self):
        """The source config's FP8 block size (vLLM's DeepSeek-V4 model pads its shared experts by it), or None."""
        return getattr(self.source_config, "weight_block_size", None)

    def apply_vllm_mapper(self, hf_to_vllm_mapper: Any) -> None:
        """The model's checkpoint-to-vLLM name mapper, applied to the source config's module names (ignored layers)."""
        if self.source_config is not None:
            self.source_config.apply_vllm_mapper(hf_to_vllm_mapper)

    def get_quant_method(self, layer: EngineLayer, prefix: str):
        if self.bake is None or self.source_config is None:
            raise refuse("the manifest was not read (vLLM did not call MoebakeConfig.maybe_update_config)")
        if not isinstance(layer, RoutedExperts):
            return self.source_config.get_quant_method(layer, prefix)
        from vllm.config import get_current_vllm_config

        load_format = get_current_vllm_config().load_config.load_format
        if load_format != LOAD_FORMAT:
            raise refuse(
                f"--load-format {load_format}: the baked experts are copied by moebake's loader; "
                f"start vLLM with --load-format {LOAD_FORMAT}"
            )
        if self.bake.served is MODELOPT_NVFP4:
            from moebake.engines.vllm.nvfp4 import MoebakeNvfp4MoEMethod

            return MoebakeNvfp4MoEMethod(self.source_config.get_quant_method(layer, prefix), layer.moe_config, self.bake, prefix)
        if self.bake.served in DEEPSEEK_V4_KINDS:
            stock = self.source_config.get_quant_method(layer, prefix)
            if type(stock) is not Mxfp4MoEMethod:
                raise refuse(
                    f"{prefix}: vLLM's DeepseekV4FP8Config gives these experts {type(stock).__name__} "
                    f"(config.json's expert_dtype, moe_quant_algo or ignored layers), not the Mxfp4MoEMethod "
                    "the bake's bytes are for"
                )
            return MoebakeDeepseekV4Mxfp4MoEMethod(layer.moe_config, self.bake, prefix, internals.mxfp4_method_options(stock))
        return MoebakeMxfp4MoEMethod(layer.moe_config, self.bake, prefix)


class BakedMxfp4(LoaderFilledExperts):
    """What both MXFP4 methods share: vLLM's backend must be the bake's (its serving record's ``kernel_backend``), its
    padded sizes the bake's, its parameters are created at the bake's final shapes (placed before vLLM's method class)."""

    mxfp4_backend: Any  # set by the vLLM MXFP4 method class placed after this one

    def check_backend(self, served: Served) -> None:
        expected = Mxfp4MoeBackend[served.record.kernel_backend]
        if self.mxfp4_backend != expected:
            raise refuse(
                f"{self.prefix}: vLLM selected MoE backend {self.mxfp4_backend.value}; the bake is for "
                f"{expected.value}: start vLLM with --moe-backend {served.moe_backend}"
            )

    def maybe_roundup_sizes(self, hidden_size: int, intermediate_size_per_partition: int, act_dtype: torch.dtype, moe_parallel_config: Any):
        """vLLM's padded sizes for the selected backend, refused unless they are the bake's."""
        padded = super().maybe_roundup_sizes(  # type: ignore[misc]  # vLLM's method class, after this one
            hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config
        )
        record = self.layer_record
        if tuple(padded) != (record.hidden_padded, record.intermediate_padded):
            raise refuse(
                f"{self.prefix}: vLLM pads H, I to {tuple(padded)}, the bake to "
                f"({record.hidden_padded}, {record.intermediate_padded}) (config.json and the manifest disagree)"
            )
        return padded

    def create_weights(
        self,
        layer: EngineLayer,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ):
        """Parameters at the bake's final shapes for this rank's ``num_experts`` experts; filled by the moebake loader."""
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size_per_partition
        self.hidden_size = hidden_size
        layer.params_dtype = params_dtype
        layer.num_experts = num_experts
        self.register_baked(layer, parameter_specs(self.layer_record, self.bake.served, num_experts))


class MoebakeMxfp4MoEMethod(BakedMxfp4, GptOssMxfp4MoEMethod):
    """vLLM's GPT-OSS MXFP4 MoE method over baked parameters (no transform at load), ``sm90-cutlass`` or
    ``sm100-trtllm``."""

    supports_pre_processed_weights = True

    def __init__(self, moe: Any, bake: VllmBake, prefix: str):
        super().__init__(moe)  # vLLM's own backend selection
        self.adopt(bake, prefix, moe)
        self.check_backend(bake.served)

    def process_weights_after_loading(self, layer: EngineLayer) -> None:
        """No transform: check every baked parameter was loaded, then build vLLM's kernel over them."""
        self.check_loaded(layer)
        internals.build_mxfp4_kernel_inline(self, layer)


class MoebakeDeepseekV4Mxfp4MoEMethod(BakedMxfp4, Mxfp4MoEMethod):
    """vLLM's generic MXFP4 MoE method (what ``DeepseekV4FP8Config`` gives DeepSeek-V4's experts) over baked
    parameters: its ``process_weights_after_loading`` would convert the checkpoint's tensors
    (``convert_weight_to_mxfp4_moe_kernel_format``) and then build the kernel; the baked ones are already
    converted, so only the kernel is built (``_build_moe_kernel``). With ``MARLIN`` (``sm90-marlin``) the conversion is
    ``prepare_moe_mxfp4_layer_for_marlin``, which replaces the four parameters and puts nothing else on the layer (the
    Marlin kernel takes its workspace from ``get_marlin_workspace`` when it runs), so the same holds. Stock vLLM's own
    pre-processed path (``weights_already_processed()``) accepts ``FLASHINFER_TRTLLM_MXFP4_MXFP8`` only; this method
    serves its three backends the same in both modes."""

    supports_pre_processed_weights = True

    def __init__(self, moe: Any, bake: VllmBake, prefix: str, options: dict):
        super().__init__(moe, **options)  # vLLM's own backend selection (options: internals.mxfp4_method_options)
        self.adopt(bake, prefix, moe)
        self.check_backend(bake.served)

    def process_weights_after_loading(self, layer: EngineLayer) -> None:
        """No byte transform: check every baked parameter was loaded, view int8 weights (``sm100-trtllm`` keeps the
        checkpoint's dtype) as the uint8 vLLM's conversion gives them, then build vLLM's kernel over them."""
        from vllm.model_executor.utils import replace_parameter

        self.check_loaded(layer)
        for name in ("w13_weight", "w2_weight"):
            if getattr(layer, name).dtype == torch.int8:
                replace_parameter(layer, name, getattr(layer, name).data.view(torch.uint8))
        internals.build_mxfp4_moe_kernel(self, layer)
