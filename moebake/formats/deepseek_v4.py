"""Source format ``deepseek-v4``: DeepSeek-V4 checkpoints (DeepSeek-native names, MXFP4 routed experts).

Detected by ``config.json``: ``model_type == "deepseek_v4"``. The top-level ``expert_dtype`` must
be ``"fp4"`` (vLLM reads a missing one as ``"fp4"``; ``"fp8"``, FP8 block experts as in
V4-Flash-Base, is refused). Routed experts live under ``layers.L.ffn.experts.`` and, for the
multi-token-prediction layers, ``mtp.J.ffn.experts.``; per expert ``e``, with ``H = hidden_size``
and ``I = moe_intermediate_size``:

  ``e.w1.weight``  I8       ``[I, H/2]``   gate, packed E2M1 (low nibble = even element)
  ``e.w1.scale``   F8_E8M0  ``[I, H/32]``  one E8M0 exponent per 32 elements of a row
  ``e.w3.weight``, ``e.w3.scale``          up, same shapes
  ``e.w2.weight``  I8 ``[H, I/2]``, ``e.w2.scale`` F8_E8M0 ``[H, I/32]``   down

Weights are also accepted as U8 and scales as U8 (the same bytes). Scale bytes are kept raw: a
checkpoint whose E8M0 scales were cast to a float type elsewhere (F32/BF16/F16 holding ``2**k``)
is refused, since that is not DeepSeek's on-disk format and its bytes are not E8M0 bytes.
No expert biases. Activation (DeepSeek's ``Expert.forward``): ``silu(min(gate, L)) *
clamp(up, -L, L)`` with ``L = swiglu_limit``, no clamping when it is absent or <= 0.
Shared experts (FP8), the router (``ffn.gate.*``), attention, norms, embeddings and every other
tensor pass through.
"""

import re
from dataclasses import dataclass
from typing import Any

from moebake.errors import CheckpointError
from moebake.formats.checkpoint import EXPERT_INDEX, SourceCheckpoint, first_missing_expert, per_expert_names
from moebake.formats.expert_source import ExpertSource
from moebake.formats.source_model import StoredExperts
from moebake.schema.enums import ActivationKind
from moebake.schema.manifest import Activation

FORMAT_NAME = "deepseek-v4"
WEIGHT_DTYPES = ("I8", "U8")
SCALE_DTYPES = ("F8_E8M0", "U8")
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
_EXPERT_RE = re.compile(r"^((?:layers|mtp)\.(\d+)\.ffn\.experts\.)(\d+)\.(w[123])\.(weight|scale)$")


@dataclass(frozen=True)
class DeepseekV4Layer:
    """One MoE layer's routed experts: ``prefix + "<e>.w1.weight"`` etc."""

    index: int
    prefix: str  # "layers.L.ffn.experts." or "mtp.J.ffn.experts."

    def pattern(self, projection: str, part: str) -> str:
        """Per-expert name pattern, e.g. ``layers.3.ffn.experts.*.w1.weight``."""
        return f"{self.prefix}{EXPERT_INDEX}.{projection}.{part}"


