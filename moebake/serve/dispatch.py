"""Stand-in for DeepEP low-latency dispatch and combine (BF16), so the masked path runs without DeepEP.

:func:`dispatch` maps token-major MoE input to the layout DeepEP's ``low_latency_dispatch``
(``use_fp8=False``) returns, and :func:`combine` maps expert outputs back like
``low_latency_combine``:

  ``hidden``       BF16  ``[T, H]``       this rank's tokens
  ``topk_ids``     int   ``[T, k]``       global expert ids; ``-1`` = no expert
  ``topk_weights`` float ``[T, k]``       routing weights (applied by combine, never before)
  ``recv_x``       BF16  ``[E_local, T_max, H]``  expert ``e``'s tokens packed at the front of block ``e``
                                          in token order; the rows past them are zero
  ``masked_m``     int32 ``[E_local]``    how many rows of each block are tokens
  combined         BF16  ``[T, H]``       ``out[t] = sum_j w[t, j] * y[e_tj, slot_tj]``, summed in fp32

This rank holds experts ``[expert_offset, expert_offset + E_local)``; choices of other experts are
skipped (another rank adds them). DeepEP itself orders an expert's rows by arrival and leaves the
padding rows uninitialised; consumers must rely on neither.

:class:`StandInDispatcher` puts these two functions behind the interface of
:class:`moebake.serve.deepep_ll.DeepEPDispatcher`, for any number of ranks of a
``torch.distributed`` group (gloo on CPU, NCCL on GPUs): every rank's tokens are all-gathered, each
rank runs its experts on all of them, and the fp32 partial sums are all-reduced.
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from moebake.errors import InvalidArgumentError


@dataclass(frozen=True)
class DispatchHandle:
    """Where every dispatched (token, choice) went: all ``[n]`` int64 on the tokens' device."""

    num_tokens: int
    token: torch.Tensor  # the token t
    choice: torch.Tensor  # flat index t * k + j into topk_ids / topk_weights
    expert: torch.Tensor  # local expert (block of recv_x)
    slot: torch.Tensor  # row within that block


def expected_m(num_tokens: int, top_k: int, num_experts: int, num_ranks: int = 1) -> int:
    """SGLang's DeepEP LL hint for the masked GEMM: ``(tokens * ranks * top_k + E) // E`` (>= 1)."""
    return (num_tokens * num_ranks * top_k + num_experts) // num_experts


def dispatch(
    hidden: torch.Tensor, topk_ids: torch.Tensor, num_local_experts: int, max_tokens: int | None = None, expert_offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor, DispatchHandle]:
    """``(recv_x [E_local, T_max, H], masked_m [E_local] int32, handle)``; ``T_max = max_tokens or T``.

    ValueError if an expert receives more than ``T_max`` tokens (a host sync checks it).
    """
    T, H = hidden.shape
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T:
        raise InvalidArgumentError(f"topk_ids must be [T={T}, k], got {list(topk_ids.shape)}")
    t_max = T if max_tokens is None else max_tokens
    ids = topk_ids.reshape(-1).long()
    local = ids - expert_offset
    choice = ((ids >= 0) & (local >= 0) & (local < num_local_experts)).nonzero().squeeze(1)
    token = torch.div(choice, topk_ids.shape[1], rounding_mode="floor")
    order = torch.sort(local[choice] * T + token, stable=True).indices  # by expert, then token
    choice, token = choice[order], token[order]
    expert = local[choice]
    counts = torch.bincount(expert, minlength=num_local_experts)
    if choice.numel() and int(counts.max()) > t_max:
        raise InvalidArgumentError(f"an expert receives {int(counts.max())} tokens, more than T_max={t_max}")
    slot = torch.arange(choice.numel(), device=hidden.device) - (torch.cumsum(counts, 0) - counts)[expert]
    recv_x = hidden.new_zeros(num_local_experts, t_max, H)
    recv_x[expert, slot] = hidden[token]
    return recv_x, counts.to(torch.int32), DispatchHandle(T, token, choice, expert, slot)


def combine(
    expert_out: torch.Tensor, topk_weights: torch.Tensor, handle: DispatchHandle, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``[T, H]`` ``dtype``: each token's expert outputs, weighted by ``topk_weights`` and summed in fp32."""
    weights = topk_weights.reshape(-1)[handle.choice].float()
    rows = expert_out[handle.expert, handle.slot].float() * weights[:, None]
    out = torch.zeros(handle.num_tokens, expert_out.shape[-1], dtype=torch.float32, device=expert_out.device)
    return out.index_add_(0, handle.token, rows).to(dtype)


@dataclass(frozen=True)
class StandInHandle:
    """What :meth:`StandInDispatcher.combine` needs: this rank's token count and the gathered dispatch."""

    num_tokens: int
    dispatch: DispatchHandle


class StandInDispatcher:
    """DeepEP LL's contract, computed with torch: ``spec`` a :class:`~moebake.serve.deepep_ll.LowLatencySpec`,
    ``group`` the EP process group (None: one rank, no communication).

    :meth:`dispatch` ``(hidden [T, H] BF16, topk_ids [T, k])`` -> ``(recv_x [E_local, t_max, H],
    masked_m [E_local] int32, handle)`` with ``t_max = ranks * max_tokens_per_rank`` as DeepEP's;
    expert ``e``'s rows are its tokens in (source rank, token) order, the rest zero.
    :meth:`combine` ``(expert_out, topk_ids, topk_weights, handle)`` -> ``[T, H]`` BF16, the fp32
    sum over every rank's experts. Collective: all ranks call both, in the same order.
    """

    name = "standin"

    def __init__(self, spec: Any, group: Any = None):
        spec.check(deep_ep=False)
        ranks = 1 if group is None else group.size()
        if spec.num_ranks != ranks:
            raise InvalidArgumentError(f"a spec for {spec.num_ranks} EP ranks cannot run on a group of {ranks}")
        self.spec, self.group = spec, group
        self.rank = 0 if group is None else group.rank()

    def _gather(self, local: torch.Tensor, fill: float) -> torch.Tensor:
        """``[ranks * max_tokens, ...]``: every rank's ``local`` rows, each padded with ``fill`` to max_tokens."""
        padded = local.new_full((self.spec.max_tokens_per_rank, *local.shape[1:]), fill)
        padded[: local.shape[0]] = local
        if self.group is None:
            return padded
        parts = [torch.empty_like(padded) for _ in range(self.spec.num_ranks)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat(parts)

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor):
        self.spec.check_batch(hidden.shape[0], topk_ids.shape[1])
        ids = self._gather(topk_ids.long(), -1)
        recv_x, masked_m, handle = dispatch(
            self._gather(hidden, 0),
            ids,
            self.spec.num_local_experts,
            max_tokens=self.spec.t_max,
            expert_offset=self.spec.first_expert(self.rank),
        )
        return recv_x, masked_m, StandInHandle(hidden.shape[0], handle)

    def combine(self, expert_out: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, handle: StandInHandle) -> torch.Tensor:
        partial = combine(expert_out, self._gather(topk_weights.float(), 0), handle.dispatch, dtype=torch.float32)
        if self.group is not None:
            dist.all_reduce(partial, group=self.group)
        start = self.rank * self.spec.max_tokens_per_rank
        return partial[start : start + handle.num_tokens].to(torch.bfloat16)
