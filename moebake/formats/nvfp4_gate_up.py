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
rounding is measured (largest relative error, non-zero scales flushed to zero) for the report.
"""

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0
_POSITIVE_CODES = torch.arange(0x7F, dtype=torch.uint8)  # 0x00..0x7E: +0 and every positive finite E4M3
_POSITIVE_VALUES = _POSITIVE_CODES.view(torch.float8_e4m3fn).double()  # ascending with the code


def round_to_e4m3(values: torch.Tensor) -> torch.Tensor:
    """float64 values in ``[0, 448]`` -> uint8 E4M3 codes of the nearest value (ties to even code)."""
    if bool(((values < 0) | (values > E4M3_MAX) | values.isnan()).any()):
        raise ValueError("values to round must lie in [0, 448]")
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


@dataclass(frozen=True)
class Rounding:
    """What rescaling did to a set of block scales: largest relative error of a non-zero result's
    value vs the exact product, and how many non-zero products rounded to zero."""

    max_relative_error: float = 0.0
    flushed_to_zero: int = 0

    def merge(self, other: "Rounding") -> "Rounding":
        return Rounding(max(self.max_relative_error, other.max_relative_error), self.flushed_to_zero + other.flushed_to_zero)


def rescale_block_scales(scales: torch.Tensor, scaled_global: float, shared: float) -> tuple[torch.Tensor, Rounding]:
    """E4M3 block-scale bytes (uint8, any shape) -> bytes of ``scales * scaled_global / shared``, and the rounding.

    Raises ValueError if a scale is negative or NaN (not a valid NVFP4 block scale) or the ratio exceeds 1.
    """
    if not 0 < scaled_global <= shared:
        raise ValueError(f"rescale ratio {scaled_global}/{shared} is not in (0, 1]")
    if bool((scales >= 0x7F).any()):
        raise ValueError("block scales must be non-negative finite E4M3 values")
    exact = scales.view(torch.float8_e4m3fn).double() * scaled_global / shared
    rounded = round_to_e4m3(exact)
    value = rounded.view(torch.float8_e4m3fn).double()
    nonzero = exact > 0
    flushed = int((nonzero & (rounded == 0)).sum())
    kept = nonzero & (rounded != 0)
    error = float(((value - exact).abs()[kept] / exact[kept]).max()) if bool(kept.any()) else 0.0
    return rounded, Rounding(error, flushed)
