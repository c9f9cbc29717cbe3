"""vLLM's ``moebake`` quantization: the config a baked checkpoint's ``quant_method: "moebake"`` selects,
and the MoE methods that hold its experts exactly as vLLM 0.33.0's own methods hold them after
``process_weights_after_loading`` (see :mod:`moebake.engines.vllm.bake`).

:class:`MoebakeConfig` reads ``moebake.json`` once vLLM knows the model (``maybe_update_config``) and
refuses, in one line, a GPU of another family than the bake's, a FlashInfer that reads another SM90 fp4
layout, a bake that is not vLLM 0.33.0's bytes, and a config.json that disagrees with the manifest. Every
layer that is not a baked MoE layer gets what the source's own quantization config gives it (GPT-OSS:
``gpt_oss_mxfp4``; ModelOpt NVFP4: ``modelopt_fp4`` or ``modelopt_mixed``, from config.json's
``quantization_config.original``), exactly as in stock vLLM.

The MoE methods (:class:`MoebakeMxfp4MoEMethod` here, :class:`~moebake.engines.vllm.nvfp4.MoebakeNvfp4MoEMethod`)
are vLLM's own (same backend selection, kernel, forward) with three differences: their parameters are
created at the bake's final shapes for this EP rank's experts; they are filled by
:class:`moebake.engines.vllm.loader.MoebakeModelLoader`, never by vLLM's weight loaders; and
``process_weights_after_loading`` transforms no weight, only builds the kernel
(``supports_pre_processed_weights``: it runs the same under ``weights_already_processed()``).
"""

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend, make_mxfp4_moe_kernel
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config, GptOssMxfp4MoEMethod

from moebake.bake.refusals import flashinfer_layout_refusal, gpu_refusal
from moebake.engines.quantization_identity import MoebakeQuantization
from moebake.engines.vllm import internals
from moebake.engines.vllm.bake import (
    GPT_OSS,
    MODELOPT_NVFP4,
    VllmBake,
    hf_config_dict,
    locate_checkpoint,
    parameter_specs,
    read_bake,
    refuse,
)
from moebake.engines.vllm.baked_experts import BakedExperts
from moebake.schema.enums import GpuFamily

LOAD_FORMAT = "moebake"


def check_platform(bake: VllmBake) -> None:
    """Refuse a GPU of another family than the bake's, and (SM90 fp4 bakes) a FlashInfer that reads another layout."""
    from vllm.platforms import current_platform

    capability = current_platform.get_device_capability()
    present = None if capability is None else GpuFamily.of_capability(capability.major)
    device = (f"{current_platform.device_name}: no CUDA GPU" if capability is None else
              f"device {current_platform.device_name} (compute capability {capability.major}.{capability.minor})")
    if refusal := gpu_refusal(bake.manifest.target, present, device):
        raise refuse(refusal)
    if bake.flashinfer_layout is not None:
        import flashinfer

        if refusal := flashinfer_layout_refusal(bake.flashinfer_layout, flashinfer.__version__, str(bake.directory / "moebake.json")):
            raise refuse(refusal)


def source_quantization_config(bake: VllmBake, quantization_config: dict) -> QuantizationConfig:
    """What stock vLLM builds from the source checkpoint's own quantization config (for every layer but the baked experts)."""
    if bake.served is GPT_OSS:
        return GptOssMxfp4Config()
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig, ModelOptNvFp4Config

    original = quantization_config.get("original") or {}
    for config_class in (ModelOptNvFp4Config, ModelOptMixedPrecisionConfig):
        if config_class.override_quantization_method(original, None):
            return config_class.from_config(original)
    raise refuse(f"{bake.directory}: config.json's quantization_config.original is not a ModelOpt NVFP4 config "
                 f"(quant_algo {original.get('quant_algo', (original.get('quantization') or {}).get('quant_algo'))!r})")


