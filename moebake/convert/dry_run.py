"""``convert --dry-run``: what a conversion would write, from its plan alone (headers read, no weights, nothing written)."""

import os

from moebake.convert.conversion import Conversion
from moebake.progress_bars import size_text


def plan_lines(conversion: Conversion, out: str | os.PathLike) -> list[str]:
    """The plan: source format, target, MoE layers with their padding, then each output shard with its
    tensors (baked ones marked ``*``: dtype, shape, bytes) and the totals."""
    model, shards, layers = conversion.model, conversion.shards, conversion.layers
    baked = {record.prefix + short for record in layers for short in record.tensors}
    lines = [
        f"dry run: would write {out} (nothing written)",
        f"source   {model.checkpoint.root} ({model.format_name})",
        f"target   {conversion.target.spec.name} (layout version {conversion.target.spec.layout_version})",
        f"layers   {len(layers)} MoE layers baked",
    ]
    for record in layers:
        lines.append(
            f"  {record.prefix}: {record.experts} experts, hidden {record.hidden} -> {record.hidden_padded}, "
            f"intermediate {record.intermediate} -> {record.intermediate_padded}"
        )
    for shard in shards:
        lines.append(f"shard {shard.file_name}: {len(shard.tensors)} tensors, {size_text(shard.nbytes)}")
        lines += [f"  {'*' if t.name in baked else ' '} {t.name}  {t.dtype} {list(t.shape)}  {t.nbytes} bytes" for t in shard.tensors]
    total = sum(s.nbytes for s in shards)
    baked_bytes = sum(t.nbytes for s in shards for t in s.tensors if t.name in baked)
    lines.append(
        f"total    {len(shards)} shards, {sum(len(s.tensors) for s in shards)} tensors, {size_text(total)} "
        f"({len(baked)} baked tensors, marked *, {size_text(baked_bytes)}; the rest copied as they are), plus the index, "
        f"the source's side files and moebake.json"
    )
    return lines
