"""Whether moebake's interception of SGLang's ``load_weights_and_postprocess`` is in place in this process.

:func:`install` (from the plugin's entry point) wraps SGLang's function with the interceptor it is given
(:func:`moebake.engines.sglang.whole_model.intercept`); where SGLang moved that function, the one-line refusal is
kept, and :func:`check_installed` raises it when a bake is served (other models start as usual).
"""

from moebake.engines.sglang import internals
from moebake.engines.sglang.refusals import MoebakeRefusal

_install_problem: MoebakeRefusal | None = None


def install(intercept) -> None:
    """Wrap SGLang's loader with ``intercept(original) -> replacement``, or keep why that cannot be done."""
    global _install_problem
    try:
        internals.wrap_load_weights_and_postprocess(intercept)
        _install_problem = None
    except MoebakeRefusal as err:
        _install_problem = err


def check_installed() -> None:
    """Raise the one-line refusal :func:`install` met, if any (called before a bake is served)."""
    if _install_problem is not None:
        raise _install_problem
