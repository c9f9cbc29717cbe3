"""Fuzz matrix, input side: damaged shard headers, indexes and configs of every source format.

Every case runs the real CLI on a private copy of a small checkpoint and asserts what the project
promises for bad input: exit status 2, exactly one line ``error: ...`` naming the file (and the
tensor or key), no traceback, nothing left beside OUT, and the source byte for byte unchanged.
Cases that would exhaust memory or time if a size were trusted before being checked against the
tensors (10^9 experts) must also finish fast.
"""

import hashlib
import json
import shutil
import struct
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from moebake.cli import main
from moebake.reference.synthetic_sources import write_bf16_moe, write_deepseek_v4, write_modelopt_nvfp4
from moebake.synthetic import write_gpt_oss

DEEP = "[" * 100_000 + "]" * 100_000
"""A JSON value nested far deeper than Python's parser recurses."""
SHARD = "model-00001-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
TARGETS = {"gpt-oss": "sm90-cutlass", "modelopt": "cutedsl", "deepseek-v4": "sm90-cutlass", "qwen3": "deepep-bf16"}
FAST_SECONDS = 20


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """One small checkpoint per source format, never modified (each case copies one)."""
    root = tmp_path_factory.mktemp("pristine")
    return {
        "gpt-oss": write_gpt_oss(root / "gpt-oss", num_layers=2, num_experts=3, hidden=160, intermediate=96, vocab=64),
        "modelopt": write_modelopt_nvfp4(root / "modelopt", num_layers=2),
        "deepseek-v4": write_deepseek_v4(root / "deepseek-v4", num_layers=1, mtp_layers=0),
        "qwen3": write_bf16_moe(root / "qwen3", style="qwen3", num_layers=1),
    }


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def set_raw(value: dict, path: tuple, literal: str) -> str:
    """JSON text of ``value`` with the member at key ``path`` replaced by the raw JSON ``literal`` (or removed if None)."""
    target = value
    for key in path[:-1]:
        target = target[key]
    if literal is None:
        target.pop(path[-1], None)
        return json.dumps(value)
    target[path[-1]] = "\0RAW\0"
    return json.dumps(value).replace('"\\u0000RAW\\u0000"', literal)


def convert_fails(source: Path, tmp_path: Path, target: str, *needles: str) -> str:
    """Run convert; assert the clean failure promised for bad input; return the error line."""
    before = tree_digest(source)
    out = tmp_path / "out"
    began = time.monotonic()
    result = CliRunner().invoke(main, ["convert", str(source), str(out), "--target", target, "--quiet"])
    elapsed = time.monotonic() - began
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, (result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out.exists() and not list(tmp_path.glob(".out.*")), list(tmp_path.iterdir())
    assert tree_digest(source) == before, "the source changed"
    assert elapsed < FAST_SECONDS, f"took {elapsed:.1f}s"
    return lines[0]


def copy_of(pristine, tmp_path, kind) -> Path:
    return shutil.copytree(pristine[kind], tmp_path / "src")


# --- config.json -------------------------------------------------------------------------------

BAD_INTEGERS = ["true", "false", "1e9", "1.5", '"abc"', "null", "-1", "0", "1e999", "NaN", "[3]", "{}", "2.5e3"]
CONFIG_KEYS = {
    "gpt-oss": [("hidden_size",), ("intermediate_size",), ("num_local_experts",)],
    "modelopt": [("hidden_size",), ("moe_intermediate_size",), ("n_routed_experts",)],
    "deepseek-v4": [("hidden_size",), ("moe_intermediate_size",), ("n_routed_experts",)],
    "qwen3": [("hidden_size",), ("moe_intermediate_size",), ("num_experts",)],
}
CONFIG_CASES = [(kind, key, literal) for kind, keys in CONFIG_KEYS.items() for key in keys for literal in BAD_INTEGERS]
CONFIG_CASES += (
    [
        ("gpt-oss", ("swiglu_limit",), literal)
        for literal in ("NaN", "Infinity", "-Infinity", "1e999", "-1", "0", '"abc"', "null", "true", "[7]")
    ]
    + [("deepseek-v4", ("swiglu_limit",), literal) for literal in ("NaN", "Infinity", "1e999", '"abc"', "true", "{}")]
    + [
        (kind, ("quantization_config",), literal)
        for kind in ("gpt-oss", "modelopt", "deepseek-v4")
        for literal in ('"mxfp4"', "[1, 2]", "7", "true")
    ]
    + [("modelopt", ("quantization_config", "config_groups"), literal) for literal in ("[]", '"g"', "3")]
    + [("modelopt", ("quantization_config", "config_groups", "group_0"), literal) for literal in ("[]", "null", "1")]
    + [
        ("modelopt", ("quantization_config", "config_groups", "group_0", "weights", "group_size"), literal)
        for literal in ("true", '"16"', "16.5", "-16", "NaN")
    ]
    + [("modelopt", ("quantization_config", "quant_algo"), literal) for literal in ("7", "null", "[]", '"FP8"', '"INT4_AWQ"')]
    + [("modelopt", ("quantization_config", "ignore"), literal) for literal in ('"lm_head"', "[1]", "{}")]
    + [(kind, ("text_config",), literal) for kind in ("modelopt", "qwen3") for literal in ('"x"', "[]", "1")]
    + [("qwen3", ("hidden_act",), literal) for literal in ("7", '"gelu"', "[]")]
    + [("deepseek-v4", ("expert_dtype",), literal) for literal in ("4", '"fp8"', "null")]
    + [(kind, ("deep",), DEEP) for kind in TARGETS]
)


@pytest.mark.parametrize("kind, key, literal", CONFIG_CASES, ids=lambda v: ".".join(v) if isinstance(v, tuple) else str(v)[:20])
def test_bad_config_value(pristine, tmp_path, kind, key, literal):
    source = copy_of(pristine, tmp_path, kind)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(DEEP if key == ("deep",) else set_raw(config, key, literal))
    convert_fails(source, tmp_path, TARGETS[kind], "config.json")


# --- shard headers -----------------------------------------------------------------------------


def rewrite_header(shard: Path, edit) -> None:
    """Re-encode ``shard``'s JSON header after ``edit(header) -> text``, keeping its data bytes."""
    data = shard.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    text = edit(header).encode()
    shard.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])


