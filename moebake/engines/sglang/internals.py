"""Every private SGLang name the plugin relies on, in one place, behind the releases the profiles are proven for.

SGLang has no public API for what the plugin does beside its methods' post-load step, so these are the
names of the SGLang releases of the release matrix (:mod:`moebake.schema.release_matrix`) that the plugin
reads or sets. :func:`check_version` refuses, in one line, an installed SGLang the matrix does not hold before
the plugin builds a layer, so a release that moved one of them is never served with a guess; :func:`check_release`
refuses a bake whose bytes that release's own code was not proven to build.

What the plugin relies on besides these, from SGLang's public behaviour (checked by the CPU tests in
the real SGLang 0.5.23):

* its default safetensors iterators hand each tensor as ``safe_open(..., framework="pt").get_tensor``
  returns it: a lazy view of the mmap'd shard, so a parameter loader that reads only the tensor's shape
  and dtype leaves the baked bytes unread (:mod:`moebake.engines.sglang.moe_methods`);
* the model's ``load_weights`` hands a baked tensor, by its name, to its parameter's ``weight_loader``,
  and ``process_weights_after_loading`` runs once per layer after every weight was handed out.
"""

from moebake.engines.release_check import release_refusal, unknown_release_refusal
from moebake.engines.sglang.refusals import MoebakeRefusal


def installed_release() -> str:
    import sglang

    return sglang.__version__


def check_version() -> None:
    """Refuse an installed SGLang that the release matrix does not hold."""
    if refusal := unknown_release_refusal("sglang", installed_release()):
        raise MoebakeRefusal(refusal)


def check_release(manifest) -> None:
    """Refuse a bake (its manifest) that the installed SGLang's own code was not proven to build."""
    if refusal := release_refusal("sglang", installed_release(), manifest):
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
    """``modelopt_quant._use_nvfp4_dispatch()``: whether the dispatcher quantizes activations to NVFP4. SGLang 0.5.17-0.5.19
    have no such function: there the module's ``MOE_NVFP4_DISPATCH`` flag alone decides (0.5.20 added the FlashInfer
    all-to-all's own dispatch type beside it)."""
    from sglang.srt.layers.quantization import modelopt_quant

    decide = getattr(modelopt_quant, "_use_nvfp4_dispatch", None)
    return decide() if decide is not None else bool(modelopt_quant.MOE_NVFP4_DISPATCH)


def platform():
    """SGLang's platform facts the GPU refusal reads (``is_sm90``, ``is_sm100``): ``runtime_context.get_platform()`` from
    0.5.19 on. SGLang 0.5.17 and 0.5.18 have no platform context: their ``sglang.srt.utils.common.is_sm90_supported`` and
    ``is_sm100_supported``, which the later platform context probes under these names, answer instead. (A real SGLang
    0.5.17 server refused every bake at ``ImportError: cannot import name 'get_platform'`` before this.)"""
    from types import SimpleNamespace

    from sglang.srt import runtime_context
    from sglang.srt.utils.common import is_sm90_supported, is_sm100_supported

    get_platform = getattr(runtime_context, "get_platform", None)
    if get_platform is not None:
        return get_platform()
    return SimpleNamespace(is_sm90=is_sm90_supported(), is_sm100=is_sm100_supported())


def fp4_scale_vector_size() -> int:
    """``flashinfer_cutedsl._FP4_SF_VEC_SIZE``: elements per NVFP4 block scale in SGLang's CuteDSL runner."""
    from sglang.srt.layers.moe.moe_runner.flashinfer_cutedsl import _FP4_SF_VEC_SIZE

    return _FP4_SF_VEC_SIZE


def is_cutedsl_v2_standard(method) -> bool:
    """``ModelOptNvFp4FusedMoEMethod._is_cutedsl_v2_standard``: the standard (not DeepEP) CuteDSL path."""
    return bool(method._is_cutedsl_v2_standard)


def clear_routing_bias(layer) -> None:
    """What SGLang's ``trtllm_sm100`` post-load step sets besides the weights: ``layer._situ_routing_bias_bf16``."""
    layer._situ_routing_bias_bf16 = None


def register_static_scale_ones(method, layer) -> None:
    """``Mxfp4FlashinferTrtllmMoEMethod._register_static_scale_ones``: the unit activation scales it registers."""
    method._register_static_scale_ones(layer)
