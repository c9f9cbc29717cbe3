"""Every registered target, by the registry: round trip, exact inverse, deep verify, its table, refusals.

The cases are read from :data:`moebake.convert.targets.TARGETS` when this module is collected, so a
target is covered the moment it registers. :class:`ToyBf16` shows it: a whole new target is the one
class below (registered for this module's tests only, so the CLI's registry tests see the built-ins).
"""

import pytest
import torch

import moebake.serve
from moebake.convert.options import ConvertOptions
from moebake.convert.output_dir import output_paths
from moebake.convert.run import convert
from moebake.convert.source_check import compare_with_source, inverse_problems, proof_summary
from moebake.convert.targets import TARGETS
from moebake.convert.targets.base import Planned, Target, register
from moebake.convert.targets.expert_chunks import zip_expert_chunks
from moebake.convert.verify import verify_output
from moebake.errors import MoebakeError, UnsupportedError
from moebake.formats import open_source
from moebake.formats.checkpoint import stored_names
from moebake.layouts.gate_up import split_halves
from moebake.reference.registration import unregister
from moebake.reference.synthetic_sources import write_bf16_moe, write_deepseek_v4, write_modelopt_nvfp4
from moebake.schema.enums import DType, GateUpOrder, GpuFamily
from moebake.schema.manifest import read_manifest, read_manifest_record
from moebake.schema.targets import TARGET_SPECS, LayerDims, TargetSpec, TensorSpec
from moebake.synthetic import write_gpt_oss


class ToyBf16(Target):
    """A toy target: BF16 experts with W13 rows ``[up; gate]`` (all a new target needs: spec, bake, restore)."""

    spec = TargetSpec(
        name="toy-bf16",
        layout_version=1,
        source_formats=("bf16-moe",),
        kernel="a toy `[up; gate]` BF16 layout",
        arch="Hopper (SM90)",
        gpus=(GpuFamily.SM90,),
        tensors=(
            TensorSpec("w13_weight", DType.BF16, "E, 2 * I, H", gate_up_order=GateUpOrder.UP_GATE),
            TensorSpec("w2_weight", DType.BF16, "E, H, I"),
        ),
    )

    def layer_tensors(self, model, layer, dims: LayerDims, options: ConvertOptions) -> dict[str, Planned]:
        I, H = dims.intermediate, dims.hidden

        def up_gate(*parts):
            gate, up = split_halves(parts[0], (I, H)) if len(parts) == 1 else parts
            return torch.cat([up, gate], 1)

        def planned(sources, combine, order):
            produce = zip_expert_chunks(model.checkpoint, sources, dims.experts, options.chunk_bytes, combine)
            return Planned(produce, stored_names(sources, dims.experts), sources[0] if len(sources) == 1 else sources, order)

        return {
            "w13_weight": planned(layer.gate_up, up_gate, GateUpOrder.GATE_UP if layer.fused else GateUpOrder.SEPARATE),
            "w2_weight": planned((layer.down,), lambda down: down, None),
        }

    def restore(self, record, baked, layout):
        up, gate = split_halves(baked["w13_weight"], (record.intermediate, record.hidden))
        sources = record.tensors["w13_weight"].source
        out = {sources: torch.cat([gate, up], 1)} if isinstance(sources, str) else {sources[0]: gate, sources[1]: up}
        return {**out, record.tensors["w2_weight"].source: baked["w2_weight"]}


register(ToyBf16)
CASES = [(name, source) for name, target in TARGETS.items() for source in target.spec.source_formats]
NAMES = list(TARGETS)
unregister(ToyBf16.spec.name)

# One small checkpoint per source format, with dims every target of that format takes (GPT-OSS: H % 64 == 0 for
# sm90-marlin, padded to 256 all the same).
SOURCES = {
    "gpt-oss": lambda path: write_gpt_oss(path, num_layers=2, num_experts=3, hidden=192, intermediate=96, vocab=64),
    "deepseek-v4": lambda path: write_deepseek_v4(path, num_layers=1, num_experts=3, hidden=256, intermediate=128, mtp_layers=1),
    "modelopt-nvfp4": lambda path: write_modelopt_nvfp4(path, num_layers=2, num_experts=4, hidden=128, intermediate=64),
    "bf16-moe": lambda path: write_bf16_moe(path, style="qwen3", num_layers=2, num_experts=4, hidden=64, intermediate=32),
}
# A ModelOpt NVFP4 checkpoint's BF16 MTP layer is a bf16-moe source: targets of bf16-moe take it.
HOLDS = {"modelopt-nvfp4": {"modelopt-nvfp4", "bf16-moe"}}


@pytest.fixture(scope="module", autouse=True)
def toy_registered():
    register(ToyBf16)
    yield
    unregister(ToyBf16.spec.name)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    return {name: write(root / name) for name, write in SOURCES.items()}


