"""One global scale for an NVFP4 expert's gate and up halves (fused-W13 kernels take only one).

NVFP4 dequantizes as ``w = e2m1 * block_scale * weight_scale_2``: E4M3 block scales, one per 16
elements of a row, and an F32 per-tensor global ``weight_scale_2``. Fused-W13 kernels take one
global per expert (SGLang and vLLM pass the gate's and only warn), so an expert whose gate and up
globals differ would be dequantized wrongly in one half. Instead, the half with the smaller global
``s`` gets its block scales multiplied by ``s / S``, ``S`` being the larger global, which both
halves then share::

    block_scale' = round_to_e4m3(block_scale * s / S)

``s / S <= 1``, so no block scale can overflow E4M3 (max 448). The product is formed in float64
(exact up to one rounding at 2**-53) and rounded to the nearest E4M3 value, ties to even. It is
exact when ``s / S`` is a power of two and the product stays a normal E4M3 number; otherwise the
rounding is reported, from the ratios alone, as a bound over every value a block scale can hold
(:func:`rounding_bound`).
"""

from dataclasses import dataclass

import torch

from moebake.errors import InvalidArgumentError

E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0**-6
_POSITIVE_CODES = torch.arange(0x7F, dtype=torch.uint8)  # 0x00..0x7E: +0 and every positive finite E4M3
_POSITIVE_VALUES = _POSITIVE_CODES.view(torch.float8_e4m3fn).double()  # ascending with the code


def round_to_e4m3(values: torch.Tensor) -> torch.Tensor:
    """float64 values in ``[0, 448]`` -> uint8 E4M3 codes of the nearest value (ties to even code)."""
    if bool(((values < 0) | (values > E4M3_MAX) | values.isnan()).any()):
        raise InvalidArgumentError("values to round must lie in [0, 448]")
    upper = torch.searchsorted(_POSITIVE_VALUES, values).clamp(max=len(_POSITIVE_VALUES) - 1)
    lower = (upper - 1).clamp(min=0)
    below, above = values - _POSITIVE_VALUES[lower], _POSITIVE_VALUES[upper] - values
    take_upper = (above < below) | ((above == below) & (upper % 2 == 0))
    return torch.where(take_upper, upper, lower).to(torch.uint8)


@dataclass(frozen=True)
class SharedGlobal:
    """How one expert's gate/up globals are made one: ``shared`` (F32 bits as a float), and the half
    (``"gate"``/``"up"``, or None when they already agree) whose block scales are multiplied by
    ``scaled_global / shared``."""

    shared: float
    rescaled_half: str | None
    scaled_global: float

    @property
    def ratio(self) -> float:
        return self.scaled_global / self.shared


def share_global(gate_global: float, up_global: float) -> SharedGlobal:
    """The larger of the two F32 globals is kept; the other half is rescaled down to it."""
    if gate_global == up_global:
        return SharedGlobal(gate_global, None, gate_global)
    if gate_global > up_global:
        return SharedGlobal(gate_global, "up", up_global)
    return SharedGlobal(up_global, "gate", gate_global)


def rescale_block_scales(scales: torch.Tensor, scaled_global: float, shared: float) -> torch.Tensor:
    """E4M3 block-scale bytes (uint8, any shape) -> bytes of ``scales * scaled_global / shared``, rounded.

    Raises InvalidArgumentError if a scale is negative or NaN (not a valid NVFP4 block scale) or the ratio is not in (0, 1].
    """
    if not 0 < scaled_global <= shared:
        raise InvalidArgumentError(f"rescale ratio {scaled_global}/{shared} is not in (0, 1]")
    if bool((scales >= 0x7F).any()):
        raise InvalidArgumentError("block scales must be positive-signed finite E4M3 values")
    return round_to_e4m3(scales.view(torch.float8_e4m3fn).double() * scaled_global / shared)


@dataclass(frozen=True)
class RoundingBound:
    """What rescaling by a set of ratios can do to a block scale, over every value E4M3 can hold
    (so it bounds any checkpoint's actual block scales, without reading them):

    ``max_relative_error``: largest relative error of a result whose exact value is in E4M3's normal
    range (>= 2**-6); 0 exactly when every ratio is a power of two. ``subnormal_below``: block scales
    below this land in the subnormal range (fewer significant bits, larger relative error; above 448
    if all do).
    ``zero_at_or_below``: block scales up to this become zero (0 if none can).
    """

    max_relative_error: float = 0.0
    subnormal_below: float = 0.0
    zero_at_or_below: float = 0.0

    def merge(self, other: "RoundingBound") -> "RoundingBound":
        return RoundingBound(*(max(a, b) for a, b in zip(vars(self).values(), vars(other).values())))


def rounding_bound(scaled_global: float, shared: float) -> RoundingBound:
    """:class:`RoundingBound` of :func:`rescale_block_scales` with this ratio, over all positive finite E4M3 values."""
    values = _POSITIVE_VALUES[1:]
    exact = values * scaled_global / shared
    result = round_to_e4m3(exact).view(torch.float8_e4m3fn).double()
    normal = exact >= E4M3_MIN_NORMAL
    zero = result == 0
    return RoundingBound(
        float(((result - exact).abs() / exact)[normal].max()) if bool(normal.any()) else 0.0,
        float(values[normal].min()) if bool(normal.any()) else 2 * E4M3_MAX,
        float(values[zero].max()) if bool(zero.any()) else 0.0,
    )
