"""What the MXFP4 targets share: padded sizes, output tensors streamed from canonical experts, the way back.

A target lists, per MoE layer, its output tensors as :class:`Bake` entries (which canonical expert
tensor of :mod:`moebake.formats.expert_source` each is made from, and how one chunk of experts is
transformed); :func:`plan_layers` turns them into output tensors that read a few experts at a time,
and the layer records of the manifest. :func:`restore_layer` maps canonical parts recovered by a
target's inverse back to source tensors, through those records.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputTensor
from moebake.convert.targets.expert_chunks import zip_expert_chunks
from moebake.errors import MoebakeError
from moebake.formats.expert_source import source_tensors
from moebake.schema.sizes import round_up


@dataclass(frozen=True)
class Bake:
    """One output tensor of a layer: ``prefix + name``, made from canonical tensor ``canonical``.

    ``transform`` maps the canonical parts of ``e`` experts (e.g. ``gate, up``) to the output's
    rows ``[e, ...]``; ``gate_up_order`` names the W13 row order it writes (None for W2 tensors).
    With ``canonical`` None the tensor comes from the config, not from expert tensors (per-expert
    activation constants): ``transform()`` returns all of it, and it is stored next to the layer's W13.
    """

    name: str
    canonical: str | None
    dtype: str
    shape: tuple[int, ...]
    transform: Callable[..., torch.Tensor]
    gate_up_order: str | None = None


def layer_dims(model, options: ConvertOptions, target: str) -> dict:
    """Experts and (padded) hidden/intermediate sizes of ``model``'s MoE layers, as a layer record has them.

    Models whose engine path does not pad (``model.padding_allowed`` false) must already be
    multiples of the padding multiples; otherwise a MoebakeError says so.
    """
    H, I = model.hidden_size, model.intermediate_size
    Hp, Ip = round_up(H, options.hidden_multiple), round_up(I, options.intermediate_multiple)
    if not model.padding_allowed and (Hp, Ip) != (H, I):
        raise MoebakeError(
            f"{model.checkpoint.root / 'config.json'}: hidden size {H} and expert intermediate size {I} must be "
            f"multiples of {options.hidden_multiple} and {options.intermediate_multiple} for target {target}: "
            f"{model.format_name} experts are not padded (SGLang's {model.format_name} MXFP4 path has no padding)"
        )
    return {"experts": model.num_experts, "hidden": H, "hidden_padded": Hp, "intermediate": I, "intermediate_padded": Ip}


def plan_layers(model, options: ConvertOptions, bakes: Callable[[dict], list[Bake]], record_extra: dict,
                target: str) -> tuple[list[OutputTensor], list[dict]]:
    """Output tensors and layer records for every MoE layer of ``model``.

    ``bakes(dims)`` lists a layer's output tensors (see :func:`layer_dims` for ``dims``); entries
    whose canonical tensor the model lacks (e.g. biases of DeepSeek-V4) are left out.
    ``record_extra`` is merged into every layer record.
    """
    dims = layer_dims(model, options, target)
    E, checkpoint, chunk = dims["experts"], model.checkpoint, options.chunk_bytes
    tensors, layers = [], []
    for layer in model.layers:
        sources = model.expert_sources(layer)
        record = {"index": layer.index, "prefix": layer.prefix, **dims, **record_extra, "tensors": {}}
        for bake in bakes(dims):
            if bake.canonical is None:
                anchor = sources["w13_weight"].stored_names(E)[:1]
                tensors.append(OutputTensor(layer.prefix + bake.name, bake.dtype, bake.shape, anchor,
                                            lambda transform=bake.transform: iter([transform()])))
                record["tensors"][bake.name] = {"dtype": bake.dtype, "shape": list(bake.shape), "gate_up_order": None,
                                                "source": None}
                continue
            if bake.canonical not in sources:
                continue
            source = sources[bake.canonical]

            def combine(*chunks, source=source, transform=bake.transform):
                return transform(*source.parts(*chunks))

            produce = zip_expert_chunks(checkpoint, source.names, E, chunk, combine)
            tensors.append(OutputTensor(layer.prefix + bake.name, bake.dtype, bake.shape, source.stored_names(E), produce))
            record["tensors"][bake.name] = {
                "dtype": bake.dtype, "shape": list(bake.shape), "gate_up_order": bake.gate_up_order,
                **source.manifest_fields(),
            }
        layers.append(record)
    return tensors, layers


def restore_layer(record: dict, canonical: dict[str, tuple[torch.Tensor, ...]]) -> dict[str, torch.Tensor]:
    """``{output short name: canonical parts}`` of some experts -> ``{source name or pattern: [e, ...]}``."""
    restored = {}
    for name, parts in canonical.items():
        restored.update(source_tensors(record["tensors"][name], parts))
    return restored
