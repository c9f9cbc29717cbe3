"""Progress bars for long work (convert, verify, the re-bake of ``verify --source``): one convention.

* decimal units (``7.70GB``, as ``--profile`` and disk tools count), a shard counter in the postfix;
  every other size moebake prints goes through :func:`size_text` (the same units, scaled to fit);
* the full terminal width, re-read when the terminal is resized (never cut at tqdm's fixed 60 columns);
* bytes already done at the start (resumed shards) count as ``initial``, not as a burst of speed;
  the rate is averaged (``smoothing=0``) from the first bytes reported, not from the bar's creation,
  so the seconds workers take to start (and the first report, often a few header bytes) do not show
  as an ETA of hours; until bytes flow it shows ``?``;
* nothing but a final line when stderr is not a terminal (no ``\\r`` floods in logs): there the
  caller's per-shard :func:`shard_done` lines (``-v``) say how far it got.
"""

import logging
import sys

from tqdm import tqdm

LOG = logging.getLogger("moebake")
_UNITS = ((1e12, "TB", 2), (1e9, "GB", 2), (1e6, "MB", 1), (1e3, "kB", 1))


def size_text(nbytes: int) -> str:
    """``nbytes`` in decimal units (as the progress bars count), in the largest unit it reaches:
    ``512 B``, ``1.2 kB``, ``1.2 MB``, ``13.79 GB`` (never ``0.00 GB`` for a small file)."""
    for scale, unit, digits in _UNITS:
        if nbytes >= scale:
            return f"{nbytes / scale:.{digits}f} {unit}"
    return f"{nbytes} B"


def rate_text(nbytes: int, seconds: float) -> str:
    """``nbytes`` per ``seconds`` in the units of :func:`size_text`, e.g. ``1.54 GB/s``."""
    return f"{size_text(int(nbytes / seconds))}/s" if seconds > 0 else "-"


class ByteBar(tqdm):
    """A tqdm bar whose clock starts at the first bytes reported (module docstring), with a counter of shards."""

    _flowing = False
    shards_total: int | None = None
    shards_done: int = 0

    def update(self, n: float | None = 1) -> bool | None:
        if not self._flowing and n and not self.disable:
            self._flowing = True
            self.start_t = self.last_print_t = getattr(self, "_time")()  # tqdm's clock
            self.initial = self.n + n  # neither earlier bytes nor this first report count towards the rate
        return super().update(n)


def byte_bar(total: int, desc: str, *, enabled: bool = True, initial: int = 0, shards: int | None = None, what: str = "shard") -> ByteBar:
    """A tqdm bar over ``total`` bytes (``initial`` of them already done); ``shards``: total for the counter of ``what``."""
    interactive = enabled and sys.stderr.isatty()
    bar = ByteBar(
        total=total,
        initial=initial,
        unit="B",
        unit_scale=True,
        unit_divisor=1000,
        desc=desc,
        dynamic_ncols=True,
        smoothing=0,
        mininterval=0.5,
        disable=not interactive,
        file=sys.stderr,
    )
    bar.shards_total = shards
    bar.shards_done = 0
    if shards:
        bar.set_postfix_str(f"{what} 0/{shards}", refresh=False)
    return bar


def shard_done(bar: ByteBar, name: str, nbytes: int, verb: str = "baked", what: str = "shard") -> None:
    """Count one finished shard (or ``what``: file, layer) on ``bar`` and log it (DEBUG: shown with ``-v``, one line each)."""
    bar.shards_done += 1
    counter = f"{bar.shards_done}/{bar.shards_total}" if bar.shards_total else str(bar.shards_done)
    if bar.shards_total:
        bar.set_postfix_str(f"{what} {counter}", refresh=False)
    LOG.debug("%s %s %s: %s (%s)", verb, what, counter, name, size_text(nbytes))
