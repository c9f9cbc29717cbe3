"""Benchmark (not a test): per-core speed of the CPU work in a conversion, against memcpy in the same process.

On one thread, over GPT-OSS-20B-shaped chunks (7 experts of W13 = 58 MB of packed MXFP4, the
size one 64 MiB conversion step reads), measures GB/s of: a plain copy (``torch.clone``, the
baseline), the manifest checksum xxh3-128 (done twice per source byte: source and output) and
SHA-256 (what it replaced), the SM90 fp4 interleave as the sm90-cutlass target runs it (padding and
the gate/up split fused, v2 and v1) and the scale fold, each compiled (numba) and on the numpy
fallback (``MOEBAKE_NO_COMPILED=1``), and the interleave's inverse. Prints each rate and its ratio
to the copy; median of ``--repeat`` runs.

    .venv/bin/python bench/transform_bench.py
"""

import argparse
import hashlib
import os
import statistics
import time

import torch
import xxhash


def rate(work, nbytes: int, repeat: int) -> float:
    """Median GB/s of ``work()`` over ``repeat`` runs (thread CPU time: other processes matter less)."""
    work()
    seconds = []
    for _ in range(repeat):
        start = time.thread_time()
        work()
        seconds.append(time.thread_time() - start)
    return nbytes / statistics.median(seconds) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=7)
    parser.add_argument("--hidden", type=int, default=2880, help="H = I")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    from moebake.convert.allocator import reuse_freed_buffers
    from moebake.layouts.compiled import DISABLE_ENV
    from moebake.layouts.gate_up import split_halves, split_pairs
    from moebake.layouts.sm90_fp4 import deinterleave_fp4, interleave_fp4_padded
    from moebake.layouts.sm90_scales import fold_scales_padded
    from moebake.schema.sizes import round_up

    torch.set_num_threads(1)
    reuse_freed_buffers()  # as a conversion does
    E, H = args.experts, args.hidden
    padded = round_up(H, 128)
    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (E, 2 * H, H // 2), dtype=torch.uint8, generator=generator)
    scales = torch.randint(118, 123, (E, 2 * H, H // 32), dtype=torch.uint8, generator=generator)
    scale_gate, scale_up = split_pairs(scales)
    gate, up = split_pairs(blocks)
    baked = interleave_fp4_padded((up, gate), (padded, padded // 2))
    data = memoryview(blocks.numpy().reshape(-1))
    size = blocks.numel()

    results = [("copy (torch.clone)", rate(blocks.clone, size, args.repeat))]
    results.append(("xxh3-128 (xxhash)", rate(lambda: xxhash.xxh3_128(data).digest(), size, args.repeat)))
    results.append(("sha256 (hashlib)", rate(lambda: hashlib.sha256(data).digest(), size, args.repeat)))
    for kernels in ("compiled", "numpy"):
        os.environ[DISABLE_ENV] = "1" if kernels == "numpy" else "0"
        for layout in ("v2", "v1"):
            results.append(
                (
                    f"interleave {layout} (W13, padded), {kernels}",
                    rate(lambda: interleave_fp4_padded((up, gate), (padded, padded // 2), layout), size, args.repeat),
                )
            )
        results.append(
            (
                f"fold scales (W13, padded), {kernels}",
                rate(lambda: fold_scales_padded((scale_up, scale_gate), (padded, padded // 32)), scales.numel(), args.repeat),
            )
        )
    results.append(("deinterleave v2", rate(lambda: split_halves(deinterleave_fp4(baked), (H, H // 2)), size, args.repeat)))

    copy = results[0][1]
    print(f"{'one thread, median of ' + str(args.repeat):44s} {'GB/s':>7s} {'x copy':>8s}")
    for name, value in results:
        print(f"{name:44s} {value:7.2f} {value / copy:8.3f}")


if __name__ == "__main__":
    main()
