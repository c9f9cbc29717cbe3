"""Benchmark (not a test): ``moebake convert --target sm90-cutlass`` (or ``--targets``) against ``cp -r`` of the same source.

Synthetic GPT-OSS-shaped checkpoints (GPT-OSS-20B's shapes by default: E=32, H=I=2880, 64 query /
8 KV heads of 64, vocabulary 201088; one layer per shard; 24 layers = 13.8 GB) of growing size are
generated once under ``.bench-cache/``: the largest by :func:`moebake.synthetic.write_gpt_oss`,
the smaller ones as its first shards (hard links) with their own index and config, so they cost no
extra disk. For each size and page-cache state, back to back on the same disk:

* ``copy``: ``cp -r SRC DST`` then ``sync DST/*`` (an fsync of every copied file), run before and
  after the conversions; its time is the mean of the two;
* ``moebake wN``: ``python -m moebake convert SRC OUT --target sm90-cutlass --quiet --profile
  --workers N`` (which fsyncs every file it writes).

A tiny conversion runs first (:func:`warm_up`: numba compiles the kernels once per machine and
caches them on disk). Page cache: ``cold`` drops the source from the page cache before every run
(``posix_fadvise(DONTNEED)`` on each file: no root needed, other processes' cache untouched), so
both tools read it from the disk; ``warm`` reads the whole source once right before every run, so
both find it in memory. Both tools flush everything they write. Each output is deleted right after
its run.

Reported per run: GB/s (source bytes / wall seconds), the ratio of wall time to the copy's in the
same cache state, CPU seconds (user + system of the whole process tree), the CPU floor (CPU seconds
spread over all the machine's cores, as a ratio to the copy's wall time: no schedule of that work
can beat it), peak RSS (sum over the process tree, polled every 50 ms; shared pages count once per
process, so this over-counts workers, which share torch's libraries), peak PSS (the same sum of
proportional set sizes: a page shared by N processes counts 1/N in each, so the tree's shared pages
count once; the memory target is judged on it) and the 1-minute load average before the run (other work on
the machine competes for the same cores). The conversion's own per-stage profile (``--profile``)
is printed after each run, and kept for the largest size. Results go to
``bench/results/convert_bench.{md,csv,png}`` (``--results``); ``--quick`` runs one small size and
writes ``convert_bench_quick.*`` instead, so it never overwrites the full results.

    .venv/bin/python bench/convert_bench.py                            # 3, 6, 12, 24 layers; workers 1, 2; cold + warm
    .venv/bin/python bench/convert_bench.py --quick                    # 3 layers, workers 1, cold + warm
    .venv/bin/python bench/convert_bench.py --plot-only                # redraw the plot from the CSV
"""

import argparse
import csv
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

import benchkit

REPO = benchkit.REPO
CORES = len(os.sched_getaffinity(0))
COMPLETE = ".complete"  # written last into a generated checkpoint


def source_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


GPT_OSS_20B_ATTENTION = {"heads": 64, "kv_heads": 8, "head_dim": 64, "vocab": 201088}


def full_source(cache: Path, layers: int, experts: int, hidden: int, vocab: int = GPT_OSS_20B_ATTENTION["vocab"]) -> Path:
    """The largest checkpoint, generated once (a partial one from an interrupted run is redone)."""
    from moebake.synthetic import write_gpt_oss

    own_vocab = "" if vocab == GPT_OSS_20B_ATTENTION["vocab"] else f"-V{vocab}"
    path = cache / f"gpt-oss-L{layers}-E{experts}-H{hidden}-20b-attn{own_vocab}"
    if not (path / COMPLETE).is_file():
        shutil.rmtree(path, ignore_errors=True)
        print(f"generating {path} ...", flush=True)
        write_gpt_oss(
            path,
            num_layers=layers,
            num_experts=experts,
            hidden=hidden,
            intermediate=hidden,
            layers_per_shard=1,
            **{**GPT_OSS_20B_ATTENTION, "vocab": vocab},
        )
        (path / COMPLETE).write_text("")
    return path


