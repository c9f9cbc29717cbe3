"""Every private vLLM name the plugin relies on, in one place, behind the version the profiles are proven for.

vLLM's documented extension points (``register_quantization_config``, ``register_model_loader``) are
what the plugin uses to exist; these are the few private names of vLLM 0.33.0
(:data:`moebake.schema.profiles.PROFILES`'s ``vllm`` profile) it reads beside them. :func:`check_version`
refuses, in one line, any other installed vLLM before a bake is served.
"""

from moebake.engines.release_check import unknown_release_refusal
from moebake.engines.vllm.bake import refuse


def check_version() -> None:
    """Refuse an installed vLLM that the release matrix does not hold."""
    import vllm

    if refusal := unknown_release_refusal("vllm", vllm.__version__):
        raise refuse(refusal)


def registered_quantization(name: str):
    """The quantization config class registered as ``name`` (``quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG``)."""
    from vllm.model_executor.layers.quantization import _CUSTOMIZED_METHOD_TO_QUANT_CONFIG

    return _CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(name)


def registered_model_loader(load_format: str):
    """The model loader registered for ``load_format`` (``model_loader._LOAD_FORMAT_TO_MODEL_LOADER``)."""
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

    return _LOAD_FORMAT_TO_MODEL_LOADER.get(load_format)


def local_slot(layer, expert: int) -> int:
    """The row of global expert ``expert`` in this EP rank's parameters (negative: not held here);
    ``FusedMoE._map_global_expert_id_to_local_expert_id``."""
    return layer._map_global_expert_id_to_local_expert_id(expert)


def expert_routing_tables(layer):
    """``FusedMoE._expert_routing_tables()``: what the modular kernel needs to route to this rank's experts."""
    return layer._expert_routing_tables()


def build_moe_kernel(method, layer) -> None:
    """``method._build_moe_kernel(layer)``: the modular kernel a vLLM MoE method builds over weights already in its
    format (what its ``process_weights_after_loading`` runs after the weight conversion)."""
    method._build_moe_kernel(layer)


def build_mxfp4_moe_kernel(method, layer) -> None:
    """``Mxfp4MoEMethod._build_moe_kernel(layer)``: the modular kernel over weights already in its format (what
    its ``process_weights_after_loading`` runs after the weight conversion)."""
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod

    Mxfp4MoEMethod._build_moe_kernel(method, layer)
