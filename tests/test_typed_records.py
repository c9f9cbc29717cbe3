"""The typed records: built by keyword only, ``convert()`` returns the :class:`Manifest` it wrote, options hold
their enums, each digest has one name in code, and moebake raises only its own error types."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import InvalidArgumentError, OptionError
from moebake.formats.expert_source import ExpertSource
from moebake.formats.nvfp4_gate_up import rescale_block_scales, round_to_e4m3
from moebake.schema import manifest as schema
from moebake.schema.config_json import manifest_digest
from moebake.schema.enums import DType, FlashInferLayout, GateUpGlobals
from moebake.schema.manifest import (
    SELF_CHECKSUM_KEY,
    Activation,
    EngineRecord,
    FileRecord,
    LayerRecord,
    Manifest,
    SourceRecord,
    TensorRecord,
    read_manifest_record,
    render_manifest,
    self_checksum,
)

MOEBAKE = Path(__file__).resolve().parent.parent / "moebake"
RECORDS = [Manifest, LayerRecord, TensorRecord, Activation, SourceRecord, FileRecord, EngineRecord]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_records_are_built_by_keyword_only(record):
    assert all(field.kw_only for field in dataclasses.fields(record))
    with pytest.raises(TypeError, match=r"takes 1 positional argument"):
        record(*range(len(dataclasses.fields(record))))


def test_a_record_by_keyword():
    record = TensorRecord(dtype=DType.U8, shape=(2, 4), source="x.w")
    assert record.to_json() == {"source": "x.w", "dtype": "U8", "shape": [2, 4], "gate_up_order": None, "source_gate_up_order": None}
    assert TensorRecord.from_json(record.to_json(), "m") == record


@pytest.fixture(scope="module")
def baked(gpt_oss_tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("typed") / "out"
    return out, convert(gpt_oss_tiny, out, ConvertOptions(target="sm90-cutlass", flashinfer_layout="v1"), progress=False)


def test_convert_returns_the_manifest_it_wrote(baked):
    out, manifest = baked
    assert isinstance(manifest, Manifest)
    assert render_manifest(manifest.to_json()) == (out / "moebake.json").read_text()
    assert manifest == read_manifest_record(out)
    assert (manifest.flashinfer_layout, manifest.options["flashinfer_layout"]) == (FlashInferLayout.V1, "v1")


def test_the_two_digests_named_manifest_sha256(baked):
    """moebake.json's self-checksum and config.json's bake digest: both stored as ``manifest_sha256``, different values."""
    out, manifest = baked
    fields = json.loads((out / "moebake.json").read_text())
    quantization = json.loads((out / "config.json").read_text())["quantization_config"]
    assert SELF_CHECKSUM_KEY == "manifest_sha256" and fields[SELF_CHECKSUM_KEY] == self_checksum(fields)
    assert quantization["manifest_sha256"] == manifest_digest(fields) == manifest_digest(manifest.to_json())
    assert self_checksum(fields) != manifest_digest(fields)
    assert not hasattr(schema, "manifest_checksum") and not hasattr(schema, "CHECKSUM_KEY")


def test_options_hold_enums_and_record_their_values():
    options = ConvertOptions(target="sm90-cutlass", flashinfer_layout="v1", gate_up_globals="keep")
    assert (options.flashinfer_layout, options.gate_up_globals) == (FlashInferLayout.V1, GateUpGlobals.KEEP)
    assert type(options.flashinfer_layout) is FlashInferLayout and type(options.gate_up_globals) is GateUpGlobals
    recorded = options.as_dict()
    assert (recorded["flashinfer_layout"], recorded["gate_up_globals"]) == ("v1", "keep")
    assert all(type(value) in (str, int, type(None)) for value in recorded.values())
    assert ConvertOptions(**recorded) == options
    default = ConvertOptions(target="sm90-cutlass")
    assert (default.flashinfer_layout, default.gate_up_globals) == (FlashInferLayout.V2, GateUpGlobals.SHARE)
    assert "gate_up_globals" not in default.as_dict()


@pytest.mark.parametrize("target", ["sm90-marlin", "sm100-trtllm", "cutedsl", "deepep-bf16"])
def test_a_target_without_the_flashinfer_sm90_layout_records_none(target):
    """A FlashInfer SM90 fp4 layout changes no byte of these targets (``--flashinfer-layout`` is refused for them):
    the options hold none and record none, whatever a manifest of an older bake says."""
    for given in (None, "v1", "v2"):
        options = ConvertOptions(target=target, flashinfer_layout=given)
        assert options.flashinfer_layout is None and "flashinfer_layout" not in options.as_dict()
        assert ConvertOptions(**options.as_dict()) == options


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("flashinfer_layout", "v3", "--flashinfer-layout 'v3': expected one of v2, v1"),
        ("gate_up_globals", "average", "--gate-up-globals 'average': expected one of share, keep"),
    ],
)
def test_an_option_outside_its_enum(option, value, message):
    with pytest.raises(OptionError, match=f"^{re.escape(message)}$"):
        ConvertOptions(target="sm90-cutlass", **{option: value})


def test_no_built_in_raises_left():
    pattern = re.compile(r"raise (ValueError|RuntimeError|TypeError|KeyError|AssertionError)\b")
    found = [
        f"{path.relative_to(MOEBAKE.parent)}:{number}"
        for path in sorted(MOEBAKE.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_contract_violations_raise_invalid_argument_error():
    with pytest.raises(InvalidArgumentError, match=r"^values to round must lie in \[0, 448\]$"):
        round_to_e4m3(torch.tensor([449.0], dtype=torch.float64))
    with pytest.raises(InvalidArgumentError, match=r"^rescale ratio 2.0/1.0 is not in \(0, 1\]$"):
        rescale_block_scales(torch.zeros(1, dtype=torch.uint8), 2.0, 1.0)
    with pytest.raises(InvalidArgumentError, match=r"^block scales must be positive-signed finite E4M3 values$"):
        rescale_block_scales(torch.tensor([0x80], dtype=torch.uint8), 0.5, 1.0)
    with pytest.raises(InvalidArgumentError, match=r"^ExpertSource order 'separate' does not fit names \('a',\)$"):
        ExpertSource(("a",), "separate", (1,), (1,), "U8")
