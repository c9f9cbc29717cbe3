"""CuteDSL W13 64-row group interleave: inverse, FlashInfer's own CPU helper, and a row-by-row emulation."""

import pytest
import torch

from conftest import random_u8
from moebake.layouts.group_interleave import deinterleave_halves, interleave_halves

# (E, 2I, trailing dims...): one group pair, several, 3-D and 4-D rows, other group sizes below.
SHAPES = [(1, 128, 8), (2, 384, 4), (3, 256, 2, 3)]


def emulate(w13: torch.Tensor, group: int) -> torch.Tensor:
    """Output row r takes half (r // group) % 2, row (r // (2 * group)) * group + r % group of it."""
    half = w13.shape[1] // 2
    rows = [((r // group) % 2) * half + (r // (2 * group)) * group + r % group for r in range(w13.shape[1])]
    return w13[:, rows]


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_row_emulation_and_inverts(shape):
    w13 = random_u8(*shape, seed=len(shape))
    out = interleave_halves(w13, 64)
    assert torch.equal(out, emulate(w13, 64))
    assert torch.equal(deinterleave_halves(out, 64), w13)


@pytest.mark.parametrize("group", [16, 32, 128])
def test_other_group_sizes(group):
    w13 = random_u8(2, 4 * group, 6, seed=group)
    assert torch.equal(interleave_halves(w13, group), emulate(w13, group))
    assert torch.equal(deinterleave_halves(interleave_halves(w13, group), group), w13)


def test_float8_and_first_rows():
    w13 = torch.arange(256, dtype=torch.float32).reshape(1, 256, 1)
    out = interleave_halves(w13.to(torch.float8_e4m3fn).view(torch.uint8), 64)
    assert out.dtype == torch.uint8
    rows = interleave_halves(w13, 64).flatten().tolist()
    assert rows[:64] == list(range(64)) and rows[64:128] == list(range(128, 192)) and rows[128:192] == list(range(64, 128))


def test_rejects_rows_not_in_whole_group_pairs():
    with pytest.raises(ValueError):
        interleave_halves(random_u8(1, 192, 4), 64)
    with pytest.raises(ValueError):
        deinterleave_halves(random_u8(1, 64, 4), 64)


@pytest.mark.oracle
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_flashinfer_interleave_linear_and_gate(shape):
    prepare = pytest.importorskip("flashinfer.fused_moe.prepare")
    w13 = random_u8(*shape, seed=11)
    assert torch.equal(interleave_halves(w13, 64), prepare._interleave_linear_and_gate(w13, group_size=64, dim=1))
