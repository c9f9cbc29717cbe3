"""Deep verification: prove a baked output bit-exact against its source, in both directions.

* inverse (:func:`inverse_problems`): every baked expert tensor, inverted by the target's
  ``restore``, equals the source's bytes, so the transform lost nothing;
* forward (:func:`moebake.convert.rebake_check.rebake_problems`): every byte of every output tensor
  equals a fresh bake of the source, so padding holds exactly what the target writes (zeros) and
  pass-through tensors are the source's.

Both run only once re-planning the recorded bake against the source gives the manifest's layer
records (:func:`moebake.convert.rebake_check.replan`); otherwise the source is another model, and
that is the report.

What they prove is said by :func:`proof_summary`: "bit-exact" only where the bake kept the source's
values; a bake that changed some by design (NVFP4 ``--gate-up-globals share`` rescales the smaller
half's block scales) inverts to the source *as rescaled*, and the summary says which experts differ.
A lossy target (``TargetSpec.lossy``: ``sm90-cutlass-w4a8``'s Humming rewrite) has no inverse: only
the re-bake runs, and the summary says that it proves the bytes are what the target makes of the source.

Each phase shows a progress bar (the inverse: per layer; the re-bake: per shard).

Both are target-generic (``plan``/``restore`` of the manifest's target) and work one chunk of
experts at a time (the manifest's ``chunk_bytes``), so memory stays bounded whatever the model.
Each problem is one line naming the file, the tensor and the first differing element's index in
that tensor's own index space.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from moebake.convert.mismatch import first_difference
from moebake.convert.rebake_check import rebake_problems, recorded_options, replan
from moebake.convert.targets import get_target
from moebake.formats import SOURCE_FORMATS, detected_format, open_model
from moebake.formats.checkpoint import EXPERT_INDEX, open_checkpoint
from moebake.formats.safetensors_file import read_header, tensor_nbytes
from moebake.progress_bars import byte_bar, shard_done
from moebake.schema.index import read_index
from moebake.schema.manifest import MANIFEST_NAME, Manifest, read_manifest_record, rescaled_gate_up

if TYPE_CHECKING:
    from moebake.formats.source_model import SourceModel
    from moebake.schema.manifest import LayerRecord


def compare_with_source(out: str | os.PathLike, source: str | os.PathLike, progress: bool = False) -> list[str]:
    """Problems (one line each) where ``out`` is not bit-exact against checkpoint ``source``."""
    out = Path(out)
    manifest = read_manifest_record(out)
    checkpoint = open_checkpoint(source)
    if not SOURCE_FORMATS[manifest.source.format].detect(checkpoint) and (other := detected_format(checkpoint)) is not None:
        return [
            f"{out / MANIFEST_NAME}: the source is not the checkpoint this was baked from: source.format is "
            f"{manifest.source.format!r}, {source} is a {other} checkpoint"
        ]
    model = open_model(checkpoint, (manifest.source.format,))  # as baked, e.g. bf16-moe of an NVFP4 checkpoint
    shards, problems = replan(out, manifest, model)
    if problems:
        return problems
    if get_target(manifest.target).spec.lossy:  # no inverse exists: the re-bake alone (proof_summary says so)
        return rebake_problems(out, shards, progress)
    return inverse_problems(out, manifest, model, progress) + rebake_problems(out, shards, progress)


def proof_summary(out: str | os.PathLike, source: str) -> str:
    """What :func:`compare_with_source` proved once it found no problem, for the ``ok:`` line: bit-exactness,
    or, where the bake rescaled NVFP4 gate/up block scales by design, what was proved and what differs."""
    manifest = read_manifest_record(Path(out))
    lossy = get_target(manifest.target).spec.lossy
    if lossy:
        return (
            f"against {source}: re-baking it reproduces every byte, so this is exactly what {manifest.target} makes "
            f"of it; not inverted, and not bit-exact to it by design ({lossy})"
        )
    rescaled, experts, change = rescaled_gate_up(manifest)
    if not rescaled:
        return f"bit-exact against {source}: experts invert to it, and re-baking it reproduces every byte"
    return (
        f"against {source}: re-baking it reproduces every byte, and the experts invert to it except, by design "
        f"(--gate-up-globals share), the gate/up block scales of {rescaled} of {experts} experts, which invert to "
        f"its values rescaled to one shared global (largest relative change {change:.2%}); those are not "
        f"bit-exact to the source (--gate-up-globals keep bakes its bytes)"
    )


def inverse_problems(out: Path, manifest: Manifest, model: SourceModel, progress: bool = False) -> list[str]:
    """Problems where a baked expert tensor, inverted by the target, differs from the source tensor."""
    target = get_target(manifest.target)
    layout = manifest.flashinfer_layout
    chunk_bytes = recorded_options(out, manifest).chunk_bytes
    weight_map = read_index(out).weight_map
    header = functools.cache(lambda shard_name: read_header(out / shard_name))
    problems = []
    total = sum(tensor_nbytes(s.dtype, s.shape) for record in manifest.layers for s in record.tensors.values())
    with byte_bar(total, "inverting baked experts", enabled=progress, shards=len(manifest.layers), what="layer") as bar:
        for record in manifest.layers:
            prefix, specs = record.prefix, record.tensors
            row_bytes = max(tensor_nbytes(s.dtype, s.shape) // s.shape[0] for s in specs.values())
            expert_bytes = sum(tensor_nbytes(s.dtype, s.shape) // s.shape[0] for s in specs.values())
            step = max(1, chunk_bytes // max(1, row_bytes))
            failed = set()
            for start in range(0, record.experts, step):
                stop = min(start + step, record.experts)
                baked = {}
                for short in specs:
                    baked[short] = header(weight_map[prefix + short]).read_rows(prefix + short, start, stop)
                for name, restored in target.restore(record, baked, layout).items():
                    if name in failed:
                        continue
                    problem = _compare_restored(out, weight_map, record, model, name, restored, start, stop)
                    if problem:
                        failed.add(name)
                        problems.append(problem)
                bar.update(expert_bytes * (stop - start))
            shard_done(bar, prefix, expert_bytes * record.experts, "inverted and compared", "layer")
    return problems


def _compare_restored(
    out: Path, weight_map: dict[str, str], record: LayerRecord, model: SourceModel, name: str, restored: torch.Tensor, start: int, stop: int
) -> str | None:
    """One line if ``restored`` (source tensor or per-expert pattern ``name``, experts ``[start, stop)``)
    differs from the source. A pattern's experts are compared as one ``[E, ...]`` stacked tensor.
    A model whose targets bake other bytes than the file's (ModelOpt NVFP4's shared gate/up global
    scales) gives them through its own ``read_experts``."""
    checkpoint = model.checkpoint
    baked = [record.prefix + short for short, spec in record.tensors.items() if name in spec.sources]
    files = sorted({str(out / weight_map[b]) for b in baked}) or [str(out)]
    where = f"{', '.join(files)}: {', '.join(baked) or record.prefix + '*'} inverted to {name}"
    per_expert = EXPERT_INDEX in name
    entry = checkpoint.entry(name.replace(EXPERT_INDEX, "0"))
    shape = (record.experts, *entry.shape) if per_expert else entry.shape
    source_path = checkpoint.root if per_expert else checkpoint.file_of(name).path
    original = model.read_experts(name, start, stop).contiguous().reshape(-1).view(torch.uint8)
    actual = restored.contiguous().reshape(-1).view(torch.uint8)
    if len(actual) != len(original):
        return f"{where}: {len(actual)} bytes for experts [{start}, {stop}), {source_path} has {len(original)}"
    difference = first_difference(actual, original, entry.dtype, shape, start * checkpoint.expert_row_bytes(name))
    if difference:
        return f"{where}: first difference at {difference} (restored != source {source_path})"
    return None
