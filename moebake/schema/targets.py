"""What each target is, as data: its name, layout version, sources, kernel, GPU, help text and tensor table.

The converter (:mod:`moebake.convert.targets`, which adds ``bake`` and ``restore``), the servers (which
serves what: :mod:`moebake.schema.serving`), ``inspect``, the CLI and the model card all read these specs; none of them
lists a target's tensor names again. :func:`register_spec` adds one (a target registered in the
converter registers its spec here too).

Shape formulas are Python integer expressions over one MoE layer's dims (:class:`LayerDims`):
``E`` experts, ``H``/``I`` hidden and expert intermediate sizes, ``H_pad``/``I_pad`` as baked.
"""

from dataclasses import KW_ONLY, dataclass

from moebake.errors import UnsupportedError
from moebake.schema.enums import DType, GateUpOrder, GpuFamily


@dataclass(frozen=True, kw_only=True)
class LayerDims:
    """One MoE layer's sizes as a layer record holds them (``*_padded``: as baked)."""

    experts: int
    hidden: int
    hidden_padded: int
    intermediate: int
    intermediate_padded: int

    def names(self) -> dict[str, int]:
        """The names shape formulas use."""
        return {"E": self.experts, "H": self.hidden, "H_pad": self.hidden_padded, "I": self.intermediate, "I_pad": self.intermediate_padded}


@dataclass(frozen=True)
class TensorSpec:
    """One baked tensor of a layer, stored as ``prefix + name``.

    ``dtype`` None: the source's dtype (weights kept in their container, e.g. U8 or I8).
    ``shape``: formula over :meth:`LayerDims.names`. ``gate_up_order``: the W13 row order written
    (None for tensors without gate/up halves). ``optional``: present only for sources that have it
    (biases) or models that need it (activation constants).
    """

    name: str
    dtype: DType | None
    shape: str
    _: KW_ONLY
    gate_up_order: GateUpOrder | None = None
    optional: bool = False
    v1_shape: str | None = None
    """The shape under FlashInfer layout ``v1`` where it differs (its older scale fold)."""

    def shape_for(self, dims: LayerDims, flashinfer_layout: str | None = None) -> tuple[int, ...]:
        formula = self.v1_shape if flashinfer_layout == "v1" and self.v1_shape else self.shape
        value = eval(formula, {"__builtins__": {}}, dims.names())  # noqa: S307 - a formula of this table
        return tuple(value) if isinstance(value, tuple) else (value,)


@dataclass(frozen=True, kw_only=True)
class TargetSpec:
    """A target: see the module docstring. ``kernel`` and ``arch`` are Markdown (code spans allowed);
    :attr:`description` made of them is the text the CLI (``moebake list``), ``inspect`` and model
    cards show; ``uses_flashinfer_layout``: ``--flashinfer-layout`` (the
    FlashInfer SM90 fp4 era) changes its bytes, so the manifest records it; ``gpus``: the GPU families its kernel runs on
    (every server refuses others). Which servers serve it: :mod:`moebake.schema.serving`."""

    name: str
    layout_version: int
    source_formats: tuple[str, ...]
    kernel: str
    arch: str
    tensors: tuple[TensorSpec, ...]
    uses_flashinfer_layout: bool = False
    gpus: tuple[GpuFamily, ...] = ()
    lossy: str | None = None
    """Why this target's bytes do not invert to the source (None: they do, exactly). A lossy target's
    ``restore`` refuses, and ``verify --source`` proves re-bake equality only (:mod:`moebake.convert.source_check`)."""

    @property
    def gpu_names(self) -> str:
        """``Hopper (SM90)``, or ``Hopper (SM90) or Blackwell (SM100)``: the GPUs a refusal names."""
        return " or ".join(gpu.label for gpu in self.gpus)

    @property
    def description(self) -> str:
        """``<kernel> on <arch>``: what ``inspect``, ``moebake list`` and model cards show."""
        return f"{self.kernel} on {self.arch}"

    def tensor(self, name: str) -> TensorSpec:
        return next(t for t in self.tensors if t.name == name)

    @property
    def required_tensors(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors if not t.optional)

    @property
    def optional_tensors(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors if t.optional)


TARGET_SPECS: dict[str, TargetSpec] = {}


def register_spec(spec: TargetSpec) -> TargetSpec:
    """Add ``spec`` to :data:`TARGET_SPECS` (replacing one of the same name: a re-imported module)."""
    TARGET_SPECS[spec.name] = spec
    return spec


