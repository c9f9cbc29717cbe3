"""Benchmark (not a test): DeepGEMM's BF16 masked grouped GEMM vs the torch fallback (masked bmm), one GPU.

The layer is the Qwen3.5 MTP draft MoE of SGLang PR 25540 (64 local experts, H = 4096, I = 1024):
DeepEP low-latency BF16 dispatch gives ``[E_local, T_max, H]`` with ``masked_m`` tokens per expert,
``T_max`` = DeepEP's max dispatch tokens per rank x ranks (default 128 x 8 = 1024). For each
``expected_m`` (default 8, 64, 256), ``masked_m`` is drawn Poisson(expected_m), clipped to T_max,
and both backends of :mod:`moebake.serve.masked_gemm` are timed in the same process on the same
tensors (CUDA events, median of ``--iters`` after ``--warmup``; DeepGEMM's JIT compile happens in
the warm-up and is reported separately):

  ``gemm1``    ``[E, T_max, H] x w13 [E, 2I, H]^T``  (N = 2048, K = 4096)
  ``gemm2``    ``[E, T_max, I] x w2 [E, H, I]^T``    (N = 4096, K = 1024)
  ``forward``  ``DeepEPBf16Experts.forward_masked``: gemm1, silu(gate) * up, gemm2, zeroing past masked_m

Prints a table with the speed-up (torch ms / DeepGEMM ms), writes ``--json`` and a PNG (``--png``;
``--plot-only results.json`` redraws it from the JSON, e.g. on a machine with matplotlib).

    python bench/deepgemm_masked_bench.py --json deepgemm.json --png deepgemm.png
"""

import argparse
import json
from pathlib import Path

import torch

import benchkit

OPS = ("gemm1", "gemm2", "forward")


def run(args) -> dict:
    from moebake.serve.deepep_bf16 import DeepEPBf16Experts
    from moebake.serve.masked_gemm import DEEP_GEMM, TORCH, deep_gemm_status

    if not torch.cuda.is_available():
        raise SystemExit(
            "deepgemm_masked_bench.py times GPU kernels: it needs a CUDA GPU with DeepGEMM; without one, only --plot-only runs"
        )
    module, why = deep_gemm_status()
    if module is None:
        raise SystemExit(f"DeepGEMM is not usable here: {why}")
    device = torch.device("cuda")
    E, H, I, T = args.experts, args.hidden, args.intermediate, args.t_max
    g = torch.Generator(device=device).manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, generator=g, device=device) / H**0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g, device=device) / I**0.5).to(torch.bfloat16)
    x = torch.randn(E, T, H, generator=g, device=device).to(torch.bfloat16)
    h = torch.randn(E, T, I, generator=g, device=device).to(torch.bfloat16)
    experts = {b.name: DeepEPBf16Experts(w13, w2, backend=b) for b in (DEEP_GEMM, TORCH)}
    rows = []
    for expected_m in args.expected_m:
        rate = torch.full((E,), float(expected_m), device=device)
        masked_m = torch.poisson(rate, generator=g).clamp_(max=T).to(torch.int32)
        row = {"expected_m": expected_m, "t_max": T, "mean_masked_m": float(masked_m.float().mean()), "ms": {}, "jit_s": {}}
        for backend in (DEEP_GEMM, TORCH):
            calls = {
                "gemm1": lambda b=backend: b.run(x, w13, masked_m, expected_m),
                "gemm2": lambda b=backend: b.run(h, w2, masked_m, expected_m),
                "forward": lambda b=backend: experts[b.name].forward_masked(x, masked_m, expected_m),
            }
            row["jit_s"][backend.name] = {op: benchkit.synchronized_s(fn) for op, fn in calls.items()}  # DeepGEMM JIT-compiles here
            row["ms"][backend.name] = {op: benchkit.cuda_median_ms(fn, args.iters, args.warmup) for op, fn in calls.items()}
        row["speedup"] = {op: row["ms"]["torch"][op] / row["ms"]["deep_gemm"][op] for op in OPS}
        rows.append(row)
        print_row(row)
    return {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "deep_gemm": getattr(module, "__version__", "?"),
        "shape": {"experts": E, "hidden": H, "intermediate": I, "t_max": T},
        "warmup": args.warmup,
        "iters": args.iters,
        "rows": rows,
    }


