"""Every target x source bake of tiny synthetic checkpoints, hashed file by file (the byte-unchanged guard).

Run as a script to (re)record ``tests/fixtures/bake_hashes.json``, the truth that
``tests/test_bytes_unchanged.py`` compares against::

    .venv/bin/python tests/bake_hashes.py "why the bytes changed (one line)"

Only do that for an intentional byte change, in the commit that makes it (see the test's docstring).
:func:`bake_case` is shared by the script and the test, so both bake exactly the same cases.
"""

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

if __name__ == "__main__":  # record this checkout's bytes, not those of whichever moebake the Python has installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import write_bf16_moe, write_deepseek_v4, write_modelopt_nvfp4
from moebake.synthetic import write_gpt_oss

FIXTURE = Path(__file__).parent / "fixtures" / "bake_hashes.json"

# GPT-OSS dims that need padding (H=160 -> 256, I=96 -> 128); DeepSeek-V4 dims are multiples of 128
# (its engine path does not pad); ModelOpt NVFP4 and BF16 MoE at the writers' small defaults.
_GPT_OSS = (write_gpt_oss, {"num_layers": 2, "num_experts": 3, "hidden": 160, "intermediate": 96, "vocab": 64})
_GPT_OSS_64 = (write_gpt_oss, {**_GPT_OSS[1], "hidden": 192})  # Marlin takes H % 64 == 0 only: 192 -> 256, I 96 -> 128
_DSV4 = (write_deepseek_v4, {"num_layers": 2, "num_experts": 3, "hidden": 256, "intermediate": 128, "mtp_layers": 1})
_DSV4_NO_LIMIT = (write_deepseek_v4, {**_DSV4[1], "swiglu_limit": None})
_MODELOPT = (write_modelopt_nvfp4, {"num_layers": 3, "num_experts": 4, "hidden": 128, "intermediate": 64})


def _wide_scales(case):
    """A source case whose expert E8M0 scales are then widened (60..127), so that the Humming clamp rewrites groups."""
    write, arguments = case

    def written(path, **kwargs):
        from engine_oracles.humming_oracle import widen_mxfp4_scales

        source = write(path, **kwargs)
        widen_mxfp4_scales(source, seed=5)
        return source

    return written, arguments


def _bf16(style: str, **extra):
    return write_bf16_moe, {"style": style, "num_layers": 2, "num_experts": 4, "hidden": 64, "intermediate": 32, **extra}


# case id -> (source writer and its arguments, ConvertOptions arguments)
CASES = {
    "sm90-cutlass/gpt-oss": (_GPT_OSS, {"target": "sm90-cutlass"}),
    "sm90-cutlass/gpt-oss/v1": (_GPT_OSS, {"target": "sm90-cutlass", "flashinfer_layout": "v1"}),
    "sm90-cutlass/gpt-oss/vllm": (_GPT_OSS, {"target": "sm90-cutlass", "engine": "vllm"}),
    "sm90-cutlass/gpt-oss/pad-256": (_GPT_OSS, {"target": "sm90-cutlass", "hidden_multiple": 256, "intermediate_multiple": 256}),
    "sm90-cutlass/gpt-oss/64KiB-chunks": (_GPT_OSS, {"target": "sm90-cutlass", "chunk_bytes": 1 << 16}),
    "sm90-cutlass/deepseek-v4": (_DSV4, {"target": "sm90-cutlass"}),
    "sm90-cutlass/deepseek-v4/v1": (_DSV4, {"target": "sm90-cutlass", "flashinfer_layout": "v1"}),
    "sm90-cutlass-w4a8/gpt-oss": (_GPT_OSS, {"target": "sm90-cutlass-w4a8"}),
    "sm90-cutlass-w4a8/gpt-oss/wide-scales": (_wide_scales(_GPT_OSS), {"target": "sm90-cutlass-w4a8"}),
    "sm90-cutlass-w4a8/deepseek-v4": (_DSV4, {"target": "sm90-cutlass-w4a8"}),
    "sm90-cutlass-w4a8/deepseek-v4/wide-scales": (_wide_scales(_DSV4), {"target": "sm90-cutlass-w4a8"}),
    "sm100-trtllm/gpt-oss": (_GPT_OSS, {"target": "sm100-trtllm"}),
    "sm100-trtllm/deepseek-v4": (_DSV4, {"target": "sm100-trtllm"}),
    "sm100-trtllm/deepseek-v4/no-limit": (_DSV4_NO_LIMIT, {"target": "sm100-trtllm"}),
    "sm90-marlin/gpt-oss": (_GPT_OSS_64, {"target": "sm90-marlin"}),
    "sm90-marlin/gpt-oss/64KiB-chunks": (_GPT_OSS_64, {"target": "sm90-marlin", "chunk_bytes": 1 << 16}),
    "sm90-marlin/deepseek-v4": (_DSV4, {"target": "sm90-marlin"}),
    "cutedsl/modelopt-nvfp4": (_MODELOPT, {"target": "cutedsl"}),
    "cutedsl-deepep/modelopt-nvfp4": (_MODELOPT, {"target": "cutedsl-deepep"}),
    "deepep-bf16/qwen3.5": (_bf16("qwen3.5", mtp_layers=1), {"target": "deepep-bf16"}),
    "deepep-bf16/qwen3": (_bf16("qwen3"), {"target": "deepep-bf16"}),
    "deepep-bf16/mixtral": (_bf16("mixtral"), {"target": "deepep-bf16"}),
    "deepep-bf16/modelopt-nvfp4-mtp": (_MODELOPT, {"target": "deepep-bf16"}),
}

# Manifest fields whose value is fixed by the source bytes and the options (not the run's time,
# place or moebake version); each is hashed on its own, so a failure names the field.
MANIFEST_FIELDS = (
    "schema",
    "target",
    "target_layout_version",
    "flashinfer_layout",
    "source.format",
    "source.files",
    "options",
    "activation",
    "layers",
    "files",
)


def _field(manifest: dict, dotted: str):
    value = manifest
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def file_hashes(directory: Path) -> dict[str, str]:
    """``{file: sha256}`` of every output file but the manifest, plus ``moebake.json:FIELD`` for its stable fields."""
    hashes = {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir()) if path.name != "moebake.json"
    }
    manifest = json.loads((directory / "moebake.json").read_text())
    for name in MANIFEST_FIELDS:
        blob = json.dumps(_field(manifest, name), sort_keys=True).encode()
        hashes[f"moebake.json:{name}"] = hashlib.sha256(blob).hexdigest()
    return hashes


def bake_case(case: str, root: Path) -> dict[str, str]:
    """Write case ``case``'s source under ``root``, bake it, and return the output's :func:`file_hashes`."""
    (write, arguments), options = CASES[case]
    source = write(root / "src", **arguments)
    convert(source, root / "out", ConvertOptions(**options), progress=False)
    return file_hashes(root / "out")


def record(reason: str) -> None:
    """Bake every case and write :data:`FIXTURE`, appending ``reason`` (why the bytes changed) to its history."""
    cases = {}
    for case in CASES:
        with tempfile.TemporaryDirectory() as root:
            cases[case] = bake_case(case, Path(root))
        print(f"{case}: {len(cases[case])} hashes")
    reasons = json.loads(FIXTURE.read_text())["reasons"] if FIXTURE.is_file() else []
    fixture = {"reasons": [*reasons, reason], "torch": torch.__version__, "cases": cases}
    FIXTURE.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].strip():
        sys.exit(f"usage: {sys.argv[0]} 'one line: why the baked bytes change'")
    record(sys.argv[1].strip())
