"""The ``moebake`` quantization config SGLang builds from a bake's config.json ``quantization_config``.

``from_config`` reads the manifest the config names (in the model directory SGLang serves), refuses
when the manifest's hash differs from the one config.json recorded at baking, and builds the
source's own quantization config from ``original`` (e.g. ``mxfp4`` for GPT-OSS, ``modelopt_fp4`` for
ModelOpt NVFP4): every layer that is not a baked MoE layer is handled by it, exactly as stock SGLang
would handle the source checkpoint.
"""

import logging
import re
from pathlib import Path
from typing import Any

import torch
from sglang.srt.layers.quantization.base_config import QuantizationConfig

from moebake.engines.layer_type import EngineLayer
from moebake.engines.quantization_identity import MoebakeQuantization
from moebake.engines.sglang import internals, loader_hook, refusals
from moebake.engines.sglang.refusals import MoebakeRefusal, check_parallelism
from moebake.errors import MoebakeError
from moebake.loading.rank_loader import BakeFiles, RankLoader
from moebake.loading.readahead import ReadAhead, ReadAheadStats
from moebake.loading.readahead import enabled as readahead_enabled
from moebake.loading.served_manifest import read_served_manifest
from moebake.loading.staged_reader import StagedReader, own_reader
from moebake.schema.manifest import MANIFEST_NAME, LayerRecord, Manifest


def model_directory() -> Path:
    """The directory SGLang serves (``--model-path``; a Hub id resolves to its local snapshot)."""
    from sglang.srt.runtime_context import get_server_args

    args = get_server_args()
    path = Path(args.model_path)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(args.model_path, revision=getattr(args, "revision", None), allow_patterns=["moebake.json"]))


def modelopt_algorithms(original: dict) -> set[str]:
    """Every ModelOpt ``quant_algo`` a quantization config names (upper case): at its top level, in an
    ``hf_quant_config.json``'s ``quantization`` section, per module in ``quantized_layers`` (``MIXED_PRECISION``)
    and per group in ``config_groups.*.weights``."""
    sections = [original, original.get("quantization")]
    sections += list((original.get("quantized_layers") or {}).values())
    sections += [(group or {}).get("weights") for group in (original.get("config_groups") or {}).values() if isinstance(group, dict)]
    return {
        str(section["quant_algo"]).upper() for section in sections if isinstance(section, dict) and section.get("quant_algo") is not None
    }


def _original_config(original: dict | None, original_file: str | None) -> QuantizationConfig | None:
    """SGLang's own quantization config for the source's ``original`` quantization config (None: unquantized)."""
    if not original:
        return None
    from sglang.srt.layers.quantization import get_quantization_config

    method = str(original.get("quant_method", "")).lower()
    if original_file == "hf_quant_config.json" or method in ("", "modelopt"):
        algorithms = modelopt_algorithms(original)
        method = "modelopt_fp4" if "NVFP4" in algorithms else "modelopt_fp8" if "FP8" in algorithms else "modelopt"
    try:
        return get_quantization_config(method).from_config(original)
    except Exception as err:  # SGLang raises ValueError/KeyError/NotImplementedError for what it cannot build
        raise MoebakeRefusal(
            f"config.json quantization_config.original: SGLang cannot build its {method!r} config for the non-MoE layers ({err})"
        ) from None


