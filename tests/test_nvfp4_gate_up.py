"""Gate/up global-scale sharing: E4M3 rounding vs brute force and torch's cast, exactness, rounding report."""

import pytest
import torch

from moebake.formats.nvfp4_gate_up import RoundingBound, rescale_block_scales, round_to_e4m3, rounding_bound, share_global

E4M3 = torch.float8_e4m3fn
ALL_FINITE_POSITIVE = torch.arange(0x7F, dtype=torch.uint8)  # +0 .. 448


def brute_force_e4m3(values: torch.Tensor) -> torch.Tensor:
    """Nearest E4M3 code to each value among all 127 non-negative finite codes; ties to the even code."""
    table = ALL_FINITE_POSITIVE.view(E4M3).double()
    distance = (values[:, None] - table[None, :]).abs()
    best = distance.min(dim=1, keepdim=True).values
    preference = (distance == best).long() * (2 + (ALL_FINITE_POSITIVE[None, :] % 2 == 0).long())  # nearest; even wins a tie
    return preference.argmax(dim=1).to(torch.uint8)


def test_rounding_matches_brute_force_on_random_and_midpoint_values():
    g = torch.Generator().manual_seed(0)
    table = ALL_FINITE_POSITIVE.view(E4M3).double()
    midpoints = (table[1:] + table[:-1]) / 2
    values = torch.cat(
        [
            torch.rand(4000, generator=g, dtype=torch.float64) * 448,
            torch.rand(2000, generator=g, dtype=torch.float64) * 0.02,
            midpoints,
            table,
            torch.tensor([0.0, 448.0, 2.0**-10, 2.0**-10 * 0.999, 2.0**-10 * 1.001]),
        ]
    )
    assert torch.equal(round_to_e4m3(values), brute_force_e4m3(values))


def test_rounding_matches_torch_cast_for_float32_values():
    g = torch.Generator().manual_seed(1)
    values = torch.cat([torch.rand(5000, generator=g) * 448, torch.rand(5000, generator=g) * 0.05])
    assert torch.equal(round_to_e4m3(values.double()), values.to(E4M3).view(torch.uint8))


def test_rounding_rejects_out_of_range():
    for bad in (-1.0, 449.0, float("nan")):
        with pytest.raises(ValueError):
            round_to_e4m3(torch.tensor([bad], dtype=torch.float64))


def test_share_global_keeps_the_larger_and_rescales_the_other_half():
    assert share_global(2.0, 2.0).rescaled_half is None
    up_smaller = share_global(4.0, 1.0)
    assert (up_smaller.shared, up_smaller.rescaled_half, up_smaller.ratio) == (4.0, "up", 0.25)
    gate_smaller = share_global(1.0, 3.0)
    assert (gate_smaller.shared, gate_smaller.rescaled_half) == (3.0, "gate") and gate_smaller.ratio == pytest.approx(1 / 3)


def test_power_of_two_ratio_of_normal_scales_is_exact():
    scales = torch.arange(0x40, 0x7F, dtype=torch.uint8)  # 2 .. 448, far above the subnormal range
    assert torch.equal(rescale_block_scales(scales, 1.0, 8.0), scales - 3 * 8)  # exponent field (bits 3..6) minus 3
    assert rounding_bound(1.0, 8.0).max_relative_error == 0.0


@pytest.mark.parametrize("small, large", [(0.000123, 0.000456), (1.0, 3.0), (0.3, 1.0), (1.0, 1.0)])
def test_bound_is_what_rescaling_every_e4m3_value_does(small, large):
    small, large = float(torch.tensor(small)), float(torch.tensor(large))  # F32 globals
    scales = ALL_FINITE_POSITIVE[1:]  # every positive finite block scale
    rescaled = rescale_block_scales(scales, small, large)
    exact = scales.view(E4M3).double() * small / large
    assert torch.equal(rescaled, brute_force_e4m3(exact))
    value = rescaled.view(E4M3).double()
    normal = exact >= 2.0**-6
    bound = rounding_bound(small, large)
    assert bound.max_relative_error == float(((value - exact).abs() / exact)[normal].max())
    assert bound.subnormal_below == float(scales.view(E4M3).double()[normal].min())
    assert bound.zero_at_or_below == (float(scales.view(E4M3).double()[value == 0].max()) if bool((value == 0).any()) else 0.0)
    if small == large:
        assert bound == RoundingBound(0.0, 2.0**-6, 0.0)


def test_bounds_merge_to_the_worst_case():
    merged = rounding_bound(1.0, 3.0).merge(rounding_bound(1.0, 8.0))
    assert merged.max_relative_error == rounding_bound(1.0, 3.0).max_relative_error > 0 == rounding_bound(1.0, 8.0).max_relative_error
    assert merged.zero_at_or_below == rounding_bound(1.0, 8.0).zero_at_or_below > rounding_bound(1.0, 3.0).zero_at_or_below


def test_rejects_nan_or_negative_block_scales_and_ratios_above_one():
    with pytest.raises(ValueError):
        rescale_block_scales(torch.tensor([0x7F], dtype=torch.uint8), 1.0, 2.0)
    with pytest.raises(ValueError):
        rescale_block_scales(torch.tensor([0xB8], dtype=torch.uint8), 1.0, 2.0)
    with pytest.raises(ValueError):
        rescale_block_scales(torch.tensor([0x38], dtype=torch.uint8), 2.0, 1.0)
