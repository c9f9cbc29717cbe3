"""The plugin's fused-MoE methods: baked parameters in, SGLang's own runner out, no transform in between.

Each method subclasses the SGLang method whose post-load parameters the bake equals (see
:mod:`moebake.schema.profiles`), so SGLang's ``create_moe_runner`` and ``apply`` (the kernel call)
are SGLang's own; only three steps are moebake's:

* ``create_weights``: one parameter per baked tensor of the layer's manifest record, at the
  record's shape with the rank's expert count ``E_local = experts / ep_size`` first and the record's
  dtype (uninitialised: every byte is loaded);
* the parameters' ``weight_loader``: checks the checkpoint's tensor against the record (shape and
  dtype, metadata only) and notes that the checkpoint names it; it never reads the tensor's data.
  SGLang's safetensors iterator hands lazy views of the mmap'd shards (``safe_open(...).get_tensor``),
  so the baked bytes are not read by SGLang at all;
* ``process_weights_after_loading``: refuses if a baked parameter was never named, then reads this EP
  rank's rows of every baked tensor once, from the files, straight into the parameters
  (:class:`moebake.loading.rank_loader.RankLoader`: pinned staging, overlapped host-to-device copies),
  and makes the per-expert scalars SGLang's runner takes (SwiGLU constants from the manifest's activation).

``create_weights`` also plans the ranges the post-load step will read on the bake's read-ahead
(:meth:`~moebake.engines.sglang.config.MoebakeConfig.readahead`), so the disk starts on them as the model is built.

Which method serves which (target, source format) is the serving records' (:mod:`moebake.schema.serving`): each
factory here registers under its route's name (:func:`route`). Refusals (one line each,
:mod:`moebake.engines.sglang.refusals`) run when the method is made, before any weight is read.
"""

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from moebake.engines.layer_type import EngineLayer
from moebake.engines.sglang import internals, refusals
from moebake.engines.sglang.refusals import MoebakeRefusal
from moebake.errors import MoebakeError
from moebake.formats.safetensors_file import DTYPES
from moebake.loading.rank_loader import rank_runs
from moebake.schema import serving
from moebake.schema.enums import ActivationKind
from moebake.schema.manifest import LayerRecord, TensorRecord

logger = logging.getLogger(__name__)

FACTORIES: dict = {}
"""Route name (:attr:`moebake.schema.serving.ServingRecord.route`) -> the factory of the MoE method class it makes."""


def route(name: str):
    """Register the decorated method factory as the SGLang route ``name``."""

    def register(factory: Callable[..., Any]):
        FACTORIES[name] = factory
        return factory

    return register


