"""Shared plan/restore of the targets that bake ModelOpt NVFP4 experts for FlashInfer's CuteDSL kernels.

Per quantized MoE layer, under the layer's expert prefix (``....layers.N.mlp.experts.``), with the
names of SGLang's ``ModelOptNvFp4FusedMoEMethod`` parameters; each tensor's dtype and shape is the target spec's
(:data:`moebake.schema.targets.CUTEDSL`, :data:`~moebake.schema.targets.CUTEDSL_DEEPEP`):

  ``w13_weight``          gate and up weights, rows in the target's W13 order
  ``w13_weight_scale``    their block scales in the same row order, then 128x4-swizzled per expert
                          (``block_scale_interleave``)
  ``w2_weight``           down weights, as in the source
  ``w2_weight_scale``     down block scales, 128x4-swizzled per expert
  ``w13_weight_scale_2``  (gate, up) weight globals: the expert's one shared global, twice
                          (``--gate-up-globals keep``: the source's two)
  ``w2_weight_scale_2``   the down weight global
  ``w13_input_scale``     (gate, up) activation globals, as in the source
  ``w2_input_scale``      the down activation global
  and the target's derived scalars (:mod:`moebake.layouts.nvfp4_scalars`).

``H % 128 == 0`` and ``I % 64 == 0`` are required (the CuteDSL tiles need them). H and I are padded to
the engine profile's multiples (vLLM's: H to 256 for its 256-wide K tiles, as ``align_fp4_moe_hidden_dim_for_fi``
does): zero weights and zero block scales, each of gate
and up padded on its own before the rows are ordered (``align_fp4_moe_weights_for_fi``), so the padding
never changes a real value. The swizzled scale tensors keep the linear shape (``2I_pad`` and ``H_pad``
are multiples of 128, ``H_pad/16`` and ``I_pad/16`` of 4), so SGLang's ``w*_blockscale_swizzled`` alias
of ``w*_weight_scale`` holds exactly these bytes, and CuteDSL's "MMA layout" (``convert_sf_to_mma_layout``)
is a zero-copy strided view of them for the runtime to make.
Gate/up block scales and globals are the source's after the gate/up global-scale sharing of
:mod:`moebake.formats.nvfp4_gate_up` (none under ``gate_up_globals="keep"``); the layer record reports
it under ``gate_up_global_scale``.
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.targets.base import Planned, Target, constant
from moebake.errors import UnsupportedError
from moebake.formats.checkpoint import EXPERT_INDEX, per_expert_names
from moebake.formats.modelopt_nvfp4 import GROUP_SIZE, ModelOptNvfp4Model, NvFp4Layer
from moebake.formats.source_model import SourceModel
from moebake.layouts.block_scale_swizzle import swizzle_128x4, unswizzle_128x4
from moebake.layouts.gate_up import pad_to
from moebake.schema.enums import GateUpOrder
from moebake.schema.manifest import LayerRecord
from moebake.schema.sizes import round_up
from moebake.schema.targets import LayerDims

HIDDEN_MULTIPLE, INTERMEDIATE_MULTIPLE = 128, 64
_W13_TENSORS = ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w13_input_scale")  # (gate, up) sources


@dataclass(frozen=True)
class W13Order:
    """A target's W13 row order: ``rows(gate, up)`` ``[n, I, ...]`` x2 -> ``[n, 2I, ...]``, and its inverse ``split``."""

    rows: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    split: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _expert_ranges(num_experts: int, step: int, build: Callable[[int, int], torch.Tensor]):
    """Producer yielding ``build(start, stop)`` for consecutive ranges of ``step`` experts."""

    def produce():
        for start in range(0, num_experts, step):
            yield build(start, min(start + step, num_experts)).contiguous()

    return produce


def _pattern(layer: NvFp4Layer, proj: str, part: str) -> str:
    return layer.name(EXPERT_INDEX, proj, part)


