"""Benchmark (not a test): SGLang's MoE forward on the three SM90 MXFP4 paths moebake bakes, one GPU, the same
GPT-OSS-shaped layer baked three ways: FlashInfer CUTLASS W4A16 (``sm90-cutlass``), FlashInfer CUTLASS Humming W4A8
(``sm90-cutlass-w4a8``) and SGLang's Marlin (``sm90-marlin``).

Each layer is built through SGLang 0.5.23 with moebake's plugin, the way ``tests/gpu/test_sglang_plugin_gpu.py``
builds them (where the plugin's parameters and outputs are proven equal to stock SGLang's on each path):
``--moe-runner-backend flashinfer_mxfp4`` (FlashInfer ``cutlass_fused_moe`` from moebake's reduced module), the same
with ``--flashinfer-mxfp4-moe-precision fp8``, and ``--moe-runner-backend marlin`` (SGLang's JIT-built
``moe_wna16_marlin``). For every token count, each layer's ``quant_method.apply`` on a standard dispatch (random
routing, top-k) is timed with CUDA events, eager, median of ``--iters`` after ``--warmup``; the table gives each
path's time over W4A16's (below 1: faster than W4A16). FlashInfer runs its first (untuned) tactic, as SGLang does
without its autotuner.

    python bench/sm90_paths_bench.py --json paths.json --png paths.png       # on the GPU machine, SGLang installed
    python bench/sm90_paths_bench.py --plot-only paths.json --png paths.png  # anywhere
"""

import argparse
import importlib
import json
import os
import tempfile
from pathlib import Path

import benchkit

BASELINE = "sm90-cutlass"
PATHS = {"sm90-cutlass": "CUTLASS W4A16", "sm90-cutlass-w4a8": "CUTLASS Humming W4A8", "sm90-marlin": "Marlin"}
"""Target -> its label; SGLang's server flags for each come from the target's engine profile (``server_flags``)."""


def _harness(experts: int):
    """The SGLang GPU test's helpers (server state, plugin layer, dispatch), for a layer of ``experts`` experts."""
    os.environ["MOEBAKE_GPU_SGLANG_EXPERTS"] = str(experts)
    # tests/ and tests/gpu/ are on the path (benchkit). First: the oracle stands in for compiled modules SGLang imports
    # but these paths never call
    sglang_oracle = importlib.import_module("engine_oracles.sglang_oracle")
    import test_sglang_plugin_gpu as harness

    return harness, harness.with_plugins(sglang_oracle)


def time_apply(layer, x, ids, weights, iters: int, warmup: int) -> float:
    """Median ms of ``layer.quant_method.apply`` on a standard dispatch of ``x`` routed by ``ids`` / ``weights``."""
    import torch
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    logits = torch.zeros(x.shape[0], layer.num_experts, device=x.device)  # Marlin's runner checks their token count
    topk = StandardTopKOutput(topk_weights=weights, topk_ids=ids.to(torch.int32), router_logits=logits)

    return benchkit.cuda_median_ms(lambda: layer.quant_method.apply(layer, StandardDispatchOutput(x, None, topk)), iters, warmup)