FIRST = "model.layers.0.mlp.experts.gate_up_proj_blocks"
HEADER_CASES = {
    "offsets-strings": lambda h: set_raw(h, (FIRST, "data_offsets"), json.dumps([str(o) for o in h[FIRST]["data_offsets"]])),
    "offsets-floats": lambda h: set_raw(h, (FIRST, "data_offsets"), json.dumps([float(o) for o in h[FIRST]["data_offsets"]])),
    "offsets-bools": lambda h: set_raw(h, (FIRST, "data_offsets"), "[false, true]"),
    "offsets-three": lambda h: set_raw(h, (FIRST, "data_offsets"), json.dumps([*h[FIRST]["data_offsets"], 0])),
    "offsets-reversed": lambda h: set_raw(h, (FIRST, "data_offsets"), json.dumps(h[FIRST]["data_offsets"][::-1])),
    "offsets-negative": lambda h: set_raw(h, (FIRST, "data_offsets"), json.dumps([-1, h[FIRST]["data_offsets"][1]])),
    "offsets-null": lambda h: set_raw(h, (FIRST, "data_offsets"), "null"),
    "offsets-object": lambda h: set_raw(h, (FIRST, "data_offsets"), '{"a": 1}'),
    "offsets-deep": lambda h: set_raw(h, (FIRST, "data_offsets"), DEEP),
    "shape-negative-same-product": lambda h: set_raw(
        h, (FIRST, "shape"), json.dumps([-x for x in h[FIRST]["shape"][:2]] + h[FIRST]["shape"][2:])
    ),
    "shape-floats": lambda h: set_raw(h, (FIRST, "shape"), json.dumps([float(x) for x in h[FIRST]["shape"]])),
    "shape-strings": lambda h: set_raw(h, (FIRST, "shape"), json.dumps([str(x) for x in h[FIRST]["shape"]])),
    "shape-bool": lambda h: set_raw(h, (FIRST, "shape"), "[true]"),
    "shape-null": lambda h: set_raw(h, (FIRST, "shape"), "null"),
    "shape-string": lambda h: set_raw(h, (FIRST, "shape"), '"3,192"'),
    "shape-huge": lambda h: set_raw(h, (FIRST, "shape"), "[18446744073709551616]"),
    "dtype-unknown": lambda h: set_raw(h, (FIRST, "dtype"), '"F8_E9M9"'),
    "dtype-int": lambda h: set_raw(h, (FIRST, "dtype"), "8"),
    "dtype-missing": lambda h: set_raw(h, (FIRST, "dtype"), None),
    "entry-list": lambda h: set_raw(h, (FIRST,), "[1, 2]"),
    "entry-string": lambda h: set_raw(h, (FIRST,), '"U8"'),
    "entry-null": lambda h: set_raw(h, (FIRST,), "null"),
    "metadata-list": lambda h: set_raw(h, ("__metadata__",), "[1]"),
    "metadata-non-string": lambda h: set_raw(h, ("__metadata__",), '{"format": 1}'),
    "header-list": lambda h: "[]",
    "header-deep": lambda h: DEEP,
    "header-string": lambda h: '"x"',
    "header-nan": lambda h: "NaN",
    "sub-byte-f6": lambda h: set_raw(h, (FIRST, "dtype"), '"F6_E2M3"'),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_bad_shard_header(pristine, tmp_path, case):
    source = copy_of(pristine, tmp_path, "gpt-oss")
    rewrite_header(source / SHARD, HEADER_CASES[case])
    convert_fails(source, tmp_path, "sm90-cutlass", SHARD)


# --- the index ---------------------------------------------------------------------------------

INDEX_CASES = {
    "value-int": lambda i: set_raw(i, ("weight_map", "lm_head.weight"), "1"),
    "value-null": lambda i: set_raw(i, ("weight_map", "lm_head.weight"), "null"),
    "value-list": lambda i: set_raw(i, ("weight_map", "lm_head.weight"), f'["{SHARD}"]'),
    "value-object": lambda i: set_raw(i, ("weight_map", "lm_head.weight"), "{}"),
    "value-empty": lambda i: set_raw(i, ("weight_map", "lm_head.weight"), '""'),
    "value-deep": lambda i: set_raw(i, ("weight_map", "lm_head.weight"), DEEP),
    "weight-map-list": lambda i: set_raw(i, ("weight_map",), "[]"),
    "weight-map-empty": lambda i: set_raw(i, ("weight_map",), "{}"),
    "weight-map-missing": lambda i: set_raw(i, ("weight_map",), None),
    "index-list": lambda i: "[]",
    "index-deep": lambda i: DEEP,
    "index-not-json": lambda i: "{",
    "index-not-utf8": lambda i: "\udcff",
    "names-missing-shard": lambda i: set_raw(i, ("weight_map", "lm_head.weight"), '"model-00010-of-00010.safetensors"'),
    "names-wrong-shard": lambda i: set_raw(i, ("weight_map", "lm_head.weight"), f'"{SHARD}"'),
}


@pytest.mark.parametrize("case", sorted(INDEX_CASES))
def test_bad_index(pristine, tmp_path, case):
    source = copy_of(pristine, tmp_path, "gpt-oss")
    text = INDEX_CASES[case](json.loads((source / INDEX).read_text()))
    (source / INDEX).write_bytes(text.encode("utf-8", "surrogateescape"))
    convert_fails(source, tmp_path, "sm90-cutlass", INDEX if case != "names-missing-shard" else "model-00010")


# --- sizes are checked against the tensors before any per-expert name is made ----------------


@pytest.mark.parametrize(
    "kind, key",
    [("modelopt", "n_routed_experts"), ("deepseek-v4", "n_routed_experts"), ("qwen3", "num_experts"), ("gpt-oss", "num_local_experts")],
)
@pytest.mark.parametrize("count", [10**9, 2**31 - 1, 5])
def test_expert_count_beyond_the_tensors(pristine, tmp_path, kind, key, count):
    source = copy_of(pristine, tmp_path, kind)
    (source / "config.json").write_text(set_raw(json.loads((source / "config.json").read_text()), (key,), str(count)))
    line = convert_fails(source, tmp_path, TARGETS[kind])
    assert "missing" in line or "expected" in line, line


# --- NVFP4 global scales -----------------------------------------------------------------------


@pytest.mark.parametrize("part", ["weight_scale_2", "input_scale"])
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 0.0, -1.0])
def test_nvfp4_global_scale_not_finite_positive(pristine, tmp_path, part, value):
    import torch
    from safetensors.torch import load_file, save_file

    source = copy_of(pristine, tmp_path, "modelopt")
    index = json.loads((source / INDEX).read_text())["weight_map"]
    name = f"model.layers.1.mlp.experts.1.up_proj.{part}"
    tensors = load_file(source / index[name])
    tensors[name] = torch.full_like(tensors[name], value)
    save_file(tensors, source / index[name], metadata={"format": "pt"})
    convert_fails(source, tmp_path, "cutedsl", name, index[name])


