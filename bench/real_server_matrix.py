"""Time to ready of a real SGLang server at full depth: fresh node, restarted node, fresh node with the bake's kernels.

One sequence of servers (bench/real_server.py's ``run_one``: ``python -m sglang.launch_server`` as a user runs it,
the same requests, the probe plugin) on one GPT-OSS-shaped model (default 24 layers, 32 experts, H = I = 2880: the
GPT-OSS-20B shape) and its bake. Each cell is ``PATH:NODE[:CACHE]``:

* ``PATH``: ``stock`` (the source) or ``bake``;
* ``NODE`` ``fresh``: every kernel cache empty (a new folder for all of bench/real_server.py's ``cache_env``) and the
  page cache dropped (``echo 3 > /proc/sys/vm/drop_caches``; ``CACHE`` is ``cold``);
* ``NODE`` ``restarted``: the kernel caches the latest ``fresh`` server of the same PATH in this sequence wrote (so no
  server reuses the other path's caches), ``CACHE`` ``cold`` (page cache dropped first) or ``warm`` (the model's files
  read once first);
* ``NODE`` ``fresh+kernels``: as ``fresh``, then ``moebake kernels install`` of the bake's kernel set (timed, and
  removed again with ``moebake kernels uninstall`` after the server stopped) before the server starts.

Before the first ``fresh+kernels`` cell the bake gets its kernels: ``moebake kernels harvest`` from the caches of the
latest ``bake:fresh`` server before it in the sequence, then ``moebake kernels add --replace`` (with the reduced
FlashInfer module of ``$MOEBAKE_FLASHINFER_MOE_SO``, which every server of the CUTLASS pair loads: FlashInfer's whole
``fused_moe_90`` module takes 30+ minutes to build). FlashInfer's modules are installed into FlashInfer's AOT folder in
the engine's site (``$S17_SITE/flashinfer/data/aot``), the one kernel folder outside the per-server cache folders;
every ``fresh`` cell checks it holds nothing moebake placed.

Sequences (``--sequence``): ``A`` and ``B`` below run the same cells in other orders; one sequence fits one
machine hold. Each run's record (JSON, rewritten after every server): bench/real_server.py's fields, plus ``node``,
``cache``, ``sequence``, ``page_cache_dropped``, ``kernels_install`` and the phases of
bench/real_server_phases.py (``phases``: seconds per phase, net of kernel builds, summing to the time to ready).
The file's ``meta``: date, machine, commit (``$MOEBAKE_COMMIT`` or git), the exact command, the model.

    python bench/real_server_matrix.py run --dir /tmp/rm --sequence A --out /tmp/real-server-matrix/A.json \\
        --server-arg=--disable-flashinfer-autotune
    python bench/real_server_matrix.py report A.json B.json --md fresh.md --png fresh.png
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
import real_server  # noqa: E402
from real_server_phases import WINDOWS, phases, read_events  # noqa: E402

SEQUENCES = {
    "A": [
        "bake:fresh",
        "bake:fresh+kernels",
        "stock:fresh",
        "stock:restarted:cold",
        "bake:restarted:cold",
        "stock:restarted:warm",
        "bake:restarted:warm",
    ],
    "B": [
        "stock:fresh",
        "bake:fresh",
        "bake:fresh+kernels",
        "bake:restarted:warm",
        "stock:restarted:warm",
        "bake:restarted:cold",
        "stock:restarted:cold",
    ],
}
NODES = ("fresh", "restarted", "fresh+kernels")
PHASES = (*WINDOWS, "kernel_builds")


def parse_cell(text: str) -> tuple[str, str, str]:
    """``PATH:NODE[:CACHE]`` -> (path, node, cache); fresh nodes are always cold. ValueError if malformed."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("stock", "bake") or parts[1] not in NODES:
        raise ValueError(f"{text}: expected PATH:NODE[:CACHE], PATH stock|bake, NODE {'|'.join(NODES)}")
    cache = parts[2] if len(parts) == 3 else "cold"
    if cache not in ("cold", "warm") or (parts[1] != "restarted" and cache != "cold"):
        raise ValueError(f"{text}: CACHE is cold or warm, and a fresh node's page cache is cold")
    return parts[0], parts[1], cache