HEADER = f"{'expected_m':>10} {'mean m':>7} {'T_max':>6} | " + " | ".join(
    f"{op + ' DG ms':>13} {'torch ms':>9} {'speed-up':>8}" for op in OPS
)


def print_row(row: dict) -> None:
    cells = " | ".join(f"{row['ms']['deep_gemm'][op]:>13.3f} {row['ms']['torch'][op]:>9.3f} {row['speedup'][op]:>7.2f}x" for op in OPS)
    print(f"{row['expected_m']:>10} {row['mean_masked_m']:>7.1f} {row['t_max']:>6} | {cells}", flush=True)


def print_table(results: dict) -> None:
    s = results["shape"]
    print(
        f"\n{results['device']}, torch {results['torch']}, deep_gemm {results['deep_gemm']}; E_local={s['experts']} "
        f"H={s['hidden']} I={s['intermediate']} T_max={s['t_max']}; median of {results['iters']} (CUDA events)"
    )
    print(HEADER)
    for row in results["rows"]:
        print_row(row)
    for row in results["rows"]:
        jit = ", ".join(f"{op} {seconds:.2f}" for op, seconds in row["jit_s"]["deep_gemm"].items())
        print(f"DeepGEMM first call (JIT compile for a new expected_m / shape) at expected_m={row['expected_m']}: {jit} s")


def plot(results: dict, png: Path) -> None:
    rows, width = results["rows"], 0.25
    labels = [f"expected_m={r['expected_m']}" for r in rows]
    fig, (left, right) = benchkit.pyplot().subplots(1, 2, figsize=(12, 4.5))
    for k, op in enumerate(OPS):
        offsets = [i + (k - 1) * width for i in range(len(rows))]
        bars = left.bar(offsets, [r["speedup"][op] for r in rows], width, label=op)
        left.bar_label(bars, fmt="%.1fx", fontsize=8)
        right.bar(
            [o - width / 4 for o in offsets],
            [r["ms"]["deep_gemm"][op] for r in rows],
            width / 2,
            color=bars.patches[0].get_facecolor(),
            label=f"{op} DeepGEMM",
        )
        right.bar(
            [o + width / 4 for o in offsets],
            [r["ms"]["torch"][op] for r in rows],
            width / 2,
            color=bars.patches[0].get_facecolor(),
            alpha=0.4,
            hatch="//",
            label=f"{op} torch bmm",
        )
    left.axhline(1.0, color="grey", lw=0.8)
    left.set_ylabel("speed-up (torch ms / DeepGEMM ms)")
    right.set_ylabel("median ms")
    for axis in (left, right):
        axis.set_xticks(range(len(rows)), labels)
    left.legend()
    right.legend(fontsize=7, ncol=2)
    s = results["shape"]
    fig.suptitle(
        f"BF16 masked grouped GEMM, {results['device']}: E_local={s['experts']}, H={s['hidden']}, "
        f"I={s['intermediate']}, T_max={s['t_max']} (deep_gemm {results['deep_gemm']})",
        fontsize=10,
    )
    benchkit.save(fig, png, dpi=120)
    print(f"wrote {png}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--t-max", type=int, default=1024, help="DeepEP LL rows per expert (max tokens per rank x ranks)")
    parser.add_argument("--expected-m", type=lambda s: [int(v) for v in s.split(",")], default=[8, 64, 256])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--png", type=Path)
    parser.add_argument("--plot-only", type=Path, help="redraw --png (and print the table) from a saved JSON")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.plot_only:
        results = json.loads(args.plot_only.read_text())
    else:
        print(HEADER)
        results = run(args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    print_table(results)
    if args.png:
        plot(results, args.png)


if __name__ == "__main__":
    main()
