"""Every private vLLM name the plugin relies on, in one place, behind the version the profiles are proven for.

vLLM's documented extension points (``register_quantization_config``, ``register_model_loader``) are
what the plugin uses to exist; these are the few private names it reads beside them, and the steps whose names or
arguments moved between the releases of the release matrix (:mod:`moebake.schema.release_matrix`), each gated by the
installed release (:func:`since`). :func:`check_version` refuses, in one line, an installed vLLM the matrix does not
hold before a bake is served.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from moebake.engines.layer_type import EngineLayer
from moebake.engines.release_check import installed_release, unknown_release_refusal
from moebake.engines.vllm.bake import ENGINE, refuse


def since(version: str) -> bool:
    """Whether the installed vLLM is release ``version`` or later."""
    return installed_release(ENGINE).parsed >= Version(version)


def check_version() -> None:
    """Refuse an installed vLLM that the release matrix does not hold."""
    if refusal := unknown_release_refusal(installed_release(ENGINE)):
        raise refuse(refusal)


def registered_quantization(name: str):
    """The quantization config class registered as ``name`` (``quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG``)."""
    from vllm.model_executor.layers.quantization import _CUSTOMIZED_METHOD_TO_QUANT_CONFIG

    return _CUSTOMIZED_METHOD_TO_QUANT_CONFIG.get(name)


def registered_model_loader(load_format: str):
    """The model loader registered for ``load_format`` (``model_loader._LOAD_FORMAT_TO_MODEL_LOADER``)."""
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

    return _LOAD_FORMAT_TO_MODEL_LOADER.get(load_format)


def local_slot(layer: EngineLayer, expert: int) -> int:
    """The row of global expert ``expert`` in this EP rank's parameters (negative: not held here);
    ``FusedMoE._map_global_expert_id_to_local_expert_id``."""
    return layer._map_global_expert_id_to_local_expert_id(expert)


def expert_routing_tables(layer: EngineLayer):
    """``FusedMoE._expert_routing_tables()``: what the modular kernel needs to route to this rank's experts."""
    return layer._expert_routing_tables()


def build_nvfp4_moe_kernel(method: Any, layer: EngineLayer) -> None:
    """``ModelOptNvFp4FusedMoE._build_moe_kernel(layer)``: the modular kernel over weights already in its format (what
    its ``process_weights_after_loading`` runs after the weight conversion). Before 0.30.0 the method has no such
    function: its ``process_weights_after_loading`` runs the same steps inline after the conversion
    (``get_fused_moe_quant_config``, ``make_nvfp4_moe_kernel`` over the layer's routing tables, the experts' own
    ``process_weights_after_loading``)."""
    if since("0.30.0"):
        method._build_moe_kernel(layer)
        return
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import make_nvfp4_moe_kernel

    method.moe_quant_config = method.get_fused_moe_quant_config(layer)
    method.moe_kernel = make_nvfp4_moe_kernel(
        moe_quant_config=method.moe_quant_config,
        moe_config=method.moe,
        experts_cls=method.experts_cls,
        backend=method.nvfp4_backend,
        routing_tables=expert_routing_tables(layer),
    )
    method.moe_kernel.fused_experts.process_weights_after_loading(layer)


def build_mxfp4_moe_kernel(method: Any, layer: EngineLayer) -> None:
    """``Mxfp4MoEMethod._build_moe_kernel(layer)``: the modular kernel over weights already in its format (what
    its ``process_weights_after_loading`` runs after the weight conversion). Before 0.30.0 the method has no such
    function: its ``_setup_kernel`` builds the kernel inline after the conversion (:func:`build_mxfp4_kernel_inline`)."""
    from vllm.model_executor.layers.quantization.mxfp4 import Mxfp4MoEMethod

    if not since("0.30.0"):
        build_mxfp4_kernel_inline(method, layer)
        return
    Mxfp4MoEMethod._build_moe_kernel(method, layer)


def build_mxfp4_kernel_inline(method: Any, layer: EngineLayer) -> None:
    """The kernel set-up the MXFP4 methods' ``_setup_kernel`` runs after its weight conversion where the release has
    no function of its own for it (``GptOssMxfp4MoEMethod`` in every release, ``Mxfp4MoEMethod`` before 0.30.0):
    ``get_fused_moe_quant_config``, then ``make_mxfp4_moe_kernel`` over the layer's routing tables (before 0.28.0 also
    handed the layer), then (from 0.29.0) the experts' own ``process_weights_after_loading``."""
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import make_mxfp4_moe_kernel

    method.moe_quant_config = method.get_fused_moe_quant_config(layer)
    if method.moe_quant_config is None or method.experts_cls is None:
        return
    with_layer = {} if since("0.28.0") else {"layer": layer}
    method.moe_kernel = make_mxfp4_moe_kernel(
        moe_quant_config=method.moe_quant_config,
        moe_config=method.moe,
        mxfp4_backend=method.mxfp4_backend,
        experts_cls=method.experts_cls,
        routing_tables=expert_routing_tables(layer),
        **with_layer,
    )
    if since("0.29.0"):
        method.moe_kernel.fused_experts.process_weights_after_loading(layer)


def mxfp4_method_options(stock: Any) -> dict:
    """What ``Mxfp4MoEMethod(moe, **options)`` takes besides the MoE config, from the ``stock`` method vLLM's config
    gives the layer: its ``activation_key`` from 0.32.0 (releases before take the MoE config only)."""
    return {"activation_key": stock.activation_key} if since("0.32.0") else {}
