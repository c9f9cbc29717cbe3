"""Benchmark (not a test): one deepep-bf16 MoE layer's decode step on DeepEP low-latency, DeepGEMM vs torch GEMMs.

One process per GPU (``--ranks``, EP = ranks, through :func:`moebake.serve.ep_launch.run_ranks`).
Each rank holds ``E / ranks`` experts with random BF16 weights and, for every shape, masked GEMM
backend and token count (tokens per rank, default 1 to 128), runs the eager decode step

  ``dispatch``  DeepEP ``low_latency_dispatch(use_fp8=False)`` into ``[E_local, ranks * 128, H]``
  ``experts``   ``DeepEPBf16Experts.forward_masked``: GEMM ``x @ w13.T``, silu(gate) * up, GEMM ``@ w2.T``
  ``combine``   DeepEP ``low_latency_combine`` (weighted sum back on the tokens' rank)

``--iters`` times after ``--warmup`` (the first step, which JIT-compiles DeepGEMM kernels for a new
shape, is timed separately), with CUDA events between the phases of each step (the step is the sum;
median per phase over the iterations; all ranks in lock-step, as DeepEP LL synchronises them).
With ``--graph``, the DeepGEMM step is also captured in a CUDA graph (every rank at once) and its
replays timed the same way (``graph_step`` ms: the step as decode runs it, without host launch gaps).
The buffer is sized for 128 tokens per rank (SGLang's default ``num_max_dispatch_tokens_per_rank``).
Both backends run in the same process on the same weights, inputs and DeepEP buffer; the table
shows the step's speed-up, torch ms / DeepGEMM ms.

Shapes: ``qwen3.5-35b-a3b`` (E = 256, H = 2048, I = 512, top-8: Qwen3.5-35B-A3B and its MTP
draft layer) and ``qwen3.5-397b-a17b`` (E = 512, H = 4096, I = 1024, top-10: the larger hidden
size, also the draft MoE of SGLang PR 25540).

    python bench/deepep_layer_bench.py --ranks 1 --json ep1.json
    python bench/deepep_layer_bench.py --ranks 2 --json ep2.json
    python bench/deepep_layer_bench.py --plot-only ep1.json ep2.json --png deepep_layer.png
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

import benchkit

SHAPES = {
    "qwen3.5-35b-a3b": {"experts": 256, "hidden": 2048, "intermediate": 512, "top_k": 8},
    "qwen3.5-397b-a17b": {"experts": 512, "hidden": 4096, "intermediate": 1024, "top_k": 10},
}
PHASES = ("dispatch", "experts", "combine")
BACKENDS = ("deep_gemm", "torch")
MAX_TOKENS_PER_RANK = 128


def bench_worker(ctx, args: dict) -> dict:
    """One rank: every (shape, backend, tokens) step timed; returns ``{"rows": [...], ...}`` for this rank."""
    import torch.distributed as dist

    from moebake.reference.moe_fp32 import decode_inputs
    from moebake.serve.deepep_bf16 import DeepEPBf16Experts
    from moebake.serve.deepep_ll import LowLatencyBuffer, LowLatencySpec
    from moebake.serve.dispatch import expected_m

    specs = {
        name: LowLatencySpec(s["hidden"], s["experts"], MAX_TOKENS_PER_RANK, ctx.ranks, s["top_k"])
        for name, s in SHAPES.items()
        if name in args["shapes"]
    }
    buffer = LowLatencyBuffer(ctx.group, list(specs.values()))
    rows = []
    out_path = args.get("partial")
    try:
        for name, spec in specs.items():
            s = SHAPES[name]
            E_l, H, I = spec.num_local_experts, s["hidden"], s["intermediate"]
            g = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
            w13 = (torch.randn(E_l, 2 * I, H, generator=g, device=ctx.device) / H**0.5).to(torch.bfloat16)
            w2 = (torch.randn(E_l, H, I, generator=g, device=ctx.device) / I**0.5).to(torch.bfloat16)
            dispatcher = buffer.dispatcher(spec)
            for backend in args["backends"]:
                experts = DeepEPBf16Experts(w13, w2, backend=backend, first_expert=spec.first_expert(ctx.rank))
                for tokens in args["tokens"]:
                    x, ids, weights = decode_inputs(
                        tokens, H, spec.num_experts, spec.top_k, seed=1000 * ctx.rank + tokens, device=ctx.device, drop=False
                    )
                    hint = expected_m(tokens, spec.top_k, spec.num_experts, spec.num_ranks)

                    def step(events=None):
                        if events:
                            events[0].record()
                        recv_x, masked_m, handle = dispatcher.dispatch(x, ids)
                        if events:
                            events[1].record()
                        y = experts.forward_masked(recv_x, masked_m, hint)
                        if events:
                            events[2].record()
                        out = dispatcher.combine(y, ids, weights, handle)
                        if events:
                            events[3].record()
                        return out

                    dist.barrier()
                    first_s = benchkit.synchronized_s(step)
                    for _ in range(args["warmup"]):
                        step()
                    torch.cuda.synchronize()
                    dist.barrier()
                    samples = {phase: [] for phase in PHASES}
                    for _ in range(args["iters"]):
                        events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                        step(events)
                        events[3].synchronize()
                        for i, phase in enumerate(PHASES):
                            samples[phase].append(events[i].elapsed_time(events[i + 1]))
                    ms = {phase: statistics.median(v) for phase, v in samples.items()}
                    ms["step"] = statistics.median([sum(parts) for parts in zip(*samples.values())])
                    if args.get("graph") and backend == "deep_gemm":
                        ms["graph_step"] = _graph_step_ms(step, args["iters"])
                    row = {
                        "shape": name,
                        "backend": backend,
                        "tokens": tokens,
                        "ranks": ctx.ranks,
                        "rank": ctx.rank,
                        "expected_m": hint,
                        "ms": ms,
                        "first_step_s": first_s,
                    }
                    rows.append(row)
                    if ctx.rank == 0:
                        print(
                            f"[rank 0] {name} {backend:9} tokens {tokens:4}: step {ms['step']:.3f} ms (dispatch "
                            f"{ms['dispatch']:.3f}, experts {ms['experts']:.3f}, combine {ms['combine']:.3f}); "
                            f"first step {first_s:.2f} s",
                            flush=True,
                        )
                        if out_path:
                            Path(out_path).write_text(json.dumps(rows, indent=1))
                experts = None  # drop this backend's weights before the next one's (the step closure reads the name)
            w13 = w2 = dispatcher = None
            torch.cuda.empty_cache()
    finally:
        buffer.close()
    return {"rank": ctx.rank, "device": torch.cuda.get_device_name(ctx.device), "rows": rows}


def _graph_step_ms(step, iters: int) -> float:
    """Median ms of ``iters`` replays of ``step`` captured in a CUDA graph (collective: every rank captures and
    replays in lock-step, as the eager steps)."""
    import torch.distributed as dist

    from moebake.serve.cuda_graph import capture

    graph, _ = capture(step)
    torch.cuda.synchronize()
    dist.barrier()
    return benchkit.cuda_median_ms(graph.replay, iters, warmup=0)


def run(args) -> dict:
    from moebake.serve.deepep_ll import deep_ep_status
    from moebake.serve.ep_launch import run_ranks
    from moebake.serve.masked_gemm import deep_gemm_status

    if not torch.cuda.is_available():
        raise SystemExit(
            "deepep_layer_bench.py times GPU work: it needs CUDA GPUs with DeepEP and DeepGEMM; without them, only --plot-only runs"
        )
    for module, why in (deep_ep_status(), deep_gemm_status()):
        if module is None:
            raise SystemExit(f"not usable here: {why}")
    payload = {
        "shapes": args.shapes,
        "backends": args.backends,
        "tokens": args.tokens,
        "warmup": args.warmup,
        "iters": args.iters,
        "graph": args.graph,
        "partial": str(args.json) + ".partial" if args.json else None,
    }
    per_rank = run_ranks(bench_worker, args.ranks, "cuda", payload)
    import deep_ep
    import deep_gemm

    return {
        "device": per_rank[0]["device"],
        "ranks": args.ranks,
        "torch": torch.__version__,
        "deep_gemm": getattr(deep_gemm, "__version__", "?"),
        "deep_ep": "tokenspeed-deepep 1.2.1.post20251110",
        "deep_ep_module": getattr(deep_ep, "__file__", "?"),
        "max_tokens_per_rank": MAX_TOKENS_PER_RANK,
        "shapes": {name: SHAPES[name] for name in args.shapes},
        "warmup": args.warmup,
        "iters": args.iters,
        "rows": [row for rank in per_rank for row in rank["rows"]],
    }


def table(results: dict) -> str:
    """Rank 0's phases and the slowest rank's step, DeepGEMM and torch side by side, with the speed-up."""
    by_key = {}
    for row in results["rows"]:
        by_key.setdefault((row["shape"], row["tokens"], row["backend"]), []).append(row)
    lines = [
        f"{results['device']} x {results['ranks']} (EP={results['ranks']}), torch {results['torch']}, deep_gemm "
        f"{results['deep_gemm']}, {results['deep_ep']}; eager decode step, median of {results['iters']} (CUDA events), "
        f"buffer for {results['max_tokens_per_rank']} tokens/rank",
        f"{'shape':18} {'tok/rank':>8} | {'DeepGEMM step':>13} {'dispatch':>8} {'experts':>8} {'combine':>8} | "
        f"{'torch step':>10} {'experts':>8} | {'speed-up':>8} {'max-rank DG':>11} | {'DG graph step':>13}",
    ]
    for shape in results["shapes"]:
        for tokens in sorted({r["tokens"] for r in results["rows"] if r["shape"] == shape}):
            dg, tt = by_key.get((shape, tokens, "deep_gemm")), by_key.get((shape, tokens, "torch"))
            if not dg or not tt:
                continue
            d0 = next(r for r in dg if r["rank"] == 0)["ms"]
            t0 = next(r for r in tt if r["rank"] == 0)["ms"]
            worst = max(r["ms"]["step"] for r in dg)
            lines.append(
                f"{shape:18} {tokens:>8} | {d0['step']:>13.3f} {d0['dispatch']:>8.3f} {d0['experts']:>8.3f} "
                f"{d0['combine']:>8.3f} | {t0['step']:>10.3f} {t0['experts']:>8.3f} | "
                f"{t0['step'] / d0['step']:>7.2f}x {worst:>11.3f} | "
                f"{d0['graph_step'] if 'graph_step' in d0 else float('nan'):>13.3f}"
            )
    return "\n".join(lines)


def plot(all_results: list[dict], png: Path) -> None:
    shapes = list(dict.fromkeys(name for results in all_results for name in results["shapes"]))
    fig, axes = benchkit.pyplot().subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.8), squeeze=False)
    colors = {"deep_gemm": "tab:blue", "torch": "tab:red"}
    for axis, shape in zip(axes[0], shapes):
        for results in all_results:
            style = "-" if results["ranks"] == 1 else "--"
            for backend in BACKENDS:
                rows = sorted(
                    (r for r in results["rows"] if r["shape"] == shape and r["backend"] == backend and r["rank"] == 0),
                    key=lambda r: r["tokens"],
                )
                if not rows:
                    continue
                tokens = [r["tokens"] for r in rows]
                label = f"{'DeepGEMM' if backend == 'deep_gemm' else 'torch bmm'}, EP={results['ranks']}"
                axis.plot(tokens, [r["ms"]["step"] for r in rows], style, marker="o", color=colors[backend], label=f"step, {label}")
                if backend == "deep_gemm":
                    axis.plot(
                        tokens,
                        [r["ms"]["dispatch"] + r["ms"]["combine"] for r in rows],
                        style,
                        marker=".",
                        color="tab:green",
                        alpha=0.7,
                        label=f"dispatch + combine, EP={results['ranks']}",
                    )
                    graphed = [r for r in rows if "graph_step" in r["ms"]]
                    if graphed:
                        axis.plot(
                            [r["tokens"] for r in graphed],
                            [r["ms"]["graph_step"] for r in graphed],
                            style,
                            marker="^",
                            color="tab:purple",
                            label=f"step in a CUDA graph, DeepGEMM, EP={results['ranks']}",
                        )
        s = SHAPES.get(shape, {})
        axis.set_title(f"{shape}: E={s.get('experts')}, H={s.get('hidden')}, I={s.get('intermediate')}, top-{s.get('top_k')}", fontsize=10)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("tokens per rank (decode step)")
        axis.set_ylabel("median ms, rank 0")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    first = all_results[0]
    fig.suptitle(
        f"deepep-bf16 MoE layer on DeepEP low-latency (BF16 dispatch), {first['device']}: DeepGEMM masked GEMMs vs torch bmm", fontsize=10
    )
    benchkit.save(fig, png, dpi=120)
    print(f"wrote {png}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1, help="EP ranks = GPUs (one process each)")
    parser.add_argument("--shapes", type=lambda s: s.split(","), default=list(SHAPES))
    parser.add_argument("--backends", type=lambda s: s.split(","), default=list(BACKENDS))
    parser.add_argument("--tokens", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--graph", action="store_true", help="also time the DeepGEMM step replayed from a CUDA graph")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--plot-only", type=Path, nargs="+", help="print the tables and draw --png from saved JSON files")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.plot_only:
        all_results = [json.loads(path.read_text()) for path in args.plot_only]
    else:
        unknown = set(args.shapes) - set(SHAPES)
        if unknown or set(args.backends) - set(BACKENDS) or max(args.tokens) > MAX_TOKENS_PER_RANK:
            raise SystemExit(f"shapes from {list(SHAPES)}, backends from {list(BACKENDS)}, tokens <= {MAX_TOKENS_PER_RANK}")
        all_results = [run(args)]
        if args.json:
            args.json.write_text(json.dumps(all_results[0], indent=1))
    for results in all_results:
        print(table(results))
    if args.png:
        plot(all_results, args.png)


if __name__ == "__main__":
    sys.exit(main())
