"""What the vLLM plugin tests share. Each runs moebake's vLLM plugin inside the real vLLM 0.33.0 Python package on
CPU, the platform told which GPU it is by ``engine_oracles.vllm_oracle``.

Fixtures:

* every test skips without vLLM 0.33.0, and runs with moebake's plugin loaded as vLLM loads its general plugins
  (through the ``vllm.general_plugins`` entry point);
* ``source``: the module's source checkpoint, written once by its ``write_source(directory)``;
* ``bake``: that source baked with the module's ``BAKE`` options (``engine=vllm_oracle.ENGINE``): an engine-exact vLLM bake
  that lists the module's ``SERVES`` (other engines' names) in ``serves``.

Steps: :func:`moebake_config` (vLLM's quantization config of a bake, made as vLLM makes it), :func:`build_model`
(vLLM's MoE blocks over a bake, in a :class:`Spy` model; :func:`build_gpt_oss`: GPT-OSS's), :func:`load` (the
moebake loader), :func:`post_load` (vLLM's own post-load driver), :func:`experts_of` and :func:`refusal` (a
refusal is one line in the plugin's voice).
"""

import json
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine_oracles import vllm_oracle
from moebake.convert.run import convert
from moebake.engines.vllm.bake import PREFIX

MODEL_CONFIG = SimpleNamespace(quantization="moebake", dtype=torch.bfloat16, word_embeddings_untied_by_checkpoint=False)
"""What vLLM's post-load driver reads of the ModelConfig."""


@pytest.fixture(scope="module", autouse=True)
def plugin_loaded():
    """vLLM loads its general plugins (moebake's, through the entry point) in every process it starts."""
    if not vllm_oracle.vllm_installed():
        pytest.skip(f"vllm {vllm_oracle.VLLM_VERSION} is not installed (bin/setup installs it)")
    from vllm.plugins import load_general_plugins

    load_general_plugins()


@pytest.fixture(scope="module")
def source(request, tmp_path_factory):
    return request.module.write_source(tmp_path_factory.mktemp("vllm-plugin") / "src")


@pytest.fixture(scope="module")
def bake(source, request):
    return baked_for_vllm(source, "out", request.module.BAKE, request.module.SERVES)


def baked_for_vllm(source: Path, name: str, options, serves: list[str]) -> Path:
    """``source`` baked with ``options`` (``ConvertOptions``, ``engine=vllm_oracle.ENGINE``) into ``source.parent / name``, checked to
    be an engine-exact vLLM bake whose ``serves`` names ``serves``."""
    out = source.parent / name
    manifest = convert(source, out, options, progress=False)
    assert (manifest.engine.name, manifest.engine.exact, [e.name for e in manifest.serves]) == ("vllm", True, serves)
    return out


def vllm_layout() -> str:
    """The SM90 fp4 layout the vLLM under test's pinned FlashInfer reads: what an SGLang bake it is to serve is made in
    (``ConvertOptions(..., flashinfer_layout=vllm_layout())``: the newest SGLang release whose FlashInfer reads it)."""
    from moebake.schema.engine_release import EngineRelease
    from moebake.schema.profiles import pinned_layout

    return pinned_layout(EngineRelease("vllm", vllm_oracle.VLLM_VERSION))


