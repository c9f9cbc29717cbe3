"""Source format ``modelopt-nvfp4``: NVIDIA ModelOpt NVFP4 checkpoints (DeepSeek-R1-FP4, Qwen3-MoE NVFP4, ...).

Detected by ``config.json``'s ``quantization_config`` (``quant_method`` ``modelopt`` or
``modelopt_fp4``, or ``producer.name == "modelopt"``) or by a ``hf_quant_config.json`` sidecar from
producer ``modelopt``; ``config.json`` wins when both exist. The quantization is either

* ``quant_algo: NVFP4`` with ``group_size`` 16 (top level, or ``config_groups.*.weights``): every
  module is NVFP4 except those matching ``exclude_modules`` / ``ignore`` (fnmatch patterns, matched
  against the module and its ancestors); or
* ``quant_algo: MIXED_PRECISION`` (NVIDIA's current MoE releases: FP8 attention, NVFP4 experts) with
  ``quantized_layers: {module: {"quant_algo", "group_size"}}``: a module is quantized as its entry
  says (exact name, else an fnmatch pattern matching it or an ancestor) and not at all without one.
  Expert modules must be ``NVFP4`` (W4A4: static ``input_scale`` per linear) or ``W4A16_NVFP4``
  (weight-only: no ``input_scale``), group 16.

MoE layers made of unquantized (excluded) experts pass through untouched (e.g. a BF16 MTP layer);
a layer mixing quantized and unquantized experts, or experts of another algorithm (FP8), is refused.

Experts are per-expert 2-D linears. Per MoE layer (prefix ``....layers.N.mlp.experts.``), for each
expert ``e`` and projection ``p`` in ``gate``, ``up`` (``[I, H]``) and ``down`` (``[H, I]``),
``N x K`` being out x in:

  ``{prefix}{e}.{p}_proj.weight``          U8       ``[N, K/2]``   two E2M1 codes per byte, low nibble = even k
  ``{prefix}{e}.{p}_proj.weight_scale``    F8_E4M3  ``[N, K/16]``  block scales, linear (row-major) layout
  ``{prefix}{e}.{p}_proj.weight_scale_2``  F32      ``[]``         per-tensor global: w = e2m1 * scale * scale_2
  ``{prefix}{e}.{p}_proj.input_scale``     F32      ``[]``         static activation global scale (not in W4A16_NVFP4)

(a ``[1]`` shape for the two scalars is accepted too; each must be finite and > 0). ``H = hidden_size``, ``I =
moe_intermediate_size`` (else ``intermediate_size``), ``E = n_routed_experts`` / ``num_experts`` /
``num_local_experts``, read from ``config.json`` or its ``text_config``.

Targets read experts through :meth:`ModelOptNvfp4Model.consumed`, which by default gives each
expert one gate/up global scale (see :mod:`moebake.formats.nvfp4_gate_up`): the rescaled half's block
scales and both halves' ``weight_scale_2`` differ from the file there; every other tensor is the
file's bytes. With ``gate_up_globals = "keep"`` every tensor is the file's bytes (the engines' choice).
"""

import fnmatch
import math
import re
from dataclasses import dataclass, field

import torch

from moebake.errors import CheckpointError, InvalidArgumentError, UnsupportedError
from moebake.formats.checkpoint import CONFIG_NAME, EXPERT_INDEX, SourceCheckpoint, first_missing_expert
from moebake.formats.nvfp4_gate_up import RoundingBound, SharedGlobal, rescale_block_scales, rounding_bound, share_global
from moebake.schema.config_values import ConfigValues, first_model_integer
from moebake.schema.enums import ActivationKind
from moebake.schema.manifest import Activation

FORMAT_NAME = "modelopt-nvfp4"
SIDECAR_NAME = "hf_quant_config.json"
GROUP_SIZE = 16
PARTS = ("weight", "weight_scale", "weight_scale_2", "input_scale")
SCALAR_PARTS = ("weight_scale_2", "input_scale")
NVFP4, WEIGHT_ONLY_NVFP4, MIXED_PRECISION = "NVFP4", "W4A16_NVFP4", "MIXED_PRECISION"
EXPERT_ALGOS = (NVFP4, WEIGHT_ONLY_NVFP4)
_QUANT_METHODS = ("modelopt", "modelopt_fp4")
_EXPERT_RE = re.compile(
    r"^(?P<prefix>(?:.+\.)?layers\.(?P<layer>\d+)\.mlp\.experts\.)(?P<expert>\d+)\."
    r"(?P<proj>gate|up|down)_proj\.(?P<part>weight|weight_scale|weight_scale_2|input_scale)$"
)


