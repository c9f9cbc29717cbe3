"""trtllm-gen row shuffle and gated-act pairing vs FlashInfer's CPU helpers and an index emulation."""

import pytest
import torch

from conftest import random_u8
from moebake.layouts.gate_up import merge_pairs, stack_halves
from moebake.layouts.trtllm_gen import shuffle_rows, unshuffle_rows


def emulate_shuffle(x: torch.Tensor, block: int) -> torch.Tensor:
    """TRT-LLM's srcToDstBlk{16,32}RowMap written out: source row j of a block goes to row map[j]."""
    src_to_dst = [8 * (j % (block // 8)) + j // (block // 8) for j in range(block)]
    out = torch.empty_like(x)
    for row in range(x.shape[1]):
        base, j = divmod(row, block)
        out[:, base * block + src_to_dst[j]] = x[:, row]
    return out


@pytest.mark.parametrize("tile,block", [(128, 32), (256, 32), (64, 16)])
@pytest.mark.parametrize("shape", [(2, 64, 5), (1, 256, 3), (3, 32)])
def test_shuffle_matches_emulation_and_inverts(shape, tile, block):
    if shape[1] % block:
        pytest.skip("shape not a whole number of blocks")
    x = random_u8(*shape, seed=shape[1])
    shuffled = shuffle_rows(x, tile)
    assert torch.equal(shuffled, emulate_shuffle(x, block))
    assert torch.equal(unshuffle_rows(shuffled, tile), x)


def test_shuffle_rejects_partial_blocks():
    with pytest.raises(ValueError):
        shuffle_rows(random_u8(1, 48, 4))


@pytest.mark.oracle
@pytest.mark.parametrize("rows", [128, 256, 384])
def test_shuffle_matches_flashinfer_shuffle_matrix_a(rows):
    fp4 = pytest.importorskip("flashinfer.fp4_quantization")
    x = random_u8(3, rows, 16, seed=rows)
    expected = torch.stack([fp4.shuffle_matrix_a(x[e], 128) for e in range(3)])
    assert torch.equal(shuffle_rows(x), expected)


@pytest.mark.oracle
def test_up_gate_pairs_then_shuffle_match_flashinfer_w3_w1_permute():
    core = pytest.importorskip("flashinfer.fused_moe.core")
    up, gate = random_u8(2, 96, 8, seed=1), random_u8(2, 96, 8, seed=2)
    halves = stack_halves(up, gate, (128, 8))  # [up; gate], each half zero-padded to 128 rows
    for e in range(2):
        assert torch.equal(merge_pairs(up, gate)[e], core.reorder_rows_for_gated_act_gemm(torch.cat([up, gate], 1)[e]))
        for sf in (None, 16):
            perm = core._maybe_get_cached_w3_w1_permute_indices({}, halves[e], 128, num_elts_per_sf=sf)
            ours = shuffle_rows(merge_pairs(halves[:, :128], halves[:, 128:]))
            assert torch.equal(ours[e], halves[e][perm])


@pytest.mark.oracle
def test_w2_shuffle_matches_flashinfer_w2_permute():
    core = pytest.importorskip("flashinfer.fused_moe.core")
    w2 = random_u8(2, 256, 64, seed=3)
    for sf in (None, 16):
        perm = core.get_w2_permute_indices_with_cache({}, w2[0], 128, num_elts_per_sf=sf)
        assert torch.equal(shuffle_rows(w2), w2[:, perm])