def target_spec(name: str) -> TargetSpec:
    """The spec of target ``name``; UnsupportedError naming the known ones otherwise."""
    if name not in TARGET_SPECS:
        raise UnsupportedError(f"unknown target {name!r}; expected one of {', '.join(TARGET_SPECS)}")
    return TARGET_SPECS[name]


_W = GateUpOrder
_MXFP4_SOURCES = ("gpt-oss", "deepseek-v4")
_NVFP4_SCALARS = (
    TensorSpec("w13_weight_scale_2", DType.F32, "E, 2", gate_up_order=_W.GATE_UP),
    TensorSpec("w2_weight_scale_2", DType.F32, "E"),
    TensorSpec("w13_input_scale", DType.F32, "E, 2", gate_up_order=_W.GATE_UP),
    TensorSpec("w2_input_scale", DType.F32, "E"),
)


def _nvfp4_weights(order: GateUpOrder) -> tuple[TensorSpec, ...]:
    return (
        TensorSpec("w13_weight", DType.U8, "E, 2 * I_pad, H_pad // 2", gate_up_order=order),
        TensorSpec("w13_weight_scale", DType.F8_E4M3, "E, 2 * I_pad, H_pad // 16", gate_up_order=order),
        TensorSpec("w2_weight", DType.U8, "E, H_pad, I_pad // 2"),
        TensorSpec("w2_weight_scale", DType.F8_E4M3, "E, H_pad, I_pad // 16"),
    )


_SM90_W13 = (
    TensorSpec("w13_weight", DType.U8, "E, 2 * I_pad, H_pad // 2", gate_up_order=_W.UP_GATE),
    TensorSpec(
        "w13_weight_scale",
        DType.U8,
        "E, 2 * I_pad // 64, H_pad // 128, 16, 16",
        gate_up_order=_W.UP_GATE,
        v1_shape="E, H_pad // 128, 8 * I_pad",
    ),
    TensorSpec("w13_weight_bias", DType.BF16, "E, 2 * I_pad", gate_up_order=_W.UP_GATE, optional=True),
)
_SM90_W2 = (
    TensorSpec("w2_weight", DType.U8, "E, H_pad, I_pad // 2"),
    TensorSpec("w2_weight_scale", DType.U8, "E, H_pad // 64, I_pad // 128, 16, 16", v1_shape="E, I_pad // 128, 4 * H_pad"),
    TensorSpec("w2_weight_bias", DType.BF16, "E, H_pad", optional=True),
)
"""FlashInfer's SM90 mixed-input operands: interleaved MXFP4 weights, interleaved E8M0 scales, BF16 biases (the same
shapes for W4A16 and Humming W4A8; the bytes differ)."""

SM90_CUTLASS = register_spec(
    TargetSpec(
        name="sm90-cutlass",
        layout_version=1,
        source_formats=_MXFP4_SOURCES,
        kernel="FlashInfer `cutlass_fused_moe` W4A16 (BF16 x MXFP4)",
        arch="Hopper (SM90)",
        tensors=(*_SM90_W13, *_SM90_W2),
        uses_flashinfer_layout=True,
        gpus=(GpuFamily.SM90,),
    )
)

SM90_CUTLASS_W4A8 = register_spec(
    TargetSpec(
        name="sm90-cutlass-w4a8",
        layout_version=1,
        source_formats=_MXFP4_SOURCES,
        kernel="FlashInfer `cutlass_fused_moe` Humming W4A8 (FP8 x MXFP4, `--flashinfer-mxfp4-moe-precision fp8`)",
        arch="Hopper (SM90)",
        tensors=(
            *_SM90_W13,
            TensorSpec("w13_humming_residual_scale", DType.F32, "E"),
            *_SM90_W2,
            TensorSpec("w2_humming_residual_scale", DType.F32, "E"),
        ),
        gpus=(GpuFamily.SM90,),
        lossy=(
            "FlashInfer's Humming preprocess clamps each expert's E8M0 scales to a range of 11 and rewrites the FP4 "
            "codes of clamped groups (and -0 to 0), so the source's bytes cannot be recovered"
        ),
    )
)

CUTEDSL = register_spec(
    TargetSpec(
        name="cutedsl",
        layout_version=2,
        source_formats=("modelopt-nvfp4",),
        kernel="FlashInfer CuteDSL NVFP4 MoE (`CuteDslMoEWrapper`)",
        arch="Blackwell (SM100/SM103)",
        tensors=(
            *_nvfp4_weights(_W.UP_GATE_INTERLEAVED_64),
            *_NVFP4_SCALARS,
            TensorSpec("w1_alpha", DType.F32, "E"),
            TensorSpec("w2_alpha", DType.F32, "E"),
            TensorSpec("fc2_input_scale", DType.F32, "1"),
            TensorSpec("w13_input_scale_quant", DType.F32, "E"),
            TensorSpec("g1_alphas_up", DType.F32, "E"),
        ),
        gpus=(GpuFamily.SM100,),
    )
)