def _check_parallelism(manifest: Manifest) -> None:
    """The MoE parallelism refusals, before any layer is built (SGLang's FusedMoE would otherwise stop at
    its own bare assertion on an expert count the EP size does not divide)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    for record in manifest.layers:
        check_parallelism(record, parallel.moe_tp_size, parallel.moe_ep_size)


def _check_backends(manifest: Manifest) -> None:
    """A bake for DeepEP or DeepGEMM (``deepep-bf16``, ``cutedsl-deepep``): the server's all-to-all and runner backends
    (each layer checks them again as it is built) and the module behind each, refused here, before any layer is built
    (SGLang stops only once its DeepEP dispatcher is made; without ``deep_gemm`` it turns DeepGEMM off)."""
    engine = manifest.engine
    if engine is None or not refusals.needs_backend_packages(engine):
        return
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend, get_moe_runner_backend

    refusals.check_backends(engine, get_moe_runner_backend().value, get_moe_a2a_backend().value)
    refusals.check_backend_packages(manifest.target, engine, internals.import_problem)


logger = logging.getLogger(__name__)

_DEEPSEEK_V4_EXPERTS = re.compile(r"model\.(?:layers\.(\d+)|decoder)\.mlp\.experts\.")


def deepseek_native_prefix(prefix: str) -> str:
    """SGLang's DeepSeek-V4 module prefix of an expert layer as the checkpoint names it: ``model.layers.N.mlp.experts.``
    -> ``layers.N.ffn.experts.``; the MTP draft's ``model.decoder.mlp.experts.`` -> ``mtp.0.ffn.experts.`` (SGLang
    0.5.17-0.5.23's ``DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format`` inverted; SGLang serves one MTP
    block). Any other prefix is returned as it is."""
    found = _DEEPSEEK_V4_EXPERTS.fullmatch(prefix)
    if found is None:
        return prefix
    return f"layers.{found.group(1)}.ffn.experts." if found.group(1) is not None else "mtp.0.ffn.experts."


class MoebakeConfig(MoebakeQuantization, QuantizationConfig):
    """``--quantization moebake``: baked MoE layers from the manifest, everything else as the source's config."""

    def __init__(self, quant: dict, manifest: Manifest, manifest_path: Path, original: QuantizationConfig | None):
        super().__init__()
        self.quant, self.manifest, self.manifest_path, self.original = quant, manifest, manifest_path, original
        self.records = {record.prefix: record for record in manifest.layers}
        self.files = BakeFiles(manifest_path.parent, manifest)  # index and shard headers, parsed once for every layer
        self._rank_loaders: dict[torch.device, RankLoader] = {}
        self._readers: dict[torch.device, StagedReader] = {}
        self._readaheads: dict[torch.device, ReadAhead] = {}

    @staticmethod
    def _device(device: torch.device | str) -> torch.device:
        """``device``, where ``cuda`` means the current CUDA device."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    def reader(self, device: torch.device) -> StagedReader:
        """The one :class:`StagedReader` of this bake onto ``device``: its reading threads and pinned staging ring
        serve every layer's experts and the whole-model loader's other tensors. ``cuda`` means the current CUDA
        device."""
        device = self._device(device)
        if device not in self._readers:
            self._readers[device] = own_reader(device)
        return self._readers[device]

    def readahead(self, device: torch.device) -> ReadAhead | None:
        """The one :class:`~moebake.loading.readahead.ReadAhead` of :meth:`reader` onto ``device`` (told of every
        chunk the reader reads), or None unless ``MOEBAKE_READAHEAD=1``. Each MoE layer plans its rows on it as it is
        built, the whole-model loader the other tensors before the iteration; :meth:`stop_readahead` ends it."""
        device = self._device(device)
        if not readahead_enabled():
            return None
        if device not in self._readaheads:
            readahead = ReadAhead()
            self.reader(device).on_consumed = readahead.consumed
            self._readaheads[device] = readahead
        return self._readaheads[device]

    def stop_readahead(self) -> list[ReadAheadStats]:
        """End every read-ahead of this bake (the load has ended, or failed); what each did (those not ended before).
        Never raises; a later load (a reload of the weights) has none."""
        found = []
        for device, readahead in self._readaheads.items():
            if readahead.stopped:
                continue
            try:
                found.append(readahead.stop())
                self.reader(device).on_consumed = None
            except Exception as err:  # never into the engine
                logger.debug("moebake: stopping the read-ahead: %s", err)
        return found

    def rank_loader(self, device: torch.device) -> RankLoader:
        """The one :class:`RankLoader` of this bake onto ``device`` (reading through :meth:`reader`)."""
        if device not in self._rank_loaders:
            self._rank_loaders[device] = RankLoader(self.files, device, reader=self.reader(device))
        return self._rank_loaders[device]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "MoebakeConfig":
        internals.check_version()
        loader_hook.check_installed()
        if flag := internals.loader_reads_every_byte():
            logger.warning(
                "moebake: %s makes SGLang read every shard whole, so the baked experts are read twice (the "
                "plugin reads each rank's rows itself); start without it for the fastest start-up",
                flag,
            )
        manifest_path = model_directory() / MANIFEST_NAME
        try:
            manifest = read_served_manifest(manifest_path.parent, config)
        except MoebakeError as err:
            raise MoebakeRefusal(f"cannot use the bake's manifest: {err}") from None
        internals.check_release(manifest)
        _check_parallelism(manifest)
        _check_backends(manifest)
        return cls(config, manifest, manifest_path, _original_config(config.get("original"), config.get("original_file")))

    def get_scaled_act_names(self) -> list[str]:
        return []

    def update_packed_modules_mapping(self, mapping: dict) -> None:
        super().update_packed_modules_mapping(mapping)
        if self.original is not None:
            self.original.update_packed_modules_mapping(mapping)

    def record_for(self, prefix: str) -> LayerRecord | None:
        """The manifest's layer record of the MoE layer at ``prefix`` (``...mlp.experts``), or None. A DeepSeek-V4
        bake's records keep the checkpoint's DeepSeek-native prefixes, which SGLang's model renames
        (:func:`deepseek_native_prefix`)."""
        prefix = prefix.rstrip(".") + "."
        return self.records.get(prefix) or self.records.get(deepseek_native_prefix(prefix))

    def get_quant_method(self, layer: EngineLayer, prefix: str):
        from sglang.srt.layers.moe.fused_moe_triton import FusedMoE

        if isinstance(layer, FusedMoE):
            record = self.record_for(prefix)
            if record is not None:
                from moebake.engines.sglang.moe_methods import moe_method

                return moe_method(self, record, prefix)
        return self.original.get_quant_method(layer, prefix) if self.original is not None else None
