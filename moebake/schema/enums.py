"""Named values the manifest, the converter and the runtime share (``str`` enums: they serialise as their value).

Two version vocabularies live here and must not be confused:

  * :class:`FlashInferLayout` -- the *era* of FlashInfer's SM90 W4A16 fp4 byte interleave
    (``v1``/``v2``, chosen with ``--flashinfer-layout``; FlashInfer releases alternate between them,
    see :mod:`moebake.schema.flashinfer_versions`). Recorded as ``flashinfer_layout.id``.
  * the *target layout version* -- an integer each target bumps when the bytes it writes change for
    the same options (``target_layout_version`` in the manifest; a runtime reads exactly one).
"""

import functools
from enum import Enum


class _Name(str, Enum):
    """A ``str`` enum that prints and formats as its value (as Python 3.11's ``StrEnum``)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class GateUpOrder(_Name):
    """How the gate and up halves of a W13 (fused gate/up) tensor are laid out along its rows.

    Target orders (``gate_up_order`` of a baked tensor) and source orders (``source_gate_up_order``)
    share this vocabulary; a tensor with no gate/up halves (W2, scalars) records None.
    """

    GATE_UP = "gate_up"  # rows [gate; up]
    UP_GATE = "up_gate"  # rows [up; gate]
    UP_GATE_PAIRS = "up_gate_pairs"  # rows up_0, gate_0, up_1, gate_1, ...
    UP_GATE_INTERLEAVED_64 = "up_gate_interleaved_64"  # [up; gate] interleaved in 64-row groups
    PAIRS = "pairs"  # one source tensor, rows gate_0, up_0, gate_1, ... (GPT-OSS)
    SEPARATE = "separate"  # one source tensor per half (gate, up)


class ActivationKind(_Name):
    """The expert activation ``act(gate) * up`` a manifest's ``activation`` record names."""

    SWIGLU = "swiglu"  # silu(min(gate, L)) * clamp(up, -L, L); alpha 1, beta 0, L optional
    SWIGLU_OAI = "swiglu_oai"  # GPT-OSS: min(g, L) * sigmoid(alpha * min(g, L)) * (clamp(u, -L, L) + beta)


class FlashInferLayout(_Name):
    """The SM90 fp4 interleave era of FlashInfer (not a target layout version; see the module docstring)."""

    V2 = "v2"
    V1 = "v1"


class GateUpGlobals(_Name):
    """NVFP4 experts whose gate and up global scales differ (``--gate-up-globals``; see
    :class:`~moebake.convert.options.ConvertOptions`): ``share`` one global, or ``keep`` both."""

    SHARE = "share"
    KEEP = "keep"


class GpuFamily(_Name):
    """A GPU generation a target's kernel runs on, by CUDA compute capability major."""

    SM90 = "sm90"
    SM100 = "sm100"

    @property
    def capability_major(self) -> int:
        return {GpuFamily.SM90: 9, GpuFamily.SM100: 10}[self]

    @property
    def label(self) -> str:
        return {GpuFamily.SM90: "Hopper (SM90)", GpuFamily.SM100: "Blackwell (SM100)"}[self]

    @classmethod
    def of_capability(cls, major: int) -> "GpuFamily | None":
        """The family of a device of compute capability ``major.x`` (None: a GPU no target runs on)."""
        return next((family for family in cls if family.capability_major == major), None)


class DType(_Name):
    """A safetensors dtype code, with its width and its torch and numpy element types.

    :attr:`torch` is None where this torch lacks the type, and :attr:`numpy` where numpy does
    (the float8/float4 codes: read those as raw bytes).
    """

    BOOL = "BOOL"
    U8 = "U8"
    I8 = "I8"
    F8_E5M2 = "F8_E5M2"
    F8_E4M3 = "F8_E4M3"
    F8_E8M0 = "F8_E8M0"
    F8_E4M3FNUZ = "F8_E4M3FNUZ"
    F8_E5M2FNUZ = "F8_E5M2FNUZ"
    F6_E2M3 = "F6_E2M3"
    F6_E3M2 = "F6_E3M2"
    I16 = "I16"
    U16 = "U16"
    F16 = "F16"
    BF16 = "BF16"
    I32 = "I32"
    U32 = "U32"
    F32 = "F32"
    F64 = "F64"
    I64 = "I64"
    U64 = "U64"
    C64 = "C64"
    F4 = "F4"

    @property
    def bits(self) -> int:
        """Bits per element (4 for ``F4``: two elements per byte, the even one in the low nibble; 6 for ``F6_*``)."""
        return _types()[self][0]

    @property
    def torch(self):
        """The ``torch.dtype`` (None where this torch has none); torch is imported on first use only."""
        return _types()[self][1]

    @property
    def numpy(self):
        """The ``numpy.dtype`` (None where numpy has none)."""
        return _types()[self][2]


@functools.cache
def _types() -> dict:
    """code -> (bits, torch dtype or None, numpy dtype or None); imports torch and numpy when first asked,
    so importing the schema (the CLI does) stays cheap."""
    import numpy as np
    import torch

    return {
        DType.BOOL: (8, torch.bool, np.dtype(np.bool_)),
        DType.U8: (8, torch.uint8, np.dtype(np.uint8)),
        DType.I8: (8, torch.int8, np.dtype(np.int8)),
        DType.F8_E5M2: (8, getattr(torch, "float8_e5m2", None), None),
        DType.F8_E4M3: (8, getattr(torch, "float8_e4m3fn", None), None),
        DType.F8_E8M0: (8, getattr(torch, "float8_e8m0fnu", None), None),
        DType.F8_E4M3FNUZ: (8, getattr(torch, "float8_e4m3fnuz", None), None),
        DType.F8_E5M2FNUZ: (8, getattr(torch, "float8_e5m2fnuz", None), None),
        DType.F6_E2M3: (6, None, None),
        DType.F6_E3M2: (6, None, None),
        DType.I16: (16, torch.int16, np.dtype(np.int16)),
        DType.U16: (16, getattr(torch, "uint16", None), np.dtype(np.uint16)),
        DType.F16: (16, torch.float16, np.dtype(np.float16)),
        DType.BF16: (16, torch.bfloat16, None),
        DType.I32: (32, torch.int32, np.dtype(np.int32)),
        DType.U32: (32, getattr(torch, "uint32", None), np.dtype(np.uint32)),
        DType.F32: (32, torch.float32, np.dtype(np.float32)),
        DType.F64: (64, torch.float64, np.dtype(np.float64)),
        DType.I64: (64, torch.int64, np.dtype(np.int64)),
        DType.U64: (64, getattr(torch, "uint64", None), np.dtype(np.uint64)),
        DType.C64: (64, torch.complex64, np.dtype(np.complex64)),
        DType.F4: (4, getattr(torch, "float4_e2m1fn_x2", None), None),
    }
