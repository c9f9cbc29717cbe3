"""moebake.loading.mapped_shards: a shard's tensors mapped from the file, against safetensors' own get_tensor."""

import json
import struct

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from moebake.loading.mapped_shards import mappable, mapped_tensors, shard_headers

TENSORS = {
    "b.bf16": torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16),
    "a.f32": torch.linspace(-1, 1, 10, dtype=torch.float32),
    "c.u8": torch.arange(7, dtype=torch.uint8),
    "d.fp8": torch.linspace(-2, 2, 16).to(torch.float8_e4m3fn).reshape(4, 4),
    "e.i64": torch.tensor([1, -2, 3], dtype=torch.int64),
    "f.bool": torch.tensor([True, False, True]),
    "g.empty": torch.empty(0, 5, dtype=torch.bfloat16),
    "h.scalar": torch.tensor(3.5, dtype=torch.float32),
}


def _raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""


def test_every_tensor_equals_safetensors_own_in_sorted_order(tmp_path):
    first, second = tmp_path / "model-00001.safetensors", tmp_path / "model-00002.safetensors"
    names = sorted(TENSORS)
    save_file({n: TENSORS[n] for n in names[:4]}, first)
    save_file({n: TENSORS[n] for n in names[4:]}, second)
    headers = shard_headers([second, first])  # the order given is kept: shards as handed, names sorted within each
    assert mappable(headers)
    pairs = list(mapped_tensors(headers))
    assert [n for n, _ in pairs] == names[4:] + names[:4]
    for name, tensor in pairs:
        path = second if name in names[4:] else first
        with safe_open(str(path), framework="pt") as f:
            stock = f.get_tensor(name)
        assert (tensor.dtype, tuple(tensor.shape), tensor.device.type) == (stock.dtype, tuple(stock.shape), "cpu"), name
        assert _raw(tensor) == _raw(stock), name


def test_a_tensor_at_an_offset_its_element_size_does_not_divide_is_not_mappable(tmp_path):
    header = {"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "y": {"dtype": "BF16", "shape": [2], "data_offsets": [1, 5]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(5))
    assert not mappable(shard_headers([path]))


def test_writing_a_mapped_tensor_leaves_the_file_unchanged(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(64, dtype=torch.float32)}, path)
    before = path.read_bytes()
    ((_, tensor),) = mapped_tensors(shard_headers([path]))
    tensor.zero_()  # a private (copy-on-write) mapping, as safetensors makes
    assert path.read_bytes() == before


def test_a_sub_byte_dtype_is_not_mappable(tmp_path):
    header = {"x": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "fp4.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(2))
    assert not mappable(shard_headers([path]))
