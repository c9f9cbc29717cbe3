"""Canonical MXFP4 expert tensors: what the MXFP4 targets consume, whatever the source stores.

A source format says, per MoE layer, where each canonical tensor's bytes live
(:class:`ExpertSource`); targets read canonical parts a few experts at a time and never deal with
source names or orders. Canonical tensors of a layer with hidden ``H`` and intermediate ``I``,
per chunk of ``e`` experts:

  ``w13_weight``  parts (gate, up), each uint8 ``[e, I, H/2]``   packed E2M1, low nibble = even element
  ``w13_scale``   parts (gate, up), each uint8 ``[e, I, H/32]``  E8M0 bytes, kept raw (never cast)
  ``w13_bias``    parts (gate, up), each ``[e, I]`` (source dtype, e.g. BF16)      optional
  ``w2_weight``   part (down,), uint8 ``[e, H, I/2]``
  ``w2_scale``    part (down,), uint8 ``[e, H, I/32]``
  ``w2_bias``     part (down,), ``[e, H]``                                          optional

One-byte source dtypes (U8, I8, F8_E8M0) are handed over as uint8 bytes; wider ones keep their dtype.

Source names are tensors stacked over experts (dim 0 = expert) or per-expert patterns with
:data:`~moebake.formats.checkpoint.EXPERT_INDEX` (``layers.0.ffn.experts.*.w1.weight``), read by
:meth:`~moebake.formats.checkpoint.SourceCheckpoint.read_experts`. ``order`` says how the parts
sit in them: ``pairs`` -- one W13 tensor whose rows alternate gate_i, up_i (GPT-OSS);
``separate`` -- one name per part (gate, up); ``None`` -- a single part (W2 tensors).
"""

from dataclasses import dataclass

import torch

from moebake.errors import InvalidArgumentError
from moebake.formats.checkpoint import stored_names
from moebake.layouts.gate_up import merge_pairs, split_pairs
from moebake.schema.enums import GateUpOrder
from moebake.schema.manifest import TensorRecord

ORDERS = ("pairs", "separate", None)


@dataclass(frozen=True)
class ExpertSource:
    """Where one canonical expert tensor of a layer lives in the source checkpoint.

    ``names``: source tensor names or per-expert patterns (one, or (gate, up) when ``separate``);
    ``part_shape``: one expert's canonical part, e.g. ``(I, H/2)``; ``source_shape``: one expert's
    slice of each source tensor, e.g. ``(2I, H/32, 16)``; ``source_dtype``: their safetensors code.
    """

    names: tuple[str, ...]
    order: str | None
    part_shape: tuple[int, ...]
    source_shape: tuple[int, ...]
    source_dtype: str

    def __post_init__(self):
        if self.order not in ORDERS or len(self.names) != (2 if self.order == "separate" else 1):
            raise InvalidArgumentError(f"ExpertSource order {self.order!r} does not fit names {self.names}")

    def stored_names(self, num_experts: int) -> tuple[str, ...]:
        """The real tensor names behind :attr:`names`, expert by expert (patterns expanded)."""
        return stored_names(self.names, num_experts)

    def parts(self, *chunks: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Source chunks ``[e, *source_shape]`` (one per name, source dtype) -> canonical parts ``[e, *part_shape]``."""
        chunks = tuple(c.contiguous().view(torch.uint8) if c.element_size() == 1 else c for c in chunks)
        e = chunks[0].shape[0]
        if self.order == "pairs":
            rows, *rest = self.part_shape
            return split_pairs(chunks[0].reshape(e, 2 * rows, *rest))
        return tuple(c.reshape(e, *self.part_shape) for c in chunks)


def source_tensors(spec: TensorRecord, parts: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
    """Inverse of :meth:`ExpertSource.parts`, from a tensor's manifest record ``spec`` (its ``source``,
    ``source_gate_up_order`` and ``source_shape``): canonical parts ``[e, ...]`` -> ``{source name or pattern:
    [e, *source_shape]}`` holding the source bytes (one-byte dtypes as uint8)."""
    assert spec.source_shape is not None, "an expert tensor's record names its source shape"
    stacked = [merge_pairs(parts[0], parts[1])] if spec.source_gate_up_order == GateUpOrder.PAIRS else list(parts)
    return {name: t.reshape(t.shape[0], *spec.source_shape).contiguous() for name, t in zip(spec.sources, stacked)}