class MoebakeConfig(MoebakeQuantization, QuantizationConfig):
    """``quantization_config`` of a baked checkpoint (``quant_method: "moebake"``, written by ``moebake convert``)."""

    def __init__(self, quantization_config: dict):
        super().__init__()
        self.quantization_config = quantization_config
        self.bake: VllmBake | None = None
        self.source_config: QuantizationConfig | None = None  # what stock vLLM builds for the source checkpoint

    @classmethod
    def from_config(cls, config: dict) -> "MoebakeConfig":
        return cls(dict(config))

    def maybe_update_config(self, model_name: str, hf_config=None, revision: str | None = None):
        """Read and check the bake's manifest (vLLM calls this once the model's config is known)."""
        internals.check_version()
        directory = locate_checkpoint(model_name, revision)
        self.bake = read_bake(directory, self.quantization_config, hf_config_dict(hf_config or {}))
        check_platform(self.bake)
        self.source_config = source_quantization_config(self.bake, self.quantization_config)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if self.bake is None or self.source_config is None:
            raise refuse("the manifest was not read (vLLM did not call MoebakeConfig.maybe_update_config)")
        if not isinstance(layer, RoutedExperts):
            return self.source_config.get_quant_method(layer, prefix)
        from vllm.config import get_current_vllm_config

        load_format = get_current_vllm_config().load_config.load_format
        if load_format != LOAD_FORMAT:
            raise refuse(f"--load-format {load_format}: the baked experts are copied by moebake's loader; "
                         f"start vLLM with --load-format {LOAD_FORMAT}")
        if self.bake.served is MODELOPT_NVFP4:
            from moebake.engines.vllm.nvfp4 import MoebakeNvfp4MoEMethod

            return MoebakeNvfp4MoEMethod(self.source_config.get_quant_method(layer, prefix), layer.moe_config, self.bake, prefix)
        return MoebakeMxfp4MoEMethod(layer.moe_config, self.bake, prefix)


class MoebakeMxfp4MoEMethod(BakedExperts, GptOssMxfp4MoEMethod):
    """vLLM 0.33.0's GPT-OSS MXFP4 MoE method over baked parameters (no transform at load)."""

    supports_pre_processed_weights = True

    def __init__(self, moe, bake: VllmBake, prefix: str):
        super().__init__(moe)  # vLLM's own backend selection
        self.adopt(bake, prefix, moe)
        if self.mxfp4_backend != Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16:
            raise refuse(f"{prefix}: vLLM selected MoE backend {self.mxfp4_backend.value}; the bake is for FlashInfer "
                         f"CUTLASS W4A16 (FLASHINFER_CUTLASS_MXFP4_BF16): start vLLM with --moe-backend {GPT_OSS.moe_backend}")

    def maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config):
        """vLLM's padded sizes for the selected backend, refused unless they are the bake's."""
        padded = super().maybe_roundup_sizes(hidden_size, intermediate_size_per_partition, act_dtype, moe_parallel_config)
        record = self.layer_record
        if tuple(padded) != (record.hidden_padded, record.intermediate_padded):
            raise refuse(f"{self.prefix}: vLLM pads H, I to {tuple(padded)}, the bake to "
                         f"({record.hidden_padded}, {record.intermediate_padded}) (config.json and the manifest disagree)")
        return padded

    def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                       **extra_weight_attrs):
        """Parameters at the bake's final shapes for this rank's ``num_experts`` experts; filled by the moebake loader."""
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size_per_partition
        self.hidden_size = hidden_size
        layer.params_dtype = params_dtype
        layer.num_experts = num_experts
        self.register_baked(layer, parameter_specs(self.layer_record, GPT_OSS, num_experts))

    def process_weights_after_loading(self, layer) -> None:
        """No transform: check every baked parameter was loaded, then build vLLM's kernel over them."""
        self.check_loaded(layer)
        # What GptOssMxfp4MoEMethod._setup_kernel does after its weight conversion.
        self.moe_quant_config = self.get_fused_moe_quant_config(layer)
        if self.moe_quant_config is not None and self.experts_cls is not None:
            self.moe_kernel = make_mxfp4_moe_kernel(
                moe_quant_config=self.moe_quant_config, moe_config=self.moe, mxfp4_backend=self.mxfp4_backend,
                experts_cls=self.experts_cls, routing_tables=internals.expert_routing_tables(layer))
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)
