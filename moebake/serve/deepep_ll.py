"""DeepEP low-latency (LL) dispatch/combine for the ``deepep-bf16`` runtime: what it can do, its buffer, its calls.

DeepEP's V1 ``Buffer`` (PyPI ``tokenspeed-deepep==1.2.1.post20251110``, NVSHMEM-based) moves each
rank's tokens to the ranks holding their experts and back:

  ``low_latency_dispatch(x [T, H] BF16, topk_idx [T, k] int64, max_tokens_per_rank, E, use_fp8=False)``
      -> ``recv_x`` BF16 ``[E_local, ranks * max_tokens_per_rank, H]`` (expert ``e``'s tokens packed
         at the front of block ``e``, from every rank, in arrival order; the rest uninitialised),
         ``recv_count`` int32 ``[E_local]`` (= ``masked_m``), and a handle
  ``low_latency_combine(y [E_local, ranks * max_tokens_per_rank, H] BF16, topk_idx, topk_weights fp32, handle)``
      -> ``[T, H]`` BF16, ``out[t] = sum_j topk_weights[t, j] * y[row of (t, j)]`` summed in fp32

Expert ``g`` lives on rank ``g // E_local``; a ``-1`` id selects nothing.

:class:`LowLatencySpec` is one layer's shape on one EP group (hidden, experts, max tokens per rank,
ranks, top-k) with the refusals, as one-line :class:`LowLatencyRefusal` errors, of what DeepEP LL
cannot run: hidden sizes its kernels are not built for (:data:`LL_HIDDEN_SIZES`), top-k above the
build's ``kNumMaxTopk`` (:data:`LL_MAX_TOP_K`), more tokens than ``max_tokens_per_rank`` (or more
than the NVSHMEM queue depth allows), experts not divisible by ranks. The hidden list and the
top-k limit are read off the wheel's kernel instantiations
(``internode_ll::combine<..., kHidden, kNumMaxTopk=11, ...>`` for every hidden above).

:class:`LowLatencyBuffer` owns one ``deep_ep.Buffer`` sized for the largest spec it must serve
(:func:`rdma_bytes`, which is DeepEP's ``get_low_latency_rdma_size_hint`` computed here, so a CPU
box can size it too) and hands out :class:`DeepEPDispatcher` objects for specs that fit; the
single-process stand-in with the same contract is :class:`moebake.serve.dispatch.StandInDispatcher`.
"""

import functools
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from moebake.errors import InvalidArgumentError, OptionError, PlatformError

# Hidden sizes the LL kernels of tokenspeed-deepep 1.2.1 are instantiated for (SWITCH_HIDDEN).
LL_HIDDEN_SIZES = (2048, 2560, 3072, 4096, 5120, 6144, 7168, 8192)
# The build's kNumMaxTopk: top-k of the dispatch/combine kernels (Qwen3.5: 8 or 10).
LL_MAX_TOP_K = 11
# NVSHMEM_QP_DEPTH that Buffer sets unless the environment does; every LL call asserts
# depth >= (max_tokens_per_rank + 1) * 2.
LL_QP_DEPTH = 1024
LL_MAX_TOKENS_PER_RANK = LL_QP_DEPTH // 2 - 1
# DeepGEMM's masked kernels store whole 128-row tiles: T_max = ranks * max_tokens_per_rank is
# rounded up to a multiple of this by LowLatencySpec.for_tokens, so recv_x is used without a copy.
GEMM_ROWS = 128
# DeepEP's buffer alignment (NUM_BUFFER_ALIGNMENT_BYTES) and its message framing.
_ALIGN = 128
_INT4 = 16


class LowLatencyRefusal(OptionError):
    """A layer shape or batch that DeepEP's low-latency kernels cannot run; one line."""


