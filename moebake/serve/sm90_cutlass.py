"""Runtime of targets ``sm90-cutlass`` and ``sm90-cutlass-w4a8``: baked experts -> FlashInfer ``cutlass_fused_moe``
on Hopper, W4A16 (BF16 activations x MXFP4) or Humming W4A8 (activations quantized to FP8 in the kernel x MXFP4).

Per MoE layer the manifest lists the baked tensors (SGLang's parameter names, see
:mod:`moebake.convert.targets.sm90_cutlass`); with ``E_local`` experts on this rank:

  ``w13_weight``        uint8 ``[E_local, 2*I_pad, H_pad/2]``            fc1 weights, halves [up; gate]
  ``w13_weight_scale``  uint8 ``[E_local, 2*I_pad/64, H_pad/128, 16, 16]`` fc1 E8M0 scales (read as int32)
  ``w2_weight``         uint8 ``[E_local, H_pad, I_pad/2]``              fc2 weights
  ``w2_weight_scale``   uint8 ``[E_local, H_pad/64, I_pad/128, 16, 16]`` fc2 E8M0 scales (read as int32)
  ``w13_weight_bias``   bf16  ``[E_local, 2*I_pad]``  optional, [up | gate]; with it, ``w2_weight_bias``
  ``w2_weight_bias``    bf16  ``[E_local, H_pad]``    optional

``sm90-cutlass-w4a8`` holds the same names (its weights and scales rewritten and interleaved by FlashInfer's Humming
preprocess, ``"fp4_fp8"``) and two more:

  ``w13_humming_residual_scale``  f32 ``[E_local]``  fc1 per-expert residual scale (x 64, SGLang's parameter)
  ``w2_humming_residual_scale``   f32 ``[E_local]``  fc2 per-expert residual scale (x 64)

which the kernel takes with an fp32 scalar FC2 activation scale of 1 (SGLang's ``humming_fc2_act_scale``) as
``quant_scales = [w13 scales as int32, w13 residual, fc2 act scale, w2 scales as int32, w2 residual]`` and
``use_wfp4afp8_humming=True``, SGLang's call.

The activation comes from the manifest's ``activation`` record (see :func:`swiglu_parameters`) and
is passed as per-expert fp32 ``swiglu_alpha/beta/limit [E_local]``, which selects FlashInfer's
``SwigluBias``: ``min(g, L) * sigmoid(alpha * min(g, L)) * (clamp(u, -L, L) + beta)``.

Expert parallelism: rank ``r`` of ``n`` holds the contiguous experts ``[r*E/n, (r+1)*E/n)`` and is
called with global expert ids (FlashInfer's ``ep_size``/``ep_rank``); tokens routed to other
ranks' experts contribute nothing to this rank's output, so the ranks' outputs sum to the whole.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from moebake.errors import InvalidArgumentError, ManifestError, PlatformError, UnsupportedError
from moebake.loading.staged_reader import LoadStats
from moebake.schema.manifest import Activation, LayerRecord
from moebake.schema.targets import SM90_CUTLASS, SM90_CUTLASS_W4A8, TargetSpec
from moebake.serve.baked_checkpoint import BakedCheckpoint
from moebake.serve.cuda_graph import capture
from moebake.serve.flashinfer_ops import sm90_moe_ops
from moebake.serve.platform import require_flashinfer_layout, require_gpu

if TYPE_CHECKING:
    from moebake.schema.manifest import Manifest
    from moebake.serve.platform import Platform

BIAS_TENSORS = SM90_CUTLASS.optional_tensors  # w13/w2 biases: both or neither (both targets)
HUMMING_RESIDUALS = tuple(n for n in SM90_CUTLASS_W4A8.required_tensors if n not in SM90_CUTLASS.required_tensors)
"""The tensors only an ``sm90-cutlass-w4a8`` bake holds: ``w13_humming_residual_scale``, ``w2_humming_residual_scale``."""


# Activation kinds this runtime runs, with the parameters a manifest record may leave out.
SWIGLU_DEFAULTS = {"swiglu_oai": {}, "swiglu": {"alpha": 1.0, "beta": 0.0, "limit": math.inf}}


def swiglu_parameters(activation: Activation, where: str | os.PathLike) -> tuple[float, float, float]:
    """``(alpha, beta, limit)`` of a manifest ``activation`` record; MoebakeError for other kinds.

    ``swiglu_oai`` (GPT-OSS) must give all three; ``swiglu`` (e.g. DeepSeek-V4) is
    ``silu(min(gate, L)) * clamp(up, -L, L)``: alpha defaults to 1, beta to 0, a missing or null
    ``limit`` to infinity.
    """
    kind = activation.kind
    if kind not in SWIGLU_DEFAULTS:
        raise UnsupportedError(
            f"{where}: activation kind {str(kind)!r} is not supported by the sm90-cutlass runtime ({', '.join(SWIGLU_DEFAULTS)})"
        )
    given = {"alpha": activation.alpha, "beta": activation.beta, "limit": activation.limit}
    values = {**SWIGLU_DEFAULTS[kind], **{key: value for key, value in given.items() if value is not None}}
    try:
        return float(values["alpha"]), float(values["beta"]), float(values["limit"])
    except (KeyError, TypeError, ValueError):
        raise ManifestError(f"{where}: activation {kind} needs numeric alpha, beta and limit, got {activation.to_json()}") from None


class Sm90CutlassCheckpoint(BakedCheckpoint):
    """A baked ``sm90-cutlass`` checkpoint; :meth:`load_experts` gives runnable experts of one layer."""

    spec: TargetSpec = SM90_CUTLASS
    target = spec.name
    layout_version = spec.layout_version

    def __init__(self, root: Path, manifest: Manifest, platform: Platform):
        super().__init__(root, manifest, platform)
        self.flashinfer_layout = manifest.flashinfer_layout

    def check_platform(self, device: torch.device) -> None:
        """Refuse a FlashInfer reading another fp4 layout and, for CUDA devices, a GPU that is not SM90."""
        require_flashinfer_layout(self.flashinfer_layout, self.platform.installed_flashinfer_version(), self.manifest_path)
        if device.type == "cuda":
            require_gpu(self.platform.device_capability(device), device, self.target)

    def load_experts(
        self, layer: int, device: torch.device | str = "cuda", ep_rank: int = 0, ep_size: int = 1, verify: bool = False
    ) -> Sm90CutlassExperts:
        """Read layer ``layer``'s experts of EP rank ``ep_rank`` of ``ep_size`` onto ``device``.

        ``verify=True`` first checks the SHA-256 of the shards involved against the manifest
        (reading them whole). A CPU ``device`` gives inspectable tensors; ``forward`` needs CUDA.
        """
        device = torch.device(device)
        record = self.layer(layer)
        start, stop = self.rank_experts(record, ep_rank, ep_size)
        names = self._tensor_names(record)
        swiglu = swiglu_parameters(self.manifest.activation, self.manifest_path)
        self.check_platform(device)
        if verify:
            self.verify_files([record.prefix + n for n in names])
        tensors, stats = self.read_experts(record, names, start, stop, device)
        return Sm90CutlassExperts(
            tensors,
            hidden=record.hidden,
            hidden_padded=record.hidden_padded,
            swiglu=swiglu,
            ep_rank=ep_rank,
            ep_size=ep_size,
            load_stats=stats,
        )

    def _tensor_names(self, record: LayerRecord) -> list[str]:
        """The layer's baked tensor names, checked: the target's required ones, both biases or neither, nothing else."""
        required, present = self.spec.required_tensors, set(record.tensors)
        missing = [n for n in required if n not in present]
        unknown = sorted(present - set(required) - set(BIAS_TENSORS))
        biases = [n for n in BIAS_TENSORS if n in present]
        if missing or unknown or len(biases) == 1:
            raise UnsupportedError(
                f"{self.manifest_path}: layer {record.index} tensors {sorted(present)} do not fit the {self.target} "
                f"runtime (needs {', '.join(required)}, and both or neither of {', '.join(BIAS_TENSORS)})"
            )
        return [*required, *biases]


class Sm90CutlassW4A8Checkpoint(Sm90CutlassCheckpoint):
    """A baked ``sm90-cutlass-w4a8`` checkpoint: the same runtime on FlashInfer's Humming W4A8 path (its experts carry
    the two residual scales; see the module docstring)."""

    spec: TargetSpec = SM90_CUTLASS_W4A8
    target = spec.name
    layout_version = spec.layout_version


class Sm90CutlassExperts:
    """One layer's experts for one EP rank, on one device, with the ``cutlass_fused_moe`` call ready.

    Attributes: ``num_experts`` (global), ``num_local_experts``, ``first_expert``, ``hidden``,
    ``hidden_padded``, ``swiglu_alpha/beta/limit`` (fp32 ``[E_local]``), ``load_stats``, ``humming`` (the tensors
    are a ``sm90-cutlass-w4a8`` bake's: the kernel runs Humming W4A8).
    """

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        hidden: int,
        hidden_padded: int,
        swiglu: tuple[float, float, float],
        ep_rank: int,
        ep_size: int,
        load_stats: LoadStats,
    ):
        self._tensors = tensors
        weights = tensors["w13_weight"]
        self.device = weights.device
        self.num_local_experts = weights.shape[0]
        self.num_experts = self.num_local_experts * ep_size
        self.first_expert = ep_rank * self.num_local_experts
        self.hidden, self.hidden_padded = hidden, hidden_padded
        self.load_stats = load_stats
        self.swiglu_alpha, self.swiglu_beta, self.swiglu_limit = (
            torch.full((self.num_local_experts,), value, dtype=torch.float32, device=self.device) for value in swiglu
        )
        self.humming = all(name in tensors for name in HUMMING_RESIDUALS)
        w13_scales, w2_scales = tensors["w13_weight_scale"].view(torch.int32), tensors["w2_weight_scale"].view(torch.int32)
        if self.humming:
            fc2_act_scale = torch.ones((), dtype=torch.float32, device=self.device)
            quant_scales = [
                w13_scales,
                tensors["w13_humming_residual_scale"],
                fc2_act_scale,
                w2_scales,
                tensors["w2_humming_residual_scale"],
            ]
        else:
            quant_scales = [w13_scales, w2_scales]
        self._kernel_args = dict(
            fc1_expert_weights=weights,
            fc2_expert_weights=tensors["w2_weight"],
            output_dtype=torch.bfloat16,
            quant_scales=quant_scales,
            fc1_expert_biases=tensors.get("w13_weight_bias"),
            fc2_expert_biases=tensors.get("w2_weight_bias"),
            swiglu_alpha=self.swiglu_alpha,
            swiglu_beta=self.swiglu_beta,
            swiglu_limit=self.swiglu_limit,
            ep_size=ep_size,
            ep_rank=ep_rank,
            use_w4_group_scaling=True,
            **({"use_wfp4afp8_humming": True} if self.humming else {}),
        )

    def parameters(self) -> dict[str, torch.Tensor]:
        """The baked tensors under SGLang's parameter names (``w13_weight``, ...), for engines to install."""
        return dict(self._tensors)

    def forward(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """MoE output bf16 ``[T, H]`` for bf16 ``hidden_states [T, H]``, global expert ids ``topk_ids [T, k]``
        (any integer dtype) and fp32 routing weights ``topk_weights [T, k]`` (applied inside the kernel)."""
        self._check_inputs(hidden_states, topk_ids, topk_weights)
        x = F.pad(hidden_states, (0, self.hidden_padded - self.hidden)) if self.hidden_padded != self.hidden else hidden_states
        out = torch.empty(x.shape[0], self.hidden_padded, dtype=torch.bfloat16, device=self.device)
        # FlashInfer 0.7.2 returns [output] from this call (its docstring says a tensor): write into ``out``.
        sm90_moe_ops().cutlass_fused_moe(x, topk_ids.to(torch.int32), topk_weights, output=out, **self._kernel_args)
        return out[:, : self.hidden].contiguous() if self.hidden_padded != self.hidden else out

    __call__ = forward

    def decode_step(self, max_tokens: int, top_k: int) -> Sm90DecodeStep:
        """A decode step for up to ``max_tokens`` tokens routed to ``top_k`` experts each, with persistent buffers
        (no padding, cast or allocation per call) that can be captured in a CUDA graph."""
        return Sm90DecodeStep(self, max_tokens, top_k)

    def _check_inputs(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        problems = []
        if hidden_states.dtype != torch.bfloat16 or hidden_states.dim() != 2 or hidden_states.shape[1] != self.hidden:
            problems.append(f"hidden_states is {hidden_states.dtype} {list(hidden_states.shape)}, expected bfloat16 [T, {self.hidden}]")
        if topk_ids.dim() != 2 or topk_ids.shape[0] != hidden_states.shape[0] or topk_ids.is_floating_point():
            problems.append(f"topk_ids is {topk_ids.dtype} {list(topk_ids.shape)}, expected integer [T, k]")
        if topk_weights.dtype != torch.float32 or topk_weights.shape != topk_ids.shape:
            problems.append(f"topk_weights is {topk_weights.dtype} {list(topk_weights.shape)}, expected float32 {list(topk_ids.shape)}")
        inputs = (("hidden_states", hidden_states), ("topk_ids", topk_ids), ("topk_weights", topk_weights))
        wrong_device = [n for n, t in inputs if t.device != self.device]
        if wrong_device:
            problems.append(f"{', '.join(wrong_device)} not on {self.device}")
        if problems:
            raise InvalidArgumentError("forward: " + "; ".join(problems))
        if self.device.type != "cuda":
            raise PlatformError(f"experts were loaded to {self.device}; forward needs a CUDA device")


class Sm90DecodeStep:
    """One layer's MoE for decode: the caller writes into persistent buffers, :meth:`run` calls the kernel on them.

    Buffers, allocated once on the experts' device (``T_max = max_tokens``):

      ``hidden_padded``  bf16  ``[T_max, H_pad]``  columns ``H..H_pad`` stay zero; the caller writes ``[:T, :H]``
                                                   (:attr:`hidden` is that view of all ``T_max`` rows)
      ``topk_ids``       int32 ``[T_max, k]``      global expert ids
      ``topk_weights``   fp32  ``[T_max, k]``      routing weights (applied inside the kernel)
      ``output``         bf16  ``[T_max, H_pad]``  the kernel's output; :meth:`run` returns the view ``[:T, :H]``

    :meth:`run` passes views of the first ``tokens`` rows: nothing is padded, cast, trimmed or allocated by
    moebake per call. :meth:`capture` records one ``tokens``-sized call in a CUDA graph; :meth:`replay` re-runs
    it on whatever the buffers hold then.
    """

    def __init__(self, experts: Sm90CutlassExperts, max_tokens: int, top_k: int):
        if max_tokens < 1 or top_k < 1:
            raise InvalidArgumentError(f"decode_step: max_tokens and top_k must be at least 1, got {max_tokens} and {top_k}")
        self.experts, self.max_tokens, self.top_k = experts, max_tokens, top_k
        device = experts.device
        self.hidden_padded = torch.zeros(max_tokens, experts.hidden_padded, dtype=torch.bfloat16, device=device)
        self.hidden = self.hidden_padded[:, : experts.hidden]
        self.topk_ids = torch.zeros(max_tokens, top_k, dtype=torch.int32, device=device)
        self.topk_weights = torch.zeros(max_tokens, top_k, dtype=torch.float32, device=device)
        self.output = torch.empty(max_tokens, experts.hidden_padded, dtype=torch.bfloat16, device=device)
        self._graph, self._graph_tokens = None, 0

    def run(self, tokens: int) -> torch.Tensor:
        """The MoE output of the first ``tokens`` rows: bf16 view ``[tokens, H]`` of :attr:`output`."""
        if not 1 <= tokens <= self.max_tokens:
            raise InvalidArgumentError(f"decode_step: tokens must be in 1..{self.max_tokens}, got {tokens}")
        if self.experts.device.type != "cuda":
            raise PlatformError(f"experts were loaded to {self.experts.device}; the decode step needs a CUDA device")
        sm90_moe_ops().cutlass_fused_moe(
            self.hidden_padded[:tokens],
            self.topk_ids[:tokens],
            self.topk_weights[:tokens],
            output=self.output[:tokens],
            **self.experts._kernel_args,
        )
        return self.output[:tokens, : self.experts.hidden]

    def capture(self, tokens: int) -> torch.Tensor:
        """Record ``run(tokens)`` in a CUDA graph (after one eager warm-up call on a side stream, as CUDA graphs
        require); returns the output view the replays write."""
        with torch.cuda.device(self.experts.device):
            graph, view = capture(lambda: self.run(tokens))
        self._graph, self._graph_tokens = graph, tokens
        return view

    def replay(self) -> torch.Tensor:
        """Re-run the captured call on the buffers' current contents; the output view ``[tokens, H]``."""
        if self._graph is None:
            raise InvalidArgumentError("decode_step: nothing captured yet (call capture(tokens) first)")
        self._graph.replay()
        return self.output[: self._graph_tokens, : self.experts.hidden]
