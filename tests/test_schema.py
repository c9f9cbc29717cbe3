"""The schema package: manifest records round-trip every baked manifest, and one error names the file and field."""

import json

import pytest

from bake_hashes import CASES, bake_case
from moebake.errors import CheckpointError, ManifestError, MoebakeError, format_error
from moebake.formats.safetensors_file import DTYPES
from moebake.schema.enums import DType
from moebake.schema.index import read_index, write_index
from moebake.schema.manifest import MANIFEST_NAME, EngineRecord, Manifest, read_manifest, write_manifest


@pytest.fixture(scope="module", params=sorted(CASES))
def baked(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("schema")
    bake_case(request.param, root)
    return root / "out"


def test_every_written_manifest_round_trips_through_the_records(baked):
    written = read_manifest(baked)
    assert json.loads(json.dumps(Manifest.from_json(written, baked / MANIFEST_NAME).to_json())) == written


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda m: m["layers"][0].update(experts="4"), "layers[0].experts"),
        (lambda m: m["layers"][0]["tensors"]["w2_weight"].update(dtype="U3"), "layers[0].tensors.w2_weight.dtype"),
        (lambda m: m["layers"][0]["tensors"]["w2_weight"].update(shape=[4, -1]), "layers[0].tensors.w2_weight.shape"),
        (lambda m: m["source"].pop("format"), "source.format"),
        (lambda m: m["files"]["config.json"].update(bytes=True), "files.config.json.bytes"),
        (lambda m: m.update(target_layout_version=1.0), "target_layout_version"),
    ],
)
def test_a_bad_field_is_one_manifest_error_naming_file_and_field(tmp_path, edit, field):
    out = tmp_path / "out"
    bake_case("deepep-bf16/qwen3", tmp_path)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    edit(manifest)
    write_manifest(out, manifest)  # re-sealed: only the field is wrong
    with pytest.raises(ManifestError) as caught:
        read_manifest(out)
    assert str(caught.value).startswith(f"{out / MANIFEST_NAME}: field {field} ")
    assert format_error(caught.value).startswith("error: ") and "\n" not in str(caught.value)


def test_unknown_fields_are_kept():
    data = json.loads(
        json.dumps(
            {
                "schema": "moebake.manifest/1",
                "moebake_version": "0",
                "target": "t",
                "target_layout_version": 1,
                "flashinfer_layout": None,
                "source": {"format": "f", "location": "l", "revision": None, "files": {}},
                "options": {},
                "activation": {"kind": "swiglu", "alpha": 1.0, "beta": 0.0, "limit": None},
                "layers": [],
                "files": {"a": {"xxh3-128": "0", "bytes": 1, "sha256": "9"}},
                "tuned_for": {"x": 1},
            }
        )
    )
    assert Manifest.from_json(data, "m.json").to_json() == data


ENGINE = {
    "name": "sglang",
    "version": "0.5.23",
    "runner_backend": "flashinfer_mxfp4",
    "a2a_backend": "none",
    "engine_method": "m.C",
    "hidden_multiple": 256,
    "intermediate_multiple": 128,
    "hidden_scale_fill": 127,
    "verified": True,
    "parameter_names": {},
    "exact": True,
    "not_exact_because": None,
}


def test_engine_records_are_typed_and_validated():
    record = EngineRecord.from_json(dict(ENGINE, future=1), "m.json")
    assert (record.name, record.hidden_multiple, record.exact, record.extra) == ("sglang", 256, True, {"future": 1})
    assert record.to_json() == dict(ENGINE, moe_parallelism="expert-only", future=1)  # a manifest before the field: expert-only
    for key, bad, message in (
        ("exact", "yes", "engine.exact is str"),
        ("hidden_multiple", True, "engine.hidden_multiple is bool"),
        ("parameter_names", {"a": 1}, "engine.parameter_names is dict"),
    ):
        with pytest.raises(ManifestError, match=message):
            EngineRecord.from_json(dict(ENGINE, **{key: bad}), "m.json")


def test_the_index_reader_names_the_file_and_field(tmp_path):
    write_index(tmp_path, {"b": "s2.safetensors", "a": "s1.safetensors"}, 10)
    index = read_index(tmp_path)
    assert (index.weight_map, index.total_size, index.shard_names) == (
        {"a": "s1.safetensors", "b": "s2.safetensors"},
        10,
        ["s1.safetensors", "s2.safetensors"],
    )
    path = tmp_path / "model.safetensors.index.json"
    for bad, message in (
        ("[]", "expected a JSON object"),
        ('{"weight_map": {}}', "has no weight_map"),
        ('{"weight_map": {"a": 3}}', "weight_map maps tensor a to 3"),
        ('{"weight_map": {"a": "../s.safetensors"}}', "not a plain file name"),
        ('{"weight_map": {"a": "s.bin"}}', "does not end in .safetensors"),
        ('{"weight_map": {"a": "s.safetensors"}, "metadata": {"total_size": -1}}', "metadata.total_size is -1"),
        ("{", "not valid JSON"),
    ):
        path.write_text(bad)
        with pytest.raises(CheckpointError, match=message) as caught:
            read_index(tmp_path)
        assert str(caught.value).startswith(str(path)) and isinstance(caught.value, MoebakeError)


def test_dtype_table_is_the_enum():
    assert set(DTYPES) == {code.value for code in DType}
    assert DType.BF16.torch is not None and DType.F4.bits == 4 and DType.F32.numpy.itemsize == 4


def _imported_layers(package: str) -> dict[str, set[str]]:
    """``{file: {moebake subpackage or module it imports}}`` for every module of ``moebake.<package>``."""
    import ast
    from pathlib import Path

    import moebake

    found = {}
    for path in (Path(moebake.__file__).parent / package).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            modules = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            names |= {m.split(".")[1] for m in modules if m.startswith("moebake.")}
        found[path.name] = names
    return found


@pytest.mark.parametrize(
    "package, allowed, forbidden",
    [
        ("schema", {"schema", "errors"}, None),
        ("serve", None, {"convert", "hub"}),
        ("hub", None, {"serve"}),
    ],
)
def test_layers_depend_only_downwards(package, allowed, forbidden):
    for name, layers in _imported_layers(package).items():
        assert allowed is None or layers <= allowed, f"moebake/{package}/{name} imports {sorted(layers - allowed)}"
        assert forbidden is None or not layers & forbidden, f"moebake/{package}/{name} imports {sorted(layers & forbidden)}"


def test_errors_are_typed(tmp_path):
    (tmp_path / "moebake.json").write_text("{")
    with pytest.raises(ManifestError, match="corrupt manifest"):
        read_manifest(tmp_path)
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        from moebake.formats.checkpoint import open_checkpoint

        open_checkpoint(tmp_path)