def run(args) -> dict:
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit(
            "sm90_paths_bench.py times GPU work: it needs an SM90 GPU (H100/H200) with SGLang 0.5.23 and "
            "FlashInfer; without one, only --plot-only runs"
        )
    from moebake.convert.options import ConvertOptions
    from moebake.convert.run import convert
    from moebake.serve.jit.flashinfer_build import ensure_flashinfer_sm90_moe
    from moebake.synthetic import write_gpt_oss

    ensure_flashinfer_sm90_moe()
    harness, oracle = _harness(args.experts)
    root = Path(tempfile.mkdtemp(prefix="sm90-paths-bench-"))
    source = write_gpt_oss(
        root / "src", num_layers=1, vocab=64, seed=3, num_experts=args.experts, hidden=args.hidden, intermediate=args.intermediate
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = {}
    for tokens in args.tokens:
        x = torch.randn(tokens, args.hidden, generator=g, device="cuda").to(torch.bfloat16)
        weights, ids = torch.topk(torch.softmax(torch.randn(tokens, args.experts, generator=g, device="cuda"), -1), args.top_k)
        inputs[tokens] = (x, ids, weights / weights.sum(-1, keepdim=True))
    ms = {}
    for target in args.targets:
        flags = harness.server_flags(target)
        out = root / target
        convert(source, out, ConvertOptions(target), progress=False)
        layer, _, _ = harness.plugin_layer(oracle, out, **flags)
        with harness.sm90_server(oracle, out, **flags):
            for tokens, (x, ids, weights) in inputs.items():
                ms[target, tokens] = time_apply(layer, x, ids, weights, args.iters, args.warmup)
                print(f"{target:18} {tokens:6} tokens: {ms[target, tokens]:.3f} ms", flush=True)
        del layer
        torch.cuda.empty_cache()
    rows = [{"tokens": t, "ms": {target: ms[target, t] for target in args.targets}} for t in args.tokens]
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "targets": list(args.targets),
        "shape": {"experts": args.experts, "hidden": args.hidden, "intermediate": args.intermediate, "top_k": args.top_k},
        "iters": args.iters,
        "warmup": args.warmup,
        "rows": rows,
    }


def table(results: dict) -> str:
    s, targets = results["shape"], results["targets"]
    others = [t for t in targets if t != BASELINE]
    lines = [
        f"{results['device']}, torch {results['torch']}; SGLang 0.5.23 plugin layers, E={s['experts']}, "
        f"H={s['hidden']}, I={s['intermediate']}, top-{s['top_k']}; eager quant_method.apply, median of {results['iters']}",
        "",
        "| tokens | "
        + " | ".join(f"{PATHS[t]} (ms)" for t in targets)
        + " | "
        + " | ".join(f"{PATHS[t]} / W4A16" for t in others)
        + " | fastest |",
        "|---" * (2 + len(targets) + len(others)) + "|",
    ]
    for r in results["rows"]:
        times = r["ms"]
        fastest = PATHS[min(times, key=times.get)]
        lines.append(
            f"| {r['tokens']} | "
            + " | ".join(f"{times[t]:.3f}" for t in targets)
            + " | "
            + " | ".join(f"{times[t] / times[BASELINE]:.2f}" for t in others)
            + f" | {fastest} |"
        )
    return "\n".join(lines)


def plot(results: dict, png: Path) -> None:
    rows, targets = results["rows"], results["targets"]
    tokens = [r["tokens"] for r in rows]
    fig, (left, right) = benchkit.pyplot().subplots(1, 2, figsize=(11, 4))
    for target, marker in zip(targets, "osd^"):
        left.plot(tokens, [r["ms"][target] for r in rows], marker + "-", label=f"{target} ({PATHS[target]})")
        if target != BASELINE:
            right.plot(tokens, [r["ms"][target] / r["ms"][BASELINE] for r in rows], marker + "-", label=PATHS[target])
    left.set(xscale="log", yscale="log", xlabel="tokens", ylabel="ms per layer (lower is better)", title=results["device"])
    left.legend(fontsize=8)
    right.axhline(1.0, color="k", lw=0.8, ls="--")
    right.set(xscale="log", xlabel="tokens", ylabel="time / CUTLASS W4A16", title="below 1: faster than W4A16")
    right.legend(fontsize=8)
    benchkit.save(fig, png, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2880)
    parser.add_argument("--intermediate", type=int, default=2880)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--tokens", type=lambda s: [int(t) for t in s.split(",")], default=[1, 8, 64, 1024, 8192])
    parser.add_argument(
        "--targets",
        type=lambda s: s.split(","),
        default=list(PATHS),
        help=f"comma-separated, from {', '.join(PATHS)} ({BASELINE} is always timed: the baseline)",
    )
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--plot-only", type=Path, help="print the table and draw --png from a saved JSON")
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in PATHS]
    if unknown:
        parser.error(f"--targets: unknown {unknown}; choose from {', '.join(PATHS)}")
    args.targets = [BASELINE] + [t for t in args.targets if t != BASELINE]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.plot_only:
        results = json.loads(args.plot_only.read_text())
    else:
        results = run(args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(table(results))
    if args.png:
        plot(results, args.png)


if __name__ == "__main__":
    main()
