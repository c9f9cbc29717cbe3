"""A moebake output directory opened for serving: manifest, index, shard headers, expert-range reads.

Target-independent: each target's runtime (e.g. :mod:`moebake.serve.sm90_cutlass`) subclasses
:class:`BakedCheckpoint` and adds ``load_experts``. Nothing is read at open time but the manifest
and the index; a shard's header is parsed when a tensor of it is first needed, and tensor data is
read only for the experts asked for, by the engine-neutral :class:`~moebake.loading.rank_loader.RankLoader`
that the SGLang and vLLM plugins use too.
"""

from pathlib import Path

import torch

from moebake.errors import IntegrityError, InvalidArgumentError, UnsupportedError
from moebake.loading.rank_loader import BakeFiles, ExpertRun, RankLoader, rank_runs
from moebake.loading.staged_reader import LoadStats
from moebake.schema.checksums import checksum_problem
from moebake.schema.enums import DType
from moebake.schema.manifest import MANIFEST_NAME, LayerRecord, Manifest
from moebake.serve.platform import Platform


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
            raise UnsupportedError(
                f"{self.manifest_path}: {self.target} layout version {version!r}; this runtime reads {self.layout_version}"
            )
        self.files = BakeFiles(self.root, manifest)  # the index (read now) and shard headers, for every read
        self.weight_map = self.files.weight_map
        self._loaders: dict[torch.device, RankLoader] = {}
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
        try:
            (run,) = rank_runs(record.experts, ep_rank, ep_size)
        except InvalidArgumentError as err:
            raise InvalidArgumentError(f"{self.manifest_path}: layer {record.prefix} {err}") from None
        return run.first, run.first + run.count

    def verify_files(self, tensor_names: list[str]) -> None:
        """Check the SHA-256 and size of every shard holding ``tensor_names`` against the manifest.

        Reads those shards whole (once per checkpoint object); MoebakeError on the first mismatch.
        """
        files = self.manifest.files
        named = {self.weight_map.get(n) for n in tensor_names}
        for shard_name in sorted({name for name in named if name is not None} - self._verified):
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

    def read_experts(
        self, record: LayerRecord, short_names: list[str], start: int, stop: int, device: torch.device
    ) -> tuple[dict[str, torch.Tensor], LoadStats]:
        """Experts ``[start, stop)`` of the layer's tensors ``short_names`` (manifest names), on ``device``.

        Returns ``{short name: tensor [stop - start, ...]}`` with the dtype and trailing shape the
        manifest records (checked against the shard header), and the load's statistics. Only the
        bytes of those experts are read.
        """
        tensors = {
            short: torch.empty(
                (stop - start, *record.tensors[short].shape[1:]), dtype=DType(record.tensors[short].dtype).torch, device=device
            )
            for short in short_names
        }
        if device not in self._loaders:
            self._loaders[device] = RankLoader(self.files, device)
        return tensors, self._loaders[device].load(record, tensors, [ExpertRun(first=start, slot=0, count=stop - start)])