@dataclass(frozen=True)
class ModuleQuant:
    """How one module is quantized: ModelOpt ``quant_algo`` and ``group_size`` (None if not given)."""

    algo: str
    group_size: int | None


@dataclass(frozen=True)
class QuantConfig:
    """The ModelOpt quantization settings that matter here, and the section of the file they came from.

    ``layers``: MIXED_PRECISION's ``quantized_layers`` (module name or fnmatch pattern -> its
    quantization), None for a single ``algo``.
    """

    section: ConfigValues
    algo: str
    group_size: int | None
    exclude: tuple[str, ...]
    layers: dict[str, ModuleQuant] | None = None

    @property
    def source(self) -> str:
        """Where the settings are, for messages: ``/ckpt/config.json quantization_config``."""
        return f"{self.section.file} {self.section.path}"

    def module(self, module: str) -> ModuleQuant | None:
        """How ``module`` is quantized (None: not at all)."""
        if is_excluded(module, self.exclude):
            return None
        if self.layers is None:
            return ModuleQuant(self.algo, self.group_size)
        if module in self.layers:
            return self.layers[module]
        return next((quant for pattern, quant in self.layers.items() if is_excluded(module, (pattern,))), None)


@dataclass(frozen=True)
class NvFp4Layer:
    """One quantized MoE layer: its index ``N`` and expert prefix (``...layers.N.mlp.experts.``)."""

    index: int
    prefix: str

    def name(self, expert: int | str, proj: str, part: str) -> str:
        """Tensor name of one expert's projection part (``expert`` may be the ``*`` of a per-expert pattern)."""
        return f"{self.prefix}{expert}.{proj}_proj.{part}"


