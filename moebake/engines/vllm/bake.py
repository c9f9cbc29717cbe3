"""What the vLLM plugin knows about a bake before vLLM builds a layer: the manifest, checked against the
checkpoint's config.json and against what the vLLM releases of the release matrix build (no vLLM import here).

The kinds of bake it serves are the vLLM routes of the serving records (:mod:`moebake.schema.serving`; :data:`SERVED`
is their view here), each held by a ``RoutedExperts`` module with ``E_local`` experts (this EP rank's),
``model.layers.N.mlp.experts.routed_experts`` (GPT-OSS, ModelOpt NVFP4) or ``model.layers.N.ffn.experts.routed_experts``
(DeepSeek-V4, whose bake names the layer ``layers.N.ffn.experts.`` as the checkpoint does: vLLM's
``DeepseekV4ForCausalLM.hf_to_vllm_mapper`` adds ``model.``). After ``process_weights_after_loading`` vLLM holds the
baked tensors its kind lists (:data:`HOLDINGS`, ``held``) byte for byte: the target spec's dtypes and shapes
(:mod:`moebake.schema.targets`) with ``E_local`` experts first, under the engine profile's parameter names. The
tensors in ``not_held`` are no vLLM parameter (its kernel takes those constants from config.json or its own code);
ModelOpt NVFP4's F32 ``[E_local]`` scalars are reduced at load from the bake's per-expert ones
(:mod:`moebake.engines.vllm.nvfp4`).

Every problem is a :class:`moebake.errors.MoebakeError` whose message is one line starting with
``moebake (vLLM plugin):``, saying what disagrees and what to do.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moebake.engines.release_check import installed_release
from moebake.errors import EngineRefusal, MoebakeError
from moebake.formats.gpt_oss import DEFAULT_SWIGLU_LIMIT, SWIGLU_ALPHA, SWIGLU_BETA
from moebake.loading.served_manifest import read_served_manifest
from moebake.schema import serving
from moebake.schema.enums import DType
from moebake.schema.manifest import MANIFEST_NAME, LayerRecord, Manifest
from moebake.schema.profiles import SHARED_GLOBALS, ReleaseProfile, newest, release_profile, releases
from moebake.schema.serving import ServingRecord
from moebake.schema.targets import target_spec

ENGINE = "vllm"


def installed_profile() -> ReleaseProfile:
    """The installed vLLM release's profile (the release matrix's; its newest release's where it holds no such one,
    which the plugin refuses before serving anything)."""
    release = installed_release(ENGINE)
    return release_profile(release if release in releases(ENGINE) else newest(ENGINE))


@dataclass(frozen=True, kw_only=True)
class Holding:
    """How vLLM holds one served kind of bake: the architecture it needs (None: the source's, whatever it is) and the
    baked tensors it holds as they are (``held``; the others it derives at load)."""

    architecture: str | None
    held: tuple[str, ...]
    vllm_prefix: str = ""
    """What vLLM's module names put before the bake's layer prefixes (DeepSeek-V4: ``model.``, its mapper's
    ``layers.`` -> ``model.layers.``)."""
    not_held: tuple[str, ...] = ()
    """Baked tensors vLLM does not hold (it takes the value from config.json); the plugin reads none of them."""


_GPT_OSS = "GptOssForCausalLM"
_DEEPSEEK_V4 = "DeepseekV4ForCausalLM"
_MXFP4_HELD = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
_GPT_OSS_HELD = tuple(t.name for t in target_spec("sm90-cutlass").tensors)
HOLDINGS = {
    "gpt-oss": Holding(architecture=_GPT_OSS, held=_GPT_OSS_HELD),
    "gpt-oss-sm100": Holding(architecture=_GPT_OSS, held=_GPT_OSS_HELD, not_held=("gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit")),
    "modelopt-nvfp4": Holding(architecture=None, held=_MXFP4_HELD),
    "deepseek-v4": Holding(architecture=_DEEPSEEK_V4, held=_MXFP4_HELD, vllm_prefix="model."),
    "deepseek-v4-sm100": Holding(architecture=_DEEPSEEK_V4, held=_MXFP4_HELD, vllm_prefix="model.", not_held=("gemm1_clamp_limit",)),
    "deepseek-v4-marlin": Holding(architecture=_DEEPSEEK_V4, held=_MXFP4_HELD, vllm_prefix="model."),
}
"""The vLLM routes of the serving records (:mod:`moebake.schema.serving`), each with how vLLM holds its bakes."""


@dataclass(frozen=True)
class Served:
    """One kind of bake the plugin serves: its serving record (target, source format, vLLM's kernel backend) and how
    vLLM holds it. The ``--moe-backend`` and parameter names are the engine profile's (:func:`installed_profile`),
    the GPUs the target spec's."""

    record: ServingRecord
    holding: Holding

    @property
    def target(self) -> str:
        return self.record.target

    @property
    def source_format(self) -> str:
        assert self.record.source_format is not None  # SERVED holds records of one source format
        return self.record.source_format

    @property
    def moe_backend(self) -> str:
        return installed_profile().target(self.target, self.source_format).runner_backend

    @property
    def parameter_names(self) -> dict[str, str]:
        """Baked tensor short name -> vLLM parameter name, for the tensors vLLM holds as they are."""
        renamed = dict(installed_profile().target(self.target, self.source_format).parameter_names)
        return {short: renamed.get(short, short) for short in self.holding.held}


def _served() -> dict[tuple[str, str], Served]:
    served = {}
    for r in serving.routes(serving.VLLM):
        assert r.route is not None and r.source_format is not None  # every vLLM route names its source format
        served[r.target, r.source_format] = Served(r, HOLDINGS[r.route])
    return served


SERVED = _served()
"""(target, source format) -> the kind of bake the plugin serves (a view of the serving records)."""
GPT_OSS = SERVED[("sm90-cutlass", "gpt-oss")]
GPT_OSS_SM100 = SERVED[("sm100-trtllm", "gpt-oss")]
MODELOPT_NVFP4 = SERVED[("cutedsl", "modelopt-nvfp4")]
GPT_OSS_KINDS = tuple(s for s in SERVED.values() if s.holding.architecture == _GPT_OSS)
DEEPSEEK_V4_KINDS = tuple(s for s in SERVED.values() if s.holding.architecture == _DEEPSEEK_V4)
MTP_DRAFT = "DeepSeekV4MTPModel"
"""The architecture vLLM 0.33.0's speculative config gives DeepSeek-V4's MTP draft model (not served)."""
SWIGLU = {"alpha": SWIGLU_ALPHA, "beta": SWIGLU_BETA, "limit": DEFAULT_SWIGLU_LIMIT}
"""GPT-OSS SwiGLU constants vLLM's ``GptOssMxfp4MoEMethod`` passes to the kernel (hard-coded there; GPT-OSS's own,
:mod:`moebake.formats.gpt_oss`)."""
PREFIX = "moebake (vLLM plugin): "


def refuse(message: str) -> EngineRefusal:
    """The one-line error a refusal raises (``message`` is one line)."""
    return EngineRefusal(PREFIX + message)


def parameter_specs(layer: LayerRecord, served: Served, local_experts: int) -> dict[str, tuple[DType, tuple[int, ...]]]:
    """vLLM parameter name -> (dtype, shape with ``local_experts`` experts) of the baked tensors vLLM holds as they are."""
    return {
        served.parameter_names[short]: (spec.dtype, (local_experts, *spec.shape[1:]))
        for short, spec in layer.tensors.items()
        if short in served.parameter_names
    }


@dataclass(frozen=True)
class VllmBake:
    """A baked checkpoint as the vLLM plugin serves it."""

    directory: Path
    manifest: Manifest
    layers: dict[str, LayerRecord]  # keyed by prefix

    @property
    def served(self) -> Served:
        return SERVED[(self.manifest.target, self.manifest.source.format)]

    @property
    def flashinfer_layout(self) -> str | None:
        return self.manifest.flashinfer_layout

    def layer(self, module_prefix: str) -> LayerRecord:
        """The layer whose experts vLLM builds at ``module_prefix`` (``model.layers.N.mlp.experts``;
        DeepSeek-V4: ``model.layers.N.ffn.experts``, the bake's ``layers.N.ffn.experts.``)."""
        prefix = module_prefix.rstrip(".") + "."
        prefix = prefix.removeprefix(self.served.holding.vllm_prefix)
        if prefix not in self.layers:
            raise refuse(
                f"vLLM builds MoE layer {module_prefix} but {self.directory / MANIFEST_NAME} has no layer with "
                f"prefix {prefix} (config.json and the manifest disagree)"
            )
        return self.layers[prefix]

    def baked_tensor_names(self) -> set[str]:
        return {layer.prefix + short for layer in self.layers.values() for short in layer.tensors}


def check_manifest(manifest: Manifest, hf_config: dict, where: Path) -> None:
    """Refuse unless ``manifest`` (checked against config.json by :func:`read_served_manifest`) is a bake vLLM
    0.33.0 serves bit-identically for this ``config.json``."""
    served = SERVED.get((manifest.target, manifest.source.format))
    if served is None:
        raise refuse(f"{where}: {serving.unserved(serving.VLLM, manifest.target, manifest.source.format)}")
    engines = ([manifest.engine] if manifest.engine is not None else []) + list(manifest.serves)  # same bytes
    installed = installed_release(ENGINE)
    ours = [e for e in engines if e.name == ENGINE and installed in e.serving_releases]
    if not ours or not ours[0].exact:
        engine = manifest.engine
        because = engine.not_exact_because if engine is not None else None
        keep = " --gate-up-globals keep" if because and because.startswith(SHARED_GLOBALS) else ""
        if served in DEEPSEEK_V4_KINDS and (unpadded := vllm_would_pad(manifest, served)):
            raise refuse(
                f"{where}: baked for {engine and engine.name} {engine and engine.version}, not vLLM {installed.version}'s "
                f"bytes, and no vLLM bake of this model exists: {unpadded}; serve this bake with "
                f"{engine and engine.name}"
            )
        raise refuse(
            f"{where}: baked for {engine and engine.name} {engine and engine.version} "
            f"({'engine-exact' if engine and engine.exact else 'not engine-exact'}{': ' + because if because else ''}), "
            f"not vLLM {installed.version}'s bytes; re-bake with: moebake convert SRC OUT --target {served.target} "
            f"--engine {installed.spec}{keep}"
        )
    architectures = hf_config.get("architectures") or []
    if served in DEEPSEEK_V4_KINDS and MTP_DRAFT in architectures:
        raise refuse(
            f"{where}: vLLM builds DeepSeek-V4's MTP draft model ({MTP_DRAFT}, --speculative-config); the vLLM "
            f"plugin serves the main model only: start vLLM without MTP speculative decoding"
        )
    if served.holding.architecture is not None and served.holding.architecture not in architectures:
        raise refuse(
            f"{where}: config.json architectures {architectures}; the vLLM plugin serves {served.target} bakes "
            f"of {served.holding.architecture}"
        )
    if served in GPT_OSS_KINDS:
        check_gpt_oss(manifest, hf_config, where, served)
    if served in DEEPSEEK_V4_KINDS:
        check_deepseek_v4(manifest, hf_config, where, served)
    for record in manifest.layers:
        if record.hidden != hf_config.get("hidden_size"):
            raise refuse(
                f"{where}: layer {record.prefix} has hidden size {record.hidden}, config.json says "
                f"{hf_config.get('hidden_size')} (config.json and the manifest disagree)"
            )


def vllm_would_pad(manifest: Manifest, served: Served) -> str | None:
    """Why no vLLM bake of a DeepSeek-V4 ``manifest``'s model exists (None: one does): vLLM pads H or I that are not
    multiples of its profile's for ``served.target``, and moebake pads no DeepSeek-V4 expert (``convert --engine vllm``
    refuses such a model)."""
    profile = installed_profile().target(served.target, served.source_format)
    for record in manifest.layers:
        if record.hidden % profile.hidden_multiple or record.intermediate % profile.intermediate_multiple:
            return (
                f"vLLM {installed_release(ENGINE).version} pads DeepSeek-V4's hidden size {record.hidden} and expert intermediate size "
                f"{record.intermediate} to multiples of {profile.hidden_multiple} and {profile.intermediate_multiple} "
                f"for --moe-backend {served.moe_backend}, and moebake pads no {served.source_format} expert"
            )
    return None


def check_gpt_oss(manifest: Manifest, hf_config: dict, where: Path, served: Served) -> None:
    """Refuse a GPT-OSS bake whose activation or sizes disagree with config.json or with vLLM's kernel set-up."""
    activation = manifest.activation
    if {k: getattr(activation, k) for k in SWIGLU} != SWIGLU:
        raise refuse(
            f"{where}: activation {activation.to_json()}; vLLM {installed_release(ENGINE).version}'s GPT-OSS MXFP4 "
            f"kernel set-up uses SwiGLU {SWIGLU} (config.json and the manifest disagree with vLLM)"
        )
    expected = {
        "hidden": hf_config.get("hidden_size"),
        "intermediate": hf_config.get("intermediate_size"),
        "experts": hf_config.get("num_local_experts"),
    }
    for record in manifest.layers:
        got = {key: getattr(record, key) for key in expected}
        if got != expected:
            raise refuse(f"{where}: layer {record.prefix} has {got}, config.json says {expected} (config.json and the manifest disagree)")
        unknown = set(record.tensors) - set(served.holding.held) - set(served.holding.not_held)
        if unknown:
            raise refuse(
                f"{where}: layer {record.prefix} has tensors {sorted(unknown)} that vLLM "
                f"{installed_release(ENGINE).version}'s GptOssMxfp4MoEMethod does not hold"
            )


def check_deepseek_v4(manifest: Manifest, hf_config: dict, where: Path, served: Served) -> None:
    """Refuse a DeepSeek-V4 bake whose sizes, SwiGLU limit or tensors disagree with config.json or with what vLLM's
    ``Mxfp4MoEMethod`` holds (vLLM reads the limit from config.json at run time: it must be the one baked)."""
    limit = manifest.activation.limit
    if limit != hf_config.get("swiglu_limit"):
        raise refuse(
            f"{where}: activation SwiGLU limit {limit}, config.json's swiglu_limit {hf_config.get('swiglu_limit')} "
            "(config.json and the manifest disagree)"
        )
    expected = {"intermediate": hf_config.get("moe_intermediate_size"), "experts": hf_config.get("n_routed_experts")}
    for record in manifest.layers:
        got = {key: getattr(record, key) for key in expected}
        if got != expected:
            raise refuse(f"{where}: layer {record.prefix} has {got}, config.json says {expected} (config.json and the manifest disagree)")
        if set(record.tensors) - set(served.holding.not_held) != set(served.holding.held):
            raise refuse(
                f"{where}: layer {record.prefix} has tensors {sorted(record.tensors)}; vLLM {installed_release(ENGINE).version}'s "
                f"Mxfp4MoEMethod holds {sorted(served.holding.held)}"
            )


def read_bake(directory: str | Path, quantization_config: dict, hf_config: dict) -> VllmBake:
    """Read and check ``directory/moebake.json`` (see :func:`check_manifest`)."""
    directory = Path(directory)
    try:
        manifest = read_served_manifest(directory, quantization_config)
    except MoebakeError as err:
        raise refuse(str(err)) from None
    check_manifest(manifest, hf_config, directory / MANIFEST_NAME)
    return VllmBake(directory, manifest, {record.prefix: record for record in manifest.layers})


def locate_checkpoint(model: str, revision: str | None) -> Path:
    """The local directory of ``model`` (a path, or a Hub repo id whose manifest is fetched into the Hub cache)."""
    path = Path(model)
    if path.is_dir():
        return path
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(model, MANIFEST_NAME, revision=revision)).parent


def hf_config_dict(hf_config: Any) -> dict:
    """A transformers config (or a dict) as the plain dict config.json holds."""
    if isinstance(hf_config, dict):
        return hf_config
    return json.loads(hf_config.to_json_string()) if hasattr(hf_config, "to_json_string") else dict(vars(hf_config))
