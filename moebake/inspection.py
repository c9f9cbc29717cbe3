"""``moebake inspect``: what a checkpoint directory holds, as a JSON-ready report and as text.

* A source checkpoint: detected format and model family, MoE layers, experts, dimensions, what
  the experts are quantized as (what gets baked), shards, and for every target whether it can be
  converted and, if not, why. Each target is asked exactly as ``convert`` asks it
  (:func:`moebake.convert.targets.plan_target`: the target's own source formats, then its plan with
  default options; planning reads no weights), so the answer and its reason are the target's own.
* A baked checkpoint (it has ``moebake.json``): the manifest's summary.

Reads headers and JSON only, never weights.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moebake.convert.options import ConvertOptions
from moebake.convert.targets import TARGETS, kernel_description, plan_target
from moebake.errors import MoebakeError
from moebake.formats import SOURCE_FORMATS, detect_format
from moebake.formats.checkpoint import open_checkpoint
from moebake.kernels.pack import kernel_lines, kernels_report
from moebake.progress_bars import size_text
from moebake.schema.config_values import as_count, first_model_value, short_repr
from moebake.schema.engine_release import EngineRelease
from moebake.schema.manifest import MANIFEST_NAME, Manifest, read_manifest_record
from moebake.schema.profiles import release_span, serving_flags

if TYPE_CHECKING:
    from moebake.formats.checkpoint import SourceCheckpoint
    from moebake.schema.manifest import EngineRecord


def inspect_path(path: str | os.PathLike) -> dict:
    """Report on checkpoint directory ``path`` (baked if it has a manifest, else a source)."""
    path = Path(path)
    return baked_report(path) if (path / MANIFEST_NAME).is_file() else source_report(path)


def source_report(path: Path) -> dict:
    checkpoint = open_checkpoint(path)
    config, quant = checkpoint.config, checkpoint.values.section("quantization_config")
    report: dict[str, Any] = {
        "kind": "source",
        "path": str(path),
        "model_type": _shown(config.get("model_type")),
        "architectures": _shown_list(config.get("architectures")),
        "quantization": None,
        "quant_method": _shown(quant.raw("quant_method") if quant else None),
        "shards": len(checkpoint.shards),
        "tensors": len(checkpoint.locations),
        "tensor_bytes": sum(checkpoint.entry(name).nbytes for name in checkpoint.locations),
        "format": None,
        "problem": None,
        "moe": None,
        "targets": {},
    }
    try:
        report["format"] = detect_format(checkpoint)
        model = SOURCE_FORMATS[report["format"]].open_model(checkpoint)
    except MoebakeError as err:
        report["problem"] = str(err)
        report["targets"] = {name: {"convertible": False, "reason": "the source is not a supported checkpoint"} for name in TARGETS}
        return report
    report["quantization"] = model.expert_quantization
    report["moe"] = {
        "layers": len(model.layers),
        "hidden_layers": as_count(first_model_value(checkpoint.values, "num_hidden_layers")),
        "experts": model.num_experts,
        "experts_per_token": as_count(first_model_value(checkpoint.values, "num_experts_per_tok")),
        "hidden": model.hidden_size,
        "intermediate": model.intermediate_size,
        "activation": model.activation().to_json(),
    }
    report["targets"] = {name: _ask_target(name, checkpoint) for name in TARGETS}
    return report


def _shown(value: object) -> str | None:
    """A config string as it is, anything else (an untrusted config may hold anything) as JSON text."""
    return value if value is None or isinstance(value, str) else short_repr(value)


def _shown_list(value: object) -> list[str] | None:
    if value is None:
        return None
    return [v if isinstance(v, str) else short_repr(v) for v in value] if isinstance(value, list) else [short_repr(value)]


def _ask_target(name: str, checkpoint: SourceCheckpoint) -> dict:
    """Ask target ``name`` as convert does, with default options: convertible, or the target's reason."""
    try:
        _, converted, layers = plan_target(checkpoint, name, ConvertOptions(name))
    except MoebakeError as err:
        return {"convertible": False, "reason": str(err)}
    dims = {key: getattr(layers[0], key) for key in ("hidden", "hidden_padded", "intermediate", "intermediate_padded")}
    return {
        "convertible": True,
        "kernel": kernel_description(name),
        "default_padding": dims,
        "baked_expert_bytes": sum(t.nbytes for t in converted),
    }