# --- tamper with every output file, every manifest field, random bits of the manifest -----------


@pytest.fixture(scope="module")
def baked(pristine, tmp_path_factory):
    """One output per target family: GPT-OSS for sm90-cutlass (FlashInfer layout, activation limit),
    ModelOpt for cutedsl (NVFP4 scalars, gate/up reconciliation records)."""
    root = tmp_path_factory.mktemp("baked")
    outs = {}
    for kind in ("gpt-oss", "modelopt"):
        result = CliRunner().invoke(main, ["convert", str(pristine[kind]), str(root / kind), "--target", TARGETS[kind], "--quiet"])
        assert result.exit_code == 0, result.output
        outs[kind] = root / kind
    return outs


def verify_detects(out: Path, needle: str) -> str:
    """Run plain verify on a tampered ``out``; assert it fails cleanly with one line naming ``needle``."""
    result = CliRunner().invoke(main, ["verify", str(out), "--quiet"])
    lines = result.output.strip().splitlines()
    assert result.exit_code in (1, 2), f"undetected: {result.output}"
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code == 1:  # mismatch lines, then the one-line summary
        assert lines[-1].startswith(f"failed: {out}: ") and len(lines) >= 2, result.output
        lines = lines[:-1]
    assert lines and all(line.startswith(("mismatch: ", "error: ")) for line in lines), result.output
    assert any(needle in line for line in lines), (needle, result.output)
    return lines[0]


