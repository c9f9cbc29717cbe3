"""The compiled (numba) kernels write exactly the bytes of the numpy/torch implementations they replace.

The numpy code is the oracle here (it is itself tested against FlashInfer's kernel emulation in
test_layouts_sm90.py / test_sm90_fp4_padded.py); ``MOEBAKE_NO_COMPILED=1`` selects it. Shapes cover
padded rows and columns, partial partitions, padding-only blocks, strided (gate/up) parts, odd
expert counts and several threads; then whole conversions must give identical output files.
"""

import json

import pytest
import torch

from conftest import random_u8
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.layouts.compiled import DISABLE_ENV, kernels, load
from moebake.layouts.gate_up import split_pairs
from moebake.layouts.sm90_fp4 import interleave_fp4, interleave_fp4_padded
from moebake.layouts.sm90_scales import fold_scales_padded


@pytest.fixture()
def oracle(monkeypatch):
    """Run ``fn(*args)`` on the numpy path (compiled kernels off), then restore the compiled path."""

    def run(fn, *args):
        monkeypatch.setenv(DISABLE_ENV, "1")
        try:
            return fn(*args)
        finally:
            monkeypatch.delenv(DISABLE_ENV)

    return run


def test_compiled_kernels_are_installed():
    assert kernels() is not None, "numba is a dependency: the compiled kernels must load"


@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_load_covers_the_argument_types_of_a_conversion(gpt_oss_tiny, tmp_path, layout):
    """What the ``--workers`` fork server loads ahead (:func:`load`) is all a conversion calls: its
    workers then load no kernel of their own."""
    load()
    compiled = kernels()
    loaded = {name: set(getattr(compiled, name).signatures) for name in ("interleave_fp4_part", "fold_scales_part")}
    assert all(loaded.values())
    convert(gpt_oss_tiny, tmp_path / "out", ConvertOptions("sm90-cutlass", flashinfer_layout=layout), progress=False)
    assert {name: set(getattr(compiled, name).signatures) for name in loaded} == loaded


# experts, source rows, source row bytes, padded rows, padded row bytes
PADDED_SHAPES = [
    (1, 16, 32, 16, 32),        # one block, nothing padded
    (3, 16, 32, 32, 96),        # a whole padding block, two padding partitions
    (2, 40, 48, 64, 64),        # last block half real, a partial partition
    (5, 48, 64, 48, 64),        # odd expert count, nothing padded
    (7, 1, 1, 16, 32),          # one byte of source
    (3, 97, 80, 128, 128),      # partial partition and a row count that is no multiple of 8
    (1, 360, 1440, 368, 1440),  # GPT-OSS-20B-like row width, padded rows only
    (2, 180, 720, 192, 768),    # padded rows and a whole padding partition
]


@pytest.mark.parametrize("layout", ["v2", "v1"])
@pytest.mark.parametrize("shape", PADDED_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_interleave_padded_gate_up_equals_numpy(shape, layout, oracle):
    experts, source_rows, source_bytes, rows, row_bytes = shape
    pairs = random_u8(experts, 2 * source_rows, source_bytes, seed=sum(shape))
    gate, up = split_pairs(pairs)  # strided row views, as a GPT-OSS W13 splits
    expected = oracle(interleave_fp4_padded, (up, gate), (rows, row_bytes), layout)
    assert torch.equal(interleave_fp4_padded((up, gate), (rows, row_bytes), layout), expected)
    down = random_u8(experts, source_rows, source_bytes, seed=1 + sum(shape))
    expected = oracle(interleave_fp4_padded, (down,), (rows, row_bytes), layout)
    assert torch.equal(interleave_fp4_padded((down,), (rows, row_bytes), layout), expected)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_interleave_unpadded_odd_strides_and_threads(layout, threads, oracle):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for weight in (random_u8(5, 64, 96, seed=1),
                       random_u8(3, 32, 64 + 1, seed=2)[:, :, 1:],         # rows at odd addresses
                       random_u8(3, 64, 32, seed=3).transpose(1, 2),      # column stride > 1
                       random_u8(2, 2 * 48, 64, seed=4)[:, 1::2]):        # every other row
            assert torch.equal(interleave_fp4(weight, layout), oracle(interleave_fp4, weight, layout))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("shape", [
    (1, 64, 4, 64, 4), (3, 48, 3, 64, 4), (2, 90, 22, 128, 24), (5, 96, 45, 128, 48), (1, 8, 1, 64, 8),
], ids=lambda s: "x".join(map(str, s)))
def test_fold_scales_padded_equals_torch(shape, oracle):
    experts, source_rows, groups, rows, padded_groups = shape
    pairs = random_u8(experts, 2 * source_rows, groups, seed=sum(shape))
    gate, up = split_pairs(pairs)
    expected = oracle(fold_scales_padded, (up, gate), (rows, padded_groups))
    assert torch.equal(fold_scales_padded((up, gate), (rows, padded_groups)), expected)
    down = random_u8(experts, source_rows, groups, seed=2 + sum(shape))
    expected = oracle(fold_scales_padded, (down,), (rows, padded_groups))
    assert torch.equal(fold_scales_padded((down,), (rows, padded_groups)), expected)
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if e8m0 is not None:  # DeepSeek-V4's scales arrive as E8M0 tensors
        folded = fold_scales_padded((down.view(e8m0),), (rows, padded_groups))
        assert folded.dtype == e8m0 and torch.equal(folded.view(torch.uint8), expected)


@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_whole_conversion_writes_identical_files(gpt_oss_tiny, tmp_path, layout, monkeypatch):
    options = ConvertOptions("sm90-cutlass", flashinfer_layout=layout)
    compiled = convert(gpt_oss_tiny, tmp_path / "compiled", options, progress=False).to_json()
    monkeypatch.setenv(DISABLE_ENV, "1")
    numpy_path = convert(gpt_oss_tiny, tmp_path / "numpy", options, progress=False).to_json()
    assert compiled["files"] == numpy_path["files"]
    for name in compiled["files"]:
        assert (tmp_path / "compiled" / name).read_bytes() == (tmp_path / "numpy" / name).read_bytes(), name
    assert json.loads((tmp_path / "compiled" / "moebake.json").read_text())["layers"] == numpy_path["layers"]
