"""Deep verification: invert every baked expert tensor and compare it with the source, bit for bit.

Works a few experts at a time (the layouts are per-expert), reading the baked output with
``safetensors.safe_open`` slices and the source with moebake's reader, so memory stays bounded.
"""

import json
from pathlib import Path

import torch
from safetensors import safe_open

from moebake.convert.manifest import read_manifest
from moebake.convert.targets import get_target
from moebake.formats import open_source
from moebake.formats.checkpoint import INDEX_NAME


def compare_with_source(out: str | Path, source: str | Path, experts_per_step: int = 4) -> list[str]:
    """Problems (one line each) where ``out``'s expert tensors do not invert to ``source``'s bytes."""
    out = Path(out)
    manifest = read_manifest(out)
    target = get_target(manifest["target"])
    layout = manifest["flashinfer_layout"]["id"]
    model = open_source(source)
    weight_map = json.loads((out / INDEX_NAME).read_text())["weight_map"]
    problems = []
    for record in manifest["layers"]:
        short_names = list(record["tensors"])
        for start in range(0, record["experts"], experts_per_step):
            stop = min(start + experts_per_step, record["experts"])
            baked = {}
            for short in short_names:
                full = record["prefix"] + short
                with safe_open(out / weight_map[full], framework="pt") as f:
                    baked[short] = f.get_slice(full)[start:stop]
            for name, restored in target.restore(record, baked, layout).items():
                original = model.checkpoint.file_of(name).read_rows(name, start, stop)
                if not torch.equal(restored.view(torch.uint8), original.view(torch.uint8)):
                    problems.append(_first_difference(name, start, restored, original))
    return problems


def _first_difference(name: str, start: int, restored: torch.Tensor, original: torch.Tensor) -> str:
    if restored.shape != original.shape:
        return f"{name}: restored shape {list(restored.shape)} != source {list(original.shape)}"
    diff = (restored.view(torch.uint8) != original.view(torch.uint8)).nonzero()[0].tolist()
    diff[0] += start
    return f"{name}: first differing byte at index {diff} (experts from {start})"
