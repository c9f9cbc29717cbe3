"""The type of an engine's MoE layer as the plugins see it.

SGLang's and vLLM's ``FusedMoE`` are ``torch.nn.Module`` subclasses whose attributes (``w13_weight``,
``moe_runner_config``, ``deprecate_flag``, sizes and dtypes) each engine release sets at run time; the plugins read and
set them by the names of the releases in the matrix. Typed as ``Any``: the attribute set is the engine's, not moebake's.
"""

from typing import Any, TypeAlias

EngineLayer: TypeAlias = Any
"""An engine's MoE layer module (SGLang's or vLLM's ``FusedMoE``)."""
