"""Which stored rows SGLang's ``VocabParallelEmbedding.weight_loader`` copies into a vocabulary parameter.

The loader (the same in 0.5.17-0.5.23; ``ParallelLMHead`` inherits it), for a parameter with ``output_dim == 0``
and no ``packed_dim`` of a layer without presharded weights: the stored ``[org_vocab_size, *row]`` tensor's rows
``[shard_indices.org_vocab_start_index, shard_indices.org_vocab_end_index)`` go, unchanged, to the parameter's first
rows, and every later row of the ``[num_embeddings_per_partition, *row]`` parameter is ``fill_(0)``: the rank's
padding rows (``num_org_vocab_padding``) and, for a rank past the end of the vocabulary, all of them. One tensor
parallel rank holds one contiguous range of rows; at TP 1 with a vocabulary the padding divides, all of them.

:func:`vocab_rows` states that as a :class:`~moebake.loading.direct_loader.RowShard` only where the layout
is exactly this one: the layer's quantization method is SGLang's ``UnquantizedEmbeddingMethod`` (no quantized
or AMX-packed weight), it has no added vocabulary (LoRA rows, which SGLang places after the padded base rows),
and the parameter is materialized, not GGUF, and has the layer's ``num_embeddings_per_partition`` rows. Every
fact is read from the parameter's owning layer (public attributes); anything else keeps SGLang's path.
"""

from typing import Any

import torch

from moebake.loading.direct_loader import RowShard


def loader_owner(param: torch.nn.Parameter, layer_class: Any) -> Any:
    """The ``layer_class`` instance whose own ``layer_class.weight_loader`` is ``param``'s weight loader, or None."""
    loader = getattr(param, "weight_loader", None)
    function, owner = getattr(loader, "__func__", None), getattr(loader, "__self__", None)
    return owner if function is layer_class.weight_loader and isinstance(owner, layer_class) else None


def materialized_plain(param: torch.nn.Parameter) -> bool:
    """``param`` is materialized and not a GGUF weight (whose loaders do more than copy)."""
    return not (
        isinstance(param, torch.nn.parameter.UninitializedParameter)
        or getattr(param, "is_gguf_weight", False)
        or getattr(param, "is_gguf_weight_type", False)
    )


def owning_vocab_layer(param: torch.nn.Parameter):
    """The ``VocabParallelEmbedding`` (or ``ParallelLMHead``) whose ``weight_loader`` is ``param``'s, or None."""
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding

    return loader_owner(param, VocabParallelEmbedding)


def vocab_rows(name: str, param: torch.nn.Parameter) -> RowShard | None:
    """The stored rows SGLang's vocabulary loader copies into ``param`` (the rest of it zeroed), or None where
    ``param`` is not such a parameter or its layout is not the plain one (module docstring)."""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    layer = owning_vocab_layer(param)
    if layer is None or not materialized_plain(param):
        return None
    if getattr(param, "output_dim", None) != 0 or getattr(param, "packed_dim", None) is not None:
        return None
    if type(layer.quant_method) is not UnquantizedEmbeddingMethod or layer.use_presharded_weights:
        return None
    if layer.num_embeddings != layer.org_vocab_size or param.dim() == 0 or param.shape[0] != layer.num_embeddings_per_partition:
        return None
    shard = layer.shard_indices
    return RowShard(shard.org_vocab_start_index, shard.org_vocab_end_index, layer.org_vocab_size)
