"""Runtime of target ``deepep-bf16``: unquantized MoE experts on the DeepEP low-latency (masked) layout.

Per MoE layer, ``E_local`` experts of this EP rank, as baked by
:mod:`moebake.convert.targets.deepep_bf16`:

  ``w13_weight``  BF16 ``[E_local, 2I, H]``  halves ``[gate; up]``, ``[out, in]``
  ``w2_weight``   BF16 ``[E_local, H, I]``

:meth:`DeepEPBf16Experts.forward_masked` is what SGLang's DeepGEMM runner does for such a layer
(PR 25540): ``hidden_states`` BF16 ``[E_local, T_max, H]`` and ``masked_m`` int32 ``[E_local]`` from
DeepEP's BF16 low-latency dispatch, then per expert ``gate_up = x @ w13.T`` (masked grouped GEMM),
``h = silu(gate) * up`` (in fp32, rounded to BF16), ``y = h @ w2.T`` (masked grouped GEMM); the
result is ``[E_local, T_max, H]`` BF16 with every row at or past ``masked_m[e]`` zero, ready for
DeepEP's combine. The GEMMs run on DeepGEMM when it is usable, else on ``torch.bmm``
(:mod:`moebake.serve.masked_gemm`); the activation and the zeroing are Triton kernels on CUDA
that skip the padding rows, else torch (:mod:`moebake.serve.masked_activation`). For DeepGEMM,
``T_max`` is zero-padded to a multiple of 128 on every call, and ``H`` / ``I`` to multiples of 64
once at load (the weights: zero columns, and zero rows at the end of each of the gate and up
halves, so the padded lanes give ``silu(0) * 0 = 0``); the output is cropped back.

:meth:`DeepEPBf16Experts.forward` runs a whole layer on token-major input: with a ``dispatcher``
(:class:`moebake.serve.deepep_ll.DeepEPDispatcher` for real DeepEP LL, or
:class:`moebake.serve.dispatch.StandInDispatcher`, both for any number of EP ranks) it is
dispatch -> :meth:`forward_masked` -> combine across the EP group; without one, the single-rank
stand-in functions of :mod:`moebake.serve.dispatch`. :meth:`DeepEPBf16Checkpoint.low_latency_spec`
gives the dispatch buffer's shape for a layer (``LowLatencySpec``), and :func:`make_dispatcher`
picks DeepEP when it is importable.

Expert parallelism: EP rank ``r`` of ``n`` holds experts ``[r*E/n, (r+1)*E/n)``, as DeepEP numbers them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from moebake.errors import InvalidArgumentError, MoebakeError
from moebake.formats.bf16_moe import ACTIVATION
from moebake.layouts.gate_up import pad_to, split_halves, stack_halves
from moebake.loading.staged_reader import LoadStats
from moebake.schema.config_values import ConfigValues, model_scopes, read_json_object
from moebake.schema.manifest import LayerRecord
from moebake.schema.sizes import round_up
from moebake.schema.targets import DEEPEP_BF16
from moebake.serve import deepep_ll
from moebake.serve.baked_checkpoint import BakedCheckpoint
from moebake.serve.deepep_ll import LowLatencyBuffer, LowLatencyRefusal, LowLatencySpec
from moebake.serve.dispatch import StandInDispatcher, combine, dispatch, expected_m
from moebake.serve.masked_activation import silu_and_mul_masked, zero_rows_past
from moebake.serve.masked_gemm import MaskedGemm, get_backend

if TYPE_CHECKING:
    from moebake.schema.manifest import Manifest
    from moebake.serve.platform import Platform

TENSORS = DEEPEP_BF16.required_tensors  # w13_weight, w2_weight


class DeepEPBf16Experts:
    """One layer's experts of one EP rank, on one device, with the masked GEMM backend chosen.

    ``w13`` BF16 ``[E_local, 2I, H]`` (``[gate; up]``), ``w2`` BF16 ``[E_local, H, I]``; ``backend``:
    a :class:`MaskedGemm`, ``"deep_gemm"``, ``"torch"`` or None (DeepGEMM when usable, else torch).
    Attributes: ``num_local_experts``, ``first_expert``, ``hidden``, ``intermediate``, ``backend``,
    ``w13`` / ``w2`` (as the backend consumes them: padded for DeepGEMM where needed), ``load_stats``.
    """

    def __init__(
        self,
        w13: torch.Tensor,
        w2: torch.Tensor,
        backend: MaskedGemm | str | None = None,
        first_expert: int = 0,
        load_stats: LoadStats | None = None,
    ):
        E, two_i, H = w13.shape
        I = two_i // 2
        if w13.dtype != torch.bfloat16 or w2.dtype != torch.bfloat16 or two_i % 2 or tuple(w2.shape) != (E, H, I):
            raise InvalidArgumentError(
                f"expected w13 BF16 [E, 2I, H] and w2 BF16 [E, H, I], got w13 {w13.dtype} "
                f"{list(w13.shape)} and w2 {w2.dtype} {list(w2.shape)}"
            )
        self.num_local_experts, self.hidden, self.intermediate = E, H, I
        self.first_expert, self.load_stats = first_expert, load_stats
        self.backend = get_backend(backend, w13.device)
        H_pad, I_pad = round_up(H, self.backend.k_align), round_up(I, self.backend.k_align)
        if (H_pad, I_pad) == (H, I):
            self.w13, self.w2 = w13.contiguous(), w2.contiguous()
        else:
            self.w13 = stack_halves(*split_halves(w13, (I, H)), (I_pad, H_pad))
            self.w2 = pad_to(w2, (H_pad, I_pad))

    def parameters(self) -> dict[str, torch.Tensor]:
        """SGLang's parameter names -> the weights as the backend reads them."""
        return {"w13_weight": self.w13, "w2_weight": self.w2}

    def forward_masked(self, hidden_states: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
        """``[E_local, T_max, H]`` BF16 expert outputs of DeepEP LL input; rows past ``masked_m`` are zero.

        ``hidden_states`` BF16 ``[E_local, T_max, H]`` (rows past ``masked_m`` may hold anything,
        NaN included); ``masked_m`` int32 ``[E_local]`` on the same device, each in ``[0, T_max]``;
        ``expected_m`` > 0, the typical tokens per expert (DeepGEMM's tile choice).
        """
        E, T, H = hidden_states.shape
        if hidden_states.dtype != torch.bfloat16 or (E, H) != (self.num_local_experts, self.hidden):
            raise InvalidArgumentError(
                f"hidden_states must be BF16 [E_local={self.num_local_experts}, T_max, H={self.hidden}], "
                f"got {hidden_states.dtype} {list(hidden_states.shape)}"
            )
        if masked_m.dtype != torch.int32 or tuple(masked_m.shape) != (E,) or masked_m.device != hidden_states.device:
            raise InvalidArgumentError(
                f"masked_m must be int32 [{E}] on {hidden_states.device}, got {masked_m.dtype} {list(masked_m.shape)} on {masked_m.device}"
            )
        if not isinstance(expected_m, int) or expected_m <= 0:
            raise InvalidArgumentError(f"expected_m must be a positive int, got {expected_m!r}")
        run = self.backend.run
        x = pad_to(hidden_states, (round_up(T, self.backend.m_align), self.w13.shape[2]))
        gate_up = run(x, self.w13, masked_m, expected_m)
        y = run(silu_and_mul_masked(gate_up, masked_m), self.w2, masked_m, expected_m)
        return zero_rows_past(y[:, :T, :H], masked_m).contiguous()

    def forward(
        self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, dispatcher: Any = None
    ) -> torch.Tensor:
        """Token-major MoE: ``hidden_states`` BF16 ``[T, H]``, global ``topk_ids`` / ``topk_weights`` ``[T, k]``
        (``-1`` ids select nothing) -> ``[T, H]`` BF16.

        With ``dispatcher`` (DeepEP LL or the stand-in, see the module docstring) the output is the
        whole layer's, every rank's experts summed; collective: every rank of the EP group calls it.
        Without one, it is this rank's experts' share of the single-rank stand-in.
        """
        T, k = topk_ids.shape
        if dispatcher is None:
            recv_x, masked_m, handle = dispatch(hidden_states, topk_ids, self.num_local_experts, expert_offset=self.first_expert)
            # SGLang's hint over E global experts and E / E_local ranks reduces to this.
            hint = expected_m(T, k, self.num_local_experts)
            return combine(self.forward_masked(recv_x, masked_m, hint), topk_weights, handle)
        spec = dispatcher.spec
        mine = (self.hidden, self.num_local_experts, self.first_expert)
        if (spec.hidden, spec.num_local_experts, spec.first_expert(dispatcher.rank)) != mine:
            raise LowLatencyRefusal(
                f"the dispatcher is for hidden {spec.hidden} and experts [{spec.first_expert(dispatcher.rank)}, "
                f"{spec.first_expert(dispatcher.rank + 1)}) on rank {dispatcher.rank}; these experts are hidden {self.hidden}, "
                f"[{self.first_expert}, {self.first_expert + self.num_local_experts})"
            )
        recv_x, masked_m, handle = dispatcher.dispatch(hidden_states, topk_ids)
        hint = expected_m(T, k, spec.num_experts, spec.num_ranks)
        return dispatcher.combine(self.forward_masked(recv_x, masked_m, hint), topk_ids, topk_weights, handle)


class DeepEPBf16Checkpoint(BakedCheckpoint):
    """A baked ``deepep-bf16`` checkpoint; :meth:`load_experts` gives one layer's experts of one EP rank."""

    target = DEEPEP_BF16.name
    layout_version = DEEPEP_BF16.layout_version

    def __init__(self, root: Path, manifest: Manifest, platform: Platform):
        super().__init__(root, manifest, platform)
        if manifest.activation != ACTIVATION:
            raise MoebakeError(
                f"{self.manifest_path}: activation {manifest.activation.to_json()} is not the silu(gate) * up "
                f"({ACTIVATION.to_json()}) that the {self.target} runtime computes"
            )

    def layer(self, layer: int | str) -> LayerRecord:
        """The record of MoE layer ``layer``: its index, or its prefix (``mtp.layers.0.mlp.experts.``),
        which an index shared by a main and an MTP layer needs."""
        if isinstance(layer, str):
            for record in self.manifest.layers:
                if record.prefix == layer:
                    return record
            prefixes = [record.prefix for record in self.manifest.layers]
            raise MoebakeError(f"{self.manifest_path}: no MoE layer with prefix {layer!r} (layers: {prefixes})")
        matches = [record.prefix for record in self.manifest.layers if record.index == layer]
        if len(matches) > 1:
            raise MoebakeError(f"{self.manifest_path}: MoE layer index {layer} is ambiguous ({', '.join(matches)}); pass the prefix")
        return super().layer(layer)

    def load_experts(
        self,
        layer: int | str,
        device: torch.device | str = "cuda",
        ep_rank: int = 0,
        ep_size: int = 1,
        verify: bool = False,
        backend: MaskedGemm | str | None = None,
    ) -> DeepEPBf16Experts:
        """Read layer ``layer``'s (index or prefix) experts of EP rank ``ep_rank`` of ``ep_size`` onto ``device``.

        ``verify=True`` first checks the SHA-256 of the shards involved against the manifest.
        ``backend``: the masked GEMM (default: DeepGEMM when usable on ``device``, else torch).
        """
        device = torch.device(device)
        record = self.layer(layer)
        start, stop = self.rank_experts(record, ep_rank, ep_size)
        if sorted(record.tensors) != sorted(TENSORS) or record.dispatcher_output_dtype != "bf16":
            raise MoebakeError(
                f"{self.manifest_path}: layer {record.prefix} is not a deepep-bf16 layer "
                f"(needs tensors {', '.join(TENSORS)} and dispatcher_output_dtype bf16)"
            )
        if verify:
            self.verify_files([record.prefix + name for name in TENSORS])
        tensors, stats = self.read_experts(record, list(TENSORS), start, stop, device)
        return DeepEPBf16Experts(tensors["w13_weight"], tensors["w2_weight"], backend, start, stats)

    def top_k(self) -> int | None:
        """``num_experts_per_tok`` of the bake's config.json (or its ``text_config``), if it says; a
        value that is not a positive integer is a MoebakeError naming the file and key."""
        path = self.root / "config.json"
        if not path.is_file():
            return None
        config = ConfigValues.of_file(read_json_object(path), path)
        scope = next((scope for scope in model_scopes(config) if "num_experts_per_tok" in scope), None)
        return None if scope is None else scope.integer("num_experts_per_tok")

    def low_latency_spec(self, layer: int | str, tokens_per_rank: int, ep_size: int = 1, top_k: int | None = None) -> LowLatencySpec:
        """The DeepEP LL shape of layer ``layer`` on ``ep_size`` ranks for up to ``tokens_per_rank`` tokens
        per rank (rounded up, see :meth:`LowLatencySpec.for_tokens`); ``top_k`` defaults to the
        config's ``num_experts_per_tok``. Checked for what any dispatcher can run (see
        :func:`make_dispatcher` for DeepEP's own limits)."""
        record = self.layer(layer)
        top_k = self.top_k() if top_k is None else top_k
        if top_k is None:
            raise MoebakeError(f"{self.root / 'config.json'}: no num_experts_per_tok; pass top_k")
        spec = LowLatencySpec.for_tokens(record.hidden, record.experts, tokens_per_rank, ep_size, top_k)
        spec.check(deep_ep=False)
        return spec


DISPATCHERS = ("auto", "deepep", "standin")


def make_dispatcher(
    spec: LowLatencySpec, group: Any = None, kind: str = "auto", device: torch.device | str = "cuda", buffer: LowLatencyBuffer | None = None
):
    """A dispatcher of ``kind`` for ``spec`` on EP group ``group`` (None: one rank, no group).

    ``deepep``: DeepEP LL on a :class:`LowLatencyBuffer` (``buffer``, or a new one sized for ``spec``;
    needs a group, CUDA and DeepEP); refuses with one line what DeepEP LL cannot run. ``standin``:
    :class:`StandInDispatcher`, anywhere. ``auto``: DeepEP when it is importable, ``device`` is CUDA
    and ``spec`` is within DeepEP's limits, else the stand-in.
    """
    if kind not in DISPATCHERS:
        raise InvalidArgumentError(f"unknown dispatcher {kind!r}; expected one of {', '.join(DISPATCHERS)}")
    if kind == "auto":
        try:
            spec.check(deep_ep=True)
            usable = deepep_ll.deep_ep_status()[0] is not None and torch.device(device).type == "cuda" and group is not None
        except LowLatencyRefusal:
            usable = False
        kind = "deepep" if usable else "standin"
    if kind == "standin":
        return StandInDispatcher(spec, group)
    spec.check(deep_ep=True)
    if group is None:
        raise MoebakeError("the DeepEP dispatcher needs a torch.distributed process group (one rank is a group of 1)")
    return (buffer or LowLatencyBuffer(group, [spec])).dispatcher(spec)