@dataclass(frozen=True)
class LowLatencySpec:
    """One MoE layer on one EP group, as DeepEP LL sees it.

    ``hidden`` H, ``num_experts`` E (global), ``max_tokens_per_rank`` (the same on every rank),
    ``num_ranks``, ``top_k`` (the routing's k). Rank ``r`` holds experts
    ``[r * E_local, (r + 1) * E_local)``; ``t_max = num_ranks * max_tokens_per_rank`` rows per expert.
    """

    hidden: int
    num_experts: int
    max_tokens_per_rank: int
    num_ranks: int = 1
    top_k: int = 1

    @classmethod
    def for_tokens(cls, hidden: int, num_experts: int, tokens_per_rank: int, num_ranks: int = 1, top_k: int = 1) -> "LowLatencySpec":
        """The spec for up to ``tokens_per_rank`` tokens per rank, with ``max_tokens_per_rank``
        rounded up so that ``t_max`` is a multiple of :data:`GEMM_ROWS` (DeepGEMM then reads
        DeepEP's ``recv_x`` in place)."""
        step = GEMM_ROWS // math.gcd(GEMM_ROWS, max(num_ranks, 1))
        return cls(hidden, num_experts, max(step, -(-tokens_per_rank // step) * step), num_ranks, top_k)

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.num_ranks

    @property
    def t_max(self) -> int:
        return self.num_ranks * self.max_tokens_per_rank

    def first_expert(self, rank: int) -> int:
        return rank * self.num_local_experts

    def check(self, deep_ep: bool = True) -> None:
        """LowLatencyRefusal for what no dispatcher can do, and with ``deep_ep`` what DeepEP LL cannot."""
        for name in ("hidden", "num_experts", "max_tokens_per_rank", "num_ranks", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LowLatencyRefusal(f"{name} must be a positive integer, got {value!r}")
        if self.num_experts % self.num_ranks:
            raise LowLatencyRefusal(
                f"{self.num_experts} experts cannot be split evenly over {self.num_ranks} EP ranks "
                f"(the rank count must divide the expert count)"
            )
        if self.top_k > self.num_experts:
            raise LowLatencyRefusal(f"top-k {self.top_k} is more than the layer's {self.num_experts} experts")
        if not deep_ep:
            return
        if self.hidden not in LL_HIDDEN_SIZES:
            raise LowLatencyRefusal(
                f"hidden size {self.hidden} is not one DeepEP low-latency kernels are built for "
                f"({', '.join(map(str, LL_HIDDEN_SIZES))}); use the stand-in dispatcher"
            )
        if self.top_k > LL_MAX_TOP_K:
            raise LowLatencyRefusal(
                f"top-k {self.top_k} is above DeepEP low-latency's maximum of {LL_MAX_TOP_K} "
                f"(kNumMaxTopk of tokenspeed-deepep 1.2.1); use the stand-in dispatcher"
            )
        if self.max_tokens_per_rank > LL_MAX_TOKENS_PER_RANK:
            raise LowLatencyRefusal(
                f"max tokens per rank {self.max_tokens_per_rank} is above DeepEP low-latency's "
                f"{LL_MAX_TOKENS_PER_RANK} (NVSHMEM queue depth {LL_QP_DEPTH} >= 2 * (max tokens + 1))"
            )
        if self.t_max % 4:
            raise LowLatencyRefusal(f"ranks x max tokens per rank = {self.t_max} must be a multiple of 4 for DeepEP's TMA copies")

    def check_batch(self, num_tokens: int, top_k: int) -> None:
        """LowLatencyRefusal unless a batch of ``num_tokens`` tokens routed to ``top_k`` experts fits this spec."""
        if num_tokens > self.max_tokens_per_rank:
            raise LowLatencyRefusal(
                f"{num_tokens} tokens on this rank are more than num_max_dispatch_tokens_per_rank="
                f"{self.max_tokens_per_rank} that the dispatch buffer was sized for"
            )
        if top_k > self.top_k:
            raise LowLatencyRefusal(f"the batch routes each token to {top_k} experts, the dispatcher was made for top-k <= {self.top_k}")

    def rdma_bytes(self) -> int:
        """:func:`rdma_bytes` of this spec: the NVSHMEM buffer DeepEP LL needs on every rank."""
        return rdma_bytes(self.max_tokens_per_rank, self.hidden, self.num_ranks, self.num_experts)


def rdma_bytes(max_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """DeepEP's ``Buffer.get_low_latency_rdma_size_hint`` (BF16 LL layout), computed without DeepEP.

    The buffer holds two (odd/even) copies each of: a signaling area (one int per expert, 128-byte
    aligned), a send area and a receive area. A dispatch message is a 16-byte header plus
    ``max(2H, H + 4 * H/128)`` bytes (BF16 token or FP8 token + scales); a combine message is
    ``2H + 4 * H/128`` bytes (BF16 token + per-128-channel min/max). The send area holds the larger
    of ``max_tokens`` dispatch messages and ``E * max_tokens`` combine messages, the receive area
    the larger of ``E * max_tokens`` messages of either kind. The total is rounded up to the next
    128 bytes, strictly (a multiple of 128 gains 128). ``num_ranks`` does not enter the sum.
    """
    del num_ranks  # kept for the hint's signature; the per-rank layout does not depend on it
    scales = hidden // 128
    dispatch_msg = _INT4 + max(2 * hidden, hidden + 4 * scales)
    combine_msg = 4 * scales + 2 * hidden
    send = max(max_tokens_per_rank * dispatch_msg, num_experts * max_tokens_per_rank * combine_msg)
    recv = num_experts * max_tokens_per_rank * max(dispatch_msg, combine_msg)
    signal = -(-(num_experts * 4) // _ALIGN) * _ALIGN
    total = 2 * (signal + send + recv)
    return (total + _ALIGN) // _ALIGN * _ALIGN


@functools.cache
def deep_ep_status() -> tuple[ModuleType | None, str]:
    """``(deep_ep, "")`` when DeepEP's V1 ``Buffer`` with low-latency calls imports, else ``(None, why)``."""
    try:
        import deep_ep  # torch first (imported above): its preload resolves libnvshmem_host
    except Exception as err:  # noqa: BLE001 - ImportError, OSError (a missing .so), RuntimeError: all mean "absent"
        return None, f"import deep_ep failed: {type(err).__name__}: {err}"
    if not hasattr(getattr(deep_ep, "Buffer", None), "low_latency_dispatch"):
        return None, "deep_ep has no V1 Buffer.low_latency_dispatch (install tokenspeed-deepep==1.2.1.post20251110)"
    return deep_ep, ""


def require_deep_ep() -> ModuleType:
    module, why = deep_ep_status()
    if module is None:
        raise PlatformError(f"DeepEP is not usable here ({why}); use the stand-in dispatcher")
    return module


class LowLatencyBuffer:
    """One ``deep_ep.Buffer`` in low-latency mode for ``group``, big enough for every spec in ``specs``.

    Collective: every rank of ``group`` creates it with the same specs, on its own CUDA device
    (``torch.cuda.set_device`` first). :meth:`dispatcher` gives a :class:`DeepEPDispatcher` for any
    spec that fits; switching between specs of different layouts cleans DeepEP's signaling area
    (also collective: all ranks switch in the same order). :meth:`close` releases NVSHMEM.
    """

    def __init__(self, group: Any, specs: list[LowLatencySpec]):
        deep_ep = require_deep_ep()
        if not specs:
            raise InvalidArgumentError("LowLatencyBuffer needs at least one spec to size the buffer")
        for spec in specs:
            spec.check(deep_ep=True)
            if spec.num_ranks != group.size():
                raise LowLatencyRefusal(f"a spec for {spec.num_ranks} EP ranks cannot run on a group of {group.size()}")
        self.group, self.rank, self.num_ranks = group, group.rank(), group.size()
        self.num_bytes = max(
            deep_ep.Buffer.get_low_latency_rdma_size_hint(s.max_tokens_per_rank, s.hidden, s.num_ranks, s.num_experts) for s in specs
        )
        self.num_qps_per_rank = max(s.num_local_experts for s in specs)
        self.buffer = deep_ep.Buffer(
            group,
            num_nvl_bytes=0,
            num_rdma_bytes=self.num_bytes,
            low_latency_mode=True,
            num_qps_per_rank=self.num_qps_per_rank,
            allow_nvlink_for_low_latency_mode=True,
            explicitly_destroy=True,
        )
        self.topk_idx_dtype = deep_ep.topk_idx_t
        self._layout: tuple[int, int, int] | None = None

    def dispatcher(self, spec: LowLatencySpec) -> "DeepEPDispatcher":
        """A dispatcher for ``spec`` on this buffer; LowLatencyRefusal if it does not fit."""
        spec.check(deep_ep=True)
        if spec.num_ranks != self.num_ranks:
            raise LowLatencyRefusal(f"a spec for {spec.num_ranks} EP ranks cannot run on a buffer of {self.num_ranks}")
        if spec.rdma_bytes() > self.num_bytes:
            raise LowLatencyRefusal(f"the spec needs {spec.rdma_bytes()} bytes of DeepEP LL buffer, this buffer has {self.num_bytes}")
        return DeepEPDispatcher(self, spec)

    def use(self, spec: LowLatencySpec) -> None:
        """Clean the LL signaling area when ``spec`` lays the buffer out differently from the last call's."""
        layout = (spec.max_tokens_per_rank, spec.hidden, spec.num_experts)
        if layout != self._layout:
            if self._layout is not None:
                self.buffer.clean_low_latency_buffer(*layout)
            self._layout = layout

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.destroy()
            self.buffer = None


class DeepEPDispatcher:
    """DeepEP LL BF16 dispatch/combine of one :class:`LowLatencySpec` on a :class:`LowLatencyBuffer`.

    :meth:`dispatch` ``(hidden [T, H] BF16, topk_ids [T, k])`` -> ``(recv_x [E_local, t_max, H] BF16,
    masked_m [E_local] int32, handle)``; :meth:`combine` ``(expert_out [E_local, t_max, H] BF16,
    topk_ids, topk_weights [T, k], handle)`` -> ``[T, H]`` BF16. At most two dispatch results may
    be alive at once (DeepEP reuses its two buffers).
    """

    name = "deepep"

    def __init__(self, buffer: LowLatencyBuffer, spec: LowLatencySpec):
        self.buffer, self.spec, self.rank = buffer, spec, buffer.rank

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor):
        self.spec.check_batch(hidden.shape[0], topk_ids.shape[1])
        self.buffer.use(self.spec)
        recv_x, masked_m, handle, _, _ = self.buffer.buffer.low_latency_dispatch(
            hidden.contiguous(),
            topk_ids.to(self.buffer.topk_idx_dtype).contiguous(),
            self.spec.max_tokens_per_rank,
            self.spec.num_experts,
            use_fp8=False,
        )
        return recv_x, masked_m, handle

    def combine(self, expert_out: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, handle: Any) -> torch.Tensor:
        combined, _, _ = self.buffer.buffer.low_latency_combine(
            expert_out.contiguous(), topk_ids.to(self.buffer.topk_idx_dtype).contiguous(), topk_weights.float().contiguous(), handle
        )
        return combined
