"""vLLM's ``--load-format moebake``: reads the baked expert tensors into the ``moebake`` MoE layers itself
(this EP rank's experts' rows only, once, straight from the files into the parameters through
:class:`moebake.loading.rank_loader.RankLoader`), and hands every other tensor to the model's own
``load_weights`` (GPT-OSS's attention, router, norms, embeddings load as they always do), each read from
the files exactly (:func:`other_tensors`); the baked tensors never go through vLLM's iterator.

vLLM's GPT-OSS loader cannot be given the baked experts: for a quantization it does not know it
transposes ``*.w13_weight`` (``_load_weights_other``). Each baked tensor is checked against the
manifest (dtype, shape) before a byte is copied, and every baked parameter must be filled: the moebake
MoE methods (:class:`moebake.engines.vllm.loader_filled_experts.LoaderFilledExperts`) refuse to set up a layer that was not.
Parameters vLLM derives from the baked tensors (NVFP4's per-expert scalars) are filled by the method's
``load_derived`` from the whole baked tensors.

vLLM's post-load step then runs as usual: the MoE layers only build their kernel (they transform
nothing), while the rest of the checkpoint, which is the source's own tensors, gets vLLM's normal
processing. That is why the whole load is not wrapped in ``weights_already_processed()``, which would
tell every other layer (e.g. the KV-cache scales) that its tensors are post-processed too.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from moebake.engines.layer_type import EngineLayer
from moebake.engines.vllm import internals
from moebake.engines.vllm.bake import refuse
from moebake.engines.vllm.loader_filled_experts import LoaderFilledExperts
from moebake.errors import MoebakeError
from moebake.formats.safetensors_file import DTYPES
from moebake.loading.checkpoint_tensors import CheckpointTensors
from moebake.loading.rank_loader import BakeFiles, ExpertRun, RankLoader, runs_from_slots
from moebake.loading.staged_reader import ByteRange, own_reader

_PATTERNS = ["*.safetensors", "*.json"]


def weight_map(files: BakeFiles) -> dict[str, str]:
    """Tensor name -> shard file name, from the bake's index (``moebake convert`` always writes one)."""
    try:
        return files.weight_map
    except MoebakeError as err:
        raise refuse(str(err)) from None


def local_expert_runs(layer: EngineLayer, experts: int) -> list[ExpertRun]:
    """The runs of global experts this EP rank holds, and the parameter rows vLLM gives them."""
    return runs_from_slots(internals.local_slot(layer, expert) for expert in range(experts))


def copy_baked_experts(layer: EngineLayer, method: LoaderFilledExperts, loader: RankLoader) -> None:
    """Fill ``layer``'s baked parameters from the files: this rank's experts' rows of each tensor vLLM holds as
    it is (read by ``loader`` straight into the parameters), then what the method derives from whole baked tensors."""
    record = method.layer_record
    runs = local_expert_runs(layer, record.experts)
    held = sum(run.count for run in runs)
    destinations, parameters = {}, []
    for short, parameter_name in method.copied_tensors().items():
        parameter = getattr(layer, parameter_name)
        if parameter.shape[0] != held:
            raise refuse(f"{record.prefix + short}: this EP rank holds {held} experts but vLLM made {parameter.shape[0]} slots")
        destinations[short] = parameter.data
        parameters.append(parameter)
    try:
        loader.load(record, destinations, runs)
    except MoebakeError as err:
        raise refuse(str(err)) from None
    for parameter in parameters:
        parameter.moebake_loaded = True

    def read_whole(short: str):
        shard, entry = loader.files.stored(record, short)
        with safe_open(shard.path, framework="pt") as f:
            return f.get_tensor(entry.name)

    in_slot_order = sorted(runs, key=lambda run: run.slot)
    method.load_derived(layer, read_whole, [e for run in in_slot_order for e in range(run.first, run.first + run.count)])


def other_tensors(files: CheckpointTensors, skip: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint that the index maps to its shard and that is not in ``skip``, one at a time:
    shards in name order, names sorted within each (as safetensors lists them). Each is read whole from its file into
    a CPU tensor of its own, of the stored dtype and shape (a :class:`StagedReader` onto the CPU: ``os.preadv`` with
    the kernel's readahead off, little-endian bytes as stored): its bytes and no others, where safetensors' mmap'd
    view would fault in up to ``read_ahead_kb`` around it, the next layer's baked expert rows (other EP ranks' among
    them) included. A tensor of a dtype torch lacks, or narrower than a byte, is safetensors' own view. Host memory:
    the tensor being handed, one at a time."""
    reader = own_reader("cpu")
    try:
        for shard_name in sorted(set(files.weight_map.values())):
            shard = files.header(shard_name)
            for name in sorted(shard.tensors):
                if name in skip or files.weight_map.get(name) != shard_name:
                    continue
                entry = shard.tensors[name]
                dtype, bits = DTYPES[entry.dtype]
                if dtype is None or bits < 8:
                    with safe_open(shard.path, framework="pt") as f:
                        yield name, f.get_tensor(name)
                    continue
                tensor = torch.empty(entry.shape, dtype=dtype)
                try:
                    reader.read([ByteRange(str(shard.path), shard.data_start + entry.begin, tensor.reshape(-1).view(torch.uint8), name)])
                except MoebakeError as err:
                    raise refuse(str(err)) from None
                yield name, tensor
    finally:
        reader.close()


class MoebakeModelLoader(BaseModelLoader):
    """``--load-format moebake``: baked experts copied here, the rest through ``model.load_weights``."""

    def checkpoint_directory(self, model_config: Any) -> Path:
        path = Path(model_config.model)
        if path.is_dir():
            return path
        from vllm.model_executor.model_loader.weight_utils import download_weights_from_hf

        return Path(
            download_weights_from_hf(
                model_config.model,
                self.load_config.download_dir,
                _PATTERNS,
                model_config.revision,
                ignore_patterns=self.load_config.ignore_patterns,
            )
        )

    def download_model(self, model_config: Any) -> None:
        self.checkpoint_directory(model_config)

    def load_weights(self, model: Any, model_config: Any) -> None:
        directory = self.checkpoint_directory(model_config)
        layers = [
            (name, module)
            for name, module in model.named_modules()
            if isinstance(getattr(module, "quant_method", None), LoaderFilledExperts)
        ]
        if not layers:
            raise refuse(
                f"{directory}: the model has no moebake MoE layer (config.json's quant_method must be "
                f"'moebake'; was the checkpoint baked by moebake convert?)"
            )
        bake = layers[0][1].quant_method.bake
        loader = RankLoader(BakeFiles(directory, bake.manifest), next(layers[0][1].parameters()).device)
        weight_map(loader.files)  # the one read of the index (refused here if unreadable): every other read uses it
        for _, layer in layers:
            copy_baked_experts(layer, layer.quant_method, loader)
        self.load_stats = loader.total
        baked = bake.baked_tensor_names()
        model.load_weights(other_tensors(loader.files, baked))
        unloaded = [
            f"{name}.{p}" for name, layer in layers for p in layer.quant_method.baked_parameters() if not getattr(layer, p).moebake_loaded
        ]
        if unloaded:
            raise refuse(f"{directory}: baked parameters never loaded: {', '.join(unloaded[:4])}{' ...' if len(unloaded) > 4 else ''}")
