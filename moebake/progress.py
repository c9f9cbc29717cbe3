"""Progress bars for long work (convert, verify, the re-bake of ``verify --source``): one convention.

* decimal units (``7.70GB``, as ``--profile`` and disk tools count), a shard counter in the postfix;
* the full terminal width, re-read when the terminal is resized (never cut at tqdm's fixed 60 columns);
* bytes already done at the start (resumed shards) count as ``initial``, not as a burst of speed,
  and the rate is averaged over the whole run (``smoothing=0``) so no absurd ETA shows at the start
  when workers report their first bytes late;
* nothing but a final line when stderr is not a terminal (no ``\\r`` floods in logs): there the
  caller's per-shard :func:`shard_done` lines (``-v``) say how far it got.
"""

import logging
import sys

from tqdm import tqdm

LOG = logging.getLogger("moebake")


def byte_bar(total: int, desc: str, *, enabled: bool = True, initial: int = 0, shards: int | None = None) -> tqdm:
    """A tqdm bar over ``total`` bytes (``initial`` of them already done); ``shards``: total for the counter."""
    interactive = enabled and sys.stderr.isatty()
    bar = tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1000, desc=desc,
               dynamic_ncols=True, smoothing=0, mininterval=0.5, disable=not interactive, file=sys.stderr)
    bar.shards_total = shards
    bar.shards_done = 0
    if shards:
        bar.set_postfix_str(f"shard 0/{shards}", refresh=False)
    return bar


def shard_done(bar: tqdm, name: str, nbytes: int, verb: str = "baked") -> None:
    """Count one finished shard on ``bar`` and log it (DEBUG: shown with ``-v``, one line per shard)."""
    bar.shards_done += 1
    counter = f"{bar.shards_done}/{bar.shards_total}" if bar.shards_total else str(bar.shards_done)
    if bar.shards_total:
        bar.set_postfix_str(f"shard {counter}", refresh=False)
    LOG.debug("%s shard %s: %s (%.2f GB)", verb, counter, name, nbytes / 1e9)
