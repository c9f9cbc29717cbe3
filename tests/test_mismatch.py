"""First-difference reports: element index in the tensor's own index space, checked against numpy."""

import numpy as np
import pytest
import torch

from moebake.convert.mismatch import first_difference


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8).clone()


def test_equal_images_have_no_difference():
    a = torch.arange(24, dtype=torch.uint8)
    assert first_difference(a, a.clone(), "U8", (2, 3, 4)) is None


def test_bf16_difference_in_high_byte_names_the_element():
    expected = torch.randn(3, 4, 5).to(torch.bfloat16)
    actual = expected.clone()
    actual[2, 1, 3] = -actual[2, 1, 3] if actual[2, 1, 3] != 0 else 1.0
    a, e = _bytes(actual), _bytes(expected)
    got = first_difference(a, e, "BF16", (3, 4, 5))
    stored = actual[2, 1, 3].view(torch.int16).item() & 0xFFFF
    original = expected[2, 1, 3].view(torch.int16).item() & 0xFFFF
    assert got == f"index [2, 1, 3] (0x{stored:04x} != 0x{original:04x})"


def test_f32_difference_with_a_byte_offset():
    expected = torch.arange(60, dtype=torch.float32).reshape(5, 12)
    actual = expected.clone()
    actual[3, 7] = 1000.0
    rows = slice(2, 5)  # the images hold rows 2..4 only: 2 rows * 12 * 4 bytes into the tensor
    got = first_difference(_bytes(actual[rows]), _bytes(expected[rows]), "F32", (5, 12), byte_offset=2 * 12 * 4)
    assert got.startswith("index [3, 7] (")
    assert got.endswith(f"(0x{np.float32(1000.0).view(np.uint32):08x} != 0x{np.float32(43.0).view(np.uint32):08x})")


@pytest.mark.parametrize("high", [False, True])
def test_f4_difference_resolves_the_nibble(high):
    expected = torch.zeros(16, dtype=torch.uint8)
    actual = expected.clone()
    actual[5] = 0x30 if high else 0x03  # byte 5 packs elements 10 (low nibble) and 11 (high nibble)
    flat = 11 if high else 10
    assert first_difference(actual, expected, "F4", (4, 8)) == f"index {[flat // 8, flat % 8]} (0x3 != 0x0)"
