"""Source format ``bf16-moe``: unquantized BF16 SwiGLU MoE experts in Hugging Face form.

An MoE layer is any tensor prefix ``<...>layers.N.mlp.experts.`` (or ``block_sparse_moe.experts.``):
``model.layers.N``, ``model.language_model.layers.N`` (Qwen3.5), ``mtp.layers.N`` (multi-token
prediction / draft layers). With ``E`` experts, hidden ``H`` and intermediate ``I`` from
``config.json`` (or its ``text_config``), a layer stores its experts in one of two ways:

  fused (Qwen3.5 style):
    ``gate_up_proj``  BF16 ``[E, 2I, H]``  rows ``[gate_0..gate_{I-1}, up_0..up_{I-1}]`` (halves, not pairs)
    ``down_proj``     BF16 ``[E, H, I]``
  per expert (Qwen3 / DeepSeek / ModelOpt-export style, or Mixtral's ``w1``/``w3``/``w2``), ``e`` in ``[0, E)``:
    ``e.gate_proj.weight`` (``e.w1.weight``)  BF16 ``[I, H]``
    ``e.up_proj.weight``   (``e.w3.weight``)  BF16 ``[I, H]``
    ``e.down_proj.weight`` (``e.w2.weight``)  BF16 ``[H, I]``

All are ``[out, in]`` (``y = x @ W.T``); an expert computes ``down(silu(gate(x)) * up(x))``.

Layers whose expert weights are not BF16 are left alone when the checkpoint is quantized
(``quantization_config`` in config.json, or ModelOpt's ``hf_quant_config.json``): that is how the
BF16 MTP/draft layers of an NVFP4 checkpoint are picked up while its NVFP4 layers pass through.
In an unquantized checkpoint every expert weight must be BF16.
"""

import re
from dataclasses import dataclass

from moebake.errors import CheckpointError
from moebake.formats.checkpoint import EXPERT_INDEX, SourceCheckpoint, first_missing_expert, per_expert_names
from moebake.formats.source_model import StoredExperts
from moebake.schema.config_values import first_model_integer, model_scopes
from moebake.schema.enums import ActivationKind
from moebake.schema.manifest import Activation

FORMAT_NAME = "bf16-moe"
BF16 = "BF16"
QUANT_SIDECAR = "hf_quant_config.json"
SILU_ACTIVATIONS = ("silu", "swish")
# silu(gate) * up in the manifest's SwiGLU parametrisation (as modelopt-nvfp4 records it).
ACTIVATION = Activation(kind=ActivationKind.SWIGLU, alpha=1.0, beta=0.0, limit=None)

