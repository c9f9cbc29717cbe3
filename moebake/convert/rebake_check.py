"""Deep verification, forward direction: re-bake every output tensor from the source and compare bytes.

Re-plans the conversion the manifest records (same target, same options) against the source; if the
plan's layer records match the manifest's (:func:`replan`), streams each planned tensor's producer
chunk by chunk against the same byte range of the stored tensor (:func:`rebake_problems`). That covers
every byte of every tensor in the output's shards: baked expert tensors with
all their padding, and the pass-through copies. Memory stays bounded by one chunk of each side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from moebake.convert.mismatch import first_difference
from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputShard, OutputTensor, assign_shards
from moebake.convert.targets import get_target
from moebake.errors import ManifestError, MoebakeError
from moebake.formats.safetensors_file import SafetensorsFile, read_header
from moebake.progress_bars import byte_bar, shard_done
from moebake.schema.manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from moebake.convert.targets.base import Target
    from moebake.formats.source_model import SourceModel


def recorded_options(out: Path, manifest: Manifest) -> ConvertOptions:
    """The ConvertOptions the manifest records; MoebakeError if this moebake cannot rebuild them."""
    try:
        return ConvertOptions(**manifest.options)
    except (KeyError, TypeError) as err:
        raise ManifestError(f"{out / MANIFEST_NAME}: options {manifest.options!r} not understood ({err})") from None


def replan(out: Path, manifest: Manifest, model: SourceModel) -> tuple[list[OutputShard], list[str]]:
    """The shards a fresh bake of ``model`` with the recorded target and options writes, and problems
    where the manifest's record of the bake differs from that plan (layout version, MoE layers and
    their dims and tensors). Plans only: reads no weights. Shards are empty when there are problems,
    since byte comparisons against another model would only repeat them."""
    target = get_target(manifest.target)
    if manifest.target_layout_version != target.spec.layout_version:
        return [], [
            f"{out / MANIFEST_NAME}: baked with {target.spec.name} layout version "
            f"{manifest.target_layout_version}, this moebake writes version {target.spec.layout_version}; "
            "cannot re-derive it"
        ]
    options = recorded_options(out, manifest)
    converted, layers = target.plan(model, options)
    problems = _model_differences(out, manifest, model, target, options)
    problems += _layer_differences(
        out, *(json.loads(json.dumps([layer.to_json() for layer in records])) for records in (manifest.layers, layers))
    )
    return ([] if problems else assign_shards(model.checkpoint, converted, options.chunk_bytes)), problems


def _model_differences(out: Path, manifest: Manifest, model: SourceModel, target: Target, options: ConvertOptions) -> list[str]:
    """Top-level records the source re-derives: its format, the activation, the FlashInfer layout."""
    expected = {
        "source.format": model.format_name,
        "activation": model.activation().to_json(),
        "flashinfer_layout.id": options.flashinfer_layout and str(options.flashinfer_layout),
    }
    recorded = {
        "source.format": manifest.source.format,
        "activation": json.loads(json.dumps(manifest.activation.to_json())),
        "flashinfer_layout.id": manifest.flashinfer_layout and str(manifest.flashinfer_layout),
    }
    where = f"{out / MANIFEST_NAME}: the source is not the checkpoint this was baked from"
    return [
        f"{where}: {key} is {recorded[key]!r}, the source gives {value!r}"
        for key, value in expected.items()
        if json.loads(json.dumps(value)) != recorded[key]
    ]


def _layer_differences(out: Path, recorded: list[dict], planned: list[dict]) -> list[str]:
    where = f"{out / MANIFEST_NAME}: the source is not the checkpoint this was baked from"
    if [r["prefix"] for r in recorded] != [p["prefix"] for p in planned]:
        return [f"{where}: MoE layers {[r['prefix'] for r in recorded]}, the source has {[p['prefix'] for p in planned]}"]
    lines = []
    for r, p in zip(recorded, planned):
        for key in sorted(set(r) | set(p)):
            if r.get(key) != p.get(key):
                path, a, b = _first_difference_in(r.get(key), p.get(key), (key,))
                lines.append(f"{where}: layer {r['prefix']} {'.'.join(path)} is {a!r}, the source gives {b!r}")
    return lines


def _first_difference_in(recorded: object, planned: object, path: tuple) -> tuple[tuple, object, object]:
    """``(path, recorded value, planned value)`` at the first difference between two JSON values."""
    if isinstance(recorded, dict) and isinstance(planned, dict):
        for key in sorted(set(recorded) | set(planned)):
            if recorded.get(key) != planned.get(key):
                return _first_difference_in(recorded.get(key), planned.get(key), (*path, key))
    return path, recorded, planned


def rebake_problems(out: str | os.PathLike, shards: list[OutputShard], progress: bool = False) -> list[str]:
    """Problems (one line each) where ``out``'s stored bytes differ from ``shards`` (see :func:`replan`)."""
    out = Path(out)
    problems = []
    with byte_bar(sum(s.nbytes for s in shards), "re-baking from source", enabled=progress, shards=len(shards)) as bar:
        for shard in shards:
            try:
                stored = read_header(out / shard.file_name)
            except MoebakeError as err:
                problems.append(f"{err} (re-baking the source writes this shard)")
                bar.update(shard.nbytes)
                continue
            planned = {t.name for t in shard.tensors}
            problems += [
                f"{stored.path}: tensor {name} is not produced by re-baking the source" for name in sorted(set(stored.tensors) - planned)
            ]
            for tensor in shard.tensors:
                problem = _compare_tensor(stored, tensor, bar.update)
                if problem:
                    problems.append(problem)
            shard_done(bar, shard.file_name, shard.nbytes, "re-baked and compared")
    return problems


def _compare_tensor(stored: SafetensorsFile, tensor: OutputTensor, on_bytes: Callable[[int], object]) -> str | None:
    entry = stored.tensors.get(tensor.name)
    if entry is None:
        return f"{stored.path}: tensor {tensor.name} is missing (re-baking the source produces it)"
    if (entry.dtype, entry.shape) != (tensor.dtype, tensor.shape):
        return (
            f"{stored.path}: tensor {tensor.name} is {entry.dtype} {list(entry.shape)}, "
            f"re-baking the source gives {tensor.dtype} {list(tensor.shape)}"
        )
    position, first, differing = 0, None, 0
    for chunk in tensor.produce():
        expected = chunk.contiguous().view(-1).view(torch.uint8)
        actual = stored.read_bytes(entry, position, position + len(expected))
        difference = first_difference(actual, expected, entry.dtype, entry.shape, position)
        if difference:
            first = first or difference
            differing += int((actual != expected).sum())
        position += len(expected)
        on_bytes(len(expected))
    if first:  # one line per tensor: the first difference, and how many bytes differ in all
        return (
            f"{stored.path}: tensor {tensor.name}: first difference at {first} (stored != re-baked from source); "
            f"{differing} of {position} bytes differ"
        )
    return None