def baked_report(path: Path) -> dict:
    manifest = read_manifest_record(path)
    first, source = manifest.layers[0], manifest.source
    layout = manifest.flashinfer_layout
    return {
        "kind": "baked",
        "path": str(path),
        "target": manifest.target,
        "target_layout_version": manifest.target_layout_version,
        "kernel": kernel_description(manifest.target) if manifest.target in TARGETS else None,
        "flashinfer_layout": None if layout is None else {"id": layout, "description": manifest.flashinfer_layout_description},
        "source": {"format": source.format, "location": source.location, "revision": source.revision},
        "moebake_version": manifest.moebake_version,
        "created": manifest.created,
        "options": _options(manifest),
        "activation": manifest.activation.to_json(),
        "moe": {
            "layers": len(manifest.layers),
            **{key: getattr(first, key) for key in ("experts", "hidden", "hidden_padded", "intermediate", "intermediate_padded")},
        },
        "expert_tensors": {short: {"dtype": spec.dtype, "shape": list(spec.shape)} for short, spec in first.tensors.items()},
        "files": len(manifest.files),
        "bytes": sum(record.bytes for record in manifest.files.values()),
        "file_problems": _file_problems(path, manifest),
        "engine": _engine_report(manifest.engine),
        "serves": [_engine_report(other) for other in manifest.serves],
        "kernels": kernels_report(manifest.to_json(), path / MANIFEST_NAME),
    }


def _options(manifest: Manifest) -> dict:
    """The recorded options, without a ``flashinfer_layout`` where the bake has none (the target bakes no FlashInfer
    SM90 fp4 layout: older bakes of such targets recorded the default all the same)."""
    if manifest.flashinfer_layout is None:
        return {key: value for key, value in manifest.options.items() if key != "flashinfer_layout"}
    return manifest.options


def _file_problems(path: Path, manifest: Manifest) -> list[str]:
    """The listed files that are missing, not regular files, or not of their recorded size (``os.stat`` only:
    ``inspect`` reads no file's bytes; ``verify`` checks their checksums)."""
    problems = []
    for name, record in manifest.files.items():
        try:
            st = os.stat(path / name)
        except OSError:
            problems.append(f"{name}: missing")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{name}: not a regular file")
        elif st.st_size != record.bytes:
            problems.append(f"{name}: {st.st_size} bytes, {MANIFEST_NAME} says {record.bytes}")
    return problems


def _engine_report(engine: EngineRecord | None) -> dict | None:
    """The manifest's engine record (None for bakes from before engine profiles), with the flags that serve it."""
    if engine is None:
        return None
    return engine.to_json() | {"serving_flags": serving_flags(engine)}


def _engine_line(engine: dict) -> str:
    exactness = "engine-exact" if engine["exact"] else f"NOT engine-exact: {engine['not_exact_because']}"
    versions = engine["releases"] if "releases" in engine else [engine["version"]] if engine["exact"] else []
    releases = [EngineRelease(engine["name"], version) for version in versions]
    proven = f"; proven on {engine['name']} {release_span(engine['name'], releases)}" if releases else ""
    serve = f"serve with {engine['serving_flags']}" if engine["serving_flags"] else "no flags serve it"
    return f"{engine['name']} {engine['version']}: {exactness}{proven}; {serve}"


def render_text(report: dict) -> str:
    """Human-readable form of :func:`inspect_path`'s report."""
    return "\n".join(_source_lines(report) if report["kind"] == "source" else _baked_lines(report)) + "\n"


def _source_lines(r: dict) -> list[str]:
    family = f"{', '.join(r['architectures'] or ['?'])}, model_type {r['model_type']}"
    lines = [
        f"{r['path']}: source checkpoint",
        f"  format         {r['format'] or 'not supported'} ({family})",
        f"  quantization   {r['quantization'] or '?'} (config.json quant_method: {r['quant_method'] or 'none'})",
        f"  weights        {r['shards']} shards, {r['tensors']} tensors, {size_text(r['tensor_bytes'])}",
    ]
    if r["problem"]:
        lines.append(f"  problem        {r['problem']}")
    if r["moe"]:
        m = r["moe"]
        lines += [
            f"  MoE layers     {m['layers']} ({m['hidden_layers'] or '?'} hidden layers in config.json), "
            f"{m['experts']} experts, {m['experts_per_token'] or '?'} per token",
            f"  dims           hidden {m['hidden']}, intermediate {m['intermediate']}",
            f"  activation     {json.dumps(m['activation'])}",
        ]
    lines.append("targets")
    width = max(map(len, r["targets"])) + 1
    for name, answer in r["targets"].items():
        if answer["convertible"]:
            p = answer["default_padding"]
            lines.append(
                f"  {name:<{width}} yes: {answer['kernel']}; default padding hidden {p['hidden']} -> "
                f"{p['hidden_padded']}, intermediate {p['intermediate']} -> {p['intermediate_padded']}; "
                f"baked experts {size_text(answer['baked_expert_bytes'])}"
            )
        else:
            lines.append(f"  {name:<{width}} no: {_within(answer['reason'], r['path'])}")
    return lines