@dataclass(frozen=True)
class DeepseekV4Model(StoredExperts):
    """A validated DeepSeek-V4 source with MXFP4 routed experts."""

    checkpoint: SourceCheckpoint
    hidden_size: int
    intermediate_size: int
    num_experts: int
    swiglu_limit: float | None
    layers: tuple[DeepseekV4Layer, ...]

    format_name = FORMAT_NAME
    expert_quantization = "MXFP4 routed experts (expert_dtype fp4: E2M1 + E8M0 scales per 32); FP8 shared experts pass through"
    padding_allowed = False  # SGLang's DeepSeek-V4 MXFP4 methods assert H % 128 == I % 128 == 0

    def expert_sources(self, layer: DeepseekV4Layer) -> dict[str, ExpertSource]:
        """Canonical expert tensors of ``layer`` (see :mod:`moebake.formats.expert_source`)."""
        H, I = self.hidden_size, self.intermediate_size
        entry = self.checkpoint.entry

        def source(projections: tuple[str, ...], part: str, shape: tuple[int, ...]):
            names = tuple(layer.pattern(p, part) for p in projections)
            dtype = entry(names[0].replace(EXPERT_INDEX, "0")).dtype
            return ExpertSource(names, "separate" if len(names) == 2 else None, shape, shape, dtype)

        return {
            "w13_weight": source(("w1", "w3"), "weight", (I, H // 2)),
            "w13_scale": source(("w1", "w3"), "scale", (I, H // 32)),
            "w2_weight": source(("w2",), "weight", (H, I // 2)),
            "w2_scale": source(("w2",), "scale", (H, I // 32)),
        }

    def activation(self) -> Activation:
        """Plain SwiGLU with clamping: ``g * sigmoid(alpha * g) * (clamp(up, -limit, limit) + beta)``, ``g = min(gate, limit)``."""
        return Activation(kind=ActivationKind.SWIGLU, alpha=1.0, beta=0.0, limit=self.swiglu_limit)


def detect(checkpoint: SourceCheckpoint) -> bool:
    return checkpoint.values.raw("model_type") == "deepseek_v4"


def _config(checkpoint: SourceCheckpoint) -> dict:
    """Dimensions and the activation limit from config.json (``swiglu_limit``: absent, null or <= 0 is
    no clamping, as DeepSeek's ``if swiglu_limit > 0``; NaN and infinities are refused)."""
    config = checkpoint.values
    expert_dtype = config.string("expert_dtype", "fp4")
    if expert_dtype != "fp4":
        raise config.fail("expert_dtype", f'is {expert_dtype!r}: only MXFP4 routed experts ("fp4") are supported')
    dims: dict[str, Any] = {key: config.integer(key) for key in ("hidden_size", "moe_intermediate_size", "n_routed_experts")}
    for key in ("hidden_size", "moe_intermediate_size"):
        if dims[key] % 32:
            raise config.fail(key, f"is {dims[key]}, not a multiple of the MXFP4 block (32)")
    limit = None if config.raw("swiglu_limit") is None else config.number("swiglu_limit")
    dims["swiglu_limit"] = limit if limit is not None and limit > 0 else None
    return dims


def _check_tensor(checkpoint: SourceCheckpoint, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> str:
    """The dtype of tensor ``name``, after checking it is one of ``dtypes`` with ``shape``."""
    if name not in checkpoint.locations:
        raise CheckpointError(f"{checkpoint.root}: tensor {name} is missing")
    entry, path = checkpoint.entry(name), checkpoint.file_of(name).path
    if name.endswith(".scale") and entry.dtype in FLOAT_DTYPES:
        raise CheckpointError(
            f"{path}: tensor {name} is {entry.dtype}: its E8M0 scales were cast to a float type elsewhere; "
            f"moebake needs the raw F8_E8M0 bytes as DeepSeek ships them (use the original checkpoint files)"
        )
    if entry.dtype not in dtypes or entry.shape != shape:
        raise CheckpointError(
            f"{path}: tensor {name} is {entry.dtype} {list(entry.shape)}, expected {' or '.join(dtypes)} {list(shape)} from config.json"
        )
    return entry.dtype


def open_model(checkpoint: SourceCheckpoint) -> DeepseekV4Model:
    """Validate the config and every routed-expert tensor's dtype/shape; raise MoebakeError on mismatch."""
    dims = _config(checkpoint)
    H, I, E = dims["hidden_size"], dims["moe_intermediate_size"], dims["n_routed_experts"]
    prefixes: dict[str, int] = {}
    experts: dict[str, set[int]] = {}
    for name in checkpoint.locations:
        match = _EXPERT_RE.match(name)
        if match:
            prefixes[match.group(1)] = int(match.group(2))
            experts.setdefault(match.group(1), set()).add(int(match.group(3)))
            if int(match.group(3)) >= E:
                raise CheckpointError(
                    f"{checkpoint.file_of(name).path}: tensor {name} names expert {match.group(3)}, "
                    f"but config.json has n_routed_experts={E}"
                )
    if not prefixes:
        raise CheckpointError(f"{checkpoint.root}: deepseek-v4 checkpoint has no layers.L.ffn.experts.E.w1.weight tensors")
    for prefix, present in experts.items():  # before any per-expert name list is made
        missing = first_missing_expert(present, E)
        if missing is not None:
            raise CheckpointError(
                f"{checkpoint.root}: tensor {prefix}{missing}.w1.weight is missing "
                f"(config.json has n_routed_experts={E}, the checkpoint holds experts of {len(present)})"
            )
    layers = tuple(DeepseekV4Layer(index, prefix) for prefix, index in sorted(prefixes.items(), key=_layer_order))
    shapes = {"w1": (I, H), "w3": (I, H), "w2": (H, I)}  # [out, in] in elements
    for layer in layers:
        for projection, (rows, k) in shapes.items():
            for part, dtypes, shape in (("weight", WEIGHT_DTYPES, (rows, k // 2)), ("scale", SCALE_DTYPES, (rows, k // 32))):
                first, *others = per_expert_names(layer.pattern(projection, part), E)
                dtype = _check_tensor(checkpoint, first, dtypes, shape)
                for name in others:  # all in expert 0's dtype: experts are read stacked
                    _check_tensor(checkpoint, name, (dtype,), shape)
    return DeepseekV4Model(checkpoint, H, I, E, dims["swiglu_limit"], layers)


def _layer_order(item: tuple[str, int]) -> tuple[bool, int]:
    """Main layers first, then MTP layers, each by index."""
    prefix, index = item
    return prefix.startswith("mtp."), index
