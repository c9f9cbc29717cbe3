"""Source format ``modelopt-nvfp4``: NVIDIA ModelOpt NVFP4 checkpoints (DeepSeek-R1-FP4, Qwen3-MoE NVFP4, ...).

Detected by ``config.json``'s ``quantization_config`` (``quant_method`` ``modelopt`` or
``modelopt_fp4``, or ``producer.name == "modelopt"``) or by a ``hf_quant_config.json`` sidecar from
producer ``modelopt``; ``config.json`` wins when both exist. The quantization must be
``quant_algo: NVFP4`` with ``group_size`` 16 (top level, or ``config_groups.*.weights``); modules
matching ``exclude_modules`` / ``ignore`` (fnmatch patterns, matched against the module and its
ancestors) are not quantized, and MoE layers made of them pass through untouched (e.g. a BF16 MTP
layer).

Experts are per-expert 2-D linears. Per MoE layer (prefix ``....layers.N.mlp.experts.``), for each
expert ``e`` and projection ``p`` in ``gate``, ``up`` (``[I, H]``) and ``down`` (``[H, I]``),
``N x K`` being out x in:

  ``{prefix}{e}.{p}_proj.weight``          U8       ``[N, K/2]``   two E2M1 codes per byte, low nibble = even k
  ``{prefix}{e}.{p}_proj.weight_scale``    F8_E4M3  ``[N, K/16]``  block scales, linear (row-major) layout
  ``{prefix}{e}.{p}_proj.weight_scale_2``  F32      ``[]``         per-tensor global: w = e2m1 * scale * scale_2
  ``{prefix}{e}.{p}_proj.input_scale``     F32      ``[]``         static activation global scale

(a ``[1]`` shape for the two scalars is accepted too). ``H = hidden_size``, ``I =
moe_intermediate_size`` (else ``intermediate_size``), ``E = n_routed_experts`` / ``num_experts`` /
``num_local_experts``, read from ``config.json`` or its ``text_config``.

Targets read experts through :meth:`ModelOptNvfp4Model.consumed`, which gives each expert one
gate/up global scale (see :mod:`moebake.formats.nvfp4_gate_up`): the rescaled half's block scales
and both halves' ``weight_scale_2`` differ from the file there; every other tensor is the file's bytes.
"""

import fnmatch
import re
from dataclasses import dataclass, field

import torch

from moebake.errors import MoebakeError
from moebake.formats.checkpoint import CONFIG_NAME, EXPERT_INDEX, SourceCheckpoint
from moebake.formats.nvfp4_gate_up import RoundingBound, SharedGlobal, rescale_block_scales, rounding_bound, share_global

FORMAT_NAME = "modelopt-nvfp4"
SIDECAR_NAME = "hf_quant_config.json"
GROUP_SIZE = 16
PARTS = ("weight", "weight_scale", "weight_scale_2", "input_scale")
SCALAR_PARTS = ("weight_scale_2", "input_scale")
_QUANT_METHODS = ("modelopt", "modelopt_fp4")
_EXPERT_RE = re.compile(
    r"^(?P<prefix>(?:.+\.)?layers\.(?P<layer>\d+)\.mlp\.experts\.)(?P<expert>\d+)\."
    r"(?P<proj>gate|up|down)_proj\.(?P<part>weight|weight_scale|weight_scale_2|input_scale)$"
)


@dataclass(frozen=True)
class QuantConfig:
    """The ModelOpt quantization settings that matter here, and the file they came from."""

    source: str
    algo: str
    group_size: int | None
    exclude: tuple[str, ...]


@dataclass(frozen=True)
class NvFp4Layer:
    """One quantized MoE layer: its index ``N`` and expert prefix (``...layers.N.mlp.experts.``)."""

    index: int
    prefix: str

    def name(self, expert: int | str, proj: str, part: str) -> str:
        """Tensor name of one expert's projection part (``expert`` may be the ``*`` of a per-expert pattern)."""
        return f"{self.prefix}{expert}.{proj}_proj.{part}"