CUTEDSL_DEEPEP = register_spec(
    TargetSpec(
        name="cutedsl-deepep",
        layout_version=2,
        source_formats=("modelopt-nvfp4",),
        kernel="FlashInfer CuteDSL masked grouped GEMM behind DeepEP low-latency",
        arch="Blackwell (SM100/SM103)",
        tensors=(
            *_nvfp4_weights(_W.GATE_UP),
            *_NVFP4_SCALARS,
            TensorSpec("g1_alphas", DType.F32, "E"),
            TensorSpec("g1_alphas_up", DType.F32, "E"),
            TensorSpec("g2_alphas", DType.F32, "E"),
            TensorSpec("w13_input_scale_quant", DType.F32, "E"),
            TensorSpec("w2_input_scale_quant", DType.F32, "E"),
        ),
        gpus=(GpuFamily.SM100,),
    )
)

DEEPEP_BF16 = register_spec(
    TargetSpec(
        name="deepep-bf16",
        layout_version=1,
        source_formats=("bf16-moe",),
        kernel="DeepGEMM `m_grouped_bf16_gemm_nt_masked` behind DeepEP low-latency BF16 dispatch",
        arch="Hopper (SM90)",
        tensors=(
            TensorSpec("w13_weight", DType.BF16, "E, 2 * I, H", gate_up_order=_W.GATE_UP),
            TensorSpec("w2_weight", DType.BF16, "E, H, I"),
        ),
        gpus=(GpuFamily.SM90, GpuFamily.SM100),
    )
)

SM100_TRTLLM = register_spec(
    TargetSpec(
        name="sm100-trtllm",
        layout_version=1,
        source_formats=_MXFP4_SOURCES,
        kernel="FlashInfer `trtllm_fp4_block_scale_moe` (trtllm-gen, MXFP4 weights)",
        arch="Blackwell (SM100)",
        tensors=(
            TensorSpec("w13_weight", None, "E, 2 * I_pad, H_pad // 2", gate_up_order=_W.UP_GATE_PAIRS),
            TensorSpec("w13_weight_scale", DType.F8_E4M3, "E, 2 * I_pad, H_pad // 32", gate_up_order=_W.UP_GATE_PAIRS),
            TensorSpec("w13_weight_bias", DType.F32, "E, 2 * I_pad", gate_up_order=_W.UP_GATE_PAIRS, optional=True),
            TensorSpec("w2_weight", None, "E, H_pad, I_pad // 2"),
            TensorSpec("w2_weight_scale", DType.F8_E4M3, "E, H_pad, I_pad // 32"),
            TensorSpec("w2_weight_bias", DType.F32, "E, H_pad", optional=True),
            TensorSpec("gemm1_alpha", DType.F32, "E", optional=True),
            TensorSpec("gemm1_beta", DType.F32, "E", optional=True),
            TensorSpec("gemm1_clamp_limit", DType.F32, "E", optional=True),
        ),
        gpus=(GpuFamily.SM100,),
    )
)

SM90_MARLIN = register_spec(
    TargetSpec(
        name="sm90-marlin",
        layout_version=1,
        source_formats=_MXFP4_SOURCES,
        kernel="Marlin W4A16 MoE (`gptq_marlin_repack` layout, BF16 x MXFP4)",
        arch="Hopper (SM90)",
        tensors=(
            TensorSpec("w13_weight", DType.I32, "E, H_pad // 16, 4 * I_pad", gate_up_order=_W.GATE_UP),
            TensorSpec("w13_weight_scale", DType.F8_E8M0, "E, H_pad // 32, 2 * I_pad", gate_up_order=_W.GATE_UP),
            TensorSpec("w13_weight_bias", DType.BF16, "E, 2 * I_pad", gate_up_order=_W.GATE_UP, optional=True),
            TensorSpec("w2_weight", DType.I32, "E, I_pad // 16, 2 * H_pad"),
            TensorSpec("w2_weight_scale", DType.F8_E8M0, "E, I_pad // 32, H_pad"),
            TensorSpec("w2_weight_bias", DType.BF16, "E, H_pad", optional=True),
        ),
        gpus=(GpuFamily.SM90,),
    )
)
