"""The whole model through moebake's loader: a bake's non-expert tensors read once per rank, straight into their parameters.

What is intercepted: SGLang's ``DefaultModelLoader.load_weights_and_postprocess(model, weights, target_device)``
(a staticmethod, the same in 0.5.17-0.5.23; :func:`moebake.engines.sglang.internals.wrap_load_weights_and_postprocess`
replaces it once per process, from the plugin's entry point). When ``model.quant_config`` is the plugin's
:class:`~moebake.engines.sglang.config.MoebakeConfig` (the model serves a bake), its class is one of
:data:`VERIFIED_MODELS`, and the model was not loaded through it before (a later ``update_weights_from_disk``
keeps SGLang's path), ``weights`` is replaced by :meth:`DirectParameterLoader.filter`, then SGLang's own function
runs: ``load_weights`` gets every pair the filter yields, and the kept-back tensors are on the device when the
iterator ends, before SGLang's post-load step. The bake's read-ahead (:mod:`moebake.loading.readahead`: the
MoE layers planned their rows on it as the model was built; the filter puts the other tensors' ranges first) is
stopped when SGLang's function returns or raises.

Which tensors go direct: those whose parameter SGLang fills by a plain full copy (:func:`plain_copy`): the
parameter's ``weight_loader`` is ``default_weight_loader`` or absent, or is ``ReplicatedLinear.weight_loader``,
with the shape and dtype of the stored tensor (:mod:`moebake.loading.direct_loader`); and the vocabulary
parameters of ``VocabParallelEmbedding`` / ``ParallelLMHead`` (:func:`~moebake.engines.sglang.vocab_rows.vocab_rows`):
this rank's contiguous range of the stored ``[vocab, hidden]`` rows into the parameter's first rows, its padding
rows zeroed, as SGLang's loader leaves them, at any tensor-parallel size (not with added/LoRA vocabulary,
quantized, packed, presharded or GGUF weights). The baked expert tensors, and every other TP-sharded, stacked
(q/k/v, gate/up), converted or renamed tensor keep SGLang's path.
"""

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from moebake.engines.sglang.refusals import MoebakeRefusal
from moebake.engines.sglang.vocab_rows import loader_owner, materialized_plain, owning_vocab_layer, vocab_rows
from moebake.loading.direct_loader import DirectLoadStats
from moebake.loading.direct_loader import DirectParameterLoader as _EngineNeutralLoader

__all__ = ["DirectLoadStats", "DirectParameterLoader", "VERIFIED_MODELS", "plain_copy"]

logger = logging.getLogger(__name__)

VERIFIED_MODELS = frozenset({"GptOssForCausalLM"})
"""Model classes whose ``load_weights`` (read in 0.5.17-0.5.23) hands a checkpoint tensor whose name is a parameter's
name to that parameter's loader, unchanged: no other model is intercepted. ``GptOssForCausalLM``: its name mapping
only renames the original-format names (``block.N...``, ``embedding.weight``), which are no parameter's; it checks no
parameter was left unloaded."""

DISABLE_ENV = "MOEBAKE_SGLANG_DIRECT_LOAD"
"""Set to ``0`` to keep SGLang's path for every non-expert tensor, and its own safetensors iterator for a bake's shards
(:mod:`moebake.engines.sglang.shard_iterator`)."""


def plain_copy(name: str, param: torch.nn.Parameter) -> bool:
    """Whether SGLang's loader for ``param`` copies the whole checkpoint tensor into it unchanged (the caller has
    checked that shapes and dtypes are equal). A vocabulary layer's ``output_dim == 0`` parameters are row shards
    (:func:`~moebake.engines.sglang.vocab_rows.vocab_rows`), not plain copies."""
    from sglang.srt.layers.linear import ReplicatedLinear
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    loader = getattr(param, "weight_loader", None)
    if loader is None or loader is default_weight_loader:
        return True
    if not materialized_plain(param):
        return False
    if loader_owner(param, ReplicatedLinear) is not None:
        return True
    return owning_vocab_layer(param) is not None and getattr(param, "output_dim", None) is None


