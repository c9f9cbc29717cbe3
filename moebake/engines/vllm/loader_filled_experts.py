"""What every moebake MoE method in vLLM shares: it holds one baked layer, refuses the parallel layouts a
whole-expert bake cannot serve, and creates, lists and checks the parameters the moebake loader fills.

A mixin placed before vLLM's own MoE method class (``class M(LoaderFilledExperts, VllmMethod)``); no vLLM import.
"""

from collections.abc import Callable
from typing import Any

import torch

from moebake.engines.layer_type import EngineLayer
from moebake.engines.vllm.bake import VllmBake, refuse
from moebake.loading.refusals import parallelism_refusal, unloaded_refusal
from moebake.schema.enums import DType

# The remedies in vLLM's own flags.
USE_EXPERT_PARALLELISM = "add --enable-expert-parallel"
CHOOSE_EP_SIZE = "use an EP size"


class LoaderFilledExperts:
    """Baked-layer bookkeeping of a vLLM MoE method whose parameters moebake's loader (``--load-format moebake``)
    fills: the method registers them empty and checks them filled, and reads no file itself (see the module
    docstring; contrast the SGLang plugin's self-loading methods)."""

    def adopt(self, bake: VllmBake, prefix: str, moe: Any) -> None:
        """Take the layer of ``bake`` vLLM builds at ``prefix``; refuse MoE tensor parallelism (the experts are
        baked whole) and an EP size that does not divide the expert count (``moe``: vLLM's ``FusedMoEConfig``)."""
        self.bake = bake
        self.layer_record = bake.layer(prefix)
        self.prefix = prefix
        parallel = moe.moe_parallel_config
        if refusal := parallelism_refusal(
            prefix,
            moe.num_experts,
            parallel.tp_size,
            parallel.ep_size,
            use_expert_parallelism=USE_EXPERT_PARALLELISM,
            choose_ep_size=CHOOSE_EP_SIZE,
        ):
            raise refuse(refusal)

    def register_baked(self, layer: EngineLayer, specs: dict[str, tuple[DType, tuple[int, ...]]]) -> None:
        """Register on ``layer`` one empty parameter per ``{vLLM name: (dtype, shape)}``, marked not loaded."""
        self.baked_names = list(specs)
        for name, (dtype, shape) in specs.items():
            parameter = torch.nn.Parameter(torch.empty(shape, dtype=dtype.torch), requires_grad=False)
            setattr(parameter, "moebake_loaded", False)
            layer.register_parameter(name, parameter)

    def baked_parameters(self) -> list[str]:
        """vLLM parameter names this method holds (each filled by the moebake loader)."""
        return list(self.baked_names)

    def copied_tensors(self) -> dict[str, str]:
        """Baked tensor short name -> vLLM parameter name, for the tensors vLLM holds as the files have them
        (the loader copies this rank's experts' rows)."""
        names = self.bake.served.parameter_names
        return {short: names[short] for short in self.layer_record.tensors if short in names}

    def load_derived(self, layer: EngineLayer, read_whole: Callable[[str], torch.Tensor], local_experts: list[int]) -> None:
        """Fill the parameters vLLM computes from the bake's tensors at load (none by default).
        ``read_whole(short) -> tensor``: a whole baked tensor of this layer (every expert), checked against the
        manifest; ``local_experts``: the global expert ids this rank holds, in slot order."""

    def check_loaded(self, layer: EngineLayer) -> None:
        """Refuse a layer whose baked parameters were not all filled."""
        missing = [name for name in self.baked_parameters() if not getattr(layer, name).moebake_loaded]
        if refusal := unloaded_refusal(
            self.prefix.rstrip(".") + ".",
            missing,
            "start vLLM with --load-format moebake and check the checkpoint's shards against its index (`moebake verify`)",
        ):
            raise refuse(refusal)
