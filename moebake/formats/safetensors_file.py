"""The safetensors file format: its rules, in one place, for reading headers and writing files.

Byte layout of a file:
  * 8 bytes: ``N``, the header length, little-endian u64;
  * ``N`` bytes: UTF-8 JSON ``{"__metadata__": {str: str}, name: {"dtype", "shape",
    "data_offsets": [begin, end]}, ...}``, starting with ``{`` and right-padded with spaces;
  * the data buffer: every tensor's bytes, C order, little-endian, at ``data_offsets`` relative to
    the buffer's start. Tensors tile the buffer with no holes or overlaps, and the file ends
    exactly at the last tensor's end.
Writers here pad the header to a multiple of 8 bytes so the buffer starts 8-aligned.
"""

import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from moebake.errors import CheckpointError, InvalidArgumentError
from moebake.schema.config_values import as_count, json_type, parse_json, short_repr
from moebake.schema.enums import DType
from moebake.schema.files import open_regular

HEADER_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"

# safetensors dtype code -> torch dtype (None where this torch has no such dtype); bits per element.
# Every code safetensors 0.8 accepts (:class:`~moebake.schema.enums.DType`); tensors of any of them pass through as opaque bytes.
DTYPES: dict[str, tuple[torch.dtype | None, int]] = {code.value: (code.torch, code.bits) for code in DType}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: dtype code, shape, and byte range in the data buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def row_bytes(self) -> int:
        """Bytes per index of dim 0 (a dim-0 slice ``[a:b]`` is bytes ``[a*row_bytes, b*row_bytes)``)."""
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else 0


SourceReader = Callable[[str, int, int], np.ndarray]
"""``(path, offset, length)`` -> uint8 bytes ``[offset, offset + length)`` of the file (fewer at its end)."""


def read_file_range(path: str, offset: int, length: int) -> np.ndarray:
    """The plain :data:`SourceReader`: one fresh array, filled by ``readinto`` (numpy asks for huge pages)."""
    array = np.empty(length, np.uint8)
    view, got = memoryview(array), 0
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while got < length and (n := f.readinto(view[got:])):  # one read returns at most ~2 GiB
            got += n
    return array[:got]


