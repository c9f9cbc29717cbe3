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
from moebake.layouts.marlin import permute_scales_padded, repack_padded
from moebake.layouts.sm90_fp4 import interleave_fp4, interleave_fp4_padded
from moebake.layouts.sm90_humming import humming_weight
from moebake.layouts.sm90_scales import fold_scales_padded
from moebake.synthetic import write_gpt_oss


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
    (1, 16, 32, 16, 32),  # one block, nothing padded
    (3, 16, 32, 32, 96),  # a whole padding block, two padding partitions
    (2, 40, 48, 64, 64),  # last block half real, a partial partition
    (5, 48, 64, 48, 64),  # odd expert count, nothing padded
    (7, 1, 1, 16, 32),  # one byte of source
    (3, 97, 80, 128, 128),  # partial partition and a row count that is no multiple of 8
    (1, 360, 1440, 368, 1440),  # GPT-OSS-20B-like row width, padded rows only
    (2, 180, 720, 192, 768),  # padded rows and a whole padding partition
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
        for weight in (
            random_u8(5, 64, 96, seed=1),
            random_u8(3, 32, 64 + 1, seed=2)[:, :, 1:],  # rows at odd addresses
            random_u8(3, 64, 32, seed=3).transpose(1, 2),  # column stride > 1
            random_u8(2, 2 * 48, 64, seed=4)[:, 1::2],
        ):  # every other row
            assert torch.equal(interleave_fp4(weight, layout), oracle(interleave_fp4, weight, layout))
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 64, 4, 64, 4),
        (3, 48, 3, 64, 4),
        (2, 90, 22, 128, 24),
        (5, 96, 45, 128, 48),
        (1, 8, 1, 64, 8),
    ],
    ids=lambda s: "x".join(map(str, s)),
)
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


# experts, source rows, source row bytes, padded rows, padded row bytes (Marlin: rows % 64 == 0, row bytes % 8 == 0)
MARLIN_SHAPES = [
    (1, 64, 8, 64, 8),  # one tile, nothing padded
    (3, 40, 8, 64, 16),  # padded rows inside a group, a whole padding tile of K
    (2, 64, 12, 128, 24),  # a whole padding group, a partial word of a row (copied, zero-padded)
    (5, 96, 48, 128, 48),  # odd expert count, rows not a multiple of 64
    (7, 1, 1, 64, 8),  # one byte of source
    (1, 360, 1440, 384, 1536),  # GPT-OSS-20B-like row width, padded rows and columns
]


@pytest.mark.parametrize("shape", MARLIN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_marlin_repack_padded_gate_up_equals_numpy(shape, oracle):
    experts, source_rows, source_bytes, rows, row_bytes = shape
    pairs = random_u8(experts, 2 * source_rows, source_bytes, seed=sum(shape))
    gate, up = split_pairs(pairs)  # strided row views, as a GPT-OSS W13 splits
    expected = oracle(repack_padded, (gate, up), (rows, row_bytes))
    assert torch.equal(repack_padded((gate, up), (rows, row_bytes)), expected)
    down = random_u8(experts, source_rows, source_bytes + 1, seed=1 + sum(shape))[:, :, 1:]  # rows at odd addresses
    expected = oracle(repack_padded, (down,), (rows, row_bytes))
    assert torch.equal(repack_padded((down,), (rows, row_bytes)), expected)
    assert torch.equal(repack_padded((down.contiguous().view(torch.int8),), (rows, row_bytes)), expected)


@pytest.mark.parametrize(
    "shape",
    [
        (1, 64, 2, 64, 2),
        (3, 48, 3, 64, 4),
        (2, 90, 22, 128, 24),
        (5, 96, 45, 128, 48),
        (1, 8, 1, 192, 8),
    ],
    ids=lambda s: "x".join(map(str, s)),
)
def test_marlin_scales_padded_equals_torch(shape, oracle):
    experts, source_rows, groups, rows, padded_groups = shape
    pairs = random_u8(experts, 2 * source_rows, groups, seed=sum(shape))
    gate, up = split_pairs(pairs)
    expected = oracle(permute_scales_padded, (gate, up), (rows, padded_groups), 127, 119)
    assert torch.equal(permute_scales_padded((gate, up), (rows, padded_groups), 127, 119), expected)
    down = random_u8(experts, source_rows, groups, seed=2 + sum(shape))
    expected = oracle(permute_scales_padded, (down,), (rows, padded_groups), 0, 127)
    assert torch.equal(permute_scales_padded((down,), (rows, padded_groups), 0, 127), expected)
    column_strided = down.transpose(1, 2).contiguous().transpose(1, 2)
    assert torch.equal(permute_scales_padded((column_strided,), (rows, padded_groups), 0, 127), expected)
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if e8m0 is not None:  # DeepSeek-V4's scales arrive as E8M0 tensors
        permuted = permute_scales_padded((down.view(e8m0),), (rows, padded_groups), 0, 127)
        assert permuted.dtype == e8m0 and torch.equal(permuted.view(torch.uint8), expected)


@pytest.mark.parametrize(
    "target, used", [("sm90-marlin", ("marlin_repack_part", "marlin_scales_part")), ("sm90-cutlass-w4a8", ("humming_weight_expert",))]
)
def test_padded_conversion_loads_no_kernel_and_writes_identical_files(tmp_path, monkeypatch, target, used):
    """Padded (H 192 -> 256, I 96 -> 128): what :func:`load` loads is all the conversion calls, and the numpy path
    writes the same files."""
    source = write_gpt_oss(tmp_path / "src", num_layers=2, num_experts=3, hidden=192, intermediate=96, vocab=64)
    load()
    compiled = kernels()
    loaded = {name: set(getattr(compiled, name).signatures) for name in used}
    assert all(loaded.values())
    options = ConvertOptions(target)
    with_kernels = convert(source, tmp_path / "compiled", options, progress=False).to_json()
    assert {name: set(getattr(compiled, name).signatures) for name in loaded} == loaded
    monkeypatch.setenv(DISABLE_ENV, "1")
    numpy_path = convert(source, tmp_path / "numpy", options, progress=False).to_json()
    assert with_kernels["files"] == numpy_path["files"]
    for name in with_kernels["files"]:
        assert (tmp_path / "compiled" / name).read_bytes() == (tmp_path / "numpy" / name).read_bytes(), name


@pytest.mark.parametrize("shape", [(1, 16, 32), (3, 48, 64), (2, 368, 1440)], ids=lambda s: "x".join(map(str, s)))
def test_humming_weight_equals_numpy(shape, oracle):
    """Scales over a range wider than 11 (so groups are rewritten), E8M0 255 (NaN) among them."""
    experts, rows, row_bytes = shape
    weight = random_u8(experts, rows, row_bytes, seed=sum(shape))
    scales = 100 + random_u8(experts, rows, row_bytes // 16, seed=1 + sum(shape)) % 28
    scales[0, 0, 0] = 255
    expected = oracle(humming_weight, weight, scales)
    assert torch.equal(humming_weight(weight, scales), expected)
    assert torch.equal(humming_weight(weight, scales, interleave=False), oracle(humming_weight, weight, scales, 11, False))


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
