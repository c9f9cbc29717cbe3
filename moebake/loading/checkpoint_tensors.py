"""Where a checkpoint directory's tensors lie: its index (or its one ``model.safetensors``) and each shard's
header, parsed once when first needed. Never reads tensor data."""

from pathlib import Path

from moebake.formats.safetensors_file import SafetensorsFile, TensorEntry, read_header
from moebake.schema.index import read_index

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointTensors:
    """The tensors of checkpoint ``directory``: ``weight_map`` (name -> shard file name) and the shards' headers."""

    def __init__(self, directory: str | Path):
        self.root = Path(directory)
        self._weight_map: dict[str, str] | None = None
        self._headers: dict[str, SafetensorsFile] = {}

    @property
    def weight_map(self) -> dict[str, str]:
        if self._weight_map is None:
            self._weight_map = self._read_weight_map()
        return self._weight_map

    def _read_weight_map(self) -> dict[str, str]:
        """``model.safetensors.index.json``'s map, or every tensor of a lone ``model.safetensors``."""
        if (self.root / SINGLE_FILE).is_file() and not (self.root / INDEX_FILE).exists():
            return {name: SINGLE_FILE for name in self.header(SINGLE_FILE).tensors}
        return read_index(self.root).weight_map

    def header(self, shard_name: str) -> SafetensorsFile:
        """The parsed header of shard ``shard_name`` (a file of this directory), parsed on first use."""
        if shard_name not in self._headers:
            self._headers[shard_name] = read_header(self.root / shard_name)
        return self._headers[shard_name]

    def find(self, name: str) -> tuple[SafetensorsFile, TensorEntry] | None:
        """The shard header and entry of tensor ``name``, or None where the checkpoint does not store it."""
        shard_name = self.weight_map.get(name)
        if shard_name is None:
            return None
        shard = self.header(shard_name)
        entry = shard.tensors.get(name)
        return None if entry is None else (shard, entry)
