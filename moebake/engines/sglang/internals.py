"""Every private SGLang name the plugin relies on, in one place, behind the version the profiles are proven for.

SGLang has no public API for what the plugin does beside its methods' post-load step, so these are the
names of SGLang 0.5.23 (:data:`moebake.schema.profiles.PROFILES`'s ``sglang`` profile) that the plugin
reads or sets. :func:`check_version` refuses, in one line, any other installed SGLang before the plugin
builds a layer, so a release that moved one of them is never served with a guess.

What the plugin relies on besides these, from SGLang's public behaviour (checked by the CPU tests in
the real SGLang 0.5.23):

* its default safetensors iterators hand each tensor as ``safe_open(..., framework="pt").get_tensor``
  returns it: a lazy view of the mmap'd shard, so a parameter loader that reads only the tensor's shape
  and dtype leaves the baked bytes unread (:mod:`moebake.engines.sglang.moe_methods`);
* the model's ``load_weights`` hands a baked tensor, by its name, to its parameter's ``weight_loader``,
  and ``process_weights_after_loading`` runs once per layer after every weight was handed out.
"""

from moebake.engines.sglang.refusals import MoebakeRefusal
from moebake.schema.profiles import PROFILES

PROVEN_VERSION = PROFILES["sglang"].version


def check_version() -> None:
    """Refuse an installed SGLang other than :data:`PROVEN_VERSION`."""
    import sglang

    if sglang.__version__ != PROVEN_VERSION:
        raise MoebakeRefusal(f"this moebake's SGLang plugin is proven against SGLang {PROVEN_VERSION} (its private names and "
                             f"load-time bytes), and SGLang {sglang.__version__} is installed; install sglang=={PROVEN_VERSION} "
                             f"(`pip install \".[sglang]\"` from a moebake clone pins it) or a moebake proven for {sglang.__version__}")


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
    """``modelopt_quant._use_nvfp4_dispatch()``: whether the dispatcher quantizes activations to NVFP4."""
    from sglang.srt.layers.quantization.modelopt_quant import _use_nvfp4_dispatch

    return _use_nvfp4_dispatch()


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
