"""The target contract: what a target is (a :class:`~moebake.schema.targets.TargetSpec`), how it bakes, how it inverts.

A target is one class, registered with :func:`register` (as llama.cpp's ``ModelBase.register``)::

    @register
    class MyTarget(Target):
        spec = TargetSpec(name="my-target", layout_version=1, source_formats=("gpt-oss",), kernel="...", arch="...",
                          tensors=(TensorSpec(...), ...), gpus=(GpuFamily.SM90,))

        def layer_tensors(self, model, layer, dims, options): ...   # {short name: Planned}
        def restore(self, record, baked, layout): ...                 # the exact inverse

Registration adds the spec to the schema (:data:`~moebake.schema.targets.TARGET_SPECS`, which
the runtime, ``inspect`` and the model card read) and the target to :data:`TARGETS`, so the CLI
and the generic tests (``tests/test_target_contract.py``) cover it at once.

:meth:`Target.plan` is the one planner: for every MoE layer of the source model it asks the target
for its tensors' producers, takes every dtype and shape from the spec's tensor table, and builds
the layer's :class:`~moebake.schema.manifest.LayerRecord`. A target refines :meth:`Target.check`
(refusals), :meth:`Target.layer_dims` (padding) and :meth:`Target.layer_facts` (record fields).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputTensor, Producer
from moebake.errors import InternalError, UnsupportedError
from moebake.formats.source_model import SourceModel
from moebake.schema.enums import DType, GateUpOrder
from moebake.schema.manifest import LayerRecord, TensorRecord
from moebake.schema.targets import LayerDims, TargetSpec, register_spec


@dataclass(frozen=True)
class Planned:
    """How one baked tensor of a layer is made: ``produce`` yields its bytes, read from the real source
    tensors ``stored`` (expert by expert; the first decides the output shard); ``source`` is what the
    layer record names (a name or pattern, a list, or None for a tensor derived from the config), with
    the source's gate/up order and, for canonical MXFP4 sources, one expert's source slice shape and
    dtype. ``dtype``: the dtype for a table entry whose dtype is the source's (None in the table)."""

    produce: Producer
    stored: tuple[str, ...]
    source: str | tuple[str, ...] | None
    source_gate_up_order: GateUpOrder | None = None
    source_shape: tuple[int, ...] | None = None
    source_dtype: DType | None = None
    dtype: DType | None = None


class Target:
    """Base of every target; see the module docstring. Subclasses set :attr:`spec`."""

    spec: ClassVar[TargetSpec]

    def check(self, model: SourceModel, options: ConvertOptions) -> None:
        """UnsupportedError when this target cannot bake ``model`` (default: a source format it does not read)."""
        if model.format_name not in self.spec.source_formats:
            raise UnsupportedError(
                f"target {self.spec.name} does not support source format {model.format_name} "
                f"(it bakes {', '.join(self.spec.source_formats)})"
            )

    def layer_dims(self, model: SourceModel, options: ConvertOptions) -> LayerDims:
        """The MoE layers' dims as baked (default: no padding)."""
        H, I = model.hidden_size, model.intermediate_size
        return LayerDims(experts=model.num_experts, hidden=H, hidden_padded=H, intermediate=I, intermediate_padded=I)

    def layer_facts(self, model: SourceModel, layer: Any) -> dict:
        """Target-specific fields of a layer record (:class:`~moebake.schema.manifest.LayerRecord`'s optional ones)."""
        return {}

    def layer_tensors(self, model: SourceModel, layer: Any, dims: LayerDims, options: ConvertOptions) -> dict[str, Planned]:
        """``{short name: Planned}`` of one layer; a short name must be in the spec's table (optional
        entries may be left out)."""
        raise NotImplementedError

    def restore(self, record: LayerRecord, baked: dict[str, torch.Tensor], layout: str | None) -> dict[str, torch.Tensor]:
        """Exact inverse for one layer and any run of experts ``[e, ...]`` of the baked tensors (by short name):
        ``{source tensor name or per-expert pattern: [e, ...]}`` holding the source's bytes."""
        raise NotImplementedError

    def plan(self, model: SourceModel, options: ConvertOptions) -> tuple[list[OutputTensor], list[LayerRecord]]:
        """Output tensors and manifest layer records of every MoE layer of ``model`` (reads no tensor data
        beyond what :meth:`layer_facts` needs)."""
        self.check(model, options)
        dims = self.layer_dims(model, options)
        layout = options.flashinfer_layout
        tensors, records = [], []
        for layer in model.layers:
            planned = self.layer_tensors(model, layer, dims, options)
            unknown = set(planned) - {entry.name for entry in self.spec.tensors}
            if unknown:
                raise InternalError(f"target {self.spec.name} planned tensors {sorted(unknown)} its table does not list")
            specs = {}
            for entry in self.spec.tensors:
                if entry.name not in planned:
                    if entry.optional:
                        continue
                    raise InternalError(f"target {self.spec.name} did not plan its tensor {entry.name}")
                made = planned[entry.name]
                dtype, shape = entry.dtype or made.dtype, entry.shape_for(dims, layout)
                if dtype is None:
                    raise InternalError(f"target {self.spec.name}: tensor {entry.name} has no dtype in the table or the plan")
                tensors.append(
                    OutputTensor(name=layer.prefix + entry.name, dtype=dtype, shape=shape, sources=made.stored, produce=made.produce)
                )
                specs[entry.name] = TensorRecord(
                    dtype=dtype,
                    shape=shape,
                    source=made.source,
                    gate_up_order=entry.gate_up_order,
                    source_gate_up_order=made.source_gate_up_order,
                    source_shape=made.source_shape,
                    source_dtype=made.source_dtype,
                )
            record = LayerRecord(
                index=layer.index,
                prefix=layer.prefix,
                experts=dims.experts,
                hidden=dims.hidden,
                hidden_padded=dims.hidden_padded,
                intermediate=dims.intermediate,
                intermediate_padded=dims.intermediate_padded,
                tensors=specs,
                **self.layer_facts(model, layer),
            )
            records.append(record)
        return tensors, records


TARGETS: dict[str, Target] = {}
"""Every registered target by name, in registration order."""


def register(cls: type[Target]) -> type[Target]:
    """Class decorator: register target class ``cls`` (an instance in :data:`TARGETS`, its spec in the schema)."""
    register_spec(cls.spec)
    TARGETS[cls.spec.name] = cls()
    return cls


def constant(value: Callable[[], torch.Tensor]) -> Producer:
    """A producer of a tensor computed whole (from the config or a few scalars), yielded in one piece."""
    return lambda: iter([value()])
