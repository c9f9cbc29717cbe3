"""SM90 fp4 interleave of padded, stacked, strided parts (the fused path the sm90-cutlass target uses).

The oracle is the kernel emulation (tests/kernel_emulation.py) applied to the padded stack built here
with plain zero tensors, so neither moebake's padding helpers nor its interleave are trusted.
"""

import numpy as np
import pytest
import torch

from conftest import random_u8
from kernel_emulation import kernel_interleave_v1, kernel_interleave_v2
from moebake.layouts import sm90_fp4
from moebake.layouts.sm90_fp4 import interleave_fp4, interleave_fp4_padded

KERNELS = {"v2": kernel_interleave_v2, "v1": kernel_interleave_v1}


@pytest.fixture(autouse=True)
def poisoned_empty(monkeypatch):
    """Fresh buffers hold garbage, not the kernel's zero pages, so bytes left unwritten show."""
    empty = np.empty

    def poisoned(*args, **kwargs):
        out = empty(*args, **kwargs)
        out.view(np.uint8).fill(0xA5)
        return out

    monkeypatch.setattr(np, "empty", poisoned)


def padded_stack(parts, rows, row_bytes):
    out = torch.zeros(parts[0].shape[0], len(parts) * rows, row_bytes, dtype=torch.uint8)
    for index, part in enumerate(parts):
        out[:, index * rows : index * rows + part.shape[1], : part.shape[2]] = part
    return out


@pytest.mark.parametrize("layout", ["v2", "v1"])
@pytest.mark.parametrize(
    "experts, source_rows, source_bytes, rows, row_bytes",
    [
        (2, 40, 48, 64, 64),  # rows and columns padded, the last block only half real
        (1, 48, 64, 48, 64),  # nothing padded
        (3, 16, 32, 32, 96),  # a whole padding block and two padding partitions
    ],
)
def test_padded_pairs_equal_kernel_on_the_padded_stack(layout, experts, source_rows, source_bytes, rows, row_bytes):
    pairs = random_u8(experts, 2 * source_rows, source_bytes, seed=source_rows + row_bytes)
    gate, up = pairs[:, 0::2], pairs[:, 1::2]  # strided row views, as a GPT-OSS W13 splits
    expected = KERNELS[layout](padded_stack((up, gate), rows, row_bytes))
    assert torch.equal(interleave_fp4_padded((up, gate), (rows, row_bytes), layout), expected)


def test_parts_of_different_widths_leave_no_stale_bytes():
    wide = random_u8(2, 64, 64, seed=3)[:, 0::2]  # strided, so staged like the narrow one
    narrow = random_u8(2, 16, 32, seed=4)
    expected = kernel_interleave_v2(padded_stack((wide, narrow, wide), 32, 64))
    assert torch.equal(interleave_fp4_padded((wide, narrow, wide), (32, 64)), expected)


@pytest.fixture(params=[1, 3], ids=["1-thread", "3-threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_steps_across_many_blocks(layout, threads, monkeypatch):
    """More blocks than one step holds, a step count that does not divide them, a partial last block;
    experts shared out between threads."""
    monkeypatch.setattr(sm90_fp4, "_STEP_BYTES", 3 * 512 * 2)  # 3 blocks of 2 partitions per step
    down = random_u8(2, 120, 64, seed=5)
    expected = KERNELS[layout](padded_stack((down,), 128, 64))
    assert torch.equal(interleave_fp4_padded((down,), (128, 64), layout), expected)
    narrow = random_u8(2, 2 * 96, 32, seed=7)[:, 1::2]  # read in place, one partition of two; then padding blocks
    expected = KERNELS[layout](padded_stack((narrow,), 160, 64))
    assert torch.equal(interleave_fp4_padded((narrow,), (160, 64), layout), expected)
    whole = random_u8(5, 128, 64, seed=6)
    assert torch.equal(interleave_fp4(whole, layout), KERNELS[layout](whole))
    assert torch.equal(sm90_fp4.deinterleave_fp4(interleave_fp4(whole, layout), layout), whole)


def test_non_contiguous_and_unaligned_inputs():
    base = random_u8(2, 32, 64 + 1, seed=9)
    unaligned = base[:, :, 1:]  # rows start at odd addresses
    assert torch.equal(interleave_fp4(unaligned), kernel_interleave_v2(unaligned.contiguous()))
    transposed = random_u8(2, 64, 32, seed=10).transpose(1, 2)
    assert torch.equal(interleave_fp4(transposed), kernel_interleave_v2(transposed.contiguous()))


def test_padded_rejects_parts_that_do_not_fit():
    with pytest.raises(ValueError, match="do not fit"):
        interleave_fp4_padded((random_u8(1, 32, 32),), (16, 32))
    with pytest.raises(ValueError, match="do not fit"):
        interleave_fp4_padded((random_u8(1, 16, 32), random_u8(2, 16, 32)), (16, 32))
    with pytest.raises(ValueError, match="n % 16 == 0 and k % 64 == 0"):
        interleave_fp4_padded((random_u8(1, 16, 32),), (24, 32))
    with pytest.raises(ValueError, match="at least one part"):
        interleave_fp4_padded((), (16, 32))
