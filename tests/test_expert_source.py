"""Canonical expert parts from source chunks, and back (the inverse deep verify relies on)."""

import pytest
import torch

from conftest import random_u8
from moebake.formats.expert_source import ExpertSource, source_tensors
from moebake.schema.enums import DType, GateUpOrder
from moebake.schema.manifest import TensorRecord


def test_pairs_split_even_rows_as_gate_and_invert():
    source = ExpertSource(("x.gate_up_proj_blocks",), "pairs", (3, 8), (6, 1, 8), "U8")
    chunk = random_u8(2, 6, 1, 8)
    gate, up = source.parts(chunk)
    assert torch.equal(gate, chunk.reshape(2, 6, 8)[:, 0::2]) and torch.equal(up, chunk.reshape(2, 6, 8)[:, 1::2])
    record = TensorRecord(
        dtype=DType.U8,
        shape=(3, 6, 1, 8),
        source="x.gate_up_proj_blocks",
        source_gate_up_order=GateUpOrder.PAIRS,
        source_shape=(6, 1, 8),
        source_dtype=DType.U8,
    )
    restored = source_tensors(record, (gate, up))
    assert list(restored) == ["x.gate_up_proj_blocks"] and torch.equal(restored["x.gate_up_proj_blocks"], chunk)


def test_separate_parts_keep_raw_bytes_of_one_byte_dtypes():
    source = ExpertSource(("e.*.w1.scale", "e.*.w3.scale"), "separate", (4, 2), (4, 2), "F8_E8M0")
    gate_bytes, up_bytes = random_u8(3, 4, 2, seed=1), random_u8(3, 4, 2, seed=2)
    gate, up = source.parts(gate_bytes.view(torch.float8_e8m0fnu), up_bytes.view(torch.float8_e8m0fnu))
    assert gate.dtype == torch.uint8 and torch.equal(gate, gate_bytes) and torch.equal(up, up_bytes)
    record = TensorRecord(
        dtype=DType.U8,
        shape=(3, 8, 2),
        source=("e.*.w1.scale", "e.*.w3.scale"),
        source_gate_up_order=GateUpOrder.SEPARATE,
        source_shape=(4, 2),
        source_dtype=DType.F8_E8M0,
    )
    restored = source_tensors(record, (gate, up))
    assert torch.equal(restored["e.*.w1.scale"], gate_bytes) and torch.equal(restored["e.*.w3.scale"], up_bytes)
    assert source.stored_names(2) == ("e.0.w1.scale", "e.0.w3.scale", "e.1.w1.scale", "e.1.w3.scale")


def test_wider_dtypes_keep_their_dtype():
    source = ExpertSource(("b",), "pairs", (2,), (4,), "BF16")
    bias = torch.randn(1, 4).to(torch.bfloat16)
    gate, up = source.parts(bias)
    assert gate.dtype == torch.bfloat16 and torch.equal(torch.stack([gate, up], -1).flatten(1), bias)


def test_order_must_fit_the_names():
    with pytest.raises(ValueError):
        ExpertSource(("a",), "separate", (1,), (1,), "U8")
    with pytest.raises(ValueError):
        ExpertSource(("a", "b"), "pairs", (1,), (1,), "U8")
