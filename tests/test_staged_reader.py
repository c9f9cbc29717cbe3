"""StagedReader on CPU: the chunked, ring-buffered pipeline (staged) and direct reads land every byte."""

import pytest
import torch

from moebake.errors import MoebakeError
from moebake.serving_core.staged_reader import ByteRange, StagedReader
from tests.conftest import random_u8


@pytest.fixture()
def data_file(tmp_path):
    data = random_u8(50_000, seed=5)
    path = tmp_path / "blob.bin"
    path.write_bytes(data.numpy().tobytes())
    return path, data


# (offset, length) pieces: one smaller than a chunk, one spanning several chunks plus a tail, one empty.
PIECES = [(7, 900), (1000, 20_001), (30_000, 0), (31_000, 19_000)]


@pytest.mark.parametrize("staged, chunk_bytes, slots", [(True, 1024, 3), (True, 4096, 1), (True, 1 << 20, 4), (False, 1000, 2)])
def test_every_byte_lands_where_asked(data_file, staged, chunk_bytes, slots):
    path, data = data_file
    dests = [torch.full((n,), 0xAA, dtype=torch.uint8) for _, n in PIECES]
    ranges = [ByteRange(str(path), offset, dest, f"t{i}") for i, ((offset, _), dest) in enumerate(zip(PIECES, dests))]
    reader = StagedReader(torch.device("cpu"), chunk_bytes=chunk_bytes, slots=slots, staged=staged)
    for _ in range(2):  # the ring is re-used by a second read
        stats = reader.read(ranges)
        for (offset, n), dest in zip(PIECES, dests):
            assert torch.equal(dest, data[offset:offset + n])
    assert stats.bytes == sum(n for _, n in PIECES) and stats.tensors == len(PIECES) and stats.device == "cpu"


@pytest.mark.parametrize("staged", [True, False])
def test_a_file_ending_early_names_the_tensor(data_file, staged):
    path, _ = data_file
    ranges = [ByteRange(str(path), 49_000, torch.empty(5000, dtype=torch.uint8), "model.layers.0.mlp.experts.w2_weight")]
    reader = StagedReader(torch.device("cpu"), chunk_bytes=1024, slots=2, staged=staged)
    with pytest.raises(MoebakeError,
                       match=r"blob.bin: tensor model.layers.0.mlp.experts.w2_weight is truncated \(file ends at byte 50000\)"):
        reader.read(ranges)