def leaves(value, path=()):
    """``(path, leaf)`` for every scalar in a JSON value, and ``(path, container)`` for every list/object."""
    if isinstance(value, dict):
        yield path, value
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        yield path, value
        for position, item in enumerate(value):
            yield from leaves(item, (*path, position))
    else:
        yield path, value


def changed(value):
    """A different JSON value of the same kind where there is one (7.0 -> 70.0, "v2" -> "v1", ...)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 10 if value else 1.0
    if isinstance(value, str):
        return {"v2": "v1", "v1": "v2"}.get(value, value + "x")
    if isinstance(value, list):
        return value[:-1] if value else [0]
    if isinstance(value, dict):
        return {} if value else {"x": 1}
    return 0


def set_at(manifest, path, value):
    target = manifest
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


@pytest.mark.parametrize("kind", ["gpt-oss", "modelopt"])
def test_every_manifest_field_change_is_detected(baked, tmp_path, kind):
    """Each field of moebake.json (every scalar, list and object, at every depth), changed on its own:
    plain verify reports it, without the source."""
    text = (baked[kind] / "moebake.json").read_text()
    paths = [path for path, _ in leaves(json.loads(text)) if path and path[0] != "manifest_sha256"]
    assert len(paths) > 100
    out = shutil.copytree(baked[kind], tmp_path / "out")
    for path in paths:
        manifest = json.loads(text)
        target = manifest
        for key in path:
            target = target[key]
        set_at(manifest, path, changed(target))
        (out / "moebake.json").write_text(json.dumps(manifest, indent=2) + "\n")
        verify_detects(out, "moebake.json")


@pytest.mark.parametrize(
    "field, value",
    [
        (("target",), "cutedsl"),
        (("activation", "limit"), 70.0),
        (("flashinfer_layout", "id"), "v1"),
        (("layers", 0, "hidden_padded"), 384),
        (("layers",), []),
        (("options", "hidden_multiple"), 256),
        (("target_layout_version",), 2),
        (("files",), {}),
        (("manifest_sha256",), "0" * 64),
        (("source", "format"), "deepseek-v4"),
    ],
)
def test_named_manifest_changes_are_detected(baked, tmp_path, field, value):
    out = shutil.copytree(baked["gpt-oss"], tmp_path / "out")
    manifest = json.loads((out / "moebake.json").read_text())
    set_at(manifest, field, value)
    (out / "moebake.json").write_text(json.dumps(manifest, indent=2) + "\n")
    verify_detects(out, "moebake.json")


@pytest.mark.parametrize("seed", range(40))
def test_random_bit_flip_in_the_manifest_is_detected(baked, tmp_path, seed):
    import random

    out = shutil.copytree(baked["gpt-oss"], tmp_path / "out")
    data = bytearray((out / "moebake.json").read_bytes())
    rng = random.Random(seed)
    position = rng.randrange(len(data))
    data[position] ^= 1 << rng.randrange(8)
    (out / "moebake.json").write_bytes(bytes(data))
    verify_detects(out, "moebake.json")


def test_a_consistently_rewritten_activation_limit_is_caught_by_verify_source(baked, pristine, tmp_path):
    from moebake.schema.manifest import write_manifest

    out = shutil.copytree(baked["gpt-oss"], tmp_path / "out")
    manifest = json.loads((out / "moebake.json").read_text())
    manifest["activation"]["limit"] = 70.0
    write_manifest(out, manifest)
    assert "config.json and manifest disagree (manifest_sha256 differs" in CliRunner().invoke(main, ["verify", str(out)]).output
    rewrite_config_digest(out)  # config.json's digest and the checksums rewritten too: only the source can tell
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(pristine["gpt-oss"]), "--quiet"])
    assert result.exit_code == 1 and "activation" in result.output and "70.0" in result.output, result.output


def rewrite_config_digest(out):
    """Point ``out/config.json`` at the manifest as it is now (and re-record config.json's checksum)."""
    from moebake.schema.checksums import file_record
    from moebake.schema.config_json import manifest_digest
    from moebake.schema.manifest import write_manifest

    manifest = json.loads((out / "moebake.json").read_text())
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["manifest_sha256"] = manifest_digest(manifest)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    manifest["files"]["config.json"] = file_record(out / "config.json")
    write_manifest(out, manifest)


OUTPUT_FILE_TAMPERS = {
    "flip-middle": lambda data: data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 0x10]) + data[len(data) // 2 + 1 :],
    "flip-first": lambda data: bytes([data[0] ^ 1]) + data[1:],
    "flip-last": lambda data: data[:-1] + bytes([data[-1] ^ 0x80]),
    "truncate": lambda data: data[:-1],
    "append": lambda data: data + b"\0",
}


