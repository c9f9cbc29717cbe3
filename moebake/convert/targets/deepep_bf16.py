"""Target ``deepep-bf16``: DeepGEMM ``m_grouped_bf16_gemm_nt_masked`` behind DeepEP low-latency BF16 dispatch on Hopper (SM90).

What SGLang's ``UnquantizedFusedMoEMethod`` holds for an unquantized MoE layer served with DeepEP
low-latency dispatch and the DeepGEMM runner (SGLang PR 25540), per MoE layer under the layer's
expert prefix, with ``E`` experts, hidden ``H`` and intermediate ``I``:

  ``w13_weight``  BF16 ``[E, 2I, H]``  halves ``[gate; up]``, each ``[out, in]`` (K-major "NT" operand)
  ``w2_weight``   BF16 ``[E, H, I]``   ``down_proj``, ``[out, in]``

No padding and no byte transform: the BF16 values are the source's, bit for bit, only stacked
(per-expert sources) and renamed. Each layer record carries ``dispatcher_output_dtype: bf16``:
the layer needs DeepEP to dispatch BF16 activations (SGLang sets the same per layer), while the
checkpoint's other (e.g. NVFP4) layers keep their own dispatch. DeepGEMM's SM90 BF16 masked kernel
needs K (``H`` for w13, ``I`` for w2) to be a multiple of 64; :mod:`moebake.serve.deepep_bf16`
pads at load time when it is not, so the baked tensors stay the shapes SGLang allocates.
"""

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputTensor
from moebake.convert.targets.expert_chunks import zip_expert_chunks
from moebake.errors import MoebakeError
from moebake.formats.checkpoint import stored_names
from moebake.layouts.gate_up import split_halves

NAME = "deepep-bf16"
LAYOUT_VERSION = 1  # bump when the bytes this target writes change for the same options
USES_FLASHINFER_SM90_LAYOUT = False  # --flashinfer-layout (the SM90 fp4 interleave version) does not apply
SOURCE_FORMATS = ("bf16-moe",)
DISPATCHER_OUTPUT_DTYPE = "bf16"


def _cat_rows(*parts: torch.Tensor) -> torch.Tensor:
    """Concatenate chunks ``[e, rows_k, cols]`` along the rows: ``(gate, up)`` -> ``[e, 2I, H]`` = ``[gate; up]``.

    One part (a fused ``gate_up_proj`` or ``down_proj``) is returned as it is.
    """
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def plan(model, options: ConvertOptions) -> tuple[list[OutputTensor], list[dict]]:
    """Output tensors and per-layer manifest records for every BF16 MoE layer of ``model``."""
    if model.format_name not in SOURCE_FORMATS:
        raise MoebakeError(f"target {NAME} does not support source format {model.format_name}")
    E, H, I = model.num_experts, model.hidden_size, model.intermediate_size
    checkpoint, chunk = model.checkpoint, options.chunk_bytes
    tensors, layers = [], []
    for layer in model.layers:
        w13_order = "gate_up" if layer.fused else "separate"
        recipe = (
            ("w13_weight", layer.gate_up, (E, 2 * I, H), "gate_up", w13_order),
            ("w2_weight", (layer.down,), (E, H, I), None, None),
        )
        record = {
            "index": layer.index, "prefix": layer.prefix, "experts": E,
            "hidden": H, "hidden_padded": H, "intermediate": I, "intermediate_padded": I,
            "dispatcher_output_dtype": DISPATCHER_OUTPUT_DTYPE, "tensors": {},
        }
        for out_name, sources, shape, order, source_order in recipe:
            produce = zip_expert_chunks(checkpoint, sources, E, chunk, _cat_rows)
            tensors.append(OutputTensor(layer.prefix + out_name, "BF16", shape, stored_names(sources, E), produce))
            record["tensors"][out_name] = {
                "source": sources[0] if len(sources) == 1 else list(sources), "dtype": "BF16", "shape": list(shape),
                "gate_up_order": order, "source_gate_up_order": source_order,
            }
        layers.append(record)
    return tensors, layers


def restore(record: dict, baked: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Exact inverse of :func:`plan` for one layer (any run of experts ``[e, ...]``).

    Returns ``{source name: [e, ...]}`` with the names the record gives (a per-expert pattern
    stands for its experts stacked; :meth:`SourceCheckpoint.read_experts` reads them). ``layout``
    (the FlashInfer layout id every manifest carries) does not apply to this target.
    """
    w13, H, I = baked["w13_weight"], record["hidden"], record["intermediate"]
    gate_up = record["tensors"]["w13_weight"]["source"]
    if isinstance(gate_up, str):
        out = {gate_up: w13}
    else:
        gate, up = split_halves(w13, (I, H))
        out = {gate_up[0]: gate, gate_up[1]: up}
    out[record["tensors"]["w2_weight"]["source"]] = baked["w2_weight"]
    return {name: value.contiguous() for name, value in out.items()}