def check_plan(cells: list[str]) -> list[tuple[str, str, str]]:
    """The cells parsed; ValueError for a restarted cell with no fresh server of its path before it, or kernels with no
    bake:fresh server before them."""
    plan, fresh = [], set()
    for cell in cells:
        path, node, cache = parse_cell(cell)
        if node == "restarted" and path not in fresh:
            raise ValueError(f"{cell}: a restarted node needs a {path}:fresh cell before it (its kernel caches)")
        if node == "fresh+kernels" and "bake" not in fresh:
            raise ValueError(f"{cell}: the bake's kernels are harvested from a bake:fresh server: put one before it")
        if node == "fresh+kernels" and path != "bake":
            raise ValueError(f"{cell}: the kernels are the bake's")
        if node == "fresh":
            fresh.add(path)
        plan.append((path, node, cache))
    return plan


def machine() -> dict:
    info = {"hostname": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        done = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], capture_output=True, text=True
        )
        info["gpus"] = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return info


def commit() -> str | None:
    if os.environ.get("MOEBAKE_COMMIT"):
        return os.environ["MOEBAKE_COMMIT"]
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def model_files(folder: Path) -> list[Path]:
    return [p for p in sorted(folder.iterdir()) if p.is_file()]


def warm(folder: Path) -> int:
    """Read every file of ``folder`` once (into the page cache); returns the bytes read."""
    total = 0
    for path in model_files(folder):
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(16 << 20):
                total += len(chunk)
    return total


def drop(folder: Path) -> bool:
    from benchkit import drop_page_cache

    return drop_page_cache(model_files(folder))