def _bake_config(model: torch.nn.Module):
    from moebake.engines.sglang.config import MoebakeConfig

    config = getattr(model, "quant_config", None)
    return config if isinstance(config, MoebakeConfig) else None


class DirectParameterLoader(_EngineNeutralLoader):
    """``DirectParameterLoader(model, directory, device)``: SGLang's rules (:func:`plain_copy`, :func:`vocab_rows`) on
    the engine-neutral loader; when ``model.quant_config`` is a bake's, its baked expert tensors are always yielded unchanged.

    ``weights = loader.filter(weights)`` (SGLang's ``(name, tensor)`` iterator in, the pairs SGLang must still load
    out), ``model.load_weights(weights)``, then ``loader.stats`` (:class:`DirectLoadStats`)."""

    def __init__(self, model: torch.nn.Module, directory: str | Path, device: torch.device | str, **options: Any):
        config = _bake_config(model)
        baked = {record.prefix + short for record in config.manifest.layers for short in record.tensors} if config else set()
        super().__init__(
            model,
            directory,
            device,
            plain_copy=plain_copy,
            row_shard=vocab_rows,
            exclude=baked | set(options.pop("exclude", ())),
            **options,
        )

    @classmethod
    def for_served_model(cls, model: torch.nn.Module, device: torch.device | str, **options: Any) -> "DirectParameterLoader":
        """The loader of the bake SGLang serves: its directory is the one ``model.quant_config``'s manifest is in,
        else :func:`moebake.engines.sglang.config.model_directory` (``--model-path``). With a bake's config it reads
        through the config's reader onto ``device`` (the one the experts' loads use)."""
        config = _bake_config(model)
        if config is not None:  # the index and shard headers the bake's config has parsed already
            return cls(
                model,
                config.files.root,
                device,
                files=config.files,
                reader=config.reader(device),
                readahead=config.readahead(device),
                **options,
            )
        from moebake.engines.sglang.config import model_directory

        return cls(model, model_directory(), device, **options)


def _loader_for(model: torch.nn.Module, target_device: torch.device) -> DirectParameterLoader | None:
    """The loader for this ``load_weights_and_postprocess`` call, or None where SGLang's path is kept."""
    if _bake_config(model) is None or getattr(model, "moebake_direct_load", None) is not None:
        return None
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    if type(model).__name__ not in VERIFIED_MODELS:
        logger.info(
            "moebake: %s is not a model class whose load_weights moebake has checked (%s); its non-expert tensors keep SGLang's loader",
            type(model).__name__,
            ", ".join(sorted(VERIFIED_MODELS)),
        )
        return None
    loader = DirectParameterLoader.for_served_model(model, target_device)
    setattr(model, "moebake_direct_load", loader)  # the engine model's own attribute namespace
    return loader


def intercept(original: Callable[..., Any]):
    """``original`` (SGLang's ``load_weights_and_postprocess``) with a bake's plain-copy tensors read by moebake."""

    def load_weights_and_postprocess(model: torch.nn.Module, weights: Any, target_device: torch.device):
        config = _bake_config(model)
        try:
            loader = _loader_for(model, target_device)
            if loader is None:
                return original(model, weights, target_device)
            result = original(model, loader.filter(weights), target_device)
            if not loader.stats.finished:
                raise MoebakeRefusal(
                    f"{type(model).__name__}.load_weights stopped before the end of the weights, so "
                    f"moebake never read the tensors it kept back; start SGLang with {DISABLE_ENV}=0"
                )
            logger.info("moebake: %s", loader.stats)
            return result
        finally:  # the load (and every MoE layer's post-load step in it) has ended, or failed: so has the read-ahead
            for stats in config.stop_readahead() if config is not None else ():
                logger.info("moebake: %s", stats)

    return load_weights_and_postprocess
