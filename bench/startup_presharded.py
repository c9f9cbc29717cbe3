"""SGLang's own presharded load (``--load-format presharded``: ``model_loader/loader.py: PreshardedModelLoader``)
around the start-up benchmark's holder model. Not a script: ``bench/startup_bench.py`` imports it.

* :func:`dump`: what SGLang's first-time load does after loading the weights
  (``_first_time_load_and_dump``): ``_collect_shard_config``, ``_ensure_presharded_dir_writable``,
  ``_collect_extra_tensors`` and ``_dump_state_to_disk``. Every rank of the world runs it at once (it hashes
  each tensor, writes a manifest per rank, meets at barriers, and rank 0 writes the plan and ``READY``). The
  dump is under ``<source>/presharded/TP-<tp>-sig-<hash of the parallel and quantization settings>/`` and is
  valid for that parallel configuration only.
* :func:`reload`: SGLang's ``_load_from_presharded``: it builds the model (``_initialize_model``), runs every
  layer's post-load step (``process_weights_after_loading``) on the uninitialised parameters, reads the rank's
  files (``safe_open(...).get_tensor`` for each of the rank's keys, one file at a time) and copies each tensor
  into its parameter (``copy_`` from host memory).

What is not SGLang's: ``_initialize_model`` and ``_get_quantization_config`` answer with the benchmark's
holder and its quantization config, and the model config is a stand-in holding the fields that code reads
(``dtype``, ``quantization``, ``model_path``, ``is_draft_model``).
"""

from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

READY_RECORD = "presharded-ep{ep}.json"
"""In the benchmark's directory: where the dump of EP ``ep`` is (written by rank 0 once SGLang has written ``READY``)."""


def record_dump(directory: Path, ep: int, dump: Path) -> None:
    """Record, in the benchmark's ``directory``, that EP ``ep``'s dump is at ``dump``."""
    import json

    (Path(directory) / READY_RECORD.format(ep=ep)).write_text(json.dumps({"directory": str(dump)}))


def recorded_dump(directory: Path, ep: int) -> Path | None:
    """The dump of EP ``ep`` recorded in the benchmark's ``directory``, or None."""
    import json

    record = Path(directory) / READY_RECORD.format(ep=ep)
    return Path(json.loads(record.read_text())["directory"]) if record.is_file() else None


def drop_dump(directory: Path, ep: int) -> None:
    """Delete EP ``ep``'s recorded dump and its record (only what the benchmark made)."""
    import shutil

    dump = recorded_dump(directory, ep)
    if dump is not None:
        shutil.rmtree(dump, ignore_errors=True)
        (Path(directory) / READY_RECORD.format(ep=ep)).unlink()


def _loader():
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import PreshardedModelLoader

    return PreshardedModelLoader(LoadConfig())


def _model_config(source: Path, quantization: str):
    import torch

    return SimpleNamespace(
        dtype=torch.bfloat16,
        quantization=quantization,
        model_path=str(source),
        is_draft_model=False,
        hf_config=SimpleNamespace(model_type="gpt_oss"),
    )


@contextmanager
def _holder_as_sglangs_model(build_model, quant_config):
    """SGLang's ``_initialize_model`` builds the holder (``build_model()``), ``_get_quantization_config`` gives
    ``quant_config``."""
    import sglang.srt.model_loader.loader as loader_module

    with (
        mock.patch.object(loader_module, "_initialize_model", lambda *args, **kwargs: build_model()),
        mock.patch.object(loader_module, "_get_quantization_config", lambda *args, **kwargs: quant_config),
    ):
        yield


def dump(model, build_model, quant_config, source: Path) -> Path:
    """Dump this rank's post-processed ``model`` the way SGLang's first-time presharded load does; the dump's
    directory. Every rank of the world calls it at the same time."""
    loader = _loader()
    config = _model_config(source, quant_config.get_name())
    with _holder_as_sglangs_model(build_model, quant_config):
        shard_config = loader._collect_shard_config(config)
    directory = Path(loader._presharded_dir(config, shard_config))
    loader._ensure_presharded_dir_writable(str(directory))
    state_dict = dict(model.state_dict())
    extras = loader._collect_extra_tensors(model)
    loader._dump_state_to_disk(state_dict, extras, str(directory), shard_config)
    return directory


def reload(build_model, quant_config, source: Path, directory: Path, device: str):
    """The model of this rank loaded from the dump at ``directory`` by SGLang's ``_load_from_presharded``."""
    loader = _loader()
    with _holder_as_sglangs_model(build_model, quant_config):
        return loader._load_from_presharded(_model_config(source, quant_config.get_name()), SimpleNamespace(device=device), str(directory))


def dump_bytes(directory: Path) -> int:
    """Bytes of the dump's files on disk."""
    return sum(p.stat().st_size for p in Path(directory).iterdir() if p.is_file())


def rank_bytes(directory: Path, rank: int) -> int:
    """Bytes of tensor data rank ``rank`` reads from the dump at ``directory`` (its plan's reads, each stored
    tensor once)."""
    import json

    from sglang.srt.model_loader.loader import PreshardedModelLoader

    plan = json.loads((Path(directory) / PreshardedModelLoader.CHECKSUM_FILENAME).read_text())
    sizes = {(f["filename"], t["stored_key"]): t["size"] for f in plan["files"] for t in f["tensors"]}
    reads = {(r["filename"], r["stored_key"]) for r in plan["rank_to_reads"].get(str(rank), [])}
    return sum(sizes[key] for key in reads)