def moebake(args: list[str], caches: Path) -> dict:
    """``python -m moebake ARGS`` with the engine's site first on the path and the kernel caches under ``caches``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([real_server.S17_SITE, str(ROOT)]), **real_server.cache_env(caches))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "moebake", *args], capture_output=True, text=True, env=env, cwd=ROOT)
    result = {
        "command": "moebake " + " ".join(args),
        "rc": done.returncode,
        "seconds": round(time.monotonic() - start, 3),
        "output": (done.stdout + done.stderr).strip().splitlines()[-20:],
    }
    print(
        f"   {result['command']}: rc {done.returncode} in {result['seconds']:.1f} s\n     " + "\n     ".join(result["output"]), flush=True
    )
    return result


def aot_ledger() -> Path | None:
    """The ledger ``moebake kernels install`` keeps in FlashInfer's AOT folder of the engine's site, if any."""
    folder = Path(real_server.S17_SITE) / "flashinfer" / "data" / "aot"
    ledger = folder / ".moebake-kernels.json"
    return ledger if ledger.is_file() else None


def run_sequence(args) -> dict:
    plan = check_plan(args.cells or SEQUENCES[args.sequence])
    directory, work = args.dir, args.dir / "matrix"
    bake_dir = directory / args.target
    work.mkdir(parents=True, exist_ok=True)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    release = real_server._release(real_server.SGLang)
    real_server.make(
        directory, args.layers, args.experts, args.vocab, [args.target], f"sglang=={release}" if release else None, args.convert_arg
    )
    real_server.check_reduced_module("sglang")
    results = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "commit": commit(),
            "command": shlex.join([sys.executable, *sys.argv]),
            "sequence": args.sequence if not args.cells else "custom",
            "cells": [":".join(cell) for cell in plan],
            "engine": "sglang",
            "release": release,
            "layers": args.layers,
            "experts": args.experts,
            "target": args.target,
            "backend": args.backend,
            "server_args": args.server_arg,
            "flashinfer_moe_module": (
                real_server.reduced_module_of(Path(os.environ["MOEBAKE_FLASHINFER_MOE_SO"]))
                if os.environ.get("MOEBAKE_FLASHINFER_MOE_SO")
                else None
            ),
            "kernels": [],
        },
        "runs": [],
    }
    latest_fresh: dict[str, Path] = {}
    kernels_ready = False
    for order, (path, node, cache) in enumerate(plan, 1):
        label = f"{args.sequence}{order}-{path}-{node.replace('+', '-')}-{cache}"
        model = bake_dir if path == "bake" else directory / "src"
        if node == "restarted":
            caches = latest_fresh[path]
        else:
            caches = work / f"caches-{label}"
            if caches.exists():
                shutil.rmtree(caches)
            caches.mkdir()
            if aot_ledger() is not None:  # left by an interrupted fresh+kernels cell
                results["meta"]["kernels"].append({"cleanup": moebake(["kernels", "uninstall", str(bake_dir)], caches)})
        if node == "fresh+kernels" and not kernels_ready:
            harvested = work / f"harvest-{label}"
            shutil.rmtree(harvested, ignore_errors=True)
            step = {
                "from": str(latest_fresh["bake"]),
                "harvest": moebake(["kernels", "harvest", "--out", str(harvested)], latest_fresh["bake"]),
            }
            add = ["kernels", "add", str(bake_dir), "--from", str(harvested), "--replace"]
            if os.environ.get("MOEBAKE_FLASHINFER_MOE_SO"):
                add += ["--reduced-module", os.environ["MOEBAKE_FLASHINFER_MOE_SO"]]
            step["add"] = moebake(add, latest_fresh["bake"])
            results["meta"]["kernels"].append(step)
            kernels_ready = step["add"]["rc"] == 0
        dropped = None
        if cache == "cold":
            dropped = drop(model)
        else:
            warm(model)
        install = None
        if node == "fresh+kernels":
            install = moebake(["kernels", "install", str(bake_dir)], caches)
        print(f"== {label}: caches {caches}, page cache {cache}" + (" (dropped)" if dropped else ""), flush=True)
        record = real_server.run_one(
            directory,
            path,
            args.backend,
            args.target if path == "bake" else None,
            args.new_tokens,
            args.ready_timeout,
            args.server_arg,
            args.log_dir,
            order=label,
            engine="sglang",
            caches=caches,
        )
        if install is not None:
            record["kernels_uninstall"] = moebake(["kernels", "uninstall", str(bake_dir)], caches)
        record |= {
            "sequence": args.sequence if not args.cells else "custom",
            "node": node,
            "cache": cache,
            "page_cache_dropped": dropped,
            "kernels_install": install,
        }
        if record.get("start_wall") is not None and Path(record["log"]).is_file():
            ready_wall = record["start_wall"] + record["ready_seconds"] if record.get("ready_seconds") else None
            record |= phases(
                Path(record["log"]).read_text(errors="replace"), record["start_wall"], read_events(Path(record["jit_events"])), ready_wall
            )
        stock = next((r for r in results["runs"] if r["path"] == "stock" and "outputs" in r), None)
        if stock is not None and "outputs" in record:
            record["tokens_equal_to_stock"], record["logprobs_equal_to_stock"] = real_server.compare(record["outputs"], stock["outputs"])
            record["stock_order"] = stock["order"]
        results["runs"].append(record)
        if node == "fresh":
            latest_fresh[path] = caches
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"   {label}: ready {record.get('ready_seconds')} s; phases {record.get('phases')}", flush=True)
    return results


# ----------------------------------------------------------------------------------------------- report
def label(run: dict) -> str:
    """A run's name in the table and the plot: its file's sequence and its place in it, then what it was."""
    place = str(run["order"]).split("-", 1)[0][1:]
    return f"{run['sequence']} {place}: {run['path']}, {run['node']}, {run['cache']}"


def _runs(results: list[dict], with_phases: bool = False) -> list[dict]:
    """Every run of ``results``, each with its file's sequence (``A``, ``B`` or ``custom``)."""
    return [
        dict(run, sequence=result["meta"]["sequence"])
        for result in results
        for run in result["runs"]
        if run.get("phases") or not with_phases
    ]