@pytest.fixture(scope="module")
def baked(sources, tmp_path_factory):
    root, outs = tmp_path_factory.mktemp("baked"), {}

    def bake(target: str, source: str):
        if (target, source) not in outs:
            # allow_inexact: the toy target has no engine profile (convert refuses such a bake otherwise)
            outs[target, source] = convert(
                sources[source], root / f"{target}-{source}", ConvertOptions(target), progress=False, allow_inexact=True
            )
        return root / f"{target}-{source}"

    return bake


def test_the_toy_target_registered_as_one_class():
    assert "toy-bf16" in NAMES and ("toy-bf16", "bf16-moe") in CASES
    assert TARGETS["toy-bf16"].spec is TARGET_SPECS["toy-bf16"] is ToyBf16.spec


@pytest.mark.parametrize("target, source", CASES)
def test_round_trip_verifies_and_inverts_exactly(baked, sources, target, source):
    """Exact inverse; a lossy target (``TargetSpec.lossy``) instead refuses to invert, saying why."""
    out = baked(target, source)
    assert verify_output(out) == []
    manifest = read_manifest_record(out)
    model = open_source(sources[source], (manifest.source.format,))
    lossy = TARGETS[target].spec.lossy
    if lossy:
        with pytest.raises(UnsupportedError, match=f"target {target} cannot be inverted to its source: .*"):
            inverse_problems(out, manifest, model)
        return
    assert inverse_problems(out, manifest, model) == []


@pytest.mark.parametrize("target, source", CASES)
def test_deep_verify_against_the_source(baked, sources, target, source):
    """Both directions; for a lossy target the re-bake alone, and the ``ok:`` line says that is what it proves."""
    out = baked(target, source)
    assert compare_with_source(out, sources[source]) == []
    summary = proof_summary(out, str(sources[source]))
    if TARGETS[target].spec.lossy:
        assert summary.startswith(f"against {sources[source]}: re-baking it reproduces every byte")
        assert "not inverted, and not bit-exact to it by design" in summary and "bit-exact against" not in summary
    else:
        assert "bit-exact against" in summary or "--gate-up-globals" in summary


@pytest.mark.parametrize("target, source", CASES)
def test_layer_records_follow_the_tensor_table(baked, target, source):
    manifest, spec = read_manifest(baked(target, source)), TARGETS[target].spec
    assert manifest["target"] == spec.name and manifest["target_layout_version"] == spec.layout_version
    assert (manifest["flashinfer_layout"] is not None) == spec.uses_flashinfer_layout
    assert manifest["layers"]
    for layer in manifest["layers"]:
        dims = LayerDims(**{key: layer[key] for key in ("experts", "hidden", "hidden_padded", "intermediate", "intermediate_padded")})
        assert set(spec.required_tensors) <= set(layer["tensors"]) <= {t.name for t in spec.tensors}
        for short, record in layer["tensors"].items():
            entry = spec.tensor(short)
            assert tuple(record["shape"]) == entry.shape_for(dims, (manifest["flashinfer_layout"] or {}).get("id")), short
            assert entry.dtype is None or record["dtype"] == entry.dtype, short
            assert record["gate_up_order"] == entry.gate_up_order, short


@pytest.mark.parametrize("target", NAMES)
@pytest.mark.parametrize("source", list(SOURCES))
def test_refuses_sources_it_does_not_bake(sources, tmp_path, target, source):
    if HOLDS.get(source, {source}) & set(TARGETS[target].spec.source_formats):
        pytest.skip(f"{target} bakes {source} checkpoints")
    with pytest.raises(MoebakeError) as refusal:
        convert(sources[source], tmp_path / "out", ConvertOptions(target), progress=False)
    assert "\n" not in str(refusal.value) and target in str(refusal.value)
    assert not (tmp_path / "out").exists() and not output_paths(tmp_path / "out").staging.exists()


def test_each_runtime_is_for_the_target_it_serves():
    """``moebake.serve.RUNTIMES`` (the serving records' ``moebake.serve`` routes) gives each target a runtime class
    made for that target."""
    assert moebake.serve.RUNTIMES and {name: runtime.target for name, runtime in moebake.serve.RUNTIMES.items()} == {
        name: name for name in moebake.serve.RUNTIMES
    }


@pytest.mark.parametrize("source", list(SOURCES))
def test_every_source_model_implements_the_protocol_fully(sources, source):
    from moebake.formats.source_model import SourceModel

    model = open_source(sources[source])
    assert isinstance(model, SourceModel)
    layer = model.layers[0]
    assert isinstance(layer.index, int) and isinstance(layer.prefix, str) and isinstance(model.padding_allowed, bool)
    assert isinstance(model.expert_quantization, str) and model.activation().kind in ("swiglu", "swiglu_oai")


def test_every_target_names_the_gpus_it_runs_on():
    """The spec's ``gpus`` is what every server's GPU refusal reads (moebake/loading/refusals.py): none may be empty."""
    from moebake.schema.targets import TARGET_SPECS

    for spec in TARGET_SPECS.values():
        assert spec.gpus and spec.gpu_names, spec.name
