"""Target ``deepep-bf16``: DeepGEMM ``m_grouped_bf16_gemm_nt_masked`` behind DeepEP low-latency BF16 dispatch on Hopper (SM90).

What SGLang's ``UnquantizedFusedMoEMethod`` holds for an unquantized MoE layer served with DeepEP
low-latency dispatch and the DeepGEMM runner (SGLang PR 25540), per MoE layer under the layer's expert prefix; each
tensor's dtype and shape is the target spec's (:data:`moebake.schema.targets.DEEPEP_BF16`):

  ``w13_weight``  halves ``[gate; up]``, each ``[out, in]`` (K-major "NT" operand)
  ``w2_weight``   ``down_proj``, ``[out, in]``

No padding and no byte transform: the BF16 values are the source's, bit for bit, only stacked
(per-expert sources) and renamed. Each layer record carries ``dispatcher_output_dtype: bf16``:
the layer needs DeepEP to dispatch BF16 activations (SGLang sets the same per layer), while the
checkpoint's other (e.g. NVFP4) layers keep their own dispatch. DeepGEMM's SM90 BF16 masked kernel
needs K (``H`` for w13, ``I`` for w2) to be a multiple of 64; :mod:`moebake.serve.deepep_bf16`
pads at load time when it is not, so the baked tensors stay the shapes SGLang allocates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.targets.base import Planned, Target, register
from moebake.convert.targets.expert_chunks import zip_expert_chunks
from moebake.formats.bf16_moe import Bf16MoeLayer
from moebake.formats.checkpoint import stored_names
from moebake.layouts.gate_up import split_halves
from moebake.schema.enums import GateUpOrder
from moebake.schema.manifest import LayerRecord
from moebake.schema.targets import DEEPEP_BF16, LayerDims

if TYPE_CHECKING:
    from moebake.formats.source_model import SourceModel

DISPATCHER_OUTPUT_DTYPE = "bf16"


def _cat_rows(*parts: torch.Tensor) -> torch.Tensor:
    """Concatenate chunks ``[e, rows_k, cols]`` along the rows: ``(gate, up)`` -> ``[e, 2I, H]`` = ``[gate; up]``.

    One part (a fused ``gate_up_proj`` or ``down_proj``) is returned as it is.
    """
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


@register
class DeepEPBf16(Target):
    spec = DEEPEP_BF16

    def layer_facts(self, model: SourceModel, layer: Any) -> dict:
        return {"dispatcher_output_dtype": DISPATCHER_OUTPUT_DTYPE}

    def layer_tensors(self, model: Any, layer: Bf16MoeLayer, dims: LayerDims, options: ConvertOptions) -> dict[str, Planned]:
        E, checkpoint = dims.experts, model.checkpoint
        planned = {}
        for short, sources, order in (
            ("w13_weight", layer.gate_up, GateUpOrder.GATE_UP if layer.fused else GateUpOrder.SEPARATE),
            ("w2_weight", (layer.down,), None),
        ):
            produce = zip_expert_chunks(checkpoint, sources, E, options.chunk_bytes, _cat_rows)
            planned[short] = Planned(produce, stored_names(sources, E), sources[0] if len(sources) == 1 else sources, order)
        return planned

    def restore(self, record: LayerRecord, baked: dict[str, torch.Tensor], layout: str | None) -> dict[str, torch.Tensor]:
        """Returns ``{source name: [e, ...]}`` with the names the record gives (a per-expert pattern
        stands for its experts stacked; :meth:`SourceCheckpoint.read_experts` reads them)."""
        w13, H, I = baked["w13_weight"], record.hidden, record.intermediate
        gate_up = record.tensors["w13_weight"].source
        if isinstance(gate_up, str):
            out = {gate_up: w13}
        else:
            assert gate_up is not None  # the layer record names W13's sources
            gate, up = split_halves(w13, (I, H))
            out = {gate_up[0]: gate, gate_up[1]: up}
        down = record.tensors["w2_weight"].source
        assert isinstance(down, str)  # W2 is one source tensor (or one per-expert pattern)
        out[down] = baked["w2_weight"]
        return {name: value.contiguous() for name, value in out.items()}