def table(results: list[dict]) -> str:
    """The Markdown table of every run (fresh nodes first), then the ratios the targets name."""
    runs = _runs(results)
    order = {"fresh": 0, "fresh+kernels": 1, "restarted": 2}
    runs.sort(key=lambda r: (order.get(r["node"], 9), r["cache"], r["path"], str(r["order"])))
    head = ["run", "path", "node", "page cache", "ready s", "install s", "load s (SGLang)", *PHASES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        p = run.get("phases") or {}
        install = (run.get("kernels_install") or {}).get("seconds")
        cells = [
            label(run),
            run["path"],
            run["node"],
            run["cache"],
            _f(run.get("ready_seconds")),
            _f(install),
            _f(run.get("load_seconds")),
            *(_f(p.get(name)) for name in PHASES),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *summary(runs)]
    metas = [result["meta"] for result in results]
    for meta in metas:
        lines.append(
            f"- sequence {meta['sequence']}: {meta['date']}, {', '.join(meta['machine'].get('gpus', []))}, "
            f"{meta['machine'].get('cpus')} cores, commit {meta['commit']}, {meta['layers']} layers x "
            f"{meta['experts']} experts, target {meta['target']} ({meta['backend']}); `{meta['command']}`"
        )
    return "\n".join(lines) + "\n"


def _f(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summary(runs: list[dict]) -> list[str]:
    """The targets' ratios: a fresh node with the bake's kernels (install included) against a restarted node."""

    def ready(path, node, cache=None):
        return _mean(
            [r.get("ready_seconds") for r in runs if r["path"] == path and r["node"] == node and (cache is None or r["cache"] == cache)]
        )

    lines = []
    kernels = _mean(
        [
            (r.get("ready_seconds") or 0) + ((r.get("kernels_install") or {}).get("seconds") or 0)
            for r in runs
            if r["node"] == "fresh+kernels" and r.get("ready_seconds")
        ]
    )
    for cache in ("warm", "cold"):
        restarted = ready("bake", "restarted", cache)
        if kernels and restarted:
            lines.append(
                f"- bake, fresh node with its kernels (install included) {kernels:.1f} s vs restarted node "
                f"({cache} page cache) {restarted:.1f} s: {kernels / restarted:.2f}x (target 1.2x)"
            )
    for path in ("stock", "bake"):
        fresh = ready(path, "fresh")
        if fresh:
            lines.append(
                f"- {path}: fresh node {fresh:.1f} s; restarted warm {_f(ready(path, 'restarted', 'warm'))} s, "
                f"cold {_f(ready(path, 'restarted', 'cold'))} s"
            )
    return lines


def plot(results: list[dict], png: Path) -> None:
    """Stacked horizontal bars: each run's phases (net of builds) and its kernel builds and install."""
    from benchkit import pyplot, save

    plt = pyplot()
    runs = _runs(results, with_phases=True)
    figure, axis = plt.subplots(figsize=(12, 0.45 * len(runs) + 1.6))
    colors = dict(zip((*PHASES, "install"), plt.cm.tab10.colors))
    for row, run in enumerate(runs):
        left = 0.0
        parts = [
            ("install", (run.get("kernels_install") or {}).get("seconds") or 0.0),
            *((name, run["phases"].get(name) or 0.0) for name in PHASES),
        ]
        for name, seconds in parts:
            axis.barh(row, seconds, left=left, color=colors[name], label=name if row == 0 else None)
            left += seconds
        axis.text(left + 1, row, f"{left:.0f} s", va="center", fontsize=8)
    axis.set_yticks(range(len(runs)), [label(run) for run in runs], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("seconds from process start to ready (kernel install before it)")
    meta = results[0]["meta"]
    axis.set_title(
        f"SGLang {meta['release']} time to ready, {meta['layers']} layers x {meta['experts']} experts, {meta['target']}", fontsize=10
    )
    handles, labels = axis.get_legend_handles_labels()
    axis.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save(figure, png, 120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="make the model and its bake, then run one sequence of servers")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--sequence", choices=sorted(SEQUENCES), default="A")
    p.add_argument("--cells", nargs="+", help="PATH:NODE[:CACHE] ... instead of a sequence")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--target", default="sm90-cutlass")
    p.add_argument("--backend", default="flashinfer_mxfp4", help="--moe-runner-backend of both paths")
    p.add_argument("--convert-arg", action="append", default=[])
    p.add_argument("--server-arg", action="append", default=[])
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--ready-timeout", type=float, default=900)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--log-dir", type=Path, default=Path(os.environ.get("OUT", "/tmp/real-server-matrix")))
    r = sub.add_parser("report", help="the Markdown table and the plot of results JSON files")
    r.add_argument("results", nargs="+", type=Path)
    r.add_argument("--md", type=Path, default=None, help="default: the first JSON's .md")
    r.add_argument("--png", type=Path, default=None, help="default: the first JSON's .png")
    args = parser.parse_args(argv)
    if args.command == "run":
        try:
            check_plan(args.cells or SEQUENCES[args.sequence])
        except ValueError as err:
            parser.error(str(err))
        results = run_sequence(args)
        (args.out.with_suffix(".md")).write_text(table([results]))
        try:
            plot([results], args.out.with_suffix(".png"))
        except Exception as err:  # the JSON is what counts; the report can be made again from it
            print(f"plot not drawn: {type(err).__name__}: {err}", flush=True)
        return
    results = [json.loads(path.read_text()) for path in args.results]
    md = args.md or args.results[0].with_suffix(".md")
    md.write_text(table(results))
    plot(results, args.png or args.results[0].with_suffix(".png"))
    print(f"wrote {md} and {args.png or args.results[0].with_suffix('.png')}")


if __name__ == "__main__":
    main()
