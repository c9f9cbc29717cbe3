"""Whether moebake's interceptions of SGLang's loader are in place in this process.

:func:`install` (from the plugin's entry point) wraps SGLang's ``load_weights_and_postprocess`` with the interceptor
it is given (:func:`moebake.engines.sglang.whole_model.intercept`) and, when given one, its safetensors iterators
(:func:`moebake.engines.sglang.shard_iterator.lazy`); where SGLang moved one of them, the one-line refusal is kept,
and :func:`check_installed` raises it when a bake is served (other models start as usual).
"""

from collections.abc import Callable
from typing import Any

from moebake.engines.sglang import internals
from moebake.engines.sglang.refusals import MoebakeRefusal

_install_problem: MoebakeRefusal | None = None


def install(intercept: Callable[..., Any], iterators: Callable[..., Any] | None = None) -> None:
    """Wrap SGLang's loader with ``intercept(original) -> replacement`` and its safetensors iterators with
    ``iterators(original) -> replacement`` (if given), or keep why that cannot be done."""
    global _install_problem
    try:
        internals.wrap_load_weights_and_postprocess(intercept)
        if iterators is not None:
            internals.wrap_safetensors_iterators(iterators)
        _install_problem = None
    except MoebakeRefusal as err:
        _install_problem = err


def check_installed() -> None:
    """Raise the one-line refusal :func:`install` met, if any (called before a bake is served)."""
    if _install_problem is not None:
        raise _install_problem