@pytest.mark.parametrize("tamper", sorted(OUTPUT_FILE_TAMPERS))
@pytest.mark.parametrize("kind", ["gpt-oss", "modelopt"])
def test_tamper_of_every_output_file_is_detected(baked, tmp_path, kind, tamper):
    names = sorted(p.name for p in baked[kind].iterdir())
    for name in names:
        out = shutil.copytree(baked[kind], tmp_path / name)
        path = out / name
        path.write_bytes(OUTPUT_FILE_TAMPERS[tamper](path.read_bytes()))
        verify_detects(out, name)


@pytest.mark.parametrize("kind", ["gpt-oss", "modelopt"])
def test_a_missing_or_an_extra_output_file_is_detected(baked, tmp_path, kind):
    for name in sorted(p.name for p in baked[kind].iterdir()):
        out = shutil.copytree(baked[kind], tmp_path / name)
        (out / name).unlink()
        verify_detects(out, name)
    out = shutil.copytree(baked[kind], tmp_path / "extra")
    (out / "notes.txt").write_text("x")
    verify_detects(out, "notes.txt")


@pytest.mark.parametrize("value", [None, {}, "x", 1.5])
def test_readers_of_a_consistently_wrong_manifest_never_crash(baked, tmp_path, value):
    """A manifest whose checksum was rewritten after a field got a wrong type (only a buggy or
    malicious writer does that): verify and inspect answer with exit status 0, 1 or 2, never a traceback."""
    from moebake.schema.manifest import write_manifest

    text = (baked["gpt-oss"] / "moebake.json").read_text()
    paths = [path for path, _ in leaves(json.loads(text)) if path and path[0] != "manifest_sha256"]
    out = shutil.copytree(baked["gpt-oss"], tmp_path / "out")
    crashes = []
    for path in paths:
        manifest = json.loads(text)
        set_at(manifest, path, value)
        write_manifest(out, manifest)
        for command in (["verify", str(out), "--quiet"], ["inspect", str(out)]):
            result = CliRunner().invoke(main, command)
            if result.exit_code not in (0, 1, 2) or not isinstance(result.exception, (SystemExit, type(None))):
                crashes.append((path, command[0], repr(result.exception)))
    assert not crashes, crashes[:5]


@pytest.mark.parametrize("literal", ["[1, 2]", "7", '{"a": 1}', "[null]", '"Gpt"'])
def test_inspect_shows_odd_config_values_instead_of_crashing(pristine, tmp_path, literal):
    source = copy_of(pristine, tmp_path, "gpt-oss")
    for key in ("architectures", "model_type", "num_hidden_layers"):
        (source / "config.json").write_text(set_raw(json.loads((source / "config.json").read_text()), (key,), literal))
    result = CliRunner().invoke(main, ["inspect", str(source)])
    assert result.exit_code in (0, 2) and (result.exception is None or isinstance(result.exception, SystemExit)), result.output
