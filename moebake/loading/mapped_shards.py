"""A checkpoint's safetensors shards as tensors mapped from their files, without reading a byte of tensor data.

An engine's safetensors iterator hands out each tensor as ``safe_open(path, framework="pt").get_tensor(name)``
returns it: a view of the mmap'd shard. safetensors touches each tensor's first page as it makes that view, and the
kernel's fault read-around then reads up to ``read_ahead_kb`` on either side of it; for a baked expert tensor most of
those bytes are other EP ranks' rows, which a rank that reads only its own rows
(:class:`~moebake.loading.rank_loader.RankLoader`) never needs.

:func:`mapped_tensors` yields the same ``(name, tensor)`` pairs, in the same order (shards in the order given, names
sorted within each, as the engine's iterators), each a CPU tensor of the stored dtype and shape over a private
(copy-on-write) mapping of its shard; nothing is read until a caller reads the tensor's elements, and then only the
pages it reads (with the kernel's read-around for those). A shard stays mapped while any of its tensors lives.

:func:`mappable` says whether every tensor of the shards can be so mapped: a dtype torch has, at least a byte wide,
its data at an offset its element size divides (safetensors writers align; a file that does not is left to the
engine's iterator).
"""

import mmap
import os
from collections.abc import Iterator, Sequence

import torch

from moebake.formats.safetensors_file import DTYPES, SafetensorsFile, read_header


def mappable(headers: Sequence[SafetensorsFile]) -> bool:
    """Whether :func:`mapped_tensors` can hand every tensor of these shards (see the module docstring)."""
    for shard in headers:
        for entry in shard.tensors.values():
            torch_dtype, bits = DTYPES[entry.dtype]
            if torch_dtype is None or bits < 8 or (shard.data_start + entry.begin) % (bits // 8):
                return False
    return True


def _shard_map(path: str) -> mmap.mmap | None:
    """A private, writable (copy-on-write) mapping of the whole file, as safetensors makes; None for an empty file."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return None
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)


def mapped_tensors(headers: Sequence[SafetensorsFile]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of ``headers``' shards, in order: shards as given, names sorted; each tensor
    of the stored dtype and shape, C order, little-endian as stored, mapped from its file (module docstring). The
    caller checks :func:`mappable` first."""
    for shard in headers:
        mapping = _shard_map(shard.path) if shard.tensors else None
        for name in sorted(shard.tensors):
            entry = shard.tensors[name]
            torch_dtype, bits = DTYPES[entry.dtype]
            assert torch_dtype is not None  # mapped_tensors is called where mappable() holds
            count = entry.nbytes // (bits // 8)
            if count == 0:
                yield name, torch.empty(entry.shape, dtype=torch_dtype)
                continue
            flat = torch.frombuffer(mapping, dtype=torch_dtype, count=count, offset=shard.data_start + entry.begin)
            yield name, flat.view(entry.shape)


def shard_headers(paths: Sequence[str | os.PathLike]) -> list[SafetensorsFile]:
    """The parsed headers of ``paths``, in order (CheckpointError naming a file whose header is broken)."""
    return [read_header(path) for path in paths]
