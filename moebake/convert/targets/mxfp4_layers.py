"""What the MXFP4 targets share: padded sizes, output tensors streamed from canonical experts, the way back.

An MXFP4 target (:class:`Mxfp4Target`) says, per output tensor of its table, which canonical expert
tensor of :mod:`moebake.formats.expert_source` it is made from and how one chunk of experts is
transformed (:class:`Bake`); :meth:`Mxfp4Target.layer_tensors` turns that into producers that read
a few experts at a time. :func:`restore_layer` maps canonical parts recovered by a target's inverse
back to source tensors, through the layer records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.targets.base import Planned, Target, constant
from moebake.convert.targets.expert_chunks import zip_expert_chunks
from moebake.errors import UnsupportedError
from moebake.formats.expert_source import source_tensors
from moebake.layouts.gate_up import pad_to
from moebake.schema.enums import DType, GateUpOrder
from moebake.schema.manifest import LayerRecord
from moebake.schema.sizes import round_up
from moebake.schema.targets import LayerDims

if TYPE_CHECKING:
    from moebake.schema.profiles import Padding


@dataclass(frozen=True)
class Bake:
    """How one output tensor is made from canonical tensor ``canonical``: ``transform`` maps the
    canonical parts of ``e`` experts (e.g. ``gate, up``) to the output's rows ``[e, ...]``. With
    ``canonical`` None the tensor comes from the config, not from expert tensors (per-expert
    activation constants): ``transform()`` returns all of it, and it is stored next to the layer's W13."""

    canonical: str | None
    transform: Callable[..., torch.Tensor]
    also: tuple[str, ...] = ()
    """More canonical tensors read with the same experts; their parts follow ``canonical``'s in ``transform``'s
    arguments (the Humming weight rewrite needs the block scales). The layer record names ``canonical``."""


class PaddedScales:
    """E8M0 block scales padded to a layer's ``H_pad`` / ``I_pad`` at the engine profile's fill bytes (hidden padding
    first, then intermediate padding: the order SGLang's scale buffers fill them in)."""

    def __init__(self, dims: LayerDims, padding: Padding):
        self.Hp, self.Ip = dims.hidden_padded, dims.intermediate_padded
        self.hidden_fill, self.intermediate_fill = padding.hidden_scale_fill, padding.intermediate_scale_fill

    def w13_half(self, half: torch.Tensor) -> torch.Tensor:
        """One W13 half's block scales ``[e, I, H/32]`` -> ``[e, Ip, Hp/32]``."""
        widened = pad_to(half, (half.shape[1], self.Hp // 32), self.hidden_fill)
        return pad_to(widened, (self.Ip, self.Hp // 32), self.intermediate_fill)

    def w2(self, down: torch.Tensor) -> torch.Tensor:
        """W2 block scales ``[e, H, I/32]`` -> ``[e, Hp, Ip/32]``."""
        widened = pad_to(down, (down.shape[1], self.Ip // 32), self.intermediate_fill)
        return pad_to(widened, (self.Hp, self.Ip // 32), self.hidden_fill)


class Mxfp4Target(Target):
    """A target baking canonical MXFP4 experts (GPT-OSS, DeepSeek-V4); subclasses give :meth:`bakes`."""

    def bakes(self, model: Any, dims: LayerDims, options: ConvertOptions) -> dict[str, Bake]:
        """``{short name: Bake}`` of a layer's tensors; entries whose canonical tensor the model lacks
        (biases of DeepSeek-V4) are left out of the layer."""
        raise NotImplementedError

    def layer_dims(self, model: Any, options: ConvertOptions) -> LayerDims:
        """H and I padded to the engine profile's multiples (or the options' overrides). Models whose
        engine path does not pad (``model.padding_allowed`` false) must already be multiples of them
        (UnsupportedError)."""
        H, I = model.hidden_size, model.intermediate_size
        hidden_multiple, intermediate_multiple, *_ = options.padding(model.format_name)
        Hp, Ip = round_up(H, hidden_multiple), round_up(I, intermediate_multiple)
        if not model.padding_allowed and (Hp, Ip) != (H, I):
            raise UnsupportedError(
                f"{model.checkpoint.root / 'config.json'}: hidden size {H} and expert intermediate size {I} must be "
                f"multiples of {hidden_multiple} and {intermediate_multiple} for target {self.spec.name}: "
                f"{model.format_name} experts are not padded (the {options.engine_text} profile's multiples; moebake pads "
                f"no {model.format_name} expert)"
            )
        return LayerDims(experts=model.num_experts, hidden=H, hidden_padded=Hp, intermediate=I, intermediate_padded=Ip)

    def layer_tensors(self, model: Any, layer: Any, dims: LayerDims, options: ConvertOptions) -> dict[str, Planned]:
        E, sources, planned = dims.experts, model.expert_sources(layer), {}
        for short, bake in self.bakes(model, dims, options).items():
            if bake.canonical is None:
                planned[short] = Planned(constant(bake.transform), sources["w13_weight"].stored_names(E)[:1], None)
                continue
            if bake.canonical not in sources:
                continue
            source, read = sources[bake.canonical], [sources[bake.canonical], *(sources[name] for name in bake.also)]

            def combine(*chunks: torch.Tensor, read: list[Any] = read, transform: Callable[..., torch.Tensor] = bake.transform):
                parts, start = [], 0
                for each in read:
                    parts += each.parts(*chunks[start : start + len(each.names)])
                    start += len(each.names)
                return transform(*parts)

            names = tuple(name for each in read for name in each.names)
            planned[short] = Planned(
                zip_expert_chunks(model.checkpoint, names, E, options.chunk_bytes, combine),
                tuple(name for each in read for name in each.stored_names(E)),
                source.names[0] if len(source.names) == 1 else source.names,
                GateUpOrder(source.order) if source.order else None,
                source.source_shape,
                DType(source.source_dtype),
                dtype=DType(source.source_dtype),
            )
        return planned


def restore_layer(record: LayerRecord, canonical: dict[str, tuple[torch.Tensor, ...]]) -> dict[str, torch.Tensor]:
    """``{output short name: canonical parts}`` of some experts -> ``{source name or pattern: [e, ...]}``."""
    restored = {}
    for name, parts in canonical.items():
        restored.update(source_tensors(record.tensors[name], parts))
    return restored