_LAYER = r"(?P<prefix>(?:[\w.]+\.)?layers\.(?P<index>\d+)\.(?:mlp|block_sparse_moe)\.experts\.)"
_FUSED_RE = re.compile(_LAYER + r"(?P<projection>gate_up_proj|down_proj)$")
_PER_EXPERT_RE = re.compile(_LAYER + r"(?P<expert>\d+)\.(?P<projection>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
# role -> (Hugging Face projection name, Mixtral projection name)
_PROJECTIONS = {"gate": ("gate_proj", "w1"), "up": ("up_proj", "w3"), "down": ("down_proj", "w2")}
_ROLE = {projection: role for role, names in _PROJECTIONS.items() for projection in names}

# config.json keys, first present wins (looked up in text_config first, then at the top level).
_DIM_KEYS = {
    "hidden": ("hidden_size",),
    "intermediate": ("moe_intermediate_size", "intermediate_size"),
    "experts": ("num_experts", "num_local_experts", "n_routed_experts"),
}


@dataclass(frozen=True)
class Bf16MoeLayer:
    """One MoE layer's BF16 expert weights, by source tensor name.

    ``gate_up``: ``(gate_up_proj,)`` for a fused layer, else the per-expert (gate, up) name patterns
    (:data:`EXPERT_INDEX` in place of the expert index); concatenating them along dim 1 gives
    ``[E, 2I, H]`` = ``[gate; up]`` either way. ``down``: the ``[E, H, I]`` tensor or pattern.
    """

    index: int
    prefix: str
    gate_up: tuple[str, ...]
    down: str

    @property
    def fused(self) -> bool:
        return len(self.gate_up) == 1


@dataclass(frozen=True)
class Bf16MoeModel(StoredExperts):
    """A validated BF16 MoE source: dimensions and the layers whose experts are BF16."""

    checkpoint: SourceCheckpoint
    hidden_size: int
    intermediate_size: int
    num_experts: int
    layers: tuple[Bf16MoeLayer, ...]

    format_name = FORMAT_NAME
    expert_quantization = "BF16 experts (unquantized)"
    padding_allowed = False  # deepep-bf16 stores SGLang's unpadded shapes; the runtime pads at load time

    def activation(self) -> Activation:
        return ACTIVATION


def _scan(checkpoint: SourceCheckpoint) -> dict[str, dict]:
    """Expert weight tensors by layer prefix: ``{prefix: {"index", "fused": {proj: name}, "per_expert": {role: {proj: {e: name}}}}}``."""
    layers: dict[str, dict] = {}
    for name in checkpoint.locations:
        match = _FUSED_RE.match(name) or _PER_EXPERT_RE.match(name)
        if not match:
            continue
        layer = layers.setdefault(match["prefix"], {"index": int(match["index"]), "fused": {}, "per_expert": {}})
        if "expert" in match.groupdict():
            role = layer["per_expert"].setdefault(_ROLE[match["projection"]], {})
            role.setdefault(match["projection"], {})[int(match["expert"])] = name
        else:
            layer["fused"][match["projection"]] = name
    return layers


def _names(found: dict) -> list[str]:
    by_role = found["per_expert"].values()
    return [*found["fused"].values(), *(n for role in by_role for proj in role.values() for n in proj.values())]


def detect(checkpoint: SourceCheckpoint) -> bool:
    """Any BF16 MoE expert weight (GPT-OSS excluded: its fused tensors are ``[E, H, 2I]`` pair-interleaved)."""
    if checkpoint.values.raw("model_type") == "gpt_oss":
        return False
    return any(checkpoint.entry(n).dtype == BF16 for found in _scan(checkpoint).values() for n in _names(found))


def _config_dims(checkpoint: SourceCheckpoint) -> dict[str, int]:
    config = checkpoint.values
    dims = {dim: first_model_integer(config, keys)[1] for dim, keys in _DIM_KEYS.items()}
    scope = next((s for s in model_scopes(config) if "hidden_act" in s), None)
    activation = "silu" if scope is None else scope.string("hidden_act")
    if scope is not None and activation not in SILU_ACTIVATIONS:
        raise scope.fail("hidden_act", f"is {activation!r}, not supported (bf16-moe experts are silu(gate) * up)")
    return dims


def _is_quantized(checkpoint: SourceCheckpoint) -> bool:
    quant = checkpoint.values.section("quantization_config")
    return (quant is not None and bool(quant.data)) or (checkpoint.root / QUANT_SIDECAR).is_file()


def _check(checkpoint: SourceCheckpoint, name: str, shape: tuple[int, ...]) -> None:
    if name not in checkpoint.locations:
        raise CheckpointError(f"{checkpoint.root}: tensor {name} is missing")
    entry = checkpoint.entry(name)
    if entry.dtype != BF16 or entry.shape != shape:
        raise CheckpointError(
            f"{checkpoint.file_of(name).path}: tensor {name} is {entry.dtype} {list(entry.shape)}, "
            f"expected {BF16} {list(shape)} from config.json"
        )


def _per_expert_pattern(
    checkpoint: SourceCheckpoint, prefix: str, role: str, projections: dict, E: int, shape: tuple[int, ...], naming: int
) -> str:
    """Validate one role's per-expert tensors (all of ``[0, E)``, one naming) and return its name pattern."""
    if not projections:
        raise CheckpointError(f"{checkpoint.root}: tensor {prefix}0.{_PROJECTIONS[role][naming]}.weight is missing")
    if len(projections) > 1:
        raise CheckpointError(f"{checkpoint.root}: layer {prefix} names its {role} experts both {' and '.join(sorted(projections))}")
    ((projection, experts),) = projections.items()
    beyond = sorted(e for e in experts if e >= E)
    if beyond:
        raise CheckpointError(
            f"{checkpoint.file_of(experts[beyond[0]]).path}: tensor {experts[beyond[0]]} has expert index {beyond[0]}, "
            f"but config.json says {E} experts"
        )
    missing = first_missing_expert(experts, E)  # before the E names are made
    if missing is not None:
        raise CheckpointError(
            f"{checkpoint.root}: tensor {prefix}{missing}.{projection}.weight is missing "
            f"(config.json says {E} experts, the checkpoint holds {len(experts)})"
        )
    pattern = f"{prefix}{EXPERT_INDEX}.{projection}.weight"
    for name in per_expert_names(pattern, E):
        _check(checkpoint, name, shape)
    return pattern


def _layer(checkpoint: SourceCheckpoint, prefix: str, found: dict, dims: dict) -> Bf16MoeLayer:
    E, H, I = dims["experts"], dims["hidden"], dims["intermediate"]
    if found["fused"] and found["per_expert"]:
        raise CheckpointError(
            f"{checkpoint.root}: layer {prefix} has both fused ({', '.join(found['fused'])}) and per-expert expert tensors"
        )
    if found["fused"]:
        gate_up, down = prefix + "gate_up_proj", prefix + "down_proj"
        _check(checkpoint, gate_up, (E, 2 * I, H))
        _check(checkpoint, down, (E, H, I))
        return Bf16MoeLayer(found["index"], prefix, (gate_up,), down)
    roles = found["per_expert"]
    naming = max(_PROJECTIONS[role].index(p) for role, projections in roles.items() for p in projections)
    shapes = {"gate": (I, H), "up": (I, H), "down": (H, I)}
    patterns = {
        role: _per_expert_pattern(checkpoint, prefix, role, roles.get(role, {}), E, shape, naming) for role, shape in shapes.items()
    }
    return Bf16MoeLayer(found["index"], prefix, (patterns["gate"], patterns["up"]), patterns["down"])


def open_model(checkpoint: SourceCheckpoint) -> Bf16MoeModel:
    """Validate config and every BF16 expert tensor's dtype/shape; raise MoebakeError on mismatch."""
    dims = _config_dims(checkpoint)
    quantized = _is_quantized(checkpoint)
    layers = []
    for prefix, found in _scan(checkpoint).items():
        names = sorted(_names(found))
        if not any(checkpoint.entry(n).dtype == BF16 for n in names):
            if quantized:
                continue  # a quantized layer: passes through untouched
            name = names[0]
            raise CheckpointError(f"{checkpoint.file_of(name).path}: tensor {name} is {checkpoint.entry(name).dtype}, expected {BF16}")
        layers.append(_layer(checkpoint, prefix, found, dims))
    if not layers:
        raise CheckpointError(f"{checkpoint.root}: no BF16 MoE expert tensors (<...>layers.N.mlp.experts.*)")
    layers.sort(key=lambda layer: (layer.prefix[: layer.prefix.rindex("layers.")], layer.index))
    return Bf16MoeModel(checkpoint, dims["hidden"], dims["intermediate"], dims["experts"], tuple(layers))