@dataclass(frozen=True)
class ModelOptNvfp4Model:
    """A validated ModelOpt NVFP4 source: dimensions, quantized MoE layers, excluded MoE layers."""

    checkpoint: SourceCheckpoint
    hidden_size: int
    intermediate_size: int
    num_experts: int
    scalar_shape: tuple[int, ...]
    quant: QuantConfig
    layers: tuple[NvFp4Layer, ...]
    excluded_layers: tuple[str, ...]
    _shared: dict = field(default_factory=dict, compare=False, repr=False)

    format_name = FORMAT_NAME

    def expected_specs(self, layer: NvFp4Layer) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Expected (dtype, shape) of every expert tensor of ``layer``."""
        H, I = self.hidden_size, self.intermediate_size
        specs = {}
        for expert in range(self.num_experts):
            for proj, (rows, cols) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                specs[layer.name(expert, proj, "weight")] = ("U8", (rows, cols // 2))
                specs[layer.name(expert, proj, "weight_scale")] = ("F8_E4M3", (rows, cols // GROUP_SIZE))
                for part in SCALAR_PARTS:
                    specs[layer.name(expert, proj, part)] = ("F32", self.scalar_shape)
        return specs

    def activation(self) -> dict:
        """Plain SwiGLU, ``silu(gate) * up`` (FlashInfer's parametrisation: alpha 1, beta 0, no limit)."""
        return {"kind": "swiglu", "alpha": 1.0, "beta": 0.0, "limit": None}

    def read(self, name: str) -> torch.Tensor:
        """Source tensor ``name`` as stored: U8 and F8_E4M3 as uint8 bytes, F32 as float32, its own shape."""
        entry = self.checkpoint.entry(name)
        raw = self.checkpoint.file_of(name).read_bytes(entry)
        return (raw.view(torch.float32) if entry.dtype == "F32" else raw).reshape(entry.shape)

    def shared_global(self, layer: NvFp4Layer, expert: int) -> SharedGlobal:
        """The one gate/up global of ``expert`` (cached: a bake reads it for several tensors)."""
        key = (layer.prefix, expert)
        if key not in self._shared:
            gate, up = (float(self.read(layer.name(expert, proj, "weight_scale_2"))) for proj in ("gate", "up"))
            self._shared[key] = share_global(gate, up)
        return self._shared[key]

    def block_scales(self, layer: NvFp4Layer, expert: int, proj: str) -> torch.Tensor:
        """uint8 E4M3 block scales ``[N, K/16]`` of one projection, as baked (rescaled for the smaller gate/up global)."""
        name = layer.name(expert, proj, "weight_scale")
        scales = self.read(name)
        shared = self.shared_global(layer, expert) if proj != "down" else None
        if shared is None or shared.rescaled_half != proj:
            return scales
        try:
            return rescale_block_scales(scales, shared.scaled_global, shared.shared)
        except ValueError as err:
            raise MoebakeError(f"{self.checkpoint.file_of(name).path}: tensor {name}: {err}") from None

    def consumed(self, layer: NvFp4Layer, expert: int, proj: str, part: str) -> torch.Tensor:
        """The tensor targets bake: the file's, except gate/up globals made one (module docstring)."""
        if part == "weight_scale":
            return self.block_scales(layer, expert, proj)
        if part == "weight_scale_2" and proj != "down":
            return torch.full(self.scalar_shape, self.shared_global(layer, expert).shared, dtype=torch.float32)
        return self.read(layer.name(expert, proj, part))

    def read_experts(self, pattern: str, start: int, stop: int) -> torch.Tensor:
        """Experts ``[start, stop)`` of a per-expert name pattern (``*`` = expert), stacked: what
        baked tensors must invert to (:meth:`consumed` for quantized layers, else the file's)."""
        match = _EXPERT_RE.match(pattern.replace(EXPERT_INDEX, "0"))
        layer = next((layer for layer in self.layers if match and layer.prefix == match["prefix"]), None)
        if layer is None:
            return self.checkpoint.read_experts(pattern, start, stop)
        return torch.stack([self.consumed(layer, e, match["proj"], match["part"]) for e in range(start, stop)])

    def reconciliation(self, layer: NvFp4Layer) -> dict:
        """How ``layer``'s gate/up globals are made one, from the globals alone (no block scale is read):
        ``rescaled_gate``/``rescaled_up`` expert ids, ``max_relative_change`` = 1 - the smallest ratio,
        and the :class:`~moebake.formats.nvfp4_gate_up.RoundingBound` fields over the rescaled experts."""
        rescaled = {"gate": [], "up": []}
        smallest_ratio, bound = 1.0, RoundingBound()
        for expert in range(self.num_experts):
            shared = self.shared_global(layer, expert)
            if shared.rescaled_half is not None:
                rescaled[shared.rescaled_half].append(expert)
                smallest_ratio = min(smallest_ratio, shared.ratio)
                bound = bound.merge(rounding_bound(shared.scaled_global, shared.shared))
        return {"experts_rescaled": len(rescaled["gate"]) + len(rescaled["up"]), "rescaled_gate": rescaled["gate"],
                "rescaled_up": rescaled["up"], "max_relative_change": 1.0 - smallest_ratio, **vars(bound)}


def read_quant_config(checkpoint: SourceCheckpoint) -> QuantConfig | None:
    """ModelOpt settings from ``config.json``'s ``quantization_config`` or ``hf_quant_config.json``; None if neither is ModelOpt's."""
    inline = checkpoint.config.get("quantization_config")
    if isinstance(inline, dict) and (inline.get("quant_method") in _QUANT_METHODS or _is_modelopt(inline)):
        groups = [g.get("weights", {}).get("group_size") for g in (inline.get("config_groups") or {}).values()]
        group_size = inline.get("group_size", groups[0] if groups else None)
        exclude = inline.get("exclude_modules", inline.get("ignore")) or []
        return QuantConfig(f"{CONFIG_NAME} quantization_config", str(inline.get("quant_algo")), group_size, tuple(exclude))
    sidecar = checkpoint.read_json(SIDECAR_NAME)
    if sidecar is not None and _is_modelopt(sidecar):
        quant = sidecar.get("quantization") or {}
        return QuantConfig(SIDECAR_NAME, str(quant.get("quant_algo")), quant.get("group_size"),
                           tuple(quant.get("exclude_modules") or []))
    return None


def _is_modelopt(section: dict) -> bool:
    return (section.get("producer") or {}).get("name") == "modelopt"


def is_excluded(module: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``module`` or one of its ancestors (``a``, ``a.b``, ...) matches an fnmatch pattern."""
    parts = module.split(".")
    ancestors = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(a, p) for p in patterns for a in ancestors)


def detect(checkpoint: SourceCheckpoint) -> bool:
    return read_quant_config(checkpoint) is not None


def _dimension(checkpoint: SourceCheckpoint, keys: tuple[str, ...]) -> int:
    config = {**checkpoint.config, **(checkpoint.config.get("text_config") or {})}
    for key in keys:
        if key in config:
            if not isinstance(config[key], int) or config[key] <= 0:
                raise MoebakeError(f"{checkpoint.root / CONFIG_NAME}: {key}={config[key]!r} is not a positive integer")
            return config[key]
    raise MoebakeError(f"{checkpoint.root / CONFIG_NAME}: none of {', '.join(keys)} is set")


def _check_quant(checkpoint: SourceCheckpoint, quant: QuantConfig) -> None:
    where = checkpoint.root / quant.source.split()[0]
    if quant.algo.upper() != "NVFP4":
        raise MoebakeError(f"{where}: ModelOpt quant_algo {quant.algo!r} is not supported (moebake reads NVFP4)")
    if quant.group_size != GROUP_SIZE:
        raise MoebakeError(f"{where}: NVFP4 group_size is {quant.group_size!r}, expected {GROUP_SIZE}")


def _scan_layers(checkpoint: SourceCheckpoint, quant: QuantConfig) -> tuple[list[NvFp4Layer], list[str]]:
    """Quantized MoE layers and excluded (pass-through) MoE layer prefixes; MoebakeError on a mixed layer."""
    modules: dict[tuple[int, str], set[bool]] = {}
    for name in checkpoint.locations:
        match = _EXPERT_RE.match(name)
        if match:
            module = name[: -len(match["part"]) - 1]
            modules.setdefault((int(match["layer"]), match["prefix"]), set()).add(is_excluded(module, quant.exclude))
    layers, excluded = [], []
    for (index, prefix), flags in sorted(modules.items()):
        if flags == {True, False}:
            raise MoebakeError(f"{checkpoint.root}: MoE layer {prefix[:-1]} has both excluded and quantized experts "
                               f"({quant.source} exclude list); moebake bakes whole layers")
        if flags == {True}:
            excluded.append(prefix)
        else:
            layers.append(NvFp4Layer(index, prefix))
    return layers, excluded


def open_model(checkpoint: SourceCheckpoint) -> ModelOptNvfp4Model:
    """Validate quantization settings, config and every expert tensor's dtype/shape; MoebakeError on mismatch."""
    quant = read_quant_config(checkpoint)
    _check_quant(checkpoint, quant)
    layers, excluded = _scan_layers(checkpoint, quant)
    if not layers:
        raise MoebakeError(f"{checkpoint.root}: ModelOpt checkpoint has no quantized ...layers.N.mlp.experts.E.* tensors")
    hidden = _dimension(checkpoint, ("hidden_size",))
    intermediate = _dimension(checkpoint, ("moe_intermediate_size", "intermediate_size"))
    for key, size in (("hidden_size", hidden), ("moe_intermediate_size", intermediate)):
        if size % GROUP_SIZE:
            raise MoebakeError(f"{checkpoint.root / CONFIG_NAME}: {key}={size} is not a multiple of the NVFP4 block ({GROUP_SIZE})")
    experts = _dimension(checkpoint, ("n_routed_experts", "num_experts", "num_local_experts"))
    first_scalar = layers[0].name(0, "gate", "weight_scale_2")
    scalar_shape = (1,) if first_scalar in checkpoint.locations and checkpoint.entry(first_scalar).shape == (1,) else ()
    model = ModelOptNvfp4Model(checkpoint, hidden, intermediate, experts, scalar_shape, quant, tuple(layers), tuple(excluded))
    for layer in model.layers:
        for name, (dtype, shape) in model.expected_specs(layer).items():
            if name not in checkpoint.locations:
                raise MoebakeError(f"{checkpoint.root}: tensor {name} is missing (an NVFP4 expert needs "
                                   f"{', '.join(PARTS)} for each of gate/up/down_proj)")
            entry = checkpoint.entry(name)
            if entry.dtype != dtype or entry.shape != shape:
                raise MoebakeError(f"{checkpoint.file_of(name).path}: tensor {name} is {entry.dtype} {list(entry.shape)}, "
                                   f"expected {dtype} {list(shape)} (ModelOpt NVFP4, group {GROUP_SIZE}, from {CONFIG_NAME})")
    prefixes = {layer.prefix for layer in model.layers}
    beyond = next((n for n in checkpoint.locations if (m := _EXPERT_RE.match(n)) and m["prefix"] in prefixes
                   and int(m["expert"]) >= experts), None)
    if beyond:
        raise MoebakeError(f"{checkpoint.file_of(beyond).path}: tensor {beyond} names an expert beyond the {experts} in {CONFIG_NAME}")
    return model
