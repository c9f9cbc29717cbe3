"""Every private SGLang name the plugin relies on, in one place, behind the releases the profiles are proven for.

SGLang has no public API for what the plugin does beside its methods' post-load step, so these are the
names of the SGLang releases of the release matrix (:mod:`moebake.schema.release_matrix`) that the plugin
reads or sets. :func:`check_version` refuses, in one line, an installed SGLang the matrix does not hold before
the plugin builds a layer, so a release that moved one of them is never served with a guess; :func:`check_release`
refuses a bake whose bytes that release's own code was not proven to build.

What the plugin relies on besides these, from SGLang's public behaviour (checked by the CPU tests in
the real SGLang 0.5.23):

* its safetensors iterators (:data:`SAFETENSORS_ITERATORS`, wrapped for a bake's shards by
  :mod:`moebake.engines.sglang.shard_iterator`) hand out tensors that a parameter loader reading only their shape
  and dtype leaves unread (:mod:`moebake.engines.sglang.moe_methods`);
* the model's ``load_weights`` hands a baked tensor, by its name, to its parameter's ``weight_loader``,
  and ``process_weights_after_loading`` runs once per layer after every weight was handed out.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from moebake.engines.layer_type import EngineLayer
from moebake.engines.release_check import installed_release, release_refusal, unknown_release_refusal
from moebake.engines.sglang.refusals import MoebakeRefusal

if TYPE_CHECKING:
    from moebake.schema.manifest import Manifest

ENGINE = "sglang"


def import_problem(module: str) -> str | None:
    """Why ``module`` (``deep_ep``, ``deep_gemm``) does not import here, in one line, or None. Any exception means it
    does not, as SGLang takes it (DeepEP's import-time host checks raise more than ImportError)."""
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - ImportError, OSError (a missing .so), RuntimeError: all mean "absent"
        return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
    return None


def cutedsl_w4a16_requested() -> bool:
    """``envs.SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16``: CuteDSL's W4A16 mode (from 0.5.19; False before, which lack it)."""
    from sglang.srt.environ import envs

    flag = getattr(envs, "SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16", None)
    return bool(flag.get()) if flag is not None else False


def platform():
    """What SGLang says the GPU is (``is_sm90``, ``is_sm100``): ``runtime_context.get_platform()`` from 0.5.19, its
    cached device checks in ``sglang.srt.utils`` before."""
    try:
        from sglang.srt.runtime_context import get_platform
    except ImportError:
        from types import SimpleNamespace

        from sglang.srt import utils

        return SimpleNamespace(is_sm90=bool(utils.is_sm90_supported()), is_sm100=bool(utils.is_sm100_supported()))
    return get_platform()


def quantization_choices():
    """SGLang's ``--quantization`` choices and the function that extends them: ``sglang.srt.arg_groups.choices``
    from 0.5.20, ``sglang.srt.server_args`` before."""
    try:
        from sglang.srt.arg_groups.choices import QUANTIZATION_CHOICES, add_quantization_method_choices
    except ImportError:
        from sglang.srt.server_args import QUANTIZATION_CHOICES, add_quantization_method_choices
    return QUANTIZATION_CHOICES, add_quantization_method_choices


def check_version() -> None:
    """Refuse an installed SGLang that the release matrix does not hold."""
    if refusal := unknown_release_refusal(installed_release(ENGINE)):
        raise MoebakeRefusal(refusal)


def check_release(manifest: Manifest) -> None:
    """Refuse a bake (its manifest) that the installed SGLang's own code was not proven to build."""
    if refusal := release_refusal(installed_release(ENGINE), manifest):
        raise MoebakeRefusal(refusal)


def loader_reads_every_byte() -> str | None:
    """The server flag that makes SGLang's weight iterator read whole shard files (so the baked bytes are read
    twice: by SGLang into host memory, then by the plugin), or None when its iterator hands lazy mmap views."""
    from sglang.srt.runtime_context import get_model

    model = get_model()
    if getattr(model, "weight_loader_disable_mmap", False):
        return "--weight-loader-disable-mmap"
    if getattr(model, "weight_loader_prefetch_checkpoints", False):
        return "--weight-loader-prefetch-checkpoints"
    return None


def use_nvfp4_dispatch() -> bool:
    """``modelopt_quant._use_nvfp4_dispatch()``: whether the dispatcher quantizes activations to NVFP4 (before 0.5.19,
    the module's ``MOE_NVFP4_DISPATCH``)."""
    from sglang.srt.layers.quantization import modelopt_quant

    if hasattr(modelopt_quant, "_use_nvfp4_dispatch"):
        return modelopt_quant._use_nvfp4_dispatch()
    return bool(modelopt_quant.MOE_NVFP4_DISPATCH)


def fp4_scale_vector_size() -> int:
    """``flashinfer_cutedsl._FP4_SF_VEC_SIZE``: elements per NVFP4 block scale in SGLang's CuteDSL runner."""
    from sglang.srt.layers.moe.moe_runner.flashinfer_cutedsl import _FP4_SF_VEC_SIZE

    return _FP4_SF_VEC_SIZE


def is_cutedsl_v2_standard(method: Any) -> bool:
    """``ModelOptNvFp4FusedMoEMethod._is_cutedsl_v2_standard``: the standard (not DeepEP) CuteDSL path."""
    return bool(method._is_cutedsl_v2_standard)


def route_as_unquantized_deepep(layer: EngineLayer) -> None:
    """``DeepEPMoE.deprecate_flag`` (0.5.17-0.5.23): SGLang's ``DeepEPMoE`` runs an unquantized BF16 layer on the
    ``deep_gemm`` runner behind DeepEP through FusedMoE's runner (``UnquantizedFusedMoEMethod.apply``, DeepGEMM's masked
    grouped GEMM) when its ``quant_config is None``; a ``--quantization moebake`` layer has a config, so SGLang would
    take its own masked branch, which asserts in low-latency mode. The bake's layer is given stock's decision. A
    ``FusedMoE`` (another all-to-all backend, refused for this target) has no such attribute and is left alone."""
    if hasattr(layer, "deprecate_flag"):
        layer.deprecate_flag = True


def clear_routing_bias(layer: EngineLayer) -> None:
    """What SGLang's ``trtllm_sm100`` post-load step sets besides the weights: ``layer._situ_routing_bias_bf16``."""
    layer._situ_routing_bias_bf16 = None


def register_static_scale_ones(method: Any, layer: EngineLayer) -> None:
    """``Mxfp4FlashinferTrtllmMoEMethod._register_static_scale_ones``: the unit activation scales it registers."""
    method._register_static_scale_ones(layer)


def set_padded_hidden(method: Any, hidden_padded: int) -> None:
    """``Mxfp4MoEMethod._padded_hidden``: the hidden size its SM90 forward pads activations to (the bake's ``H_pad``)."""
    method._padded_hidden = hidden_padded


def uses_sm90_humming(method: Any) -> bool:
    """``Mxfp4MoEMethod._use_sm90_humming``: whether the server runs FlashInfer's Humming W4A8 path
    (``--flashinfer-mxfp4-moe-precision fp8``); releases before 0.5.19 have no such path (False)."""
    return bool(getattr(method, "_use_sm90_humming", False))


def set_mxfp4_backend(layer: EngineLayer, backend: str) -> None:
    """``layer._mxfp4_backend``: the runner ``Mxfp4MoEMethod``'s forward dispatches on (its post-load step sets it)."""
    layer._mxfp4_backend = backend


def set_dsv4_mxfp4_backend(layer: EngineLayer, backend: str) -> None:
    """``layer._dsv4_mxfp4_backend``: the runner DeepSeek-V4's MXFP4 methods dispatch on (their post-load step sets it)."""
    layer._dsv4_mxfp4_backend = backend


def cutedsl_derived(method: Any, layer: EngineLayer) -> None:
    """SGLang's CuteDSL post-load step (``ModelOptNvFp4FusedMoEMethod.process_weights_after_loading``) minus its
    transforms (the bake holds their result): the
    swizzled-scale aliases, on the standard path the load-time F32 scalars the bake does not store
    (``g1_alphas``, ``g2_alphas``, ``w2_input_scale_quant``; per local expert, from the global input scales)
    and the MMA-layout scale views, then the dispatcher's activation quantization."""
    from sglang.srt.layers.quantization.modelopt_quant import should_use_flashinfer_cutlass_moe_fp4_allgather
    from sglang.srt.layers.utils.common import copy_or_rebind_param

    from moebake.layouts.nvfp4_scalars import load_time_scales

    local = slice(layer.moe_ep_rank * layer.num_local_experts, (layer.moe_ep_rank + 1) * layer.num_local_experts)
    layer.w13_blockscale_swizzled, layer.w2_blockscale_swizzled = layer.w13_weight_scale, layer.w2_weight_scale
    if is_cutedsl_v2_standard(method):
        from flashinfer.cute_dsl.utils import convert_sf_to_mma_layout

        derived = load_time_scales(
            {name: getattr(layer, name).data for name in ("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale")},
            local,
        )
        for name in ("g1_alphas", "g2_alphas", "w2_input_scale_quant"):
            copy_or_rebind_param(layer, name, derived[name])
        for weight, scales in (("w13_weight", "w13_weight_scale"), ("w2_weight", "w2_weight_scale")):
            w, sf = getattr(layer, weight), getattr(layer, scales)
            copy_or_rebind_param(
                layer,
                scales.replace("weight_scale", "blockscale_mma"),
                convert_sf_to_mma_layout(
                    sf.data.contiguous().view(torch.uint8).reshape(-1),
                    m=w.shape[1],
                    k=w.shape[2] * 2,
                    num_groups=w.shape[0],
                    sf_vec_size=fp4_scale_vector_size(),
                ),
            )
    dispatch_fp4 = use_nvfp4_dispatch() or should_use_flashinfer_cutlass_moe_fp4_allgather()
    layer.dispatcher.set_quant_config({"input_global_scale": layer.w13_input_scale_quant if dispatch_fp4 else None})


SAFETENSORS_ITERATORS = ("safetensors_weights_iterator", "buffered_multi_thread_safetensors_weights_iterator")
"""The safetensors iterators ``DefaultModelLoader._get_weights_iterator`` calls for a local checkpoint (0.5.17-0.5.23):
names bound in ``sglang.srt.model_loader.loader``, each taking ``hf_weights_files`` first and the options
:data:`SAFETENSORS_ITERATOR_OPTIONS`."""
SAFETENSORS_ITERATOR_OPTIONS = ("disable_mmap", "prefetch", "drop_cache_after_load")


def wrap_safetensors_iterators(wrap: Callable[..., Any]) -> None:
    """Replace each of :data:`SAFETENSORS_ITERATORS` in ``sglang.srt.model_loader.loader`` by ``wrap(original)``, once
    per process. MoebakeRefusal, in one line, where one is missing or takes other parameters (a release that moved
    it)."""
    import inspect

    from sglang.srt.model_loader import loader

    found = {}
    for name in SAFETENSORS_ITERATORS:
        function = getattr(loader, name, None)
        function = getattr(function, "moebake_original", function)
        try:
            parameters = tuple(inspect.signature(function).parameters) if callable(function) else ()
        except (TypeError, ValueError):
            parameters = ()
        if parameters[:1] != ("hf_weights_files",) or not set(SAFETENSORS_ITERATOR_OPTIONS) <= set(parameters):
            raise MoebakeRefusal(
                f"SGLang {installed_release(ENGINE).version} changed sglang.srt.model_loader.loader.{name} (expected a function of "
                f"hf_weights_files and {', '.join(SAFETENSORS_ITERATOR_OPTIONS)}, found "
                f"{'nothing' if function is None else parameters}), through which SGLang hands out a bake's tensors; "
                f"install an SGLang of the release matrix (pip install 'moebake[sglang]') or update "
                f"moebake/engines/sglang/internals.py for this release"
            )
        found[name] = function
    for name, function in found.items():
        if getattr(loader, name) is function:  # not wrapped yet (twice must not wrap twice)
            wrapped = wrap(function)
            wrapped.moebake_original = function
            setattr(loader, name, wrapped)


LOAD_WEIGHTS_AND_POSTPROCESS = "sglang.srt.model_loader.loader.DefaultModelLoader.load_weights_and_postprocess"
LOAD_WEIGHTS_AND_POSTPROCESS_PARAMETERS = ("model", "weights", "target_device")


def wrap_load_weights_and_postprocess(wrap: Callable[..., Any]) -> None:
    """Replace ``DefaultModelLoader.load_weights_and_postprocess(model, weights, target_device)`` (a staticmethod in
    0.5.17-0.5.23: every model SGLang's default, sharded-state-free loaders build gets its weights through it) by
    ``wrap(original)``, once per process. MoebakeRefusal, in one line, where the function is missing or is not a
    staticmethod of those parameters (a release that moved it): the plugin never guesses another entry point."""
    import inspect

    from sglang.srt.model_loader import loader

    cls = getattr(loader, "DefaultModelLoader", None)
    found = inspect.getattr_static(cls, "load_weights_and_postprocess", None) if cls is not None else None
    function = found.__func__ if isinstance(found, staticmethod) else None
    try:
        parameters = tuple(inspect.signature(function).parameters) if function is not None else None
    except (TypeError, ValueError):
        parameters = None
    if parameters != LOAD_WEIGHTS_AND_POSTPROCESS_PARAMETERS:
        what = (
            "missing"
            if found is None
            else f"a staticmethod{parameters}"
            if function is not None
            else f"a {type(found).__name__}, not a staticmethod"
        )
        raise MoebakeRefusal(
            f"SGLang {installed_release(ENGINE).version} changed {LOAD_WEIGHTS_AND_POSTPROCESS} (expected a staticmethod"
            f"{LOAD_WEIGHTS_AND_POSTPROCESS_PARAMETERS}, found {what}), through which the plugin reads a bake's "
            f"non-expert tensors; install an SGLang of the release matrix (pip install 'moebake[sglang]') or "
            f"update moebake/engines/sglang/internals.py for this release"
        )
    if getattr(function, "moebake_original", None) is not None:
        return  # installed already (plugins load once per process, but twice must not wrap twice)
    wrapped = wrap(function)
    wrapped.moebake_original = function
    assert cls is not None  # a found staticmethod has its class
    cls.load_weights_and_postprocess = staticmethod(wrapped)