@dataclass(frozen=True)
class SafetensorsFile:
    """A parsed and validated safetensors header; data is read on demand, never mapped.

    ``reader`` (optional) serves the reads instead of :func:`read_file_range`; a conversion's
    reads ahead, times its reads and hashes the source file in the same pass.
    """

    path: str
    data_start: int
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    reader: SourceReader | None = field(default=None, compare=False, repr=False)

    def read_bytes(self, entry: TensorEntry, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """uint8 tensor of bytes ``[start, stop)`` of ``entry``'s data."""
        stop = entry.nbytes if stop is None else stop
        data = (self.reader or read_file_range)(self.path, self.data_start + entry.begin + start, stop - start)
        if len(data) != stop - start:
            raise CheckpointError(f"{self.path}: tensor {entry.name} is truncated (read {len(data)} of {stop - start} bytes)")
        return torch.from_numpy(data)

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of dim 0 of tensor ``name``, with its dtype (raw bytes for dtypes torch lacks)."""
        entry = self.tensors[name]
        raw = self.read_bytes(entry, start * entry.row_bytes, stop * entry.row_bytes)
        torch_dtype, _ = DTYPES[entry.dtype]
        if torch_dtype is None or DTYPES[entry.dtype][1] < 8:
            return raw.reshape(stop - start, -1)
        return raw.view(torch_dtype).reshape(stop - start, *entry.shape[1:])


def tensor_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of this safetensors dtype code and shape occupies."""
    bits = DTYPES[dtype][1] * math.prod(shape)
    if bits % 8:
        raise InvalidArgumentError(f"{dtype} tensor of shape {list(shape)} does not fill whole bytes")
    return bits // 8


def read_header(path: str | os.PathLike, reader: SourceReader | None = None) -> SafetensorsFile:
    """Parse and validate the header of ``path`` (its data to be read through ``reader``, if given); raises
    CheckpointError naming the file on any violation."""
    path = str(path)
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(HEADER_LENGTH_BYTES)
            if len(prefix) < HEADER_LENGTH_BYTES:
                raise CheckpointError(f"{path}: not a safetensors file (only {size} bytes)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES or HEADER_LENGTH_BYTES + header_len > size:
                raise CheckpointError(f"{path}: corrupt safetensors header (declares {header_len} header bytes, file has {size})")
            raw = f.read(header_len)
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read ({err.strerror})") from None
    header = parse_json(raw, f"{path}: corrupt safetensors header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (expected a JSON object, found {json_type(header)})")
    metadata = header.pop(METADATA_KEY, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(
            f"{path}: corrupt safetensors header ({METADATA_KEY} is {short_repr(metadata)}, expected an object of strings)"
        )
    tensors = {name: _parse_entry(path, name, spec) for name, spec in header.items()}
    data_start = HEADER_LENGTH_BYTES + header_len
    _check_tiling(path, tensors.values(), size - data_start)
    return SafetensorsFile(path, data_start, tensors, metadata, reader)


def _header_int(value: object) -> int | None:
    """A header's shape dimension or offset: a JSON integer >= 0 (a u64 in safetensors), else None."""
    return as_count(value, maximum=(1 << 64) - 1, integral_floats=False)


def _parse_entry(path: str, name: str, spec: object) -> TensorEntry:
    """One header entry, checked as safetensors checks it: ``dtype`` a known code, ``shape`` a list of
    non-negative integers, ``data_offsets`` two integers ``0 <= begin <= end`` spanning exactly the
    bytes the shape needs (JSON floats, strings and booleans are not integers here)."""
    where = f"{path}: corrupt safetensors header: tensor {name}"
    if not isinstance(spec, dict):
        raise CheckpointError(f"{where} is {json_type(spec)}, expected an object with dtype, shape, data_offsets")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(f"{path}: tensor {name} has unknown dtype {short_repr(dtype)}")
    if not isinstance(shape, list) or any(_header_int(d) is None for d in shape):
        raise CheckpointError(f"{where}: shape {short_repr(shape)} is not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or any(_header_int(o) is None for o in offsets) or offsets[0] > offsets[1]:
        raise CheckpointError(f"{where}: data_offsets {short_repr(offsets)} is not [begin, end] with integers 0 <= begin <= end")
    shape, (begin, end) = tuple(shape), offsets
    try:
        nbytes = tensor_nbytes(dtype, shape)
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None
    if end - begin != nbytes:
        raise CheckpointError(f"{path}: tensor {name} spans {end - begin} bytes, but {dtype} {list(shape)} needs {nbytes}")
    return TensorEntry(name, dtype, shape, begin, end)


def _check_tiling(path: str, entries: Iterable[TensorEntry], buffer_len: int) -> None:
    position = 0
    for entry in sorted(entries, key=lambda e: (e.begin, e.end)):
        if entry.begin != position:
            raise CheckpointError(f"{path}: corrupt safetensors header (tensor {entry.name} starts at {entry.begin}, expected {position})")
        position = entry.end
    if position != buffer_len:
        problem = "truncated" if position > buffer_len else "has trailing bytes"
        raise CheckpointError(f"{path}: file is {problem} (tensors need {position} data bytes, file holds {buffer_len})")


def encode_header(tensors: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str]) -> tuple[bytes, list[int]]:
    """Header bytes (length prefix + JSON padded to 8) for tensors laid out in the given order.

    Returns the header and each tensor's begin offset in the data buffer.
    """
    header: dict = {METADATA_KEY: dict(metadata)}
    offsets, position = [], 0
    for name, dtype, shape in tensors:
        nbytes = tensor_nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [position, position + nbytes]}
        offsets.append(position)
        position += nbytes
    body = json.dumps(header, separators=(",", ":")).encode("utf-8")
    body += b" " * (-(HEADER_LENGTH_BYTES + len(body)) % 8)
    return struct.pack("<Q", len(body)) + body, offsets
