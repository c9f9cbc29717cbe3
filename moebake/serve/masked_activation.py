"""The elementwise steps around the masked GEMMs on the DeepEP low-latency layout ``[E, M, ...]``.

* :func:`silu_and_mul_masked`: ``gate_up`` BF16 ``[E, M, 2I]`` (halves ``[gate | up]``) -> BF16
  ``[E, M, I]`` = ``silu(gate) * up`` computed in fp32 and rounded once, as SGLang's
  ``silu_and_mul_masked_fwd``. Rows at or past ``masked_m[e]`` are unspecified.
* :func:`zero_rows_past`: zero, in place, the rows at or past ``masked_m[e]`` of ``y [E, M, N]``.

On CUDA with Triton both are Triton kernels that read ``masked_m`` on the device
(:mod:`moebake.serve.masked_activation_triton`): the activation touches only the tokens' rows,
the zeroing only writes. Elsewhere they are plain torch over all ``M`` rows. Neither syncs with
the host.
"""

import functools
from types import ModuleType

import torch
import torch.nn.functional as F

from moebake.serve.masked_gemm import valid_rows


@functools.cache
def triton_kernels() -> ModuleType | None:
    """:mod:`moebake.serve.masked_activation_triton`, or None where Triton is not installed."""
    try:
        from moebake.serve import masked_activation_triton
    except ImportError:
        return None
    return masked_activation_triton


def _kernels_for(x: torch.Tensor) -> ModuleType | None:
    return triton_kernels() if x.is_cuda else None


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """Torch, every row: ``[..., 2I]`` = ``[gate | up]`` BF16 -> ``silu(gate) * up`` ``[..., I]`` in fp32, rounded to BF16."""
    gate, up = gate_up.chunk(2, dim=-1)
    h = F.silu(gate.float(), inplace=True)
    return h.mul_(up).to(torch.bfloat16)


def silu_and_mul_masked(gate_up: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """``[E, M, 2I]`` -> ``[E, M, I]``; the Triton kernel on CUDA (valid rows only), else :func:`silu_and_mul`."""
    kernels = _kernels_for(gate_up)
    return kernels.silu_and_mul_masked(gate_up, masked_m) if kernels else silu_and_mul(gate_up)


def zero_rows_past(y: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """Zero the rows of ``y [E, M, N]`` at or past ``masked_m`` in place; returns ``y``."""
    kernels = _kernels_for(y)
    return kernels.zero_rows_past(y, masked_m) if kernels else y.masked_fill_(~valid_rows(masked_m, y.shape[1]), 0)
