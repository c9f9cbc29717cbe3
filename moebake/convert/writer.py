"""Streaming safetensors writer: header first (from the planned shapes), then one chunk at a time.

``safetensors.torch.save_file`` needs every tensor of a shard in memory; here the header is
computed from the plan and each tensor's bytes are streamed from its producer, so memory is
bounded by one chunk. The file's SHA-256 is computed over exactly the bytes written.
"""

import hashlib
import os
from collections.abc import Callable

import torch

from moebake.convert.plan import OutputShard
from moebake.formats.safetensors_file import encode_header

SHARD_METADATA = {"format": "pt"}  # transformers refuses shards whose metadata lacks a known format


def write_shard(shard: OutputShard, path: str | os.PathLike, on_bytes: Callable[[int], None] = lambda n: None) -> str:
    """Write ``shard`` to ``path`` (fsynced) and return the file's SHA-256 hex digest.

    ``on_bytes(n)`` is called after each chunk with the number of data bytes just written.
    """
    header, _ = encode_header([(t.name, t.dtype, t.shape) for t in shard.tensors], SHARD_METADATA)
    digest = hashlib.sha256(header)
    with open(path, "wb") as f:
        f.write(header)
        for tensor in shard.tensors:
            written = 0
            for chunk in tensor.produce():
                data = memoryview(chunk.contiguous().view(-1).view(torch.uint8).numpy())
                digest.update(data)
                f.write(data)
                written += len(data)
                on_bytes(len(data))
            if written != tensor.nbytes:
                raise AssertionError(f"producer of {tensor.name} wrote {written} bytes, planned {tensor.nbytes}")
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()

