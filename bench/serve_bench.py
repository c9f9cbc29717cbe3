"""Benchmark (not a test): moebake's sm90-cutlass runtime vs the SGLang way, on one SM90 GPU.

For a GPT-OSS-120B-shaped MoE layer set (synthetic: E=128, H=I=2880 -> 2944 padded, top-4):

* time-to-ready and peak GPU memory of
  - moebake: ``moebake.serve.open(OUT).load_experts(layer, "cuda")`` for every layer (baked bytes
    read into pinned buffers, copied to the GPU; nothing else), vs
  - the SGLang way (``tests/engine_oracles/sglang_baseline.py``): the source tensors to the GPU, then
    de-interleave, pad and interleave with FlashInfer's GPU helpers;
  both from a warm page cache, with FlashInfer's MoE module already loaded; median of repeats;
* forward latency for T tokens through ``experts.forward`` vs SGLang's call on its own prepared
  tensors (pad, ``cutlass_fused_moe``, trim) and vs the bare ``cutlass_fused_moe`` on the same
  tensors with a pre-padded input (CUDA events around each call, interleaved, median); at decode
  sizes (``--graph-max-tokens``) also the decode step (``experts.decode_step``: persistent buffers at
  the padded width) and the bare kernel, each replayed from a CUDA graph.

Prints a table with ratios, writes ``--json`` and a PNG plot (``--png``; needs matplotlib, so
``--plot-only results.json`` redraws it elsewhere from the JSON).

    python bench/serve_bench.py --workdir /tmp/moebake-bench --json results.json --png serve_bench.png
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import benchkit


def oracle():
    """The SGLang way, a test oracle (``tests/engine_oracles/sglang_baseline.py``), imported as the tests import it
    (:mod:`benchkit` puts ``tests/`` on the path)."""
    from engine_oracles import sglang_baseline

    return sglang_baseline


def make_checkpoints(workdir: Path, args) -> tuple[Path, Path, dict]:
    """Synthetic GPT-OSS source and its sm90-cutlass bake under ``workdir`` (re-used when present)."""
    from moebake.convert.options import ConvertOptions
    from moebake.convert.run import convert
    from moebake.synthetic import write_gpt_oss

    source, baked = workdir / "src", workdir / "out"
    timings = {}
    if not (source / "config.json").is_file():
        start = time.perf_counter()
        write_gpt_oss(
            source, num_layers=args.layers, num_experts=args.experts, hidden=args.hidden, intermediate=args.intermediate, vocab=64
        )
        timings["synthesize_s"] = time.perf_counter() - start
    if not (baked / "moebake.json").is_file():
        start = time.perf_counter()
        convert(source, baked, ConvertOptions(target="sm90-cutlass"), progress=False, overwrite=True)
        timings["bake_cpu_s"] = time.perf_counter() - start
    return source, baked, timings


def warm_page_cache(*directories: Path) -> None:
    """Read every file once so that both load paths start from the page cache."""
    for directory in directories:
        for path in directory.iterdir():
            with open(path, "rb", buffering=0) as f:
                while f.read(64 << 20):
                    pass


def measure_ready(load, repeats: int) -> dict:
    """Median wall time of ``load()`` (which leaves its tensors on the GPU) and its peak GPU memory."""
    seconds, peaks, resident = [], [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        kept = load()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        peaks.append(torch.cuda.max_memory_allocated() - base)
        resident.append(torch.cuda.memory_allocated() - base)
        del kept
    return {"seconds": statistics.median(seconds), "all_seconds": seconds, "peak_bytes": max(peaks), "resident_bytes": max(resident)}


def bench_forward(experts, prepared: dict, swiglu_limit: float, args) -> list[dict]:
    """Latency per token count of moebake's forward, SGLang's call (pad, kernel, trim) on its own
    prepared tensors, and the bare ``cutlass_fused_moe`` on moebake's tensors with a pre-padded input."""
    sglang_baseline = oracle()
    from moebake.serve.cuda_graph import capture
    from moebake.serve.flashinfer_ops import sm90_moe_ops

    cutlass_fused_moe = sm90_moe_ops().cutlass_fused_moe
    p = experts.parameters()
    direct_args = dict(
        fc1_expert_weights=p["w13_weight"],
        fc2_expert_weights=p["w2_weight"],
        output_dtype=torch.bfloat16,
        quant_scales=[p["w13_weight_scale"].view(torch.int32), p["w2_weight_scale"].view(torch.int32)],
        fc1_expert_biases=p["w13_weight_bias"],
        fc2_expert_biases=p["w2_weight_bias"],
        swiglu_alpha=experts.swiglu_alpha,
        swiglu_beta=experts.swiglu_beta,
        swiglu_limit=experts.swiglu_limit,
        use_w4_group_scaling=True,
    )
    swiglu = sglang_baseline.gpt_oss_swiglu(experts.num_experts, swiglu_limit, "cuda")
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for tokens in args.tokens:
        x = torch.randn(tokens, experts.hidden, generator=g, device="cuda").to(torch.bfloat16)
        logits = torch.randn(tokens, experts.num_experts, generator=g, device="cuda")
        weights, ids = torch.topk(torch.softmax(logits, -1), args.top_k)
        weights = weights / weights.sum(-1, keepdim=True)
        ids32 = ids.to(torch.int32)
        x_padded = torch.nn.functional.pad(x, (0, experts.hidden_padded - experts.hidden))
        out = torch.empty(tokens, experts.hidden_padded, dtype=torch.bfloat16, device="cuda")
        iterations = max(5, min(100, 20000 // max(tokens, 1)))
        calls = {
            "moebake": lambda: experts.forward(x, ids, weights),
            "sglang": lambda: sglang_baseline.sglang_moe_forward(prepared, swiglu, x, ids, weights),
            "direct": lambda: cutlass_fused_moe(x_padded, ids32, weights, output=out, **direct_args),
        }
        graphs = tokens <= args.graph_max_tokens
        if graphs:  # decode sizes: moebake's decode step and the bare kernel, each replayed from a CUDA graph
            step = experts.decode_step(max_tokens=tokens, top_k=args.top_k)
            step.hidden.copy_(x)
            step.topk_ids.copy_(ids32)
            step.topk_weights.copy_(weights)
            step.capture(tokens)
            direct_graph, _ = capture(lambda: cutlass_fused_moe(x_padded, ids32, weights, output=out, **direct_args))
            calls.update(decode_graph=step.replay, direct_graph=direct_graph.replay)
        ms = benchkit.cuda_medians_ms(calls, iterations, warmup=10)
        cutlass_fused_moe(x_padded, ids32, weights, output=out, **direct_args)
        ours = experts.forward(x, ids, weights)
        theirs = sglang_baseline.sglang_moe_forward(prepared, swiglu, x, ids, weights)
        same = torch.equal(ours, out[:, : experts.hidden]) and torch.equal(ours, theirs)
        row = {
            "tokens": tokens,
            "moebake_ms": ms["moebake"],
            "sglang_ms": ms["sglang"],
            "direct_ms": ms["direct"],
            "ratio": ms["moebake"] / ms["direct"],
            "ratio_sglang": ms["moebake"] / ms["sglang"],
            "iterations": iterations,
            "outputs_equal": same,
        }
        if graphs:
            same_graph = torch.equal(step.replay(), ours)
            row.update(
                decode_graph_ms=ms["decode_graph"],
                direct_graph_ms=ms["direct_graph"],
                ratio_graph=ms["decode_graph"] / ms["direct_graph"],
                ratio_graph_vs_direct=ms["decode_graph"] / ms["direct"],
                outputs_equal=same and same_graph,
            )
        rows.append(row)
    return rows


def require_sm90_gpu() -> None:
    """SystemExit (one line) unless a CUDA SM90 GPU is here: everything but ``--plot-only`` times GPU work."""
    if not torch.cuda.is_available():
        raise SystemExit(
            "serve_bench.py times GPU work: it needs a CUDA SM90 GPU (H100/H200) and FlashInfer; without one, only --plot-only runs"
        )
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        raise SystemExit(
            f"serve_bench.py benchmarks the sm90-cutlass target: it needs an SM90 GPU, "
            f"not {torch.cuda.get_device_name()} (SM{capability[0]}{capability[1]})"
        )


def layer_shape(checkpoint, top_k: int) -> dict:
    """The benchmarked shape: the bake's MoE layer count and its first layer's dims (as baked, and padded)."""
    layers = checkpoint.manifest.layers
    record = layers[0]
    return {
        "layers": len(layers),
        "experts": record.experts,
        "hidden": record.hidden,
        "hidden_padded": record.hidden_padded,
        "intermediate": record.intermediate,
        "intermediate_padded": record.intermediate_padded,
        "top_k": top_k,
    }


def run(args) -> dict:
    import moebake.serve

    sglang_baseline = oracle()
    from moebake.serve.flashinfer_ops import sm90_moe_ops

    require_sm90_gpu()
    workdir = Path(args.workdir)
    source, baked, prep = make_checkpoints(workdir, args)
    start = time.perf_counter()
    sm90_moe_ops().get_module("90")  # load (or build) the reduced module outside the timings
    prep["flashinfer_module_s"] = time.perf_counter() - start
    warm_page_cache(source, baked)

    checkpoint = moebake.serve.open(baked)
    layers = [record.index for record in checkpoint.manifest.layers]
    record = checkpoint.layer(layers[0])
    Hp, Ip, E = record.hidden_padded, record.intermediate_padded, record.experts

    def moebake_load():
        opened = moebake.serve.open(baked)
        return [opened.load_experts(layer, device="cuda") for layer in layers]

    def sglang_load():
        prepared = []
        for layer in layers:
            loaded = sglang_baseline.load_source_experts(source, layer, 0, E, "cuda")
            prepared.append(sglang_baseline.prepare_like_sglang(loaded, hidden_padded=Hp, intermediate_padded=Ip))
            del loaded
        return prepared

    sglang_load()  # first call: FlashInfer interleave kernel warm-up
    ready = {"moebake": measure_ready(moebake_load, args.repeats), "sglang": measure_ready(sglang_load, args.repeats)}
    experts = checkpoint.load_experts(layers[0], device="cuda")
    prepared = sglang_load()[0]
    return {
        "device": torch.cuda.get_device_name(),
        "shape": layer_shape(checkpoint, args.top_k),
        "preparation": prep,
        "load_stats": str(experts.load_stats),
        "ready": ready,
        "forward": bench_forward(experts, prepared, json.loads((source / "config.json").read_text())["swiglu_limit"], args),
    }


def table(results: dict) -> str:
    s = results["shape"]
    m, g = results["ready"]["moebake"], results["ready"]["sglang"]
    lines = [
        f"device: {results['device']}; {s['layers']} layer(s), E={s['experts']}, H={s['hidden']}->{s['hidden_padded']}, "
        f"I={s['intermediate']}->{s['intermediate_padded']}, top-{s['top_k']}",
        f"preparation (not timed below): {', '.join(f'{k}={v:.1f}' for k, v in results['preparation'].items())}",
        f"moebake load: {results['load_stats']}",
        "",
        "| time-to-ready | seconds (median) | peak GPU memory (GiB) | resident (GiB) |",
        "|---|---|---|---|",
        f"| moebake load | {m['seconds']:.3f} | {m['peak_bytes'] / 2**30:.2f} | {m['resident_bytes'] / 2**30:.2f} |",
        f"| SGLang way (GPU prepare) | {g['seconds']:.3f} | {g['peak_bytes'] / 2**30:.2f} | {g['resident_bytes'] / 2**30:.2f} |",
        f"| ratio SGLang / moebake | {g['seconds'] / m['seconds']:.2f}x | {g['peak_bytes'] / m['peak_bytes']:.2f}x | |",
        "",
        "| tokens | moebake forward (ms) | SGLang call (ms) | bare cutlass_fused_moe (ms) | moebake / SGLang | moebake / bare "
        "| outputs equal |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['tokens']} | {r['moebake_ms']:.3f} | {r['sglang_ms']:.3f} | {r['direct_ms']:.3f} | {r['ratio_sglang']:.3f} | "
        f"{r['ratio']:.3f} | {r['outputs_equal']} |"
        for r in results["forward"]
    ]
    graphed = [r for r in results["forward"] if "decode_graph_ms" in r]
    if graphed:
        lines += [
            "",
            "Decode step (persistent buffers at the padded width, replayed from a CUDA graph) vs the bare kernel:",
            "",
            "| tokens | decode step, graph (ms) | bare kernel, graph (ms) | bare kernel, eager (ms) "
            "| step / bare graph | step / bare eager |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['tokens']} | {r['decode_graph_ms']:.4f} | {r['direct_graph_ms']:.4f} | {r['direct_ms']:.4f} | "
            f"{r['ratio_graph']:.3f} | {r['ratio_graph_vs_direct']:.3f} |"
            for r in graphed
        ]
    return "\n".join(lines)


def plot(results: dict, png: Path) -> None:
    fig, (left, right) = benchkit.pyplot().subplots(1, 2, figsize=(11, 4))
    ready = results["ready"]
    labels = ["moebake load", "SGLang way"]
    left.bar(labels, [ready["moebake"]["seconds"], ready["sglang"]["seconds"]], color=["tab:green", "tab:gray"])
    left.set_ylabel("time-to-ready (s)")
    twin = left.twinx()
    twin.plot(labels, [ready["moebake"]["peak_bytes"] / 2**30, ready["sglang"]["peak_bytes"] / 2**30], "o", color="tab:red")
    twin.set_ylabel("peak GPU memory (GiB)", color="tab:red")
    twin.set_ylim(bottom=0)
    left.set_title(f"{results['shape']['experts']} experts x {results['shape']['layers']} layer(s)")
    tokens = [r["tokens"] for r in results["forward"]]
    right.plot(tokens, [r["moebake_ms"] for r in results["forward"]], "o-", label="moebake forward")
    right.plot(tokens, [r["sglang_ms"] for r in results["forward"]], "s:", label="SGLang call (pad, kernel, trim)")
    right.plot(tokens, [r["direct_ms"] for r in results["forward"]], "x--", label="bare cutlass_fused_moe")
    graphed = [r for r in results["forward"] if "decode_graph_ms" in r]
    if graphed:
        right.plot([r["tokens"] for r in graphed], [r["decode_graph_ms"] for r in graphed], "^-", label="decode step, CUDA graph")
        right.plot([r["tokens"] for r in graphed], [r["direct_graph_ms"] for r in graphed], "v--", label="bare kernel, CUDA graph")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("tokens")
    right.set_ylabel("latency (ms)")
    right.legend()
    right.set_title(results["device"])
    benchkit.save(fig, png, dpi=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="/tmp/moebake-bench")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2880)
    parser.add_argument("--intermediate", type=int, default=2880)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--tokens", type=lambda s: [int(t) for t in s.split(",")], default=[1, 64, 1024, 8192])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--graph-max-tokens",
        type=int,
        default=256,
        help="token counts up to this also time the decode step and the bare kernel in CUDA graphs",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--plot-only", type=Path, help="redraw --png (and print the table) from a saved JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = json.loads(args.plot_only.read_text()) if args.plot_only else run(args)
    print(table(results))
    if args.json and not args.plot_only:
        args.json.write_text(json.dumps(results, indent=2))
    if args.png:
        try:
            plot(results, args.png)
        except ImportError:
            print(f"matplotlib not installed: no {args.png}; redraw with --plot-only")


if __name__ == "__main__":
    main()
