"""What the benchmark scripts share: the paths they import from, GPU timing, evicting files from the page cache, and
plotting. Not a script.

Every benchmark runs as ``python bench/NAME.py`` from a checkout; Python puts ``bench/`` first on ``sys.path``, so
``import benchkit`` finds this file. Importing it puts the checkout first on ``sys.path`` (its ``moebake``, whether
or not one is installed) and ``tests/`` and ``tests/gpu/`` last (the engine oracles and GPU-test harnesses some
benchmarks compare with, imported as the tests import them).

* :func:`cuda_medians_ms` / :func:`cuda_median_ms`: the median milliseconds of calls timed with CUDA events;
* :func:`synchronized_s`: the wall seconds of one call, the GPU synchronised before and after;
* :func:`drop_page_cache` and :func:`evict_from_page_cache`: a cold page cache for the next reads of a benchmark's files;
* :func:`io_read_bytes`: the bytes this process has had the block device read;
* :func:`pyplot` and :func:`save`: matplotlib's pyplot on its file-only Agg backend, and a figure written to a PNG.
* :func:`add_report_commands` and :func:`run_report_command`: a results-JSON benchmark's ``table`` and ``plot`` commands.
"""

import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
for _folder in (REPO / "tests", REPO / "tests" / "gpu"):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))


def cuda_medians_ms(calls: dict[str, Callable[[], object]], iters: int, warmup: int) -> dict[str, float]:
    """``{name: median milliseconds of calls[name]()}`` over ``iters`` timed rounds, after ``warmup`` untimed ones.

    Each call is timed alone by a pair of CUDA events on the current stream, and waited for before the next. The
    calls interleave, each round in a rotated order, so clock and cache state affect all alike."""
    import torch

    names = list(calls)
    for _ in range(warmup):
        for name in names:
            calls[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(iters):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            calls[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(values) for name, values in times.items()}


def cuda_median_ms(call: Callable[[], object], iters: int, warmup: int) -> float:
    """The median milliseconds of ``call()``, as :func:`cuda_medians_ms` times it."""
    return cuda_medians_ms({"call": call}, iters, warmup)["call"]


def synchronized_s(call: Callable[[], object]) -> float:
    """The wall seconds of ``call()``, the GPU synchronised before and after (a first call's JIT compile included)."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def io_read_bytes() -> int | None:
    """This process's ``read_bytes`` in ``/proc/self/io``: the bytes its threads (ended ones too) had the block device
    read; None where the file or the field is missing."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def evict_from_page_cache(files: Iterable[Path]) -> int:
    """Write back, then drop from the page cache, each of ``files`` (``posix_fadvise(POSIX_FADV_DONTNEED)``: no root
    needed, other files' pages untouched), so that the next read of them comes from the disk; how many there were."""
    evicted = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            evicted += 1
        finally:
            os.close(fd)
    return evicted


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache(
    files: Iterable[Path],
    note: Callable[[str, int], str] | None = None,
    say: Callable[[str], object] = lambda text: print(text, flush=True),
) -> bool:
    """Empty the page cache (root: ``sync``, then ``3`` to ``/proc/sys/vm/drop_caches``); where that is refused,
    evict each of ``files`` (the benchmark's own) from it with :func:`evict_from_page_cache`, which needs no root and
    leaves other processes' pages alone. Either way the next read of those files' bytes comes from the disk.

    The first eviction in this process is said once (``say``): ``note(why the drop was refused, how many files were
    evicted)``, or a plain note. True when the whole page cache was dropped."""
    global _EVICTION_SAID
    os.sync()
    try:
        DROP_CACHES.write_text("3\n")
        return True
    except OSError as err:
        refused = err.strerror
    evicted = evict_from_page_cache(files)
    if not _EVICTION_SAID:
        say(
            note(refused, evicted)
            if note
            else f"note: the page cache cannot be dropped here ({refused}): the "
            f"benchmark's {evicted} files are evicted from it instead (posix_fadvise DONTNEED)"
        )
        _EVICTION_SAID = True
    return False


_EVICTION_SAID = False


def add_report_commands(sub) -> None:
    """A results-JSON benchmark's ``table RESULTS [--md PATH]`` (its Markdown, the ``.md`` beside the JSON by default)
    and ``plot RESULTS [--png PATH]`` (its figure, the ``.png`` beside it) subcommands, on argparse's ``sub``."""
    p = sub.add_parser("table", help="write the Markdown tables of a results JSON (the .md beside it)")
    p.add_argument("results")
    p.add_argument("--md")
    p = sub.add_parser("plot", help="redraw the PNG of a results JSON (the .png beside it)")
    p.add_argument("results")
    p.add_argument("--png")


def run_report_command(args, table: Callable, plot: Callable) -> bool:
    """Run :func:`add_report_commands`' command ``args`` names, printing the path written; False for any other."""
    if args.command == "table":
        print(table(Path(args.results), args.md))
    elif args.command == "plot":
        print(plot(Path(args.results), args.png))
    else:
        return False
    return True


def pyplot():
    """matplotlib's ``pyplot`` on the Agg backend (it writes files and needs no display). ImportError without
    matplotlib (``pip install '.[bench]'``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure, png: Path, dpi: int) -> None:
    """Lay ``figure`` out tightly and write it to ``png`` at ``dpi``."""
    figure.tight_layout()
    figure.savefig(png, dpi=dpi)
