"""vLLM's ModelOpt NVFP4 MoE method over a ``cutedsl`` bake (``--moe-backend flashinfer_cutedsl``, Blackwell).

vLLM's ``ModelOptNvFp4FusedMoE`` (each release of the matrix) converts, at every start-up, each layer's NVFP4 experts with
``prepare_nvfp4_moe_layer_for_flashinfer_cutedsl``: W13 to ``[up; gate]``, I padded to 64 and H to 256 (128 before
0.32.0; zeros), 64-row gate/up interleave, 128x4-swizzled block scales. A ``cutedsl`` bake made with
``--engine vllm`` holds exactly those four tensors (U8 weights, F8_E4M3 block scales, shapes in
:mod:`moebake.engines.vllm.bake`); :class:`MoebakeNvfp4MoEMethod` creates them at those shapes for this EP
rank's experts and the moebake loader copies them. vLLM's four F32 ``[E_local]`` scalars come from the
bake's per-expert ones (the source's, which SGLang also reads) by :func:`cutedsl_scalars`, vLLM's own
reduction; the post-load step then only builds vLLM's CuteDSL kernel (which multiplies the input scales
into the weight globals, as in stock vLLM).
"""

from collections.abc import Callable
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE
from vllm.model_executor.layers.quantization.utils.quant_utils import amax_for_moe_activation_quant

from moebake.engines.layer_type import EngineLayer
from moebake.engines.vllm import internals
from moebake.engines.vllm.bake import MODELOPT_NVFP4, VllmBake, parameter_specs, refuse
from moebake.engines.vllm.loader_filled_experts import LoaderFilledExperts
from moebake.schema.enums import DType

SCALARS = ("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale")
"""vLLM's F32 ``[E_local]`` parameters derived at load, and the baked tensors (same names) they come from."""


def cutedsl_scalars(baked: dict[str, torch.Tensor], local_experts: torch.Tensor, enable_eplb: bool) -> dict[str, torch.Tensor]:
    """vLLM's four scalar parameters for the experts ``local_experts`` (global ids, slot order) from a layer's
    baked ones (every expert: ``w13_weight_scale_2`` / ``w13_input_scale`` F32 ``[E, 2]`` (gate, up),
    ``w2_weight_scale_2`` / ``w2_input_scale`` F32 ``[E]``), as ``ModelOptNvFp4FusedMoE`` computes them:
    the gate's weight global (vLLM takes it for both halves), the down weight global, and for every
    expert the layer's largest W13 / W2 input scale (``amax_for_moe_activation_quant``, which all-reduces
    it over the EP group under EPLB)."""
    count = len(local_experts)
    return {
        "w13_weight_scale_2": baked["w13_weight_scale_2"][local_experts, 0].contiguous(),
        "w2_weight_scale_2": baked["w2_weight_scale_2"][local_experts].contiguous(),
        "w13_input_scale": amax_for_moe_activation_quant(baked["w13_input_scale"], enable_eplb).repeat(count),
        "w2_input_scale": amax_for_moe_activation_quant(baked["w2_input_scale"], enable_eplb).repeat(count),
    }


class MoebakeNvfp4MoEMethod(LoaderFilledExperts, ModelOptNvFp4FusedMoE):
    """vLLM's ModelOpt NVFP4 MoE method over baked parameters (no weight transform at load).

    ``stock``: the method the source's own quantization config gives this layer (its ModelOpt NVFP4 config
    is reused, so activation and group size are the source's)."""

    supports_pre_processed_weights = True

    def __init__(self, stock: Any, moe: Any, bake: VllmBake, prefix: str):
        if not isinstance(stock, ModelOptNvFp4FusedMoE):
            raise refuse(
                f"{prefix}: the source's quantization config gives this MoE layer {type(stock).__name__}, "
                "not ModelOpt NVFP4 experts (config.json and the manifest disagree)"
            )
        super().__init__(stock.quant_config, moe)  # vLLM's own backend selection
        self.adopt(bake, prefix, moe)
        expected = NvFp4MoeBackend[MODELOPT_NVFP4.record.kernel_backend]
        if self.nvfp4_backend != expected:
            raise refuse(
                f"{prefix}: vLLM selected MoE backend {self.nvfp4_backend.value}; the bake is for FlashInfer "
                f"CuteDSL ({expected.name}): start vLLM with --moe-backend {MODELOPT_NVFP4.moe_backend}"
            )

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
        record = self.layer_record
        if (hidden_size, intermediate_size_per_partition) != (record.hidden, record.intermediate):
            raise refuse(
                f"{self.prefix}: vLLM builds H, I = ({hidden_size}, {intermediate_size_per_partition}), the bake "
                f"has ({record.hidden}, {record.intermediate}) (config.json and the manifest disagree)"
            )
        layer.num_experts = num_experts
        layer.params_dtype = params_dtype
        layer.quant_config = self.quant_config
        scalars = {name: (DType.F32, (num_experts,)) for name in SCALARS}
        self.register_baked(layer, parameter_specs(record, MODELOPT_NVFP4, num_experts) | scalars)

    def load_derived(self, layer: EngineLayer, read_whole: Callable[[str], torch.Tensor], local_experts: list[int]) -> None:
        """vLLM's scalar parameters from the bake's (:func:`cutedsl_scalars`)."""
        baked = {name: read_whole(name) for name in SCALARS}
        eplb = self.moe.moe_parallel_config.enable_eplb
        for name, value in cutedsl_scalars(baked, torch.tensor(local_experts), eplb).items():
            parameter = getattr(layer, name)
            parameter.data.copy_(value)
            parameter.moebake_loaded = True

    def process_weights_after_loading(self, layer: EngineLayer) -> None:
        """No weight transform: check every baked parameter was loaded, record the padded sizes in the layer's
        MoE config as vLLM's conversion does, then build vLLM's CuteDSL kernel over the parameters."""
        self.check_loaded(layer)
        record, config = self.layer_record, layer.moe_config
        config.intermediate_size_per_partition = record.intermediate_padded
        if config.hidden_dim_unpadded is None:
            config.hidden_dim_unpadded = config.hidden_dim
        config.hidden_dim = record.hidden_padded
        internals.build_nvfp4_moe_kernel(self, layer)
