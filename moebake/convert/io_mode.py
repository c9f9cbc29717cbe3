"""How a conversion reads and writes its files: ``O_DIRECT`` or through the page cache (no heavy imports:
the CLI reads it for ``moebake convert --io``).

Which is faster depends on the machine. ``O_DIRECT`` saves the CPU the kernel's copies cost, which decides
on a few cores; buffered writes let the kernel keep the disk busier, which decides where cores are
plentiful (measurements: docs/benchmarks.md and bench/results/convert_bench_16core.md).
:data:`IO_ENV` chooses: ``direct``, ``plain``, or ``auto`` (the default: ``O_DIRECT`` below
:data:`PLAIN_IO_CORES` usable cores, plain I/O from there). Bytes never change.
"""

import os

IO_ENV = "MOEBAKE_IO"
"""``auto`` (default), ``direct`` or ``plain`` (``moebake convert --io`` sets it; worker processes inherit it)."""
IO_MODES = ("auto", "direct", "plain")
PLAIN_IO_CORES = 8
"""From this many usable cores on, ``auto`` reads and writes through the page cache."""


def io_mode() -> str:
    """``direct`` or ``plain``: :data:`IO_ENV`'s choice, ``auto`` resolved by the cores this process may use."""
    mode = os.environ.get(IO_ENV, "auto")
    if mode == "auto":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return "plain" if cores >= PLAIN_IO_CORES else "direct"
    return mode if mode in IO_MODES else "direct"
