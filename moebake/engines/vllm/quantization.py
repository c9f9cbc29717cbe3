"""vLLM's ``moebake`` quantization: the config a baked checkpoint's ``quant_method: "moebake"`` selects,
and the MoE method that holds its experts exactly as vLLM 0.33.0's own GPT-OSS MXFP4 method holds them
after ``process_weights_after_loading`` (see :mod:`moebake.engines.vllm.bake`).

:class:`MoebakeConfig` reads ``moebake.json`` once vLLM knows the model (``maybe_update_config``) and
refuses, in one line, a GPU that is not SM90, a FlashInfer that reads another SM90 fp4 layout, a bake
that is not vLLM 0.33.0's bytes, and a config.json that disagrees with the manifest. Every layer that
is not a baked MoE layer gets what the source's own config (``gpt_oss_mxfp4``) gives it: GPT-OSS's
linear layers stay unquantized, exactly as in stock vLLM.

:class:`MoebakeMoEMethod` is vLLM's ``GptOssMxfp4MoEMethod`` (same backend selection, kernel, forward)
with three differences: its parameters are created at the bake's final shapes for this EP rank's
experts; they are filled by :class:`moebake.engines.vllm.loader.MoebakeModelLoader`, never by vLLM's
weight loaders; and ``process_weights_after_loading`` transforms nothing, only builds the kernel
(``supports_pre_processed_weights``: it runs the same under ``weights_already_processed()``).
"""

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend, make_mxfp4_moe_kernel
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4Config, GptOssMxfp4MoEMethod

from moebake.engines.quantization_identity import MoebakeQuantization
from moebake.engines.vllm.bake import (
    MOE_BACKEND, VllmBake, hf_config_dict, locate_checkpoint, parameter_specs, read_bake, refuse,
)
from moebake.errors import MoebakeError

LOAD_FORMAT = "moebake"


def check_platform(bake: VllmBake) -> None:
    """Refuse a GPU that is not SM90 and a FlashInfer that reads another SM90 fp4 layout than the bake's."""
    import flashinfer
    from vllm.platforms import current_platform

    from moebake.serve.platform import require_flashinfer_layout, require_sm90

    capability = current_platform.get_device_capability()
    if capability is None:
        raise refuse(f"{current_platform.device_name}: no CUDA GPU; the {bake.manifest.target} bake needs an SM90 (Hopper) GPU")
    try:
        require_sm90((capability.major, capability.minor), current_platform.device_name, bake.manifest.target)
        require_flashinfer_layout(bake.flashinfer_layout, flashinfer.__version__, bake.directory / "moebake.json")
    except MoebakeError as err:
        raise refuse(str(err)) from None


class MoebakeConfig(MoebakeQuantization, QuantizationConfig):
    """``quantization_config`` of a baked checkpoint (``quant_method: "moebake"``, written by ``moebake convert``)."""

    def __init__(self, quantization_config: dict):
        super().__init__()
        self.quantization_config = quantization_config
        self.bake: VllmBake | None = None
        self.source_config = GptOssMxfp4Config()  # what stock vLLM builds for the source checkpoint

    @classmethod
    def from_config(cls, config: dict) -> "MoebakeConfig":
        return cls(dict(config))

    def maybe_update_config(self, model_name: str, hf_config=None, revision: str | None = None):
        """Read and check the bake's manifest (vLLM calls this once the model's config is known)."""
        directory = locate_checkpoint(model_name, revision)
        self.bake = read_bake(directory, self.quantization_config, hf_config_dict(hf_config or {}))
        check_platform(self.bake)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if not isinstance(layer, RoutedExperts):
            return self.source_config.get_quant_method(layer, prefix)
        if self.bake is None:
            raise refuse("the manifest was not read (vLLM did not call MoebakeConfig.maybe_update_config)")
        from vllm.config import get_current_vllm_config

        load_format = get_current_vllm_config().load_config.load_format
        if load_format != LOAD_FORMAT:
            raise refuse(f"--load-format {load_format}: the baked experts are copied by moebake's loader; "
                         f"start vLLM with --load-format {LOAD_FORMAT}")
        return MoebakeMoEMethod(layer.moe_config, self.bake, prefix)


class MoebakeMoEMethod(GptOssMxfp4MoEMethod):
    """vLLM 0.33.0's GPT-OSS MXFP4 MoE method over baked parameters (no transform at load)."""

    supports_pre_processed_weights = True

    def __init__(self, moe, bake: VllmBake, prefix: str):
        super().__init__(moe)  # vLLM's own backend selection
        self.bake = bake
        self.layer_record = bake.layer(prefix)
        self.prefix = prefix
        parallel = moe.moe_parallel_config
        if parallel.tp_size > 1:
            raise refuse(f"{prefix}: MoE tensor parallel size {parallel.tp_size}; the baked experts are whole (I is not "
                         "split), so serve them with expert parallelism: add --enable-expert-parallel")
        if moe.num_experts % parallel.ep_size:
            raise refuse(f"{prefix}: {moe.num_experts} experts do not split evenly over {parallel.ep_size} EP ranks; "
                         "use an EP size that divides the expert count")
        if self.mxfp4_backend != Mxfp4MoeBackend.FLASHINFER_CUTLASS_MXFP4_BF16:
            raise refuse(f"{prefix}: vLLM selected MoE backend {self.mxfp4_backend.value}; the bake is for FlashInfer "
                         f"CUTLASS W4A16 (FLASHINFER_CUTLASS_MXFP4_BF16): start vLLM with --moe-backend {MOE_BACKEND}")

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
        for name, (dtype, shape) in parameter_specs(self.layer_record, num_experts).items():
            parameter = torch.nn.Parameter(torch.empty(shape, dtype=dtype.torch), requires_grad=False)
            parameter.moebake_loaded = False
            layer.register_parameter(name, parameter)

    def baked_parameters(self) -> list[str]:
        """vLLM parameter names this method holds (each filled from the bake)."""
        return list(parameter_specs(self.layer_record, 1))

    def process_weights_after_loading(self, layer) -> None:
        """No transform: check every baked parameter was loaded, then build vLLM's kernel over them."""
        missing = [name for name in self.baked_parameters() if not getattr(layer, name).moebake_loaded]
        if missing:
            raise refuse(f"{self.prefix}: baked parameters {missing} were never loaded; start vLLM with "
                         f"--load-format {LOAD_FORMAT} and check the checkpoint's shards against its index")
        # What GptOssMxfp4MoEMethod._setup_kernel does after its weight conversion.
        self.moe_quant_config = self.get_fused_moe_quant_config(layer)
        if self.moe_quant_config is not None and self.experts_cls is not None:
            self.moe_kernel = make_mxfp4_moe_kernel(
                moe_quant_config=self.moe_quant_config, moe_config=self.moe, mxfp4_backend=self.mxfp4_backend,
                experts_cls=self.experts_cls, routing_tables=layer._expert_routing_tables())
            self.moe_kernel.fused_experts.process_weights_after_loading(layer)