def _within(reason: str, path: str) -> str:
    """``reason`` without the checkpoint's path in front, which the report's first line already gives
    (``/data/m: target ...`` -> ``target ...``; ``/data/m/config.json: ...`` -> ``config.json: ...``)."""
    for prefix in (f"{path}: ", f"{path.rstrip('/')}/"):
        if reason.startswith(prefix):
            return reason[len(prefix) :]
    return reason


def _baked_lines(r: dict) -> list[str]:
    m, s, layout = r["moe"], r["source"], r["flashinfer_layout"] or {}
    created = f", {r['created']}" if r["created"] else ""
    lines = [
        f"{r['path']}: baked checkpoint (moebake {r['moebake_version']}{created})",
        f"  target         {r['target']} (layout version {r['target_layout_version']}): {r['kernel'] or 'unknown to this moebake'}",
        *([f"  FlashInfer     layout {layout['id']}: {layout['description']}"] if layout else []),
        f"  source         {s['format']} {s['location']}" + (f" @ {s['revision']}" if s["revision"] else ""),
        f"  MoE layers     {m['layers']}, {m['experts']} experts",
        f"  padding        hidden {m['hidden']} -> {m['hidden_padded']}, intermediate {m['intermediate']} -> {m['intermediate_padded']}",
        f"  activation     {json.dumps(r['activation'])}",
        f"  options        {json.dumps(r['options'])}",
        f"  engine         {_engine_line(r['engine']) if r['engine'] else 'not recorded (baked before engine profiles)'}",
        *(f"  also serves    {_engine_line(other)} (the same bytes)" for other in r["serves"]),
        f"  files          {r['files']} files, {size_text(r['bytes'])} (plus moebake.json)",
        *(f"  problem        {problem}" for problem in r["file_problems"]),
        *kernel_lines(r.get("kernels") or []),
        "  expert tensors (per MoE layer)",
    ]
    lines += [f"    {short:<18} {spec['dtype']:<5} {spec['shape']}" for short, spec in r["expert_tensors"].items()]
    lines.append(
        f"checked: the manifest, and each listed file's presence and size, not its bytes: `moebake verify {r['path']}` "
        "checks every file's checksum and header"
    )
    return lines


def gate_up_summary(manifest: Manifest) -> str | None:
    """One console line summing up the layers' ``gate_up_global_scale`` reports (None if the target has none)."""
    reports = [layer.gate_up_global_scale for layer in manifest.layers if layer.gate_up_global_scale is not None]
    if not reports:
        return None
    experts = sum(layer.experts for layer in manifest.layers)
    rescaled = sum(r["experts_rescaled"] for r in reports)
    kept_apart = sum(r.get("experts_kept_apart", 0) for r in reports)
    if kept_apart:
        return (
            f"gate/up global scales kept as the source has them (--gate-up-globals keep): they differ in {kept_apart} of "
            f"{experts} experts, whose up halves a kernel taking one W13 alpha dequantizes with the gate's global"
        )
    if not rescaled:
        return f"gate/up global scales: already one per expert in all {experts} experts"
    keys = ("max_relative_change", "max_relative_error", "subnormal_below", "zero_at_or_below")
    worst = {key: max(r[key] for r in reports) for key in keys}
    return (
        f"gate/up global scales made one in {rescaled} of {experts} experts: the smaller half's block scales rescaled "
        f"(largest relative change {worst['max_relative_change']:.2%}); E4M3 rounding of any block scale >= "
        f"{worst['subnormal_below']:.3g}: at most {worst['max_relative_error']:.2%}; smaller ones lose precision, "
        f"those <= {worst['zero_at_or_below']:.3g} become 0 (--gate-up-globals keep bakes the engine's bytes instead)"
    )