@dataclass
class ModelOptNvfp4Model:
    """A validated ModelOpt NVFP4 source: dimensions, quantized MoE layers, excluded MoE layers.

    Not frozen: it holds one cache, ``_shared``, the gate/up globals made one per ``(layer prefix,
    expert)`` (:meth:`shared_global`), scoped to this model object, and ``gate_up_globals``, set by the
    target from the conversion's options (:meth:`use_gate_up_globals`): ``share`` or ``keep``.
    """

    checkpoint: SourceCheckpoint
    hidden_size: int
    intermediate_size: int
    num_experts: int
    scalar_shape: tuple[int, ...]
    quant: QuantConfig
    layers: tuple[NvFp4Layer, ...]
    excluded_layers: tuple[str, ...]
    expert_algo: str = NVFP4
    gate_up_globals: str = "share"
    _shared: dict = field(default_factory=dict, compare=False, repr=False)

    format_name = FORMAT_NAME
    padding_allowed = False  # the CuteDSL tiles need H % 128 == I % 64 == 0; NVFP4 is never padded here

    @property
    def weight_only(self) -> bool:
        """Experts are W4A16_NVFP4: no ``input_scale`` (activations stay 16-bit)."""
        return self.expert_algo == WEIGHT_ONLY_NVFP4

    @property
    def expert_quantization(self) -> str:
        """What the baked experts are, for ``inspect``."""
        kind = "weight-only, no input_scale" if self.weight_only else "W4A4, static input_scale"
        return f"{self.expert_algo} experts (ModelOpt, E2M1 + E4M3 block scales per {GROUP_SIZE}, {kind})"

    def expected_specs(self, layer: NvFp4Layer) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Expected (dtype, shape) of every expert tensor of ``layer``."""
        H, I = self.hidden_size, self.intermediate_size
        specs: dict[str, tuple[str, tuple[int, ...]]] = {}
        for expert in range(self.num_experts):
            for proj, (rows, cols) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                specs[layer.name(expert, proj, "weight")] = ("U8", (rows, cols // 2))
                specs[layer.name(expert, proj, "weight_scale")] = ("F8_E4M3", (rows, cols // GROUP_SIZE))
                for part in SCALAR_PARTS[:1] if self.weight_only else SCALAR_PARTS:
                    specs[layer.name(expert, proj, part)] = ("F32", self.scalar_shape)
        return specs

    def activation(self) -> Activation:
        """Plain SwiGLU, ``silu(gate) * up`` (FlashInfer's parametrisation: alpha 1, beta 0, no limit)."""
        return Activation(kind=ActivationKind.SWIGLU, alpha=1.0, beta=0.0, limit=None)

    def read(self, name: str) -> torch.Tensor:
        """Source tensor ``name`` as stored: U8 and F8_E4M3 as uint8 bytes, F32 as float32, its own shape.

        A global scale (``weight_scale_2``, ``input_scale``) must be finite and > 0: targets divide by
        them and multiply them into the kernels' alphas."""
        entry = self.checkpoint.entry(name)
        raw = self.checkpoint.file_of(name).read_bytes(entry)
        tensor = (raw.view(torch.float32) if entry.dtype == "F32" else raw).reshape(entry.shape)
        if name.rsplit(".", 1)[-1] in SCALAR_PARTS:
            value = float(tensor.reshape(-1)[0])
            if not (math.isfinite(value) and value > 0):
                raise CheckpointError(f"{self.checkpoint.file_of(name).path}: tensor {name} is {value}, expected a finite global scale > 0")
        return tensor

    def use_gate_up_globals(self, mode: str) -> None:
        """``share`` (one global per expert, the smaller half's block scales rescaled) or ``keep`` (the file's)."""
        if mode != self.gate_up_globals:
            self.gate_up_globals = mode
            self._shared.clear()

    def shared_global(self, layer: NvFp4Layer, expert: int) -> SharedGlobal:
        """The one gate/up global of ``expert`` (cached: a bake reads it for several tensors)."""
        key = (layer.prefix, expert)
        if key not in self._shared:
            gate, up = (float(self.read(layer.name(expert, proj, "weight_scale_2"))) for proj in ("gate", "up"))
            self._shared[key] = share_global(gate, up)
        return self._shared[key]

    def block_scales(self, layer: NvFp4Layer, expert: int, proj: str) -> torch.Tensor:
        """uint8 E4M3 block scales ``[N, K/16]`` of one projection, as baked (``share``: rescaled for the smaller gate/up global)."""
        name = layer.name(expert, proj, "weight_scale")
        scales = self.read(name)
        shared = self.shared_global(layer, expert) if proj != "down" and self.gate_up_globals == "share" else None
        if shared is None or shared.rescaled_half != proj:
            return scales
        try:
            return rescale_block_scales(scales, shared.scaled_global, shared.shared)
        except InvalidArgumentError as err:
            raise CheckpointError(f"{self.checkpoint.file_of(name).path}: tensor {name}: {err}") from None

    def consumed(self, layer: NvFp4Layer, expert: int, proj: str, part: str) -> torch.Tensor:
        """The tensor targets bake: the file's, except gate/up globals made one under ``share`` (module docstring)."""
        if part == "weight_scale":
            return self.block_scales(layer, expert, proj)
        if part == "weight_scale_2" and proj != "down" and self.gate_up_globals == "share":
            return torch.full(self.scalar_shape, self.shared_global(layer, expert).shared, dtype=torch.float32)
        return self.read(layer.name(expert, proj, part))

    def read_experts(self, pattern: str, start: int, stop: int) -> torch.Tensor:
        """Experts ``[start, stop)`` of a per-expert name pattern (``*`` = expert), stacked: what
        baked tensors must invert to (:meth:`consumed` for quantized layers, else the file's)."""
        match = _EXPERT_RE.match(pattern.replace(EXPERT_INDEX, "0"))
        layer = next((layer for layer in self.layers if match and layer.prefix == match["prefix"]), None)
        if layer is None or match is None:
            return self.checkpoint.read_experts(pattern, start, stop)
        return torch.stack([self.consumed(layer, e, match["proj"], match["part"]) for e in range(start, stop)])

    def reconciliation(self, layer: NvFp4Layer) -> dict:
        """How ``layer``'s gate/up globals are made one, from the globals alone (no block scale is read):
        ``rescaled_gate``/``rescaled_up`` expert ids, ``max_relative_change`` = 1 - the smallest ratio,
        and the :class:`~moebake.formats.nvfp4_gate_up.RoundingBound` fields over the rescaled experts;
        under ``keep`` none is rescaled and ``experts_kept_apart`` counts those whose globals differ."""
        rescaled: dict[str, list[int]] = {"gate": [], "up": []}
        smallest_ratio, bound, kept_apart = 1.0, RoundingBound(), 0
        for expert in range(self.num_experts):
            shared = self.shared_global(layer, expert)
            if shared.rescaled_half is not None and self.gate_up_globals == "keep":
                kept_apart += 1
            elif shared.rescaled_half is not None:
                rescaled[shared.rescaled_half].append(expert)
                smallest_ratio = min(smallest_ratio, shared.ratio)
                bound = bound.merge(rounding_bound(shared.scaled_global, shared.shared))
        report = {
            "experts_rescaled": len(rescaled["gate"]) + len(rescaled["up"]),
            "rescaled_gate": rescaled["gate"],
            "rescaled_up": rescaled["up"],
            "max_relative_change": 1.0 - smallest_ratio,
            **vars(bound),
        }
        return report | {"experts_kept_apart": kept_apart} if self.gate_up_globals == "keep" else report


def read_quant_config(checkpoint: SourceCheckpoint) -> QuantConfig | None:
    """ModelOpt settings from ``config.json``'s ``quantization_config`` or ``hf_quant_config.json``; None if neither is ModelOpt's."""
    inline = checkpoint.values.section("quantization_config")
    if inline is not None and (inline.raw("quant_method") in _QUANT_METHODS or _is_modelopt(inline)):
        group_sizes = [
            weights.integer("group_size", None)
            for group in inline.sections("config_groups").values()
            if (weights := group.section("weights")) is not None
        ]
        group_size = inline.integer("group_size", next((g for g in group_sizes if g is not None), None))
        exclude = inline.strings("exclude_modules" if "exclude_modules" in inline else "ignore")
        return _quant_config(inline, group_size, exclude)
    sidecar = checkpoint.read_json(SIDECAR_NAME)
    if sidecar is not None and _is_modelopt(sidecar):
        quant = sidecar.section("quantization") or ConfigValues({}, sidecar.file, "quantization")
        return _quant_config(quant, quant.integer("group_size", None), quant.strings("exclude_modules"))
    return None


def _quant_config(section: ConfigValues, group_size: int | None, exclude: tuple[str, ...]) -> QuantConfig:
    algo = section.string("quant_algo", "?")
    layers = None
    if algo.upper() == MIXED_PRECISION:
        layers = {
            module: ModuleQuant(entry.string("quant_algo", "?"), entry.integer("group_size", None))
            for module, entry in section.sections("quantized_layers").items()
        }
    return QuantConfig(section, algo, group_size, exclude, layers)


def _is_modelopt(section: ConfigValues) -> bool:
    producer = section.raw("producer")
    return isinstance(producer, dict) and producer.get("name") == "modelopt"


def is_excluded(module: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``module`` or one of its ancestors (``a``, ``a.b``, ...) matches an fnmatch pattern."""
    parts = module.split(".")
    ancestors = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(a, p) for p in patterns for a in ancestors)


def detect(checkpoint: SourceCheckpoint) -> bool:
    return read_quant_config(checkpoint) is not None


def _check_quant(quant: QuantConfig) -> None:
    if quant.layers is None and quant.algo.upper() not in EXPERT_ALGOS:
        raise quant.section.fail(
            "quant_algo",
            f"is {quant.algo!r}, not supported (moebake reads NVFP4 experts: "
            f"{', '.join(EXPERT_ALGOS)}, or {MIXED_PRECISION} with NVFP4 experts)",
        )


def _expert_algo(checkpoint: SourceCheckpoint, quant: QuantConfig, prefix: str, modules: dict[str, ModuleQuant]) -> str:
    """The one NVFP4 algorithm of a quantized MoE layer's expert modules; MoebakeError otherwise."""
    for module, module_quant in sorted(modules.items()):
        where = f"{quant.source}: MoE layer {prefix[:-1]} expert {module}"
        if module_quant.algo.upper() not in EXPERT_ALGOS:
            raise UnsupportedError(f"{where} is quantized {module_quant.algo!r}; moebake bakes NVFP4 experts ({', '.join(EXPERT_ALGOS)})")
        if module_quant.group_size != GROUP_SIZE:
            raise CheckpointError(f"{where}: NVFP4 group_size is {module_quant.group_size!r}, expected {GROUP_SIZE}")
    algos = {m.algo.upper() for m in modules.values()}
    if len(algos) > 1:
        raise UnsupportedError(f"{quant.source}: MoE layer {prefix[:-1]} mixes {' and '.join(sorted(algos))} experts")
    return algos.pop()


def _scan_layers(checkpoint: SourceCheckpoint, quant: QuantConfig) -> tuple[list[NvFp4Layer], list[str], str, dict[str, set[int]]]:
    """Quantized MoE layers, excluded (pass-through) MoE layer prefixes, the experts' algorithm and the
    expert indices present per quantized layer; MoebakeError on a mixed layer."""
    modules: dict[tuple[int, str], dict[str, ModuleQuant | None]] = {}
    experts: dict[str, set[int]] = {}
    for name in checkpoint.locations:
        match = _EXPERT_RE.match(name)
        if match:
            module = name[: -len(match["part"]) - 1]
            found = modules.setdefault((int(match["layer"]), match["prefix"]), {})
            if module not in found:
                found[module] = quant.module(module)
            experts.setdefault(match["prefix"], set()).add(int(match["expert"]))
    layers, excluded, algos = [], [], set()
    for (index, prefix), found in sorted(modules.items()):
        quantized = {module: q for module, q in found.items() if q is not None}
        if quantized and len(quantized) < len(found):
            raise UnsupportedError(
                f"{checkpoint.root}: MoE layer {prefix[:-1]} has both excluded and quantized experts "
                f"({quant.source}); moebake bakes whole layers"
            )
        if not quantized:
            excluded.append(prefix)
            continue
        algos.add(_expert_algo(checkpoint, quant, prefix, quantized))
        layers.append(NvFp4Layer(index, prefix))
    if len(algos) > 1:
        raise UnsupportedError(f"{quant.source}: MoE layers mix {' and '.join(sorted(algos))} experts")
    return layers, excluded, (algos.pop() if algos else NVFP4), experts


def open_model(checkpoint: SourceCheckpoint) -> ModelOptNvfp4Model:
    """Validate quantization settings, config and every expert tensor's dtype/shape; MoebakeError on mismatch."""
    quant = read_quant_config(checkpoint)
    if quant is None:
        raise UnsupportedError(
            f"{checkpoint.root}: config.json has no ModelOpt quantization_config and there is no "
            "hf_quant_config.json: not a modelopt-nvfp4 checkpoint"
        )
    _check_quant(quant)
    layers, excluded, expert_algo, present = _scan_layers(checkpoint, quant)
    if not layers:
        raise CheckpointError(f"{checkpoint.root}: ModelOpt checkpoint has no quantized ...layers.N.mlp.experts.E.* tensors")
    config = checkpoint.values
    dims = {}
    for dim, keys in (
        ("hidden", ("hidden_size",)),
        ("intermediate", ("moe_intermediate_size", "intermediate_size")),
        ("experts", ("n_routed_experts", "num_experts", "num_local_experts")),
    ):
        key, dims[dim] = first_model_integer(config, keys)
        if dim != "experts" and dims[dim] % GROUP_SIZE:
            raise CheckpointError(f"{checkpoint.root / CONFIG_NAME}: {key}={dims[dim]} is not a multiple of the NVFP4 block ({GROUP_SIZE})")
    hidden, intermediate, experts = dims["hidden"], dims["intermediate"], dims["experts"]
    for layer in layers:  # before any per-expert name is made
        missing = first_missing_expert(present[layer.prefix], experts)
        if missing is not None:
            name = layer.name(missing, "gate", "weight")
            raise CheckpointError(
                f"{checkpoint.root}: tensor {name} is missing ({CONFIG_NAME} says {experts} experts, "
                f"layer {layer.prefix[:-1]} holds {len(present[layer.prefix])})"
            )
    first_scalar = layers[0].name(0, "gate", "weight_scale_2")
    scalar_shape = (1,) if first_scalar in checkpoint.locations and checkpoint.entry(first_scalar).shape == (1,) else ()
    model = ModelOptNvfp4Model(checkpoint, hidden, intermediate, experts, scalar_shape, quant, tuple(layers), tuple(excluded), expert_algo)
    parts = [p for p in PARTS if not (model.weight_only and p == "input_scale")]
    for layer in model.layers:
        for name, (dtype, shape) in model.expected_specs(layer).items():
            if name not in checkpoint.locations:
                raise CheckpointError(
                    f"{checkpoint.root}: tensor {name} is missing (an {expert_algo} expert needs "
                    f"{', '.join(parts)} for each of gate/up/down_proj)"
                )
            entry = checkpoint.entry(name)
            if entry.dtype != dtype or entry.shape != shape:
                raise CheckpointError(
                    f"{checkpoint.file_of(name).path}: tensor {name} is {entry.dtype} {list(entry.shape)}, "
                    f"expected {dtype} {list(shape)} (ModelOpt NVFP4, group {GROUP_SIZE}, from {CONFIG_NAME})"
                )
    prefixes = {layer.prefix for layer in model.layers}
    beyond = next(
        (n for n in checkpoint.locations if (m := _EXPERT_RE.match(n)) and m["prefix"] in prefixes and int(m["expert"]) >= experts), None
    )
    if beyond:
        raise CheckpointError(f"{checkpoint.file_of(beyond).path}: tensor {beyond} names an expert beyond the {experts} in {CONFIG_NAME}")
    return model