class SelfLoadingExperts:
    """What every moebake MoE method in SGLang does: manifest-shaped parameters whose ``weight_loader`` only notes
    that the checkpoint names them, and a post-load step that reads this EP rank's rows from the files itself
    (SGLang's loader never reads a baked byte; contrast the vLLM plugin's loader-filled parameters).

    ``WHOLE_TENSORS``: per-expert tensors SGLang keeps for all experts on every rank (it slices them itself).
    """

    WHOLE_TENSORS: frozenset[str] = frozenset()

    def _bake_init(self, config: Any, record: LayerRecord) -> None:
        self.moebake_config, self.record = config, record
        self.loaded: set[str] = set()
        self.load_stats = None

    def _create_baked_weights(self, layer: EngineLayer, num_experts: int, hidden_size: int, intermediate_size_per_partition: int) -> None:
        record = self.record
        refusals.check_parallelism(record, layer.moe_tp_size, layer.moe_ep_size)
        refusals.check_dims(record, layer.num_experts, hidden_size, intermediate_size_per_partition)
        local = record.experts // layer.moe_ep_size
        for name, spec in record.tensors.items():
            dtype = DTYPES[spec.dtype][0]
            per_expert = spec.shape[0] == record.experts and name not in self.WHOLE_TENSORS
            shape = [local, *spec.shape[1:]] if per_expert else list(spec.shape)
            param = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, param)
            setattr(param, "weight_loader", functools.partial(self._note_baked, name, spec, dtype))  # as SGLang sets it
        self._prepare_reads(layer)

    def _rows(self, layer: EngineLayer) -> tuple[dict[str, torch.Tensor], list]:
        """What the post-load step reads: ``({baked tensor: its parameter's data}, this EP rank's expert runs)``."""
        destinations = {name: getattr(layer, name).data for name in self.record.tensors}
        return destinations, rank_runs(self.record.experts, layer.moe_ep_rank, layer.moe_ep_size)

    def _prepare_reads(self, layer: EngineLayer) -> None:
        """As the layer is built: on a CUDA device, begin pinning the bake's reader's ring (its first read, the
        whole-model loader's or a post-load step's, then finds it ready: :meth:`StagedReader.start_ring`), and plan
        the byte ranges the post-load step will read (the same :meth:`RankLoader.byte_ranges` call) on the bake's
        read-ahead. Never raises: the reads refuse whatever made this fail."""
        try:
            destinations, runs = self._rows(layer)
            device = next(iter(destinations.values())).device
            if device.type == "cuda":
                self.moebake_config.reader(device).start_ring()
            readahead = self.moebake_config.readahead(device)
            if readahead is not None:
                loader = self.moebake_config.rank_loader(device)
                readahead.add(loader.byte_ranges(self.record, destinations, runs, self.WHOLE_TENSORS))
        except Exception as err:
            logger.debug("moebake: no early ring or read-ahead for %s (%s)", self.record.prefix, err)

    def create_weights(
        self,
        layer: EngineLayer,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ):
        """SGLang's hook: the manifest's parameters instead of the method's own. Methods whose SGLang runner reads
        attributes its own ``create_weights`` sets override this and set them first."""
        self._create_baked_weights(layer, num_experts, hidden_size, intermediate_size_per_partition)

    def _note_baked(
        self,
        name: str,
        spec: TensorRecord,
        dtype: torch.dtype | None,
        param: torch.nn.Parameter,
        loaded: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """The checkpoint names baked tensor ``name``: check its shape and dtype (metadata only; its data is
        never read here, the post-load step reads the rank's rows from the files)."""
        where = f"{self.record.prefix}{name}"
        if tuple(loaded.shape) != spec.shape or loaded.dtype != dtype:
            raise MoebakeRefusal(
                f"checkpoint tensor {where} is {loaded.dtype} {list(loaded.shape)}, the manifest says "
                f"{spec.dtype} {list(spec.shape)}; run `moebake verify` on the checkpoint"
            )
        self.loaded.add(name)

    def _check_loaded(self) -> None:
        refusals.check_all_loaded(self.record, self.loaded)

    def _load_baked_rows(self, layer: EngineLayer) -> None:
        """Refuse unless the checkpoint named every baked tensor, then read this EP rank's rows of each from the
        files into the layer's parameters (tensors in ``WHOLE_TENSORS``, and those not per expert, whole)."""
        self._check_loaded()
        destinations, runs = self._rows(layer)
        device = next(iter(destinations.values())).device
        try:
            self.load_stats = self.moebake_config.rank_loader(device).load(self.record, destinations, runs, self.WHOLE_TENSORS)
        except MoebakeError as err:
            raise MoebakeRefusal(f"{err}; run `moebake verify` on the checkpoint") from None


def _common_refusals(config: Any, target: str) -> None:
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend, get_moe_runner_backend

    manifest = config.manifest
    refusals.check_gpu(target, internals.platform())
    refusals.check_backends(manifest.engine, get_moe_runner_backend().value, get_moe_a2a_backend().value)
    if manifest.flashinfer_layout:
        import flashinfer

        refusals.check_flashinfer_layout(manifest, flashinfer.__version__)


@route("sm90-cutlass")
def _sm90_cutlass_method(humming: bool = False):
    """``humming``: the ``sm90-cutlass-w4a8`` method (FlashInfer's Humming W4A8: the bake also holds the
    per-expert residual scales, and SGLang must run the profile's ``HUMMING_FLAGS``)."""
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4MoEMethod

    class MoebakeSm90CutlassMoEMethod(SelfLoadingExperts, Mxfp4MoEMethod):
        """Baked ``sm90-cutlass`` experts through SGLang's ``flashinfer_mxfp4`` runner (FlashInfer
        ``cutlass_fused_moe`` W4A16), as ``Mxfp4MoEMethod``'s ``cutlass_sm90`` path runs them; with ``humming``,
        baked ``sm90-cutlass-w4a8`` experts as its ``_use_sm90_humming`` path (W4A8) runs them."""

        def __init__(self, config: Any, record: LayerRecord, prefix: str):
            Mxfp4MoEMethod.__init__(self, prefix)
            self._bake_init(config, record)
            internals.set_padded_hidden(self, record.hidden_padded)
            refusals.check_humming_precision(config.manifest.target, humming, internals.uses_sm90_humming(self))

        def create_weights(
            self,
            layer: EngineLayer,
            num_experts: int,
            hidden_size: int,
            intermediate_size_per_partition: int,
            params_dtype: torch.dtype,
            with_bias: bool = False,
            **extra_weight_attrs: Any,
        ):
            self.num_experts = num_experts
            self._create_baked_weights(layer, num_experts, hidden_size, intermediate_size_per_partition)

        def process_weights_after_loading(self, layer: EngineLayer) -> None:
            self._load_baked_rows(layer)
            activation, local = self.moebake_config.manifest.activation, layer.num_local_experts
            device = layer.w13_weight.device

            def per_expert(value: float):
                return (
                    None
                    if value is None
                    else torch.nn.Parameter(torch.full((local,), value, dtype=torch.float32, device=device), requires_grad=False)
                )

            plain = activation.kind == ActivationKind.SWIGLU  # DeepSeek-V4: SGLang passes only the limit
            layer.swiglu_alpha = None if plain else per_expert(activation.alpha)
            layer.swiglu_beta = None if plain else per_expert(activation.beta)
            layer.swiglu_limit = per_expert(activation.limit)
            for bias in ("w13_weight_bias", "w2_weight_bias"):
                if bias not in self.record.tensors:
                    setattr(layer, bias, None)
            if humming:  # SGLang's FC2 activation scale of this path: a constant 1.0 (its residuals are baked)
                layer.humming_fc2_act_scale = torch.nn.Parameter(torch.ones((), dtype=torch.float32, device=device), requires_grad=False)

    return MoebakeSm90CutlassMoEMethod


@route("deepep-bf16")
def _deepep_bf16_method():
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    class MoebakeDeepEPBf16MoEMethod(SelfLoadingExperts, UnquantizedFusedMoEMethod):
        """Baked ``deepep-bf16`` experts (``[gate; up]`` W13) through SGLang's unquantized DeepEP
        low-latency + DeepGEMM path, whose own post-load step transforms nothing."""

        def __init__(self, config: Any, record: LayerRecord, prefix: str):
            UnquantizedFusedMoEMethod.__init__(self, use_deep_gemm=True)
            self._bake_init(config, record)

        def process_weights_after_loading(self, layer: EngineLayer) -> None:
            self._load_baked_rows(layer)
            UnquantizedFusedMoEMethod.process_weights_after_loading(self, layer)  # sets the dispatcher to BF16 only
            internals.route_as_unquantized_deepep(layer)

    return MoebakeDeepEPBf16MoEMethod


@route("sm100-trtllm")
def _sm100_trtllm_method():
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4MoEMethod

    class MoebakeSm100TrtllmMoEMethod(SelfLoadingExperts, Mxfp4MoEMethod):
        """Baked GPT-OSS ``sm100-trtllm`` experts through SGLang's ``flashinfer_mxfp4`` runner on Blackwell
        (``trtllm_fp4_block_scale_moe``), as ``Mxfp4MoEMethod``'s ``trtllm_sm100`` path runs them: the bake holds
        the shuffled weights, swizzled scales, F32 biases and the per-expert SwiGLU constants it makes."""

        def __init__(self, config: Any, record: LayerRecord, prefix: str):
            Mxfp4MoEMethod.__init__(self, prefix)
            self._bake_init(config, record)

        def create_weights(
            self,
            layer: EngineLayer,
            num_experts: int,
            hidden_size: int,
            intermediate_size_per_partition: int,
            params_dtype: torch.dtype,
            with_bias: bool = False,
            **extra_weight_attrs: Any,
        ):
            self.num_experts, self.with_bias = num_experts, with_bias
            self.hidden_size, self.intermediate_size_per_partition = self.record.hidden_padded, self.record.intermediate_padded
            self._create_baked_weights(layer, num_experts, hidden_size, intermediate_size_per_partition)

        def process_weights_after_loading(self, layer: EngineLayer) -> None:
            self._load_baked_rows(layer)
            internals.clear_routing_bias(layer)

    return MoebakeSm100TrtllmMoEMethod


@route("sm100-trtllm-deepseek-v4")
def _sm100_deepseek_v4_method():
    from sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe import Mxfp4FlashinferTrtllmMoEMethod

    class MoebakeSm100DeepseekV4MoEMethod(SelfLoadingExperts, Mxfp4FlashinferTrtllmMoEMethod):
        """Baked DeepSeek-V4 ``sm100-trtllm`` experts through SGLang's ``Mxfp4FlashinferTrtllmMoEMethod``
        (``trtllm_fp4_block_scale_moe``). SGLang names the scales ``w*_weight_scale_inv`` and holds the shuffled
        weights as uint8: the post-load step binds those names to the baked tensors (same storage)."""

        def __init__(self, config: Any, record: LayerRecord, prefix: str):
            Mxfp4FlashinferTrtllmMoEMethod.__init__(self, None, prefix)  # its FP8 method only prepares weights: baked
            self._bake_init(config, record)

        def process_weights_after_loading(self, layer: EngineLayer) -> None:
            self._load_baked_rows(layer)
            for weight in (layer.w13_weight, layer.w2_weight):
                weight.data = weight.data.view(torch.uint8)  # the same bytes, typed as SGLang's shuffle leaves them
            layer.w13_weight_scale_inv, layer.w2_weight_scale_inv = layer.w13_weight_scale, layer.w2_weight_scale
            internals.register_static_scale_ones(self, layer)

    return MoebakeSm100DeepseekV4MoEMethod


@route("sm90-marlin")
def _sm90_marlin_method():
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4MoEMethod

    class MoebakeSm90MarlinMoEMethod(SelfLoadingExperts, Mxfp4MoEMethod):
        """Baked GPT-OSS ``sm90-marlin`` experts through SGLang's ``marlin`` runner, as ``Mxfp4MoEMethod``'s Marlin
        path runs them (``_apply_marlin``: activations zero-padded to the baked H). The bake holds what
        ``prepare_moe_mxfp4_layer_for_marlin`` leaves (repacked int32 weights, E8M0 scales, BF16 biases); the
        Marlin runner makes its own workspace per call."""

        def __init__(self, config: Any, record: LayerRecord, prefix: str):
            Mxfp4MoEMethod.__init__(self, prefix)
            self._bake_init(config, record)

        def create_weights(
            self,
            layer: EngineLayer,
            num_experts: int,
            hidden_size: int,
            intermediate_size_per_partition: int,
            params_dtype: torch.dtype,
            with_bias: bool = False,
            **extra_weight_attrs: Any,
        ):
            self.num_experts, self.with_bias = num_experts, with_bias
            self.hidden_size, self.intermediate_size_per_partition = self.record.hidden_padded, self.record.intermediate_padded
            self.hidden_pad = self.record.hidden_padded - self.record.hidden
            self._create_baked_weights(layer, num_experts, hidden_size, intermediate_size_per_partition)

        def process_weights_after_loading(self, layer: EngineLayer) -> None:
            self._load_baked_rows(layer)
            internals.set_mxfp4_backend(layer, "marlin")

    return MoebakeSm90MarlinMoEMethod


@route("sm90-marlin-deepseek-v4")
def _sm90_marlin_deepseek_v4_method():
    from sglang.srt.layers.quantization.mxfp4_marlin_moe import Mxfp4MarlinMoEMethod

    class MoebakeSm90MarlinDeepseekV4MoEMethod(SelfLoadingExperts, Mxfp4MarlinMoEMethod):
        """Baked DeepSeek-V4 ``sm90-marlin`` experts through SGLang's ``Mxfp4MarlinMoEMethod`` (``marlin`` runner),
        whose Marlin preparation leaves ``w*_weight`` / ``w*_weight_scale`` as the bake holds them."""

        def __init__(self, config: Any, record: LayerRecord, prefix: str):
            Mxfp4MarlinMoEMethod.__init__(self, None, prefix)  # its FP8 method only prepares weights: baked
            self._bake_init(config, record)

        def process_weights_after_loading(self, layer: EngineLayer) -> None:
            self._load_baked_rows(layer)
            internals.set_dsv4_mxfp4_backend(layer, "marlin")

    return MoebakeSm90MarlinDeepseekV4MoEMethod


@route("cutedsl")
def _cutedsl_method():
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptNvFp4FusedMoEMethod

    class MoebakeCuteDslMoEMethod(SelfLoadingExperts, ModelOptNvFp4FusedMoEMethod):
        """Baked ``cutedsl`` / ``cutedsl-deepep`` NVFP4 experts through SGLang's ``flashinfer_cutedsl`` runner
        (standard, or DeepEP low-latency with ``--moe-a2a-backend deepep``), as ``ModelOptNvFp4FusedMoEMethod``
        prepares them. The bake holds the interleaved weights and swizzled scales; at load only what SGLang
        derives from them is made (:func:`moebake.engines.sglang.internals.cutedsl_derived`)."""

        WHOLE_TENSORS = frozenset({"w13_input_scale", "w2_input_scale"})  # SGLang keeps them for all experts

        def __init__(self, config: Any, record: LayerRecord, prefix: str):
            ModelOptNvFp4FusedMoEMethod.__init__(self, config.original)
            self._bake_init(config, record)
            _check_cutedsl_w4a4(self)

        def process_weights_after_loading(self, layer: EngineLayer) -> None:
            self._load_baked_rows(layer)
            internals.cutedsl_derived(self, layer)

    return MoebakeCuteDslMoEMethod


def _check_cutedsl_w4a4(method: Any) -> None:
    """The bake's scalars are SGLang's for static W4A4 activation scales; refuse the modes that neutralise them."""
    if getattr(method.quant_config, "use_per_token_activation", False) or (
        internals.is_cutedsl_v2_standard(method) and internals.cutedsl_w4a16_requested()
    ):
        raise MoebakeRefusal(
            "this cutedsl bake holds the checkpoint's static activation scales (W4A4); unset "
            "SGLANG_FLASHINFER_CUTEDSL_NVFP4_W4A16 / per-token activation scaling, or re-bake"
        )


@route("sm90-cutlass-w4a8")
def _sm90_cutlass_w4a8_method():
    return _sm90_cutlass_method(humming=True)


METHODS = {r.target: FACTORIES[r.route] for r in serving.routes(serving.SGLANG) if r.source_format is None}
"""Target -> its method factory, for every source format of the target (a view of the serving records)."""


def moe_method(config: Any, record: LayerRecord, prefix: str):
    """The moebake MoE method for ``config``'s target and source format and the layer ``record`` (refusing first if
    it must)."""
    manifest = config.manifest
    found = serving.record(serving.SGLANG, manifest.target, manifest.source.format)
    if found is None or not found.served:
        raise MoebakeRefusal(serving.unserved(serving.SGLANG, manifest.target, manifest.source.format))
    _common_refusals(config, manifest.target)
    return FACTORIES[found.route]()(config, record, prefix)
