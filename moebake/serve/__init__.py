"""GPU runtime: load a baked checkpoint and run the kernel it was baked for.

::

    import moebake.serve
    ckpt = moebake.serve.open("gpt-oss-120b-sm90")           # reads moebake.json + the index
    experts = ckpt.load_experts(0, device="cuda")            # layer 0, all experts (ep_rank=0, ep_size=1)
    out = experts.forward(hidden_states, topk_ids, topk_weights)   # [T, H] bf16
    experts.parameters()                                     # {"w13_weight": ..., ...} SGLang names
    experts.load_stats                                       # bytes, seconds, GiB/s

:func:`open` dispatches on the manifest's ``target`` through :data:`RUNTIMES`, the ``moebake.serve`` routes of the
serving records (:mod:`moebake.schema.serving`), each a :class:`~moebake.serve.baked_checkpoint.BakedCheckpoint`
subclass named by its route.
"""

import os
from pathlib import Path

from moebake.errors import UnsupportedError
from moebake.schema import serving
from moebake.schema.manifest import MANIFEST_NAME, read_manifest_record
from moebake.serve.baked_checkpoint import BakedCheckpoint
from moebake.serve.deepep_bf16 import DeepEPBf16Checkpoint
from moebake.serve.platform import Platform
from moebake.serve.sm90_cutlass import Sm90CutlassCheckpoint, Sm90CutlassW4A8Checkpoint

_CLASSES = {runtime.__name__: runtime for runtime in (Sm90CutlassCheckpoint, Sm90CutlassW4A8Checkpoint, DeepEPBf16Checkpoint)}
RUNTIMES: dict[str, type[BakedCheckpoint]] = {r.target: _CLASSES[str(r.route)] for r in serving.routes(serving.SERVE)}
"""Target -> its runtime class (a view of the serving records)."""


def open(path: str | os.PathLike, *, platform: Platform | None = None) -> BakedCheckpoint:  # noqa: A001 - moebake.serve.open
    """Open baked output directory ``path`` with the runtime of its manifest's target.

    ``platform`` overrides detected facts (FlashInfer version, GPU capability) for the checks
    the runtime makes before loading. MoebakeError for an unknown schema or target.
    """
    manifest = read_manifest_record(path)
    target = manifest.target
    if target not in RUNTIMES:
        raise UnsupportedError(f"{Path(path) / MANIFEST_NAME}: target {target!r} has no runtime here (known: {', '.join(RUNTIMES)})")
    return RUNTIMES[target](Path(path), manifest, platform or Platform())
