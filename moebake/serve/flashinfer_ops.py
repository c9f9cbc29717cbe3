"""FlashInfer's SM90 fused-MoE entry points, bound to moebake's reduced module through a getter of moebake's own.

FlashInfer's stock ``fused_moe_90`` JIT module takes over half an hour to build; moebake builds (or loads a
prebuilt copy of) a module with only the MXFP4 W4A16 and Humming W4A8 paths (:mod:`moebake.serve.jit.flashinfer_build`).
FlashInfer 0.7.2.post1's public ``cutlass_fused_moe`` checks and prepares its arguments, then calls
``get_cutlass_fused_moe_module(arch).cutlass_fused_moe(...)``, a cached getter that builds the module from
``gen_cutlass_fused_moe_sm90_module()``. :func:`sm90_moe_ops` rebuilds those two functions from FlashInfer's
own code objects over a copy of their module's namespace in which that generator returns the reduced
module's spec and the getter is the rebuilt one. Nothing in FlashInfer is replaced: its module, getter and
cache serve every other caller in the process (an engine's own FlashInfer calls) as before. The rebuilt
functions run FlashInfer's code unchanged, minus its API-logging wrapper. Only the FlashInfer versions in
:data:`moebake.serve.jit.flashinfer_build.TESTED_FLASHINFER_VERSIONS` are accepted.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import FunctionType, SimpleNamespace
from typing import TYPE_CHECKING, Any

from moebake.errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

QUANT_TYPES = {"fp4": 1, "fp4_fp8": 2, "int4": 0}
"""``interleave_moe_weights_for_sm90_mixed_gemm``'s quant types, as FlashInfer's wrapper numbers them for the op."""


def _rebound(function: FunctionType, namespace: dict) -> FunctionType:
    """``function``'s code (under its decorators) with ``namespace`` as its globals; defaults kept."""
    code = inspect.unwrap(function)
    rebuilt = FunctionType(code.__code__, namespace, code.__name__, code.__defaults__, code.__closure__)
    rebuilt.__kwdefaults__ = code.__kwdefaults__
    rebuilt.__doc__ = code.__doc__
    rebuilt.__annotations__ = dict(code.__annotations__)
    return rebuilt


def own_getter(make_spec: Callable[..., Any]):
    """``(get_cutlass_fused_moe_module, cutlass_fused_moe)`` of FlashInfer's code, with ``make_spec()`` (called on the
    getter's first SM90 call) as the SM90 module's spec."""
    import flashinfer.fused_moe.core as core

    namespace = dict(vars(core))
    namespace["gen_cutlass_fused_moe_sm90_module"] = lambda use_fast_build=False: make_spec()
    getter = functools.cache(_rebound(core.get_cutlass_fused_moe_module, namespace))
    namespace["get_cutlass_fused_moe_module"] = getter
    return getter, _rebound(core.cutlass_fused_moe, namespace)


@functools.cache
def sm90_moe_ops() -> SimpleNamespace:
    """``cutlass_fused_moe`` (FlashInfer's signature; returns ``[output]``), ``interleave_weights(weight, quant_type)``
    and ``interleave_scales`` on the reduced module; ``get_module(arch)`` is the getter."""
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm

    from moebake.serve.jit.flashinfer_build import check_flashinfer_version, reduced_module_spec

    check_flashinfer_version()
    getter, cutlass_fused_moe = own_getter(reduced_module_spec)

    def interleave_weights(weight: torch.Tensor, quant_type: str = "fp4"):
        """FlashInfer's SM90 mixed-GEMM weight interleave on the reduced module: ``[E, n, k // 2]`` uint8 CUDA
        tensor (two 4-bit values a byte) -> a new tensor of the same shape and dtype. FlashInfer's own wrapper
        (``fused_moe.prepare``) imports its getter at call time, so it cannot be rebound like ``cutlass_fused_moe``."""
        import torch

        if weight.dim() != 3 or weight.dtype != torch.uint8 or not weight.is_cuda:
            raise InvalidArgumentError(
                f"weight must be a 3-D uint8 CUDA tensor; got {tuple(weight.shape)} {weight.dtype} on {weight.device}"
            )
        weight = weight.contiguous()
        out = torch.empty_like(weight)
        major, minor = torch.cuda.get_device_capability(weight.device)
        getter(f"{major * 10 + minor}").interleave_moe_weights_for_sm90_mixed_gemm(weight, out, QUANT_TYPES[quant_type])
        return out

    return SimpleNamespace(
        cutlass_fused_moe=cutlass_fused_moe,
        interleave_weights=interleave_weights,
        interleave_scales=interleave_moe_scales_for_sm90_mixed_gemm,
        get_module=getter,
    )
