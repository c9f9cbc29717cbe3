"""``moebake.engines.vllm.loader.other_tensors``: the tensors the plugin hands vLLM's ``load_weights`` (every one but
the baked experts) are the files' bytes, of the stored dtype and shape, read exactly: from a cold page cache, no page
of a skipped (baked) tensor is read but the ones it shares with its neighbours, where safetensors' mmap'd views fault
in the kernel's read-around (``read_ahead_kb``) of them."""

import os

import pytest
import torch

from moebake.formats.safetensors_file import encode_header
from moebake.loading.checkpoint_tensors import CheckpointTensors
from tests.conftest import benchkit, random_u8, resident_pages

MIB = 1 << 20
SKIPPED = ("a.experts0", "c.experts1", "e.experts2")  # 8 MiB each, the handed tensors between them


ORDER = ("a.experts0", "b.norm", "c.experts1", "d.embed", "e.experts2", "f.scalar")  # as laid out in the file


@pytest.fixture()
def checkpoint(tmp_path):
    """A lone ``model.safetensors`` whose handed tensors (bf16, f32, a 0-d f32) lie between the skipped ones."""
    tensors = {name: random_u8(8 * MIB, seed=i) for i, name in enumerate(SKIPPED)}
    tensors["b.norm"] = random_u8(MIB // 2, seed=7).view(torch.bfloat16).reshape(512, 512)
    tensors["d.embed"] = random_u8(3 * MIB, seed=8).view(torch.float32).reshape(768, 1024)
    tensors["f.scalar"] = torch.tensor(1.5, dtype=torch.float32)
    codes = {torch.uint8: "U8", torch.bfloat16: "BF16", torch.float32: "F32"}
    header, _ = encode_header([(n, codes[tensors[n].dtype], tuple(tensors[n].shape)) for n in ORDER], {})
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(header)
        for name in ORDER:
            f.write(tensors[name].reshape(-1).view(torch.uint8).numpy().tobytes())
    return tmp_path, tensors


def test_the_handed_tensors_are_the_files_bytes_and_their_order_is_safetensors(checkpoint):
    from moebake.engines.vllm.loader import other_tensors

    directory, tensors = checkpoint
    handed = list(other_tensors(CheckpointTensors(directory), set(SKIPPED)))
    assert [name for name, _ in handed] == ["b.norm", "d.embed", "f.scalar"]  # names sorted, as safetensors lists them
    for name, tensor in handed:
        want = tensors[name]
        assert (tensor.dtype, tuple(tensor.shape), tensor.device.type) == (want.dtype, tuple(want.shape), "cpu"), name
        assert torch.equal(tensor.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), name


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="page-cache eviction through posix_fadvise")
def test_no_page_of_a_skipped_tensor_is_read_but_those_it_shares(checkpoint):
    from moebake.engines.vllm.loader import other_tensors

    directory, _ = checkpoint
    path = directory / "model.safetensors"
    files = CheckpointTensors(directory)
    shard = files.header("model.safetensors")  # the header parsed (its reads bring pages in), then the file evicted
    assert sorted(files.weight_map) == sorted(ORDER)
    benchkit().evict_from_page_cache([path])
    ranges = {name: (shard.data_start + shard.tensors[name].begin, shard.data_start + shard.tensors[name].end) for name in SKIPPED}
    if sum(resident_pages(path, *ranges[name]) for name in SKIPPED):
        pytest.skip("this file system keeps the file in memory (tmpfs?): no cold page cache to observe")
    handed = list(other_tensors(files, set(SKIPPED)))
    assert len(handed) == 3
    # each skipped tensor shares its edge pages with a handed neighbour (the data is not page-aligned): only those
    assert {name: resident_pages(path, *ranges[name]) for name in SKIPPED} == {"a.experts0": 1, "c.experts1": 2, "e.experts2": 2}