def moebake_config(directory: Path, hf_config=None):
    """vLLM's quantization config for ``directory`` as vLLM makes it: from config.json's quantization_config, then
    ``maybe_update_config`` with ``hf_config`` (None: ``vllm_oracle.hf_config_of(directory)``)."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    config = json.loads((directory / "config.json").read_text())
    quant = get_quantization_config(config["quantization_config"]["quant_method"]).from_config(config["quantization_config"])
    quant.maybe_update_config(str(directory), hf_config=vllm_oracle.hf_config_of(directory) if hf_config is None else hf_config)
    return quant


class Spy(torch.nn.Module):
    """A model holding vLLM's MoE blocks (``holder``, as ``model``), whose ``load_weights`` records what it is handed
    (the model's own loader for everything but the baked experts)."""

    def __init__(self, holder: torch.nn.Module):
        super().__init__()
        self.model = holder
        self.handed = {}

    def load_weights(self, weights):
        for name, tensor in weights:
            self.handed[name] = tensor
        return set(self.handed)


def build_model(engine, directory: Path, blocks, *, load_format="moebake", quant_config=None, hf_config=None):
    """``(Spy(blocks(vllm_config)), vllm_config)``: vLLM's MoE blocks over the bake at ``directory``, made by ``blocks``
    inside ``engine`` (a context manager entering vLLM's engine state and giving its ``VllmConfig``), with the plugin's
    quantization config (:func:`moebake_config`; ``quant_config``: another) and ``load_format``."""
    from vllm.config.load import LoadConfig

    with engine as vllm_config:
        vllm_config.quant_config = moebake_config(directory, hf_config) if quant_config is None else quant_config
        vllm_config.load_config = LoadConfig(load_format=load_format)
        return Spy(blocks(vllm_config)), vllm_config


def build_gpt_oss(
    directory: Path,
    *,
    load_format="moebake",
    moe_backend="flashinfer_cutlass",
    capability=90,
    tensor_parallel=(1, 0),
    expert_parallel=False,
):
    """vLLM's GPT-OSS MoE blocks (its ``MLPBlock`` of layers 0 and 1) over the bake at ``directory``, as
    :func:`build_model` builds them, on a GPU of ``capability`` with ``moe_backend``."""
    engine = vllm_oracle.vllm_engine(
        vllm_oracle.hf_config_of(directory),
        None,
        moe_backend=moe_backend,
        capability=capability,
        tensor_parallel=tensor_parallel,
        expert_parallel=expert_parallel,
    )
    return build_model(engine, directory, lambda vllm_config: vllm_oracle.gpt_oss_holder(vllm_config, [0, 1]), load_format=load_format)


def load(directory: Path, model):
    """The moebake loader (``--load-format moebake``) over ``model``, from the bake at ``directory``; returns the loader."""
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    loader = get_model_loader(LoadConfig(load_format="moebake"))
    loader.load_weights(model, SimpleNamespace(model=str(directory), revision=None))
    return loader


def post_load(model, engine, pre_processed=False) -> None:
    """vLLM's own post-load driver over ``model`` inside ``engine`` (vLLM's engine state, a context manager), in
    pre-processed mode with ``pre_processed`` (skipped on a release without that mode: no
    ``vllm.model_executor.utils.weights_already_processed``, before 0.30.0)."""
    from vllm.model_executor import utils
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    if pre_processed and not hasattr(utils, "weights_already_processed"):
        pytest.skip(f"vLLM {vllm_oracle.VLLM_VERSION} has no pre-processed mode (weights_already_processed)")
    weights_already_processed = utils.weights_already_processed if pre_processed else None

    with engine, weights_already_processed() if pre_processed else nullcontext():
        process_weights_after_loading(model, MODEL_CONFIG, torch.device("cpu"))


def experts_of(model, layer: int, block: str = "mlp"):
    """The routed experts of ``layer`` (vLLM's ``FusedMoE`` at ``model.layers.N.<block>.experts``)."""
    return getattr(model.model.layers[layer], block).experts.routed_experts


def refusal(excinfo) -> str:
    """The refusal's message, checked to be one line in the plugin's voice."""
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(PREFIX), message
    return message


def refusal_of_another_release(bake, build, monkeypatch) -> None:
    """The one-line refusal ``build(bake)`` gives under a vLLM release the matrix does not hold (0.34.0), checked to name
    the proven span and the installed release."""
    import vllm

    from moebake.errors import MoebakeError
    from moebake.schema.profiles import release_span, serving_releases

    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    with pytest.raises(MoebakeError) as excinfo:
        build(bake)
    message = refusal(excinfo)
    assert f"proven on vllm {release_span('vllm', serving_releases('vllm'))}" in message and "vllm 0.34.0 is installed" in message


def refusal_under_another_flashinfer_layout(bake, build, monkeypatch) -> None:
    """The refusal ``build(bake)`` gives where the installed FlashInfer is not the release's pin and reads the other SM90
    layout than the bake's (the release's: 0.6.17 reads v1, 0.6.18 v2), checked to name both layouts."""
    import flashinfer

    from moebake.errors import MoebakeError

    baked = vllm_layout()
    other, version = ("v1", "0.6.17") if baked == "v2" else ("v2", "0.6.18")
    monkeypatch.setattr(flashinfer, "__version__", version)
    with pytest.raises(MoebakeError) as excinfo:
        build(bake)
    message = refusal(excinfo)
    assert f"layout {baked}" in message and f"reads fp4 layout {other}" in message
