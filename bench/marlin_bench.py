"""Benchmark (not a test): SGLang's MoE forward on Marlin (``sm90-marlin``) vs FlashInfer CUTLASS W4A16
(``sm90-cutlass``), one SM90 GPU, the same GPT-OSS-shaped layer baked both ways.

Both layers are built through SGLang 0.5.23 with moebake's plugin, the way ``tests/gpu/test_sglang_plugin_gpu.py``
builds them (where the plugin's parameters and outputs are proven equal to stock SGLang's on both paths):
``--moe-runner-backend flashinfer_mxfp4`` (FlashInfer ``cutlass_fused_moe`` from moebake's reduced module) and
``--moe-runner-backend marlin`` (SGLang's JIT-built ``moe_wna16_marlin``). For every token count, each layer's
``quant_method.apply`` on a standard dispatch (random routing, top-k) is timed with CUDA events, eager, median of
``--iters`` after ``--warmup``; the table gives the ratio Marlin / CUTLASS (below 1: Marlin is faster).

    python bench/marlin_bench.py --json marlin.json --png marlin.png       # on the GPU machine, SGLang installed
    python bench/marlin_bench.py --plot-only marlin.json --png marlin.png  # anywhere
"""

import argparse
import importlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BACKENDS = {"sm90-cutlass": {}, "sm90-marlin": {"moe_runner_backend": "marlin"}}


def _harness(experts: int):
    """The SGLang GPU test's helpers (server state, plugin layer, dispatch), for a layer of ``experts`` experts."""
    os.environ["MOEBAKE_GPU_SGLANG_EXPERTS"] = str(experts)
    for path in (REPO / "tests", REPO / "tests" / "gpu"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    # first: the oracle stands in for compiled modules SGLang imports but these paths never call
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

    def call():
        return layer.quant_method.apply(layer, StandardDispatchOutput(x, None, topk))

    for _ in range(warmup):
        call()
    samples = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def run(args) -> dict:
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("marlin_bench.py times GPU work: it needs an SM90 GPU (H100/H200) with SGLang 0.5.23 and "
                         "FlashInfer; without one, only --plot-only runs")
    from moebake.convert.options import ConvertOptions
    from moebake.convert.run import convert
    from moebake.serve.flashinfer_build import ensure_flashinfer_sm90_moe
    from moebake.synthetic import write_gpt_oss

    ensure_flashinfer_sm90_moe()
    harness, oracle = _harness(args.experts)
    root = Path(tempfile.mkdtemp(prefix="marlin-bench-"))
    source = write_gpt_oss(root / "src", num_layers=1, vocab=64, seed=3, num_experts=args.experts,
                           hidden=args.hidden, intermediate=args.intermediate)
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = {}
    for tokens in args.tokens:
        x = torch.randn(tokens, args.hidden, generator=g, device="cuda").to(torch.bfloat16)
        weights, ids = torch.topk(torch.softmax(torch.randn(tokens, args.experts, generator=g, device="cuda"), -1), args.top_k)
        inputs[tokens] = (x, ids, weights / weights.sum(-1, keepdim=True))
    ms = {}
    for target, flags in BACKENDS.items():
        out = root / target
        convert(source, out, ConvertOptions(target), progress=False)
        layer, _, _ = harness.plugin_layer(oracle, out, **flags)
        with harness.sm90_server(oracle, out, **flags):
            for tokens, (x, ids, weights) in inputs.items():
                ms[target, tokens] = time_apply(layer, x, ids, weights, args.iters, args.warmup)
                print(f"{target:13} {tokens:6} tokens: {ms[target, tokens]:.3f} ms", flush=True)
        del layer
        torch.cuda.empty_cache()
    rows = [{"tokens": t, "cutlass_ms": ms["sm90-cutlass", t], "marlin_ms": ms["sm90-marlin", t],
             "marlin_over_cutlass": ms["sm90-marlin", t] / ms["sm90-cutlass", t]} for t in args.tokens]
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "shape": {"experts": args.experts, "hidden": args.hidden, "intermediate": args.intermediate, "top_k": args.top_k},
            "iters": args.iters, "warmup": args.warmup, "rows": rows}


def table(results: dict) -> str:
    s = results["shape"]
    lines = [f"{results['device']}, torch {results['torch']}; SGLang 0.5.23 plugin layers, E={s['experts']}, "
             f"H={s['hidden']}, I={s['intermediate']}, top-{s['top_k']}; eager quant_method.apply, median of {results['iters']}",
             "", "| tokens | CUTLASS W4A16 (ms) | Marlin (ms) | Marlin / CUTLASS | faster |", "|---|---|---|---|---|"]
    for r in results["rows"]:
        faster = "Marlin" if r["marlin_over_cutlass"] < 1 else "CUTLASS"
        lines.append(f"| {r['tokens']} | {r['cutlass_ms']:.3f} | {r['marlin_ms']:.3f} | {r['marlin_over_cutlass']:.2f} | {faster} |")
    return "\n".join(lines)


def plot(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    tokens = [r["tokens"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(tokens, [r["cutlass_ms"] for r in rows], "o-", label="sm90-cutlass (FlashInfer CUTLASS W4A16)")
    left.plot(tokens, [r["marlin_ms"] for r in rows], "s-", label="sm90-marlin (SGLang Marlin)")
    left.set(xscale="log", yscale="log", xlabel="tokens", ylabel="ms per layer (lower is better)", title=results["device"])
    left.legend(fontsize=8)
    right.plot(tokens, [r["marlin_over_cutlass"] for r in rows], "o-", color="tab:purple")
    right.axhline(1.0, color="k", lw=0.8, ls="--")
    right.set(xscale="log", xlabel="tokens", ylabel="Marlin / CUTLASS", title="below 1: Marlin faster (decode)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2880)
    parser.add_argument("--intermediate", type=int, default=2880)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--tokens", type=lambda s: [int(t) for t in s.split(",")], default=[1, 8, 64, 1024, 8192])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--plot-only", type=Path, help="print the table and draw --png from a saved JSON")
    return parser.parse_args(argv)


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
