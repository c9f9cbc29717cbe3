"""The plugin's fused-MoE methods: baked parameters in, SGLang's own runner out, no transform in between.

Each method subclasses the SGLang method whose post-load parameters the bake equals (see
:mod:`moebake.engines.profiles`), so SGLang's ``create_moe_runner`` and ``apply`` (the kernel call)
are SGLang's own; only three steps are moebake's:

* ``create_weights``: one parameter per baked tensor of the layer's manifest record, at the
  record's shape with the rank's expert count ``E_local = experts / ep_size`` first and the record's
  dtype (uninitialised: every byte is loaded);
* the parameters' ``weight_loader``: the checkpoint's whole tensor in, shape and dtype checked
  against the record, rows ``[ep_rank * E_local, (ep_rank + 1) * E_local)`` copied;
* ``process_weights_after_loading``: refuses if a baked parameter was never loaded, then only makes
  the per-expert scalars SGLang's runner takes (SwiGLU constants from the manifest's activation).

Refusals (one line each, :mod:`moebake.engines.sglang.refusals`) run when the method is made,
before any weight is read.
"""

import functools

import torch

from moebake.engines.sglang import refusals
from moebake.engines.sglang.refusals import MoebakeRefusal
from moebake.formats.safetensors_file import DTYPES


class BakedExperts:
    """What every moebake MoE method does: manifest-shaped parameters, checked rank-slice loading."""

    def _bake_init(self, config, record: dict) -> None:
        self.moebake_config, self.record, self.loaded = config, record, set()

    def _create_baked_weights(self, layer: torch.nn.Module, num_experts: int, hidden_size: int,
                              intermediate_size_per_partition: int) -> None:
        record = self.record
        refusals.check_parallelism(record, layer.moe_tp_size, layer.moe_ep_size)
        refusals.check_dims(record, layer.num_experts, hidden_size, intermediate_size_per_partition)
        local = record["experts"] // layer.moe_ep_size
        start = layer.moe_ep_rank * local
        for name, spec in record["tensors"].items():
            dtype = DTYPES[spec["dtype"]][0]
            per_expert = spec["shape"][0] == record["experts"]
            shape = [local, *spec["shape"][1:]] if per_expert else list(spec["shape"])
            param = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            layer.register_parameter(name, param)
            rows = slice(start, start + local) if per_expert else slice(None)
            param.weight_loader = functools.partial(self._load_baked, name, spec, dtype, rows)

    def _load_baked(self, name: str, spec: dict, dtype: torch.dtype, rows: slice, param: torch.nn.Parameter,
                    loaded: torch.Tensor, *args, **kwargs) -> None:
        """Copy this rank's rows of the checkpoint tensor ``loaded`` into ``param``; no transform."""
        where = f"{self.record['prefix']}{name}"
        if list(loaded.shape) != spec["shape"] or loaded.dtype != dtype:
            raise MoebakeRefusal(f"checkpoint tensor {where} is {loaded.dtype} {list(loaded.shape)}, the manifest says "
                                 f"{spec['dtype']} {spec['shape']}; run `moebake verify` on the checkpoint")
        param.data.copy_(loaded[rows])
        self.loaded.add(name)

    def _check_loaded(self) -> None:
        refusals.check_all_loaded(self.record, self.loaded)


def _common_refusals(config, target: str) -> None:
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend, get_moe_runner_backend
    from sglang.srt.runtime_context import get_platform

    manifest = config.manifest
    refusals.check_gpu(target, get_platform())
    refusals.check_backends(manifest["engine"], get_moe_runner_backend().value, get_moe_a2a_backend().value)
    if manifest.get("flashinfer_layout"):
        import flashinfer

        refusals.check_flashinfer_layout(manifest, flashinfer.__version__)


def _sm90_cutlass_method():
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4MoEMethod

    class MoebakeSm90CutlassMoEMethod(BakedExperts, Mxfp4MoEMethod):
        """Baked ``sm90-cutlass`` experts through SGLang's ``flashinfer_mxfp4`` runner (FlashInfer
        ``cutlass_fused_moe`` W4A16), as ``Mxfp4MoEMethod``'s ``cutlass_sm90`` path runs them."""

        def __init__(self, config, record: dict, prefix: str):
            Mxfp4MoEMethod.__init__(self, prefix)
            self._bake_init(config, record)
            self._padded_hidden = record["hidden_padded"]

        def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                           with_bias=False, **extra_weight_attrs):
            self.num_experts = num_experts
            self._create_baked_weights(layer, num_experts, hidden_size, intermediate_size_per_partition)

        def process_weights_after_loading(self, layer) -> None:
            self._check_loaded()
            activation, local = self.moebake_config.manifest["activation"], layer.num_local_experts
            device = layer.w13_weight.device

            def per_expert(value):
                return None if value is None else torch.nn.Parameter(
                    torch.full((local,), value, dtype=torch.float32, device=device), requires_grad=False)

            plain = activation["kind"] == "swiglu"  # DeepSeek-V4: SGLang passes only the limit
            layer.swiglu_alpha = None if plain else per_expert(activation["alpha"])
            layer.swiglu_beta = None if plain else per_expert(activation["beta"])
            layer.swiglu_limit = per_expert(activation["limit"])
            for bias in ("w13_weight_bias", "w2_weight_bias"):
                if bias not in self.record["tensors"]:
                    setattr(layer, bias, None)

    return MoebakeSm90CutlassMoEMethod


def _deepep_bf16_method():
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod

    class MoebakeDeepEPBf16MoEMethod(BakedExperts, UnquantizedFusedMoEMethod):
        """Baked ``deepep-bf16`` experts (``[gate; up]`` W13) through SGLang's unquantized DeepEP
        low-latency + DeepGEMM path, whose own post-load step transforms nothing."""

        def __init__(self, config, record: dict, prefix: str):
            UnquantizedFusedMoEMethod.__init__(self, use_deep_gemm=True)
            self._bake_init(config, record)

        def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                           with_bias=False, **extra_weight_attrs):
            self._create_baked_weights(layer, num_experts, hidden_size, intermediate_size_per_partition)

        def process_weights_after_loading(self, layer) -> None:
            self._check_loaded()
            UnquantizedFusedMoEMethod.process_weights_after_loading(self, layer)  # sets the dispatcher to BF16 only

    return MoebakeDeepEPBf16MoEMethod


METHODS = {"sm90-cutlass": _sm90_cutlass_method, "deepep-bf16": _deepep_bf16_method}


def moe_method(config, record: dict, prefix: str):
    """The moebake MoE method for ``config``'s target and the layer ``record`` (refusing first if it must)."""
    target = config.manifest["target"]
    if target not in METHODS:
        raise MoebakeRefusal(f"target {target}: this moebake's SGLang plugin serves {', '.join(sorted(METHODS))} only; "
                             f"serve this bake with moebake.serve")
    _common_refusals(config, target)
    return METHODS[target]()(config, record, prefix)
