"""A stock engine (no moebake plugin) refuses a bake at start-up instead of serving all-zero experts.

The output's config.json names ``quant_method: moebake`` (the source's config kept inside it) and
the manifest's hash; SGLang 0.5.23's own config parsing (``ModelConfig``) must fail with its
unknown-quantization error, and ``verify`` must catch a manifest changed after baking.
"""

import json
from unittest import mock

import pytest
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import write_modelopt_nvfp4
from moebake.schema.config_json import manifest_digest
from moebake.schema.manifest import write_manifest


@pytest.fixture(scope="module")
def baked(gpt_oss_tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("refusal") / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    return out


def test_config_names_moebake_the_original_and_the_manifest_hash(baked, gpt_oss_tiny):
    config = json.loads((baked / "config.json").read_text())
    source = json.loads((gpt_oss_tiny / "config.json").read_text())
    quant = config.pop("quantization_config")
    assert config == {k: v for k, v in source.items() if k != "quantization_config"}
    manifest = json.loads((baked / "moebake.json").read_text())
    assert quant == {
        "quant_method": "moebake",
        "original": source["quantization_config"],
        "original_file": "config.json",
        "manifest": "moebake.json",
        "manifest_sha256": manifest_digest(manifest),
        "target": "sm90-cutlass",
        "engine": "sglang",
        "engine_version": "0.5.23",
    }
    assert "config.json" in manifest["files"]


def test_modelopt_side_file_quantization_is_kept_as_original(tmp_path):
    source = write_modelopt_nvfp4(tmp_path / "src", num_layers=2, num_experts=2, quant_config="hf_quant_config", mismatches=())
    convert(source, tmp_path / "out", ConvertOptions("cutedsl"), progress=False)
    quant = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    src_config = json.loads((source / "config.json").read_text())
    expected = src_config.get("quantization_config") or json.loads((source / "hf_quant_config.json").read_text())
    assert quant["quant_method"] == "moebake" and quant["original"] == expected


def test_stock_sglang_refuses_with_unknown_quantization(baked):
    oracle = pytest.importorskip("engine_oracles.sglang_oracle")
    if not oracle.sglang_installed():
        pytest.skip("sglang 0.5.23 not installed")
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    oracle.standins.hide()
    stock = {name: method for name, method in QUANTIZATION_METHODS.items() if name != "moebake"}  # no plugin loaded
    with mock.patch.dict(QUANTIZATION_METHODS, stock, clear=True):
        with pytest.raises(ValueError, match="Unknown quantization method: moebake"):
            ModelConfig(str(baked))


def test_verify_catches_a_changed_manifest(baked, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(baked, copy)
    manifest = json.loads((copy / "moebake.json").read_text())
    manifest["activation"]["limit"] = 8.0
    write_manifest(copy, manifest)  # a valid manifest of its own, but not the one config.json was baked with
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == 1
    disagree = "config.json and manifest disagree (manifest_sha256 differs: the manifest changed after baking)"
    assert f"mismatch: {copy / 'config.json'}: {disagree}" in result.output


def test_verify_catches_a_config_restored_to_the_source_quant_method(baked, tmp_path, gpt_oss_tiny):
    import shutil

    from moebake.schema.checksums import file_record

    copy = tmp_path / "copy"
    shutil.copytree(baked, copy)
    shutil.copyfile(gpt_oss_tiny / "config.json", copy / "config.json")
    manifest = json.loads((copy / "moebake.json").read_text())
    manifest["files"]["config.json"] = file_record(copy / "config.json")
    write_manifest(copy, manifest)
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == 1 and "quantization_config.quant_method is 'mxfp4', expected 'moebake'" in result.output