class Nvfp4Target(Target):
    """A target baking ModelOpt NVFP4 experts for a CuteDSL kernel: its W13 row :attr:`order` and
    :meth:`derive`, the F32 scalars SGLang computes from the four raw ones."""

    order: ClassVar[W13Order]

    def derive(self, raw: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The four raw F32 scalar tensors (``w13_weight_scale_2``, ``w2_weight_scale_2``, ``w13_input_scale``,
        ``w2_input_scale``; SGLang's shapes) -> the target's derived F32 tensors."""
        raise NotImplementedError

    def check(self, model: Any, options: ConvertOptions) -> None:
        super().check(model, options)
        name = self.spec.name
        if model.weight_only:
            raise UnsupportedError(
                f"{model.quant.source}: experts are {model.expert_algo} (weight-only, no input_scale); target {name} "
                "runs W4A4 NVFP4 and needs each expert's static input_scale (NVFP4 experts)"
            )
        H, I = model.hidden_size, model.intermediate_size
        if H % HIDDEN_MULTIPLE or I % INTERMEDIATE_MULTIPLE:
            raise UnsupportedError(
                f"{model.checkpoint.root}: target {name} needs hidden_size % {HIDDEN_MULTIPLE} == 0 and "
                f"moe_intermediate_size % {INTERMEDIATE_MULTIPLE} == 0 (CuteDSL tiles), got {H} and {I}"
            )
        model.use_gate_up_globals(options.gate_up_globals)  # the plan's first step: before any tensor is planned or read back

    def layer_dims(self, source_model: SourceModel, options: ConvertOptions) -> LayerDims:
        """H and I padded to the engine profile's multiples (or the options' overrides)."""
        model = cast(ModelOptNvfp4Model, source_model)  # this target's only source format
        H, I = model.hidden_size, model.intermediate_size
        hidden_multiple, intermediate_multiple, *_ = options.padding(model.format_name)
        return LayerDims(
            experts=model.num_experts,
            hidden=H,
            hidden_padded=round_up(H, hidden_multiple),
            intermediate=I,
            intermediate_padded=round_up(I, intermediate_multiple),
        )

    def layer_facts(self, source_model: SourceModel, layer: Any) -> dict:
        model = cast(ModelOptNvfp4Model, source_model)
        return {"scalar_shape": tuple(model.scalar_shape), "gate_up_global_scale": model.reconciliation(layer)}

    def layer_tensors(self, source_model: SourceModel, layer: Any, dims: LayerDims, options: ConvertOptions) -> dict[str, Planned]:
        model = cast(ModelOptNvfp4Model, source_model)
        E, Hp, Ip, order = dims.experts, dims.hidden_padded, dims.intermediate_padded, self.order
        step = max(1, options.chunk_bytes // (Ip * Hp))  # one expert's gate + up weights: 2 * I_pad * H_pad/2 bytes

        def stack(proj: str, part: str, start: int, stop: int):
            return torch.stack([model.consumed(layer, e, proj, part) for e in range(start, stop)])

        def gate_up(part: str, cols: int, start: int, stop: int):
            gate, up = (pad_to(stack(proj, part, start, stop), (Ip, cols)) for proj in ("gate", "up"))
            return order.rows(gate, up)

        def w13_weight(start: int, stop: int):
            return gate_up("weight", Hp // 2, start, stop)

        def w13_scale(start: int, stop: int):
            rows = gate_up("weight_scale", Hp // GROUP_SIZE, start, stop)
            return swizzle_128x4(rows).reshape(stop - start, 2 * Ip, Hp // GROUP_SIZE)

        def w2_weight(start: int, stop: int):
            return pad_to(stack("down", "weight", start, stop), (Hp, Ip // 2))

        def w2_scale(start: int, stop: int):
            scales = pad_to(stack("down", "weight_scale", start, stop), (Hp, Ip // GROUP_SIZE))
            return swizzle_128x4(scales).reshape(stop - start, Hp, Ip // GROUP_SIZE)

        @functools.cache
        def scalars():
            def column(proj: str, part: str):
                return stack(proj, part, 0, E).reshape(E)

            raw = {
                "w13_weight_scale_2": torch.stack([column("gate", "weight_scale_2"), column("up", "weight_scale_2")], 1),
                "w2_weight_scale_2": column("down", "weight_scale_2"),
                "w13_input_scale": torch.stack([column("gate", "input_scale"), column("up", "input_scale")], 1),
                "w2_input_scale": column("down", "input_scale"),
            }
            return {**raw, **self.derive(raw)}

        pattern = functools.partial(_pattern, layer)
        sources = {
            "w13_weight": (pattern("gate", "weight"), pattern("up", "weight")),
            "w13_weight_scale": (pattern("gate", "weight_scale"), pattern("up", "weight_scale")),
            "w2_weight": (pattern("down", "weight"),),
            "w2_weight_scale": (pattern("down", "weight_scale"),),
            "w13_weight_scale_2": (pattern("gate", "weight_scale_2"), pattern("up", "weight_scale_2")),
            "w2_weight_scale_2": (pattern("down", "weight_scale_2"),),
            "w13_input_scale": (pattern("gate", "input_scale"), pattern("up", "input_scale")),
            "w2_input_scale": (pattern("down", "input_scale"),),
        }
        producers = {
            "w13_weight": _expert_ranges(E, step, w13_weight),
            "w13_weight_scale": _expert_ranges(E, step, w13_scale),
            "w2_weight": _expert_ranges(E, step, w2_weight),
            "w2_weight_scale": _expert_ranges(E, step, w2_scale),
        }
        all_scalar_sources = tuple(p for short in list(sources)[4:] for p in sources[short])
        planned = {}
        for entry in self.spec.tensors:
            short = entry.name
            patterns = sources.get(short, all_scalar_sources)

            def scalar(name: str = short) -> torch.Tensor:
                return scalars()[name]

            produce = producers.get(short) or constant(scalar)
            stored = tuple(name for p in patterns for name in per_expert_names(p, E))
            planned[short] = Planned(produce, stored, patterns, GateUpOrder.SEPARATE if short in _W13_TENSORS else None)
        return planned

    def restore(self, record: LayerRecord, baked: dict[str, torch.Tensor], layout: str | None) -> dict[str, torch.Tensor]:
        """Derived scalars are not needed (see :func:`restore_layer`)."""
        return restore_layer(record, baked, self.order)


def restore_layer(record: LayerRecord, baked: dict[str, torch.Tensor], order: W13Order) -> dict[str, torch.Tensor]:
    """Exact inverse of :meth:`Nvfp4Target.plan` for experts ``[start, stop)`` of one layer.

    ``baked``: those experts' rows of each baked tensor, by short name. Returns ``{per-expert source
    name pattern: [stop - start, ...] tensor}`` (the source dtype's bytes; scalars ``[n]`` or ``[n, 1]``),
    which equals the experts as :meth:`~moebake.formats.modelopt_nvfp4.ModelOptNvfp4Model.read_experts`
    reads them. Derived scalars are not needed.
    """
    H, I, Hp, Ip = record.hidden, record.intermediate, record.hidden_padded, record.intermediate_padded
    n = baked["w13_weight"].shape[0]
    assert record.scalar_shape is not None  # an NVFP4 layer record names its scalars' shape
    scalar_shape = (n, *record.scalar_shape)
    pattern = functools.partial(_pattern, NvFp4Layer(record.index, record.prefix))

    out = {}
    gate, up = order.split(baked["w13_weight"])
    out[pattern("gate", "weight")], out[pattern("up", "weight")] = gate[:, :I, : H // 2], up[:, :I, : H // 2]
    w13_scales = unswizzle_128x4(baked["w13_weight_scale"].reshape(n, -1).view(torch.uint8), 2 * Ip, Hp // GROUP_SIZE)
    gate, up = order.split(w13_scales)
    out[pattern("gate", "weight_scale")], out[pattern("up", "weight_scale")] = (
        gate[:, :I, : H // GROUP_SIZE],
        up[:, :I, : H // GROUP_SIZE],
    )
    out[pattern("down", "weight")] = baked["w2_weight"][:, :H, : I // 2]
    w2_scales = unswizzle_128x4(baked["w2_weight_scale"].reshape(n, -1).view(torch.uint8), Hp, Ip // GROUP_SIZE)
    out[pattern("down", "weight_scale")] = w2_scales[:, :H, : I // GROUP_SIZE]
    for part, w13, w2 in (
        ("weight_scale_2", "w13_weight_scale_2", "w2_weight_scale_2"),
        ("input_scale", "w13_input_scale", "w2_input_scale"),
    ):
        for column, proj in enumerate(("gate", "up")):
            out[pattern(proj, part)] = baked[w13][:, column].clone(memory_format=torch.contiguous_format).reshape(scalar_shape)
        out[pattern("down", part)] = baked[w2].reshape(scalar_shape)
    return {name: tensor.contiguous() for name, tensor in out.items()}
