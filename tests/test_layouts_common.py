"""Gate/up orders, padding, MXFP4 decoding and the FlashInfer layout-version table."""

import pytest
import torch

from conftest import random_u8
from moebake.layouts.gate_up import merge_pairs, pad_to, split_halves, split_pairs, stack_halves
from moebake.schema.flashinfer_versions import layout_for_flashinfer
from mxfp4_oracle import dequantize, pack_nibbles, unpack_nibbles


def test_split_pairs_takes_even_rows_as_gate():
    w13 = torch.arange(2 * 6 * 3).reshape(2, 6, 3)
    gate, up = split_pairs(w13)
    assert torch.equal(gate, w13[:, 0::2]) and torch.equal(up, w13[:, 1::2])
    assert torch.equal(merge_pairs(gate, up), w13)


def test_split_pairs_on_last_dim_for_bias():
    bias = torch.arange(12).reshape(2, 6)
    gate, up = split_pairs(bias)
    assert gate.tolist() == [[0, 2, 4], [6, 8, 10]] and up.tolist() == [[1, 3, 5], [7, 9, 11]]


def test_stack_halves_zero_pads_each_half():
    first, second = torch.ones(2, 3, 4, dtype=torch.uint8), 2 * torch.ones(2, 3, 4, dtype=torch.uint8)
    stacked = stack_halves(first, second, (5, 6))
    assert stacked.shape == (2, 10, 6)
    assert torch.equal(stacked[:, :3, :4], first) and torch.equal(stacked[:, 5:8, :4], second)
    padding = stacked.clone()
    padding[:, :3, :4] = 0
    padding[:, 5:8, :4] = 0
    assert not padding.any()
    back_first, back_second = split_halves(stacked, (3, 4))
    assert torch.equal(back_first, first) and torch.equal(back_second, second)


def test_pad_to_is_identity_when_already_sized():
    x = random_u8(2, 4, 4)
    assert torch.equal(pad_to(x, (4, 4)), x)


def test_nibble_order_low_is_even():
    packed = torch.tensor([[0x21, 0xF3]], dtype=torch.uint8)
    assert unpack_nibbles(packed).tolist() == [[1, 2, 3, 15]]
    assert torch.equal(pack_nibbles(unpack_nibbles(packed)), packed)


def _e2m1_by_formula(code: int) -> float:
    """E2M1 from its bit fields: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0."""
    sign = -1.0 if code & 8 else 1.0
    exponent, mantissa = (code >> 1) & 3, code & 1
    magnitude = mantissa * 0.5 if exponent == 0 else (1 + mantissa / 2) * 2.0 ** (exponent - 1)
    return sign * magnitude


def test_dequantize_matches_bitfield_formula():
    packed = random_u8(3, 16, seed=3)
    scales = torch.tensor([[120], [127], [130]], dtype=torch.uint8)
    values = dequantize(packed, scales)
    for row in range(3):
        factor = 2.0 ** (int(scales[row, 0]) - 127)
        for i in range(32):
            byte = int(packed[row, i // 2])
            code = byte & 0xF if i % 2 == 0 else byte >> 4
            assert values[row, i].item() == _e2m1_by_formula(code) * factor


# From the release table in shared/reference/flashinfer-layouts.md §1.2 (git history of the kernel file).
@pytest.mark.parametrize(
    "version, layout",
    [
        ("0.6.9", None),
        ("0.6.10", "v1"),
        ("0.6.15.post1", "v1"),
        ("0.6.16", "v2"),
        ("0.6.16.post1", "v2"),
        ("0.6.16.post2", "v2"),
        ("0.6.16.post3", "v1"),
        ("0.6.16.post4", "v1"),
        ("0.6.17", "v1"),
        ("0.6.18", "v2"),
        ("0.7.2.post1", "v2"),
        ("0.7.2", "v2"),
    ],
)
def test_flashinfer_layout_table(version, layout):
    assert layout_for_flashinfer(version) == layout
