"""A pure-Python ``sgl_kernel.scalar_type`` for the SGLang oracle, where ``sgl_kernel`` is not installed.

SGLang 0.5.23's Marlin MoE GEMM takes ``b_q_type.id``, which its C++ ``ScalarType::from_id``
(``sglang/kernels/jit/include/sgl_kernel/scalar_type.hpp``) decodes into the weight type the kernel is
instantiated for. That header packs the fields in constructor order into an int64, least significant first:
``exponent`` (8 bits), ``mantissa`` (8), ``signed_`` (1), ``bias`` (32, two's complement), ``finite_values_only``
(1), ``nan_repr`` (8). This module computes the same ids and names the types SGLang's Python code uses
(all the header's named types); equality is on the
fields, as in the header. ``tests/test_engine_oracles.py`` checks the ids against vLLM's ``ScalarType``, an
independent implementation of the same encoding.
"""

from dataclasses import dataclass
from enum import IntEnum


class NanRepr(IntEnum):
    """How NaNs are represented (the header's ``ScalarType::NanRepr``)."""

    NONE = 0
    IEEE_754 = 1
    EXTD_RANGE_MAX_MIN = 2


_FIELD_BITS = (("exponent", 8), ("mantissa", 8), ("signed", 1), ("bias", 32), ("finite_values_only", 1), ("nan_repr", 8))


@dataclass(frozen=True)
class ScalarType:
    """``exponent`` and ``mantissa`` bits (for integers: 0 and the value bits without sign), ``signed``, ``bias``
    (stored = value + bias), ``finite_values_only``, ``nan_repr``."""

    exponent: int
    mantissa: int
    signed: bool
    bias: int
    finite_values_only: bool = False
    nan_repr: NanRepr = NanRepr.IEEE_754

    @property
    def id(self) -> int:
        """The header's ``ScalarType::id()``: the fields packed as described in the module docstring."""
        packed, offset = 0, 0
        for name, bits in _FIELD_BITS:
            packed |= (int(getattr(self, name)) & ((1 << bits) - 1)) << offset
            offset += bits
        return packed

    @property
    def size_bits(self) -> int:
        return self.exponent + self.mantissa + int(self.signed)

    @classmethod
    def int_(cls, size_bits: int, bias: int = 0) -> "ScalarType":
        return cls(0, size_bits - 1, True, bias)

    @classmethod
    def uint(cls, size_bits: int, bias: int = 0) -> "ScalarType":
        return cls(0, size_bits, False, bias)

    @classmethod
    def float_IEEE754(cls, exponent: int, mantissa: int) -> "ScalarType":  # noqa: N802 - the header's name
        return cls(exponent, mantissa, True, 0, False, NanRepr.IEEE_754)

    @classmethod
    def float_(cls, exponent: int, mantissa: int, finite_values_only: bool, nan_repr: NanRepr) -> "ScalarType":
        return cls(exponent, mantissa, True, 0, finite_values_only, nan_repr)


class scalar_types:  # noqa: N801 - sgl_kernel's name
    """The header's named types (``kS4`` ... ``kFE5M10``, fixed-width names), as ``sgl_kernel.scalar_type`` spells
    them."""

    int4 = ScalarType.int_(4)
    uint4 = ScalarType.uint(4)
    uint4b8 = ScalarType.uint(4, 8)
    int8 = ScalarType.int_(8)
    uint8 = ScalarType.uint(8)
    uint8b128 = ScalarType.uint(8, 128)
    float4_e2m1f = ScalarType.float_(2, 1, True, NanRepr.NONE)
    float6_e3m2f = ScalarType.float_(3, 2, True, NanRepr.NONE)
    float8_e4m3fn = ScalarType.float_(4, 3, True, NanRepr.EXTD_RANGE_MAX_MIN)
    float8_e8m0fnu = ScalarType(8, 0, False, 0, True, NanRepr.EXTD_RANGE_MAX_MIN)
    float8_e5m2 = ScalarType.float_IEEE754(5, 2)
    float16_e8m7 = ScalarType.float_IEEE754(8, 7)
    float16_e5m10 = ScalarType.float_IEEE754(5, 10)
