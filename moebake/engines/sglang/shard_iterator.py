"""SGLang's safetensors iterators, for a bake's shards: the same pairs, mapped from the files without touching them.

SGLang's iterators (:data:`moebake.engines.sglang.internals.SAFETENSORS_ITERATORS`) make every tensor with
``safe_open(...).get_tensor``, which touches its first page, and the kernel reads the pages around it: for a baked
expert tensor, other EP ranks' rows, which the plugin never loads (it reads a rank's own rows itself,
:mod:`moebake.engines.sglang.moe_methods`). :func:`lazy` wraps each iterator so that, where every file it is handed is
a shard of a bake (its directory holds the bake's manifest), it returns
:func:`moebake.loading.mapped_shards.mapped_tensors` instead: the same names, in the same order, with tensors of
the same dtype, shape and bytes, none of them read until SGLang reads it.

SGLang's own iterator runs unchanged where any of its options asks for something else (``disable_mmap``, ``prefetch``,
``drop_cache_after_load``), for any checkpoint that is not a bake, where a tensor cannot be mapped
(:func:`~moebake.loading.mapped_shards.mappable`), and with ``MOEBAKE_SGLANG_DIRECT_LOAD=0``
(:data:`moebake.engines.sglang.whole_model.DISABLE_ENV`).
"""

import functools
import inspect
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moebake.engines.sglang.internals import SAFETENSORS_ITERATOR_OPTIONS
from moebake.engines.sglang.whole_model import DISABLE_ENV
from moebake.loading.mapped_shards import mappable, mapped_tensors, shard_headers
from moebake.schema.manifest import MANIFEST_NAME

logger = logging.getLogger(__name__)


def is_bake_shards(files: list[str]) -> bool:
    """Whether ``files`` are shards of one bake: all in one directory, which holds a moebake manifest."""
    folders = {Path(f).resolve().parent for f in files}
    return len(folders) == 1 and (folders.pop() / MANIFEST_NAME).is_file()


def lazy(original: Callable[..., Any]):
    """``original`` (one of SGLang's safetensors iterators) handing a bake's tensors unread (module docstring)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def iterator(*args: Any, **kwargs: Any):
        options = signature.bind(*args, **kwargs)
        options.apply_defaults()
        files = [str(f) for f in options.arguments["hf_weights_files"]]
        if (
            os.environ.get(DISABLE_ENV, "1") == "0"
            or not files
            or any(options.arguments[name] for name in SAFETENSORS_ITERATOR_OPTIONS)
            or not is_bake_shards(files)
        ):
            return original(*args, **kwargs)
        headers = shard_headers(files)
        if not mappable(headers):
            logger.info("moebake: a tensor of %s cannot be mapped as stored; SGLang's iterator reads the bake", Path(files[0]).parent)
            return original(*args, **kwargs)
        return mapped_tensors(headers)

    return iterator
