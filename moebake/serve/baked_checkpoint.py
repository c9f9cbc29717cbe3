"""A moebake output directory opened for serving: manifest, index, shard headers, expert-range reads.

Target-independent: each target's runtime (e.g. :mod:`moebake.serve.sm90_cutlass`) subclasses
:class:`BakedCheckpoint` and adds ``load_experts``. Nothing is read at open time but the manifest
and the index; a shard's header is parsed when a tensor of it is first needed, and tensor data is
read only for the experts asked for (a contiguous dim-0 range is one contiguous byte range of a
safetensors tensor, since tensors are stored C-order).
"""

from pathlib import Path

import torch

from moebake.schema.checksums import checksum_problem
from moebake.schema.manifest import MANIFEST_NAME, LayerRecord, Manifest
from moebake.errors import CheckpointError, IntegrityError, InvalidArgumentError, UnsupportedError
from moebake.formats.safetensors_file import DTYPES, SafetensorsFile, read_header
from moebake.schema.index import read_index
from moebake.serve.platform import Platform
from moebake.serve.staged_reader import ByteRange, LoadStats, StagedReader


class BakedCheckpoint:
    """Manifest + shards of a baked output directory ``root``; see the module docstring."""

    target: str = ""  # set by each target's subclass
    layout_version: int = 0  # the target's LAYOUT_VERSION that the subclass's runtime reads

    def __init__(self, root: Path, manifest: Manifest, platform: Platform):
        self.root = Path(root)
        self.manifest = manifest
        self.platform = platform
        self.manifest_path = self.root / MANIFEST_NAME
        version = manifest.target_layout_version
        if version != self.layout_version:
            raise UnsupportedError(f"{self.manifest_path}: {self.target} layout version {version!r}; this runtime reads {self.layout_version}")
        self.index = read_index(self.root)
        self.weight_map = self.index.weight_map
        self._headers: dict[str, SafetensorsFile] = {}
        self._readers: dict[torch.device, StagedReader] = {}
        self._verified: set[str] = set()

    def layer(self, index: int) -> LayerRecord:
        """The manifest record of MoE layer ``index``; MoebakeError if the checkpoint has no such layer."""
        for record in self.manifest.layers:
            if record.index == index:
                return record
        known = [record.index for record in self.manifest.layers]
        raise InvalidArgumentError(f"{self.manifest_path}: no MoE layer {index} (layers: {known})")

    def rank_experts(self, record: LayerRecord, ep_rank: int, ep_size: int) -> tuple[int, int]:
        """The contiguous expert range ``[start, stop)`` that EP rank ``ep_rank`` of ``ep_size`` owns in a layer.

        MoebakeError unless ``ep_size`` divides the layer's expert count and ``0 <= ep_rank < ep_size``.
        """
        experts = record.experts
        if ep_size < 1 or experts % ep_size or not 0 <= ep_rank < ep_size:
            raise InvalidArgumentError(
                f"{self.manifest_path}: layer {record.prefix} has {experts} experts, which EP rank {ep_rank} of "
                f"{ep_size} cannot split evenly (need ep_size dividing {experts} and 0 <= ep_rank < ep_size)"
            )
        per_rank = experts // ep_size
        return ep_rank * per_rank, (ep_rank + 1) * per_rank

    def _shard_of(self, name: str) -> SafetensorsFile:
        shard_name = self.weight_map.get(name)
        if shard_name is None:
            raise CheckpointError(f"{self.index.path}: tensor {name} is not in the index")
        if shard_name not in self._headers:
            self._headers[shard_name] = read_header(self.root / shard_name)
        return self._headers[shard_name]

    def verify_files(self, tensor_names: list[str]) -> None:
        """Check the SHA-256 and size of every shard holding ``tensor_names`` against the manifest.

        Reads those shards whole (once per checkpoint object); MoebakeError on the first mismatch.
        """
        files = self.manifest.files
        for shard_name in sorted({self.weight_map.get(n) for n in tensor_names} - self._verified - {None}):
            path = self.root / shard_name
            record = files.get(shard_name)
            if record is None:
                raise IntegrityError(f"{path}: not listed in {self.manifest_path}")
            size = path.stat().st_size if path.is_file() else None
            if size != record.bytes:
                raise IntegrityError(f"{path}: {size} bytes, {self.manifest_path} says {record.bytes}")
            if problem := checksum_problem(path, record.to_json()):
                raise IntegrityError(f"{problem} in {self.manifest_path}")
            self._verified.add(shard_name)

    def read_experts(self, record: LayerRecord, short_names: list[str], start: int, stop: int,
                     device: torch.device) -> tuple[dict[str, torch.Tensor], LoadStats]:
        """Experts ``[start, stop)`` of the layer's tensors ``short_names`` (manifest names), on ``device``.

        Returns ``{short name: tensor [stop - start, ...]}`` with the dtype and trailing shape the
        manifest records (checked against the shard header), and the load's statistics. Only the
        bytes of those experts are read.
        """
        ranges, tensors = [], {}
        for short in short_names:
            name = record.prefix + short
            shard = self._shard_of(name)
            entry = shard.tensors[name]
            expected = record.tensors[short]
            if entry.dtype != expected.dtype or tuple(entry.shape) != expected.shape:
                raise IntegrityError(
                    f"{shard.path}: tensor {name} is {entry.dtype} {list(entry.shape)}, "
                    f"{self.manifest_path} says {expected.dtype} {list(expected.shape)}"
                )
            dest = torch.empty((stop - start, *entry.shape[1:]), dtype=DTYPES[entry.dtype][0], device=device)
            offset = shard.data_start + entry.begin + start * entry.row_bytes
            ranges.append(ByteRange(shard.path, offset, dest.view(-1).view(torch.uint8), name))
            tensors[short] = dest
        return tensors, self._reader(device).read(ranges)

    def _reader(self, device: torch.device) -> StagedReader:
        if device not in self._readers:
            self._readers[device] = StagedReader(device)
        return self._readers[device]
