"""The protocol every source format's model implements fully (targets and checks call it without fallbacks)."""

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from moebake.formats.checkpoint import SourceCheckpoint
from moebake.schema.manifest import Activation


@runtime_checkable
class SourceModel(Protocol):
    """A validated source checkpoint of one format (:data:`moebake.formats.SOURCE_FORMATS`).

    ``layers``: its MoE layers (each with ``index`` and ``prefix``, the expert tensors' name prefix);
    ``padding_allowed``: whether the engine path zero-pads H and I for this format (else a target
    refuses sizes that would need it); ``expert_quantization``: one line for ``inspect``.
    """

    format_name: str
    checkpoint: SourceCheckpoint
    hidden_size: int
    intermediate_size: int
    num_experts: int
    layers: Sequence
    padding_allowed: bool
    expert_quantization: str

    def activation(self) -> Activation:
        """The manifest's ``activation`` record (kind, alpha, beta, limit)."""

    def read_experts(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Experts ``[start, stop)`` of a stacked tensor or per-expert pattern, as the baked tensors must
        invert to (:meth:`SourceCheckpoint.read_experts` unless the format bakes other bytes than the file's)."""


class StoredExperts:
    """Mixin of formats whose baked tensors invert to the file's own bytes: :meth:`SourceModel.read_experts`
    is :meth:`SourceCheckpoint.read_experts` of the model's ``checkpoint``."""

    checkpoint: SourceCheckpoint

    def read_experts(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Experts ``[start, stop)`` of ``name`` as stored."""
        return self.checkpoint.read_experts(name, start, stop)