def prefix_source(full: Path, layers: int) -> Path:
    """A ``layers``-layer checkpoint made of ``full``'s first shards (hard links), index and config rewritten."""
    from huggingface_hub.constants import SAFETENSORS_INDEX_FILE

    from moebake.formats.safetensors_file import read_header
    from moebake.schema.index import read_index, write_index

    path = full.parent / f"{full.name}-first{layers}"
    if (path / COMPLETE).is_file():
        return path
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    index = read_index(full)
    shards = index.shard_names[:layers]  # one layer per shard
    for name in shards:
        os.link(full / name, path / name)
    weight_map = {tensor: shard for tensor, shard in index.weight_map.items() if shard in shards}
    write_index(path, weight_map, sum(entry.nbytes for name in shards for entry in read_header(path / name).tensors.values()))
    config = json.loads((full / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for side in full.iterdir():
        if side.suffix == ".json" and side.name not in (SAFETENSORS_INDEX_FILE, "config.json"):
            shutil.copyfile(side, path / side.name)
    (path / COMPLETE).write_text("")
    return path


def warm_up(cache: Path, scratch: Path) -> None:
    """One tiny conversion before the measured ones, so that numba's on-disk cache of the compiled
    kernels is filled (compiling them the first time on a machine takes ~5 s, once)."""
    from moebake.synthetic import write_gpt_oss

    tiny = cache / "gpt-oss-tiny-warm-up"
    if not (tiny / COMPLETE).is_file():
        shutil.rmtree(tiny, ignore_errors=True)
        write_gpt_oss(tiny, num_layers=1, num_experts=3, hidden=160, intermediate=96, vocab=64)
        (tiny / COMPLETE).write_text("")
    out = scratch / "warm-up"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "moebake", "convert", str(tiny), str(out), "--target", "sm90-cutlass", "--quiet"],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    shutil.rmtree(out)


def drop_from_page_cache(directory: Path) -> None:
    benchkit.evict_from_page_cache(path for path in directory.iterdir() if path.is_file())


def load_into_page_cache(directory: Path) -> None:
    """Read every file of ``directory`` once, so that the next run finds it in memory."""
    buffer = bytearray(8 << 20)
    for path in directory.iterdir():
        if path.is_file():
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass


def prepare_cache(source: Path, cache: str) -> None:
    (drop_from_page_cache if cache == "cold" else load_into_page_cache)(source)


def run_measured(command: list[str], env: dict | None = None) -> dict:
    """Run ``command``; wall seconds, CPU seconds, peak RSS and peak PSS bytes of its process tree, and its stderr.

    CPU seconds: the larger of what the kernel reports for the command and the descendants it
    waited for, and the sum of every process of the tree as last seen by the 50 ms polling."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, **(env or {})}
    )
    watched, peak, peak_pss, polled_cpu = psutil.Process(process.pid), 0, 0, {}
    while process.poll() is None:
        try:
            own = watched.cpu_times()
            polled_cpu[process.pid] = own.user + own.system
            descendants = watched.children(recursive=True)
            tree = [p for p in [watched, *descendants] if p.is_running()]
            peak = max(peak, sum(p.memory_info().rss for p in tree))
            peak_pss = max(peak_pss, sum(p.memory_full_info().pss for p in tree))
            for child in descendants:
                times = child.cpu_times()
                polled_cpu[child.pid] = times.user + times.system
        except psutil.Error:
            pass
        time.sleep(0.05)
    wall = time.perf_counter() - start
    stderr = process.stderr.read()
    if process.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # ``cpu`` counts the descendants the command waited for; those it leaves to end on their own
    # (moebake --workers does not wait out its workers' teardown) only appear in the polled times.
    return {"wall_s": wall, "cpu_s": max(cpu, sum(polled_cpu.values())), "peak_rss": peak, "peak_pss": peak_pss, "stderr": stderr}


def measure_copy(source: Path, scratch: Path, cache: str) -> dict:
    destination = scratch / "copy"
    shutil.rmtree(destination, ignore_errors=True)
    prepare_cache(source, cache)
    files = sorted(p.name for p in source.iterdir() if p.is_file())
    script = f'cp -r "{source}" "{destination}" && cd "{destination}" && sync {" ".join(files)}'
    result = run_measured(["bash", "-c", script])
    shutil.rmtree(destination)
    return result


def measure_convert(source: Path, scratch: Path, workers: int, cache: str, env: dict, target: str = "sm90-cutlass") -> dict:
    out = scratch / "baked"
    shutil.rmtree(out, ignore_errors=True)
    prepare_cache(source, cache)
    result = run_measured(
        [
            sys.executable,
            "-m",
            "moebake",
            "convert",
            str(source),
            str(out),
            "--target",
            target,
            "--quiet",
            "--profile",
            "--workers",
            str(workers),
            "--writers-per-device",
            str(workers),
        ],
        env,
    )
    shutil.rmtree(out)
    result["profile"] = [line for line in result["stderr"].splitlines() if line.startswith("profile:")]
    return result


VARIANTS = {
    "": {},
    "numpy kernels": {"MOEBAKE_NO_COMPILED": "1"},
    "plain I/O": {"MOEBAKE_IO": "plain"},
    "O_DIRECT": {"MOEBAKE_IO": "direct"},
    "write depth 1": {"MOEBAKE_WRITE_DEPTH": "1"},
}
"""Conversion variants by label suffix: environment switches that turn one optimisation off (same bytes)."""


def run_size(
    source: Path,
    scratch: Path,
    workers_list: list[int],
    caches: list[str],
    variants: list[str],
    variant_workers: list[int],
    targets: tuple[str, ...] = ("sm90-cutlass",),
) -> list[dict]:
    size = source_bytes(source)
    free = shutil.disk_usage(scratch).free
    if free < 1.1 * size:
        raise SystemExit(f"{scratch}: {free / 1e9:.1f} GB free, a copy of {source} needs {size / 1e9:.1f} GB")
    rows = []
    for cache in caches:
        conversions = [
            (f"moebake w{w}" + (f", {v}" if v else ""), w, VARIANTS[v], "sm90-cutlass")
            for w in workers_list
            for v in variants
            if not v or w in variant_workers
        ]
        conversions += [(f"moebake w{w}, {t}", w, {}, t) for t in targets if t != "sm90-cutlass" for w in workers_list]
        runs = []
        for tool, measure in [
            ("copy", lambda: measure_copy(source, scratch, cache)),
            *[(label, lambda w=w, env=env, t=t: measure_convert(source, scratch, w, cache, env, t)) for label, w, env, t in conversions],
            ("copy", lambda: measure_copy(source, scratch, cache)),
        ]:
            load = os.getloadavg()[0]
            result = measure()
            runs.append({"tool": tool, "load": load, **result})
            print(
                f"  {cache:4s} {tool:26s} {result['wall_s']:7.1f} s  {size / result['wall_s'] / 1e9:5.2f} GB/s  "
                f"cpu {result['cpu_s']:6.1f} s  peak RSS {result['peak_rss'] / 2**20:6.0f} MiB  "
                f"PSS {result['peak_pss'] / 2**20:6.0f} MiB  load {load:.1f}",
                flush=True,
            )
            for line in result.get("profile", []):
                print("    " + line, flush=True)
        copies = [r for r in runs if r["tool"] == "copy"]
        copy = {
            "tool": "copy",
            **{key: sum(r[key] for r in copies) / len(copies) for key in ("wall_s", "cpu_s", "load")},
            "peak_rss": max(r["peak_rss"] for r in copies),
            "peak_pss": max(r["peak_pss"] for r in copies),
        }
        for run in [copy, *(r for r in runs if r["tool"] != "copy")]:
            rows.append(
                {
                    "source_gb": size / 1e9,
                    "cache": cache,
                    "tool": run["tool"],
                    "wall_s": run["wall_s"],
                    "gb_per_s": size / run["wall_s"] / 1e9,
                    "ratio_to_copy": run["wall_s"] / copy["wall_s"],
                    "cpu_s": run["cpu_s"],
                    "cpu_floor_ratio": run["cpu_s"] / CORES / copy["wall_s"],
                    "peak_rss_mib": run["peak_rss"] / 2**20,
                    "peak_pss_mib": run["peak_pss"] / 2**20,
                    "load": run["load"],
                    "profile": "\n".join(line.removeprefix("profile: ") for line in run.get("profile", [])),
                }
            )
    return rows


COLUMNS = [
    "source_gb",
    "cache",
    "tool",
    "wall_s",
    "gb_per_s",
    "ratio_to_copy",
    "cpu_s",
    "cpu_floor_ratio",
    "peak_rss_mib",
    "peak_pss_mib",
    "load",
]


def machine_line() -> str:
    memory = psutil.virtual_memory().total / 2**30
    return (
        f"{CORES} cores ({platform.processor() or platform.machine()}), {memory:.0f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def write_results(rows: list[dict], results: Path, stem: str, draw: bool = True) -> None:
    results.mkdir(parents=True, exist_ok=True)
    with open(results / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS + ["profile"])
        writer.writeheader()
        for row in rows:
            # significant digits, not decimals: a tiny run's GB/s (a few thousandths) must not round to 0
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    table = [
        f"| source GB | page cache | tool | wall s | GB/s | x copy | CPU s | CPU floor (/{CORES} cores) x copy | "
        "peak RSS MiB | peak PSS MiB | load |",
        "|" + "---|" * 11,
    ]
    for row in rows:
        table.append(
            f"| {row['source_gb']:.1f} | {row['cache']} | {row['tool']} | {row['wall_s']:.1f} | {row['gb_per_s']:.2f} | "
            f"{row['ratio_to_copy']:.2f} | {row['cpu_s']:.1f} | {row['cpu_floor_ratio']:.2f} | "
            f"{row['peak_rss_mib']:.0f} | {row['peak_pss_mib']:.0f} | {row['load']:.1f} |"
        )
    largest = max(row["source_gb"] for row in rows)
    profiles = [
        f"{row['tool']}, {row['cache']}, {row['source_gb']:.1f} GB (moebake convert --profile):\n\n```\n{row['profile']}\n```"
        for row in rows
        if row["source_gb"] == largest and row["profile"]
    ]
    header = f"Machine: {machine_line()}. Load: 1-minute load average before each run (column).\n\n"
    (results / f"{stem}.md").write_text(header + "\n".join(table) + "\n\n" + "\n\n".join(profiles) + "\n")
    print(header + "\n".join(table))
    if draw:
        plot(rows, results / f"{stem}.png")


def measured_cores(rows: list[dict]) -> int:
    """The core count of the machine that measured ``rows`` (CSV rows), from a conversion's CPU
    seconds and its CPU floor ratio (CPU s / cores / the copy's wall s, same size and cache state)."""
    copy = {(row["source_gb"], row["cache"]): float(row["wall_s"]) for row in rows if row["tool"] == "copy"}
    run = next(row for row in rows if row["tool"] != "copy" and float(row["cpu_floor_ratio"]) > 0)
    return round(float(run["cpu_s"]) / float(run["cpu_floor_ratio"]) / copy[(run["source_gb"], run["cache"])])


def _workers(tool: str) -> int | None:
    """N of a ``moebake wN`` row without a variant; None for the copy and the variants."""
    match = re.fullmatch(r"moebake w(\d+)", tool)
    return int(match[1]) if match else None


def plot(rows: list[dict], path: Path, cores: int = CORES) -> None:
    """Three panels: ratio of wall time to the copy's (per cache state; 1.3x target), throughput, peak PSS
    (peak RSS for results measured before PSS was; ``cores``: of the machine that measured ``rows``), against
    the model size; against ``--workers`` (the scaling curve) where one size was measured with several."""
    plt = benchkit.pyplot()
    if len({row["source_gb"] for row in rows}) == 1 and len({_workers(row["tool"]) for row in rows} - {None}) > 1:
        plot_scaling(rows, path, cores, plt)
        return
    figure, (ratio, speed, memory) = plt.subplots(1, 3, figsize=(15, 4.4))
    styles = {"cold": "o-", "warm": "s--"}  # one colour per tool, one line style per page-cache state
    colours = {tool: f"C{index}" for index, tool in enumerate(dict.fromkeys(row["tool"] for row in rows))}
    for tool, cache in dict.fromkeys((row["tool"], row["cache"]) for row in rows):
        mine = [row for row in rows if row["tool"] == tool and row["cache"] == cache]
        sizes = [row["source_gb"] for row in mine]
        look = {"color": colours[tool], "label": f"{tool} ({cache})"}
        if tool != "copy":
            ratio.plot(sizes, [row["ratio_to_copy"] for row in mine], styles[cache], **look)
        speed.plot(sizes, [row["gb_per_s"] for row in mine], styles[cache], **look)
        memory.plot(sizes, [row.get("peak_pss_mib") or row["peak_rss_mib"] for row in mine], styles[cache], **look)
    loads = [row["load"] for row in rows]
    ratio.axhline(1.3, color="grey", linestyle=":", label="1.3x target")
    ratio.axhline(1.0, color="black", linewidth=0.8)
    ratio.set(
        xlabel="source checkpoint (GB)",
        ylabel="wall time / cp + sync wall time",
        title=f"convert vs copy, {cores} cores (load {min(loads):.1f}-{max(loads):.1f})",
    )
    speed.set(xlabel="source checkpoint (GB)", ylabel="GB/s (source bytes / wall s)", title="throughput")
    measure = "PSS" if all(row.get("peak_pss_mib") for row in rows) else "RSS"
    memory.set(xlabel="source checkpoint (GB)", ylabel=f"peak {measure} of the process tree (MiB)", title="peak memory")
    memory.axhline(1024, color="grey", linestyle=":", label="1 GiB target")
    sizes = sorted({row["source_gb"] for row in rows})
    _finish(figure, (ratio, speed, memory), sizes, [f"{size:.1f}" for size in sizes], path)


def _finish(figure, panels, ticks: list, labels: list[str], path: Path) -> None:
    """Shared x ticks (log 2 where there are several), zero-based y, grid and legends; save to ``path``."""
    for axes in panels:
        if len(ticks) > 1:
            axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, labels)
        axes.minorticks_off()
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    benchkit.save(figure, path, dpi=110)
    print(f"wrote {path}")


def plot_scaling(rows: list[dict], path: Path, cores: int, plt) -> None:
    """The ``--workers`` scaling curve of one model size: wall time / the copy's, GB/s and peak PSS against the
    number of workers, one line per page-cache state; the copy's GB/s as a horizontal line; variants as points."""
    figure, (ratio, speed, memory) = plt.subplots(1, 3, figsize=(15, 4.4))
    caches = list(dict.fromkeys(row["cache"] for row in rows))
    for index, cache in enumerate(caches):
        colour, mine = f"C{index}", [row for row in rows if row["cache"] == cache]
        curve = sorted((_workers(row["tool"]), row) for row in mine if _workers(row["tool"]))
        workers = [w for w, _ in curve]
        ratio.plot(workers, [row["ratio_to_copy"] for _, row in curve], "o-", color=colour, label=f"moebake ({cache})")
        speed.plot(workers, [row["gb_per_s"] for _, row in curve], "o-", color=colour, label=f"moebake ({cache})")
        memory.plot(
            workers, [row.get("peak_pss_mib") or row["peak_rss_mib"] for _, row in curve], "o-", color=colour, label=f"moebake ({cache})"
        )
        copies = [row["gb_per_s"] for row in mine if row["tool"] == "copy"]
        if copies:
            speed.axhline(sum(copies) / len(copies), color=colour, linestyle=":", label=f"cp + sync ({cache})")
        for marker, row in zip("^vDP", [row for row in mine if row["tool"] != "copy" and _workers(row["tool"]) is None]):
            w = int(re.match(r"moebake w(\d+)", row["tool"])[1])
            label = f"{row['tool'].split(', ', 1)[1]} ({cache})"
            ratio.plot([w], [row["ratio_to_copy"]], marker, color=colour, label=label)
            speed.plot([w], [row["gb_per_s"]], marker, color=colour, label=label)
    ratio.axhline(1.0, color="black", linewidth=0.8)
    ratio.axhline(1.3, color="grey", linestyle=":", label="1.3x target")
    memory.axhline(1024, color="grey", linestyle=":", label="1 GiB target")
    gb = rows[0]["source_gb"]
    ratio.set(xlabel="--workers", ylabel="wall time / cp + sync wall time", title=f"{gb:.1f} GB on {cores} cores: convert vs copy")
    speed.set(xlabel="--workers", ylabel="GB/s (source bytes / wall s)", title="throughput (dotted: the copy's)")
    memory.set(xlabel="--workers", ylabel="peak PSS of the process tree (MiB)", title="peak memory")
    ticks = sorted({_workers(row["tool"]) for row in rows} - {None})
    _finish(figure, (ratio, speed, memory), ticks, [str(t) for t in ticks], path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 6, 12, 24], help="model sizes, in MoE layers")
    parser.add_argument(
        "--generate-layers", type=int, default=24, help="layers of the generated checkpoint; smaller sizes are its first shards"
    )
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=2880, help="H = I")
    parser.add_argument("--vocab", type=int, default=GPT_OSS_20B_ATTENTION["vocab"], help="vocabulary (embedding rows)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="moebake --workers values to run")
    parser.add_argument(
        "--cache-states", nargs="+", choices=["cold", "warm"], default=["cold", "warm"], help="page-cache states of the source to measure"
    )
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["sm90-cutlass"],
        help="targets to bake (rows 'moebake wN, TARGET'; sm90-cutlass is the plain 'moebake wN' row)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=[v for v in VARIANTS if v],
        default=[],
        help="also run --variant-workers with one optimisation off each (same bytes)",
    )
    parser.add_argument(
        "--variant-workers",
        type=int,
        nargs="+",
        default=None,
        help="the --workers values the --variants also run with (default: the first)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="3 layers, --workers 1, results to convert_bench_quick.* (not the committed full results)"
    )
    parser.add_argument("--cache", type=Path, default=REPO / ".bench-cache", help="where sources and scratch copies go")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--name", default=None, help="results file stem (default convert_bench, or convert_bench_quick)")
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the results' CSV, run nothing")
    parser.add_argument("--no-plot", action="store_true", help="write the table and CSV only (no matplotlib needed)")
    args = parser.parse_args()
    stem = args.name or ("convert_bench_quick" if args.quick else "convert_bench")
    if args.quick:
        args.layers, args.workers = [3], [1]
    if args.plot_only:
        with open(args.results / f"{stem}.csv", newline="") as f:
            rows = [
                {
                    **row,
                    **{
                        k: float(row[k])
                        for k in ("source_gb", "gb_per_s", "ratio_to_copy", "peak_rss_mib", "peak_pss_mib", "load")
                        if row.get(k)
                    },
                }
                for row in csv.DictReader(f)
            ]
        plot(rows, args.results / f"{stem}.png", measured_cores(rows))
        return

    if max(args.layers) > args.generate_layers:
        parser.error(f"--layers must be at most --generate-layers ({args.generate_layers})")
    full = full_source(args.cache, args.generate_layers, args.experts, args.hidden, args.vocab)
    scratch = args.cache / "scratch"
    scratch.mkdir(exist_ok=True)
    warm_up(args.cache, scratch)
    rows = []
    for layers in sorted(args.layers):
        source = full if layers == args.generate_layers else prefix_source(full, layers)
        print(f"{layers} layers: {source_bytes(source) / 1e9:.2f} GB ({source}); {machine_line()}", flush=True)
        rows.extend(
            run_size(
                source,
                scratch,
                args.workers,
                args.cache_states,
                ["", *args.variants],
                args.variant_workers or args.workers[:1],
                tuple(args.targets),
            )
        )
    write_results(rows, args.results, stem, draw=not args.no_plot)


if __name__ == "__main__":
    main()
