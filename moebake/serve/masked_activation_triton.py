"""Triton kernels of :mod:`moebake.serve.masked_activation` (CUDA only; imported when Triton is there).

Both walk the DeepEP low-latency layout ``[E, M, ...]`` with a grid of (expert, row block,
column block) programs and read ``masked_m[expert]`` on the device, so neither needs a host sync:

* :func:`silu_and_mul_masked`: row blocks at or past ``masked_m`` exit at once, so the work is
  proportional to the tokens, not to ``M``.
* :func:`zero_rows_past`: stores zeros (never reads) into the rows at or past ``masked_m``.
"""

import torch
import triton
import triton.language as tl

from moebake.errors import InvalidArgumentError

SILU_BLOCK_M, SILU_BLOCK_N = 16, 256
ZERO_BLOCK_M, ZERO_BLOCK_N = 32, 512


@triton.jit
def _silu_and_mul_kernel(
    gate_up, out, masked_m, I, stride_gu_e, stride_gu_m, stride_out_e, stride_out_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    expert = tl.program_id(0).to(tl.int64)
    valid = tl.load(masked_m + expert)
    if tl.program_id(1) * BLOCK_M < valid:
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < valid) & (cols[None, :] < I)
        source = gate_up + expert * stride_gu_e + rows[:, None].to(tl.int64) * stride_gu_m + cols[None, :]
        gate = tl.load(source, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(source + I, mask=mask, other=0.0).to(tl.float32)
        h = gate / (1.0 + tl.exp(-gate)) * up  # torch's silu: x / (1 + exp(-x)), in fp32
        target = out + expert * stride_out_e + rows[:, None].to(tl.int64) * stride_out_m + cols[None, :]
        tl.store(target, h.to(tl.bfloat16), mask=mask)


@triton.jit
def _zero_rows_past_kernel(y, masked_m, M, N, stride_e, stride_m, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    expert = tl.program_id(0).to(tl.int64)
    valid = tl.load(masked_m + expert)
    if (tl.program_id(1) + 1) * BLOCK_M > valid:
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] >= valid) & (rows[:, None] < M) & (cols[None, :] < N)
        target = y + expert * stride_e + rows[:, None].to(tl.int64) * stride_m + cols[None, :]
        tl.store(target, tl.zeros([BLOCK_M, BLOCK_N], dtype=y.dtype.element_ty), mask=mask)


def silu_and_mul_masked(gate_up: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """BF16 ``[E, M, 2I]`` -> BF16 ``[E, M, I]``; rows at or past masked_m are left uninitialised."""
    E, M, two_i = gate_up.shape
    if gate_up.stride(-1) != 1:
        raise InvalidArgumentError("gate_up must be contiguous in its last dimension")
    out = torch.empty(E, M, two_i // 2, dtype=torch.bfloat16, device=gate_up.device)
    grid = (E, triton.cdiv(M, SILU_BLOCK_M), triton.cdiv(two_i // 2, SILU_BLOCK_N))
    _silu_and_mul_kernel[grid](
        gate_up,
        out,
        masked_m,
        two_i // 2,
        gate_up.stride(0),
        gate_up.stride(1),
        out.stride(0),
        out.stride(1),
        BLOCK_M=SILU_BLOCK_M,
        BLOCK_N=SILU_BLOCK_N,
    )
    return out


def zero_rows_past(y: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """Zero ``y [E, M, N]``'s rows at or past masked_m in place (any strides with a unit last one); returns ``y``."""
    E, M, N = y.shape
    if y.stride(-1) != 1:
        raise InvalidArgumentError("y must be contiguous in its last dimension")
    grid = (E, triton.cdiv(M, ZERO_BLOCK_M), triton.cdiv(N, ZERO_BLOCK_N))
    _zero_rows_past_kernel[grid](y, masked_m, M, N, y.stride(0), y.stride(1), BLOCK_M=ZERO_BLOCK_M, BLOCK_N=ZERO_BLOCK_N)
    return y
