"""Every script under bench/ runs in CI, on the CPU: its argument parsing, its CPU work on tiny shapes,
its ``--plot-only`` redraw from the committed results in bench/results/, and, for the GPU benchmarks,
the one-line refusal without a GPU. (The conversion benchmark's plots: tests/test_bench_plots.py.)"""

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import load_bench
from moebake.convert.stages import NAMES as STAGES

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
PYTHON_SCRIPTS = [
    "convert_bench.py",
    "transform_bench.py",
    "serve_bench.py",
    "deepep_layer_bench.py",
    "deepgemm_masked_bench.py",
    "startup_bench.py",
    "sm90_paths_bench.py",
    "real_server.py",
    "read_bench.py",
    "real_server_matrix.py",
]  # its smoke test: tests/test_real_server_matrix.py
SHELL_SCRIPTS = ["device_convert_scaling.sh", "device_wheels.sh"]
HELPERS = [
    "benchkit.py",
    "real_server_probe.py",
    "real_server_phases.py",
    "real_server_vllm.py",
    "real_server_vllm_probe.py",
    "startup_limits.py",
    "startup_presharded.py",  # imported by the scripts (or their servers),
    "startup_report.py",
]  # not run
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the refusal on a machine without a GPU")


def test_every_bench_script_has_a_smoke_test():
    assert sorted(p.name for p in BENCH.iterdir() if p.is_file()) == sorted(PYTHON_SCRIPTS + SHELL_SCRIPTS + HELPERS)


@no_gpu
def test_a_gpu_benchmark_run_as_documented_finds_moebake_and_the_oracles(tmp_path):
    """``python bench/serve_bench.py`` from the repository root, with nothing on PYTHONPATH: the checkout's moebake
    and the tests' SGLang oracle import (before the GPU check), and the run ends in the one-line refusal."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "bench/serve_bench.py", "--workdir", str(tmp_path / "work")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert (result.returncode, result.stderr.splitlines()[-1:]) == (
        1,
        ["serve_bench.py times GPU work: it needs a CUDA SM90 GPU (H100/H200) and FlashInfer; without one, only --plot-only runs"],
    ), result.stderr[-3000:]
    assert "Traceback" not in result.stderr


def test_benchkit_times_each_call_alone_interleaved(monkeypatch):
    """The calls run ``warmup`` untimed rounds, then each round in a rotated order, each call between its own pair of
    CUDA events (stood in for here: each pair measures the call it brackets); the medians are per call."""
    benchkit = load_bench("benchkit.py")
    ran, costs = [], {"a": 1.0, "b": 2.0, "c": 3.0}

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.at = len(ran)

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            assert end.at == self.at + 1
            return costs[ran[self.at]]

    monkeypatch.setattr(torch.cuda, "Event", Event)
    calls = {name: (lambda name=name: ran.append(name)) for name in costs}
    assert benchkit.cuda_medians_ms(calls, iters=3, warmup=2) == costs
    assert ran == ["a", "b", "c"] * 2 + ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    ran.clear()
    assert benchkit.cuda_median_ms(calls["b"], iters=2, warmup=1) == 2.0 and ran == ["b"] * 3


@pytest.mark.parametrize("name", PYTHON_SCRIPTS)
def test_the_script_explains_itself(name, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as exit_:
        load_bench(name).main()
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {name} [-h]")


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_the_shell_script_parses(name):
    result = subprocess.run(["bash", "-n", str(BENCH / name)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# serve_bench.py: moebake's sm90-cutlass runtime vs the SGLang way (SM90 GPU)


def test_serve_bench_arguments():
    args = load_bench("serve_bench.py").parse_args(["--tokens", "1,64", "--experts", "4", "--plot-only", "r.json"])
    assert (args.tokens, args.experts, args.top_k, args.plot_only) == ([1, 64], 4, 4, Path("r.json"))


def test_serve_bench_shape_of_a_cpu_bake(tmp_path):
    """The CPU half of a run: the synthetic source, its bake, and the shape reported from the typed layer records."""
    import moebake.serve

    bench = load_bench("serve_bench.py")
    args = bench.parse_args(["--layers", "2", "--experts", "4", "--hidden", "160", "--intermediate", "96", "--top-k", "2"])
    source, baked, timings = bench.make_checkpoints(tmp_path, args)
    assert sorted(timings) == ["bake_cpu_s", "synthesize_s"]
    assert bench.layer_shape(moebake.serve.open(baked), args.top_k) == {
        "layers": 2,
        "experts": 4,
        "hidden": 160,
        "hidden_padded": 256,
        "intermediate": 96,
        "intermediate_padded": 128,
        "top_k": 2,
    }
    assert bench.make_checkpoints(tmp_path, args) == (source, baked, {})  # re-used, not made again


def test_serve_bench_baseline_is_the_test_oracle():
    assert Path(load_bench("serve_bench.py").oracle().__file__) == REPO / "tests" / "engine_oracles" / "sglang_baseline.py"


@no_gpu
def test_serve_bench_refuses_without_a_gpu(tmp_path):
    with pytest.raises(SystemExit, match=r"^serve_bench.py times GPU work: it needs a CUDA SM90 GPU .* only --plot-only runs$"):
        load_bench("serve_bench.py").main(["--workdir", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []  # refused before synthesizing anything


def test_serve_bench_plot_only(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    saved = RESULTS / "serve_bench_h100.json"
    load_bench("serve_bench.py").main(["--plot-only", str(saved), "--png", str(tmp_path / "serve.png"), "--json", str(tmp_path / "x.json")])
    results = json.loads(saved.read_text())
    lines = capsys.readouterr().out.splitlines()
    m, g = results["ready"]["moebake"], results["ready"]["sglang"]
    assert lines[0] == "device: NVIDIA H100 80GB HBM3; 1 layer(s), E=128, H=2880->3072, I=2880->2944, top-4"
    assert f"| moebake load | {m['seconds']:.3f} | {m['peak_bytes'] / 2**30:.2f} | {m['resident_bytes'] / 2**30:.2f} |" in lines
    assert f"| ratio SGLang / moebake | {g['seconds'] / m['seconds']:.2f}x | {g['peak_bytes'] / m['peak_bytes']:.2f}x | |" in lines
    assert len([line for line in lines if line.endswith("| True |")]) == len(results["forward"])
    assert (tmp_path / "serve.png").stat().st_size > 10_000
    assert not (tmp_path / "x.json").exists()  # --plot-only writes no JSON


def test_serve_bench_table_and_plot_show_the_graph_captured_decode_step(tmp_path):
    """Rows with the CUDA-graph timings (made up here) get the decode table and two more lines in the plot."""
    pytest.importorskip("matplotlib")
    bench = load_bench("serve_bench.py")
    results = json.loads((RESULTS / "serve_bench_h100.json").read_text())
    results["forward"][0].update(decode_graph_ms=0.2, direct_graph_ms=0.2, ratio_graph=1.0, ratio_graph_vs_direct=0.5)
    lines = bench.table(results).splitlines()
    tokens, direct = results["forward"][0]["tokens"], results["forward"][0]["direct_ms"]
    assert f"| {tokens} | 0.2000 | 0.2000 | {direct:.4f} | 1.000 | 0.500 |" in lines
    decode = lines[
        lines.index(
            "| tokens | decode step, graph (ms) | bare kernel, graph (ms) | bare kernel, eager (ms) "
            "| step / bare graph | step / bare eager |"
        )
        + 2 :
    ]
    assert len(decode) == sum("decode_graph_ms" in r for r in results["forward"])
    bench.plot(results, tmp_path / "serve.png")
    assert (tmp_path / "serve.png").stat().st_size > 10_000


# deepgemm_masked_bench.py: DeepGEMM's masked GEMM vs torch (one GPU)


def test_deepgemm_masked_bench_arguments():
    args = load_bench("deepgemm_masked_bench.py").parse_args(["--expected-m", "8,64", "--t-max", "128"])
    assert (args.expected_m, args.t_max, args.experts, args.plot_only) == ([8, 64], 128, 64, None)


@no_gpu
def test_deepgemm_masked_bench_refuses_without_a_gpu(capsys):
    with pytest.raises(SystemExit, match=r"^deepgemm_masked_bench.py times GPU kernels: it needs a CUDA GPU with DeepGEMM; "):
        load_bench("deepgemm_masked_bench.py").main(["--expected-m", "8"])


def test_deepgemm_masked_bench_plot_only(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    saved = RESULTS / "deepgemm_masked_h100.json"
    bench = load_bench("deepgemm_masked_bench.py")
    bench.main(["--plot-only", str(saved), "--png", str(tmp_path / "dg.png")])
    results = json.loads(saved.read_text())
    out = capsys.readouterr().out
    assert bench.HEADER in out.splitlines()
    for row in results["rows"]:
        assert f"{row['ms']['deep_gemm']['forward']:>13.3f} {row['ms']['torch']['forward']:>9.3f} {row['speedup']['forward']:>7.2f}x" in out
    assert out.count("DeepGEMM first call") == len(results["rows"]) == 3
    assert (tmp_path / "dg.png").stat().st_size > 10_000


# deepep_layer_bench.py: one deepep-bf16 layer's decode step on DeepEP low-latency (one or more GPUs)


def test_deepep_layer_bench_arguments():
    args = load_bench("deepep_layer_bench.py").parse_args(["--ranks", "2", "--shapes", "qwen3.5-35b-a3b", "--tokens", "1,8"])
    assert (args.ranks, args.shapes, args.backends, args.tokens) == (2, ["qwen3.5-35b-a3b"], ["deep_gemm", "torch"], [1, 8])


@pytest.mark.parametrize("argv", [["--shapes", "no-such-shape"], ["--backends", "cublas"], ["--tokens", "129"]])
def test_deepep_layer_bench_refuses_what_it_cannot_run(argv):
    with pytest.raises(
        SystemExit,
        match=r"^shapes from \['qwen3.5-35b-a3b', 'qwen3.5-397b-a17b'\], backends from "
        r"\['deep_gemm', 'torch'\], tokens <= 128$",
    ):
        load_bench("deepep_layer_bench.py").main(argv)


@no_gpu
def test_deepep_layer_bench_refuses_without_a_gpu():
    with pytest.raises(SystemExit, match=r"^deepep_layer_bench.py times GPU work: it needs CUDA GPUs with DeepEP and DeepGEMM; "):
        load_bench("deepep_layer_bench.py").main(["--tokens", "1"])


def test_deepep_layer_bench_plot_only(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    saved = [RESULTS / "deepep_layer_h200_ep1.json", RESULTS / "deepep_layer_h200_ep2.json"]
    load_bench("deepep_layer_bench.py").main(["--plot-only", *map(str, saved), "--png", str(tmp_path / "ep.png")])
    lines = capsys.readouterr().out.splitlines()
    for results in map(json.loads, (path.read_text() for path in saved)):
        rank0 = {(r["shape"], r["tokens"], r["backend"]): r["ms"] for r in results["rows"] if r["rank"] == 0}
        for (shape, tokens, backend), ms in rank0.items():
            if backend == "deep_gemm":
                speedup = rank0[(shape, tokens, "torch")]["step"] / ms["step"]
                assert any(
                    line.startswith(f"{shape:18} {tokens:>8} | {ms['step']:>13.3f}") and f"{speedup:>7.2f}x" in line for line in lines
                ), (shape, tokens)
    assert (tmp_path / "ep.png").stat().st_size > 10_000


def test_deepep_layer_bench_shows_the_graph_step(tmp_path, capsys):
    """A DeepGEMM row with ``graph_step`` (added here) gets it in the table's last column and a line in the plot."""
    pytest.importorskip("matplotlib")
    bench = load_bench("deepep_layer_bench.py")
    assert bench.parse_args(["--graph"]).graph and not bench.parse_args([]).graph
    results = json.loads((RESULTS / "deepep_layer_h200_ep1.json").read_text())
    row = next(r for r in results["rows"] if r["rank"] == 0 and r["backend"] == "deep_gemm")
    row["ms"]["graph_step"] = 0.123
    line = next(
        line
        for line in bench.table(results).splitlines()
        if line.startswith(f"{row['shape']:18} {row['tokens']:>8} | {row['ms']['step']:>13.3f}")
    )
    assert line.endswith(f"| {0.123:>13.3f}")
    bench.plot([results], tmp_path / "ep.png")
    assert (tmp_path / "ep.png").stat().st_size > 10_000


# sm90_paths_bench.py: SGLang's MoE forward on FlashInfer CUTLASS W4A16, Humming W4A8 and Marlin (one SM90 GPU)


def test_sm90_paths_bench_arguments():
    bench = load_bench("sm90_paths_bench.py")
    args = bench.parse_args(["--tokens", "1,64", "--experts", "8", "--targets", "sm90-marlin"])
    assert (args.tokens, args.experts, args.hidden, args.top_k) == ([1, 64], 8, 2880, 4)
    assert args.targets == ["sm90-cutlass", "sm90-marlin"]  # the baseline is always timed, first
    assert bench.parse_args([]).targets == ["sm90-cutlass", "sm90-cutlass-w4a8", "sm90-marlin"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--targets", "sm100-trtllm"])


@no_gpu
def test_sm90_paths_bench_refuses_without_a_gpu():
    with pytest.raises(SystemExit, match=r"^sm90_paths_bench.py times GPU work: it needs an SM90 GPU"):
        load_bench("sm90_paths_bench.py").main(["--tokens", "1"])


def test_sm90_paths_bench_table_and_plot(tmp_path, capsys):
    """A results file made up here: the ratios to W4A16, which path is fastest, and the plot."""
    pytest.importorskip("matplotlib")
    targets = ["sm90-cutlass", "sm90-cutlass-w4a8", "sm90-marlin"]
    results = {
        "device": "GPU",
        "torch": "2.x",
        "targets": targets,
        "shape": {"experts": 8, "hidden": 2880, "intermediate": 2880, "top_k": 4},
        "iters": 3,
        "warmup": 1,
        "rows": [{"tokens": 1, "ms": dict(zip(targets, (0.2, 0.3, 0.1)))}, {"tokens": 8192, "ms": dict(zip(targets, (10.0, 8.0, 15.0)))}],
    }
    (tmp_path / "r.json").write_text(json.dumps(results))
    load_bench("sm90_paths_bench.py").main(["--plot-only", str(tmp_path / "r.json"), "--png", str(tmp_path / "m.png")])
    lines = capsys.readouterr().out.splitlines()
    assert "| 1 | 0.200 | 0.300 | 0.100 | 1.50 | 0.50 | Marlin |" in lines
    assert "| 8192 | 10.000 | 8.000 | 15.000 | 0.80 | 1.50 | CUTLASS Humming W4A8 |" in lines
    assert (tmp_path / "m.png").stat().st_size > 10_000


# transform_bench.py: per-core speed of a conversion's CPU work (CPU only: runs whole, on tiny shapes)


def test_transform_bench_tiny(monkeypatch, capsys):
    from moebake.layouts.compiled import DISABLE_ENV

    monkeypatch.setenv(DISABLE_ENV, "0")  # the benchmark switches it; restored after the test
    threads = torch.get_num_threads()
    monkeypatch.setattr(sys, "argv", ["transform_bench.py", "--experts", "1", "--hidden", "128", "--repeat", "1"])
    try:
        load_bench("transform_bench.py").main()
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["one", "thread,", "median", "of", "1", "GB/s", "x", "copy"]
    names = [line[:44].rstrip() for line in lines[1:]]
    assert names == [
        "copy (torch.clone)",
        "xxh3-128 (xxhash)",
        "sha256 (hashlib)",
        *[
            f"{what}, {kernels}"
            for kernels in ("compiled", "numpy")
            for what in ("interleave v2 (W13, padded)", "interleave v1 (W13, padded)", "fold scales (W13, padded)")
        ],
        "deinterleave v2",
    ]
    assert float(lines[1].split()[-1]) == 1.0 and all(float(line.split()[-2]) > 0 for line in lines[1:])


# convert_bench.py through device_convert_scaling.sh: a real (tiny) measured run, cp vs moebake convert


def test_device_convert_scaling_tiny_run(tmp_path):
    """The device script, with this Python and no carried wheels, runs convert_bench.py on a tiny source:
    one layer, --workers 1, warm page cache; its results redraw with --plot-only."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OUT": str(out),
        "CACHE": str(cache),
        "CACHE_STATES": "warm",
        "EXPERTS": "2",
        "HIDDEN": "64",
        "VOCAB": "64",
        "NAME": "tiny",
    }
    result = subprocess.run(
        ["bash", str(BENCH / "device_convert_scaling.sh"), "1", "1"], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(out / "tiny.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(row["cache"], row["tool"]) for row in rows] == [("warm", "copy"), ("warm", "moebake w1")]
    assert all(float(row["wall_s"]) > 0 and float(row["gb_per_s"]) > 0 for row in rows)
    assert [line.split()[0] for line in rows[1]["profile"].splitlines()] == ["stage", *STAGES, "wall"]  # --profile's table
    assert "| source GB | page cache | tool |" in (out / "tiny.md").read_text()
    assert "== " in (out / "device_convert_scaling.log").read_text()
    assert [p.name for p in (cache / "scratch").iterdir()] == []  # every output deleted after its run
    if importlib.util.find_spec("matplotlib"):
        redraw = subprocess.run(
            [sys.executable, str(BENCH / "convert_bench.py"), "--plot-only", "--results", str(out), "--name", "tiny"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert redraw.returncode == 0, redraw.stderr
        assert (out / "tiny.png").stat().st_size > 10_000


def test_convert_bench_bakes_each_target_asked_for(tmp_path):
    """--targets: one more measured conversion per target besides sm90-cutlass, labelled with it."""
    from moebake.synthetic import write_gpt_oss

    bench = load_bench("convert_bench.py")
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=256, intermediate=128, vocab=32)
    (tmp_path / "scratch").mkdir()
    rows = bench.run_size(source, tmp_path / "scratch", [1], ["warm"], [""], [1], ("sm90-cutlass", "sm90-marlin"))
    assert [row["tool"] for row in rows] == ["copy", "moebake w1", "moebake w1, sm90-marlin"]
    assert all(row["wall_s"] > 0 for row in rows) and list((tmp_path / "scratch").iterdir()) == []


# device_wheels.sh: pip's download stubbed (CI has no index to fetch from); the rest runs as written


def test_device_wheels_recompresses_llvmlite_and_drops_numpy(tmp_path):
    dest = tmp_path / "wheels"
    files = {"llvmlite/__init__.py": b"x = 1\n" * 1000, "llvmlite-0.1.dist-info/RECORD": b"llvmlite/__init__.py,,\n"}
    stub = tmp_path / "python"
    stub.write_text(f"""#!{sys.executable}
import sys, zipfile
if sys.argv[1:4] == ["-m", "pip", "download"]:
    dest = sys.argv[sys.argv.index("-d") + 1]
    with open(dest + "/args", "w") as f:
        f.write(" ".join(sys.argv[4:]))
    with zipfile.ZipFile(dest + "/llvmlite-0.1-cp312-cp312-manylinux2014_x86_64.whl", "w", zipfile.ZIP_DEFLATED) as w:
        for name, data in {files!r}.items():
            w.writestr(name, data)
    open(dest + "/numpy-2.0-cp312-cp312-manylinux2014_x86_64.whl", "wb").close()
else:
    import os
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
""")
    stub.chmod(0o755)
    result = subprocess.run(
        ["bash", str(BENCH / "device_wheels.sh")],
        env={**os.environ, "DEST": str(dest), "PYTHON": str(stub)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["args", "llvmlite-0.1-cp312-cp312-manylinux2014_x86_64.whl"]
    asked = (dest / "args").read_text().split()
    assert asked[asked.index("--abi") + 1] == "cp312" and {"numba", "llvmlite", "xxhash", "psutil"} <= set(asked)
    with zipfile.ZipFile(next(dest.glob("llvmlite-*.whl"))) as wheel:
        assert {info.filename: info.compress_type for info in wheel.infolist()} == dict.fromkeys(files, zipfile.ZIP_LZMA)
        assert {name: wheel.read(name) for name in files} == files
    assert "recompressed llvmlite-0.1-cp312-cp312-manylinux2014_x86_64.whl" in result.stdout


# benchkit.drop_page_cache: a cold page cache for the benchmarks (startup_bench's, read_bench's)


def test_drop_page_cache_evicts_the_files_where_refused_and_says_so_once(tmp_path, monkeypatch, capsys):
    """benchkit.drop_page_cache (startup_bench's, through startup_limits, and read_bench's): refused, it evicts the
    files and says so the first time only, startup_bench in its own words."""
    startup = load_bench("startup_limits.py")
    benchkit = startup.benchkit
    monkeypatch.setattr(benchkit, "DROP_CACHES", tmp_path / "no-proc" / "drop_caches")
    monkeypatch.setattr(benchkit, "_EVICTION_SAID", False)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "a").write_bytes(b"a" * 4096)
    (tmp_path / "model" / "b").write_bytes(b"b" * 4096)
    startup.drop_page_cache(tmp_path / "model")
    startup.drop_page_cache(tmp_path / "model")
    assert capsys.readouterr().out == (
        "note: the page cache cannot be dropped here (No such file or directory): each cold run evicts the 2 files "
        f"under {tmp_path / 'model'} from it instead (posix_fadvise DONTNEED)\n"
    )
    said = []
    monkeypatch.setattr(benchkit, "_EVICTION_SAID", False)
    assert benchkit.drop_page_cache([tmp_path / "model" / "a"], say=said.append) is False
    assert said == [
        "note: the page cache cannot be dropped here (No such file or directory): the benchmark's 1 files "
        "are evicted from it instead (posix_fadvise DONTNEED)"
    ]


# read_bench.py: a rank's byte ranges read several ways, cold or warm, against the limit (GPU; the CPU device here)


def test_read_bench_rank_ranges_are_the_ranks_share_of_each_segment():
    """Segments of S = 1000 bytes, 4 ranks: rank 1 reads [250, 500) of each; a file of 3.5 segments ends in a partial
    one, whose range is the same clipped to the file's end (here whole), or none where the file ends before it."""
    ranges = load_bench("read_bench.py").rank_ranges
    assert ranges(3500, 1000, 4, 1) == [(250, 250), (1250, 250), (2250, 250), (3250, 250)]
    assert ranges(3500, 1000, 4, 2) == [(500, 250), (1500, 250), (2500, 250)]  # [3500, 3750) is past the end
    assert ranges(3400, 1000, 4, 1) == [(250, 250), (1250, 250), (2250, 250), (3250, 150)]  # clipped to 3400
    assert ranges(3500, 1000, 4, 0) == [(0, 250), (1000, 250), (2000, 250), (3000, 250)]
    assert ranges(20, 10, 4, 1) == [(2, 3), (12, 3)]  # [10*1//4, 10*2//4) of each
    with pytest.raises(ValueError):
        ranges(3500, 1000, 4, 4)


def test_read_bench_make_leaves_no_partial_file_when_writing_fails(tmp_path, monkeypatch):
    """``make`` writes to ``F.partial`` and renames it; a write that fails (a full disk) removes the partial file and
    leaves no ``F``."""
    bench = load_bench("read_bench.py")
    monkeypatch.setattr(bench, "MAKE_BLOCK", 64 << 10)
    calls = []

    def full_disk(text):
        calls.append(text)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bench, "GIB", 128 << 10)  # a progress line after two blocks: the failure comes mid-file
    with pytest.raises(OSError, match="No space"):
        bench.make(tmp_path / "f", 1 << 20, say=full_disk)
    assert calls and not (tmp_path / "f").exists() and not (tmp_path / "f.partial").exists()


def test_read_bench_make_run_table_and_plot_on_the_cpu(tmp_path, monkeypatch, capsys):
    """``make`` a small file (blocks of 256 KiB here: each a rotation of one random block, bytes 1-255), then ``run``
    every method twice onto the CPU, the page cache refused (so the file is evicted, and said so once): each rank
    method's read leaves exactly the file's rank ranges in the destination, every run has its fields, in a rotated
    order; then the table names every method and the plot is drawn."""
    bench = load_bench("read_bench.py")
    monkeypatch.setattr(bench, "MAKE_BLOCK", 256 << 10)
    monkeypatch.setattr(bench, "IDLE_SECONDS", 0.01)
    monkeypatch.setattr(bench.benchkit, "DROP_CACHES", tmp_path / "no-proc" / "drop_caches")
    monkeypatch.setattr(bench.benchkit, "_EVICTION_SAID", False)
    f = tmp_path / "f"
    bench.main(["make", "--file", str(f), "--mib", "2.2"])
    data = f.read_bytes()
    assert len(data) == int(2.2 * 2**20) and not (tmp_path / "f.partial").exists()
    blocks = [data[i : i + (256 << 10)] for i in range(0, 2 << 20, 256 << 10)]
    assert 0 not in data and len(set(blocks)) == 8 and len(set(data)) == 255
    segment = 2**19  # 0.5 MiB: 4 whole segments and a partial one of 0.2 MiB; rank 1 of 4: [128, 256) KiB of each
    expected = [(s + (128 << 10), min(s + (256 << 10), len(data)) - s - (128 << 10)) for s in range(0, len(data), segment)]
    assert expected[-1][1] == len(data) - 4 * segment - (128 << 10) > 0  # the last one clipped
    wanted = b"".join(data[offset : offset + length] for offset, length in expected)

    job = bench.Job.make(f, segment, 4, 1, "cpu")
    assert job.ranges == expected and job.requested == len(wanted)
    rank_methods = [name for name, method in bench.METHODS.items() if not method.whole_file]
    assert rank_methods == [
        "staged-8x16M",
        "staged-16x16M",
        "staged-8x64M",
        "staged-4x64M",
        "staged-8x8M",
        "staged-16x8M",
        "staged-8x4M",
        "staged-16x4M",
        "ring16-8x8M",
        "ring16-8x4M",
        "ring12-8x8M",
        "thread-copy-8x8M",
        "thread-copy-8x4M",
        "reads-only-8x8M",
        "idle6s-8x8M",
        "willneed-8x16M",
        "normal-8x16M",
        "per-range-8x16M",
        "per-range-split-tail-8x16M",
    ]
    assert [bench.METHODS[name].buffers for name in rank_methods[8:13]] == [16, 16, 12, 16, 16]  # two a thread-copier
    assert [(bench.METHODS[name].slots, bench.METHODS[name].chunk_bytes >> 20) for name in rank_methods[:8]] == [
        (8, 16),
        (16, 16),
        (8, 64),
        (4, 64),
        (8, 8),
        (16, 8),
        (8, 4),
        (16, 4),
    ]
    for name in rank_methods:
        job.dest.fill_(0)
        assert bench.METHODS[name].read(job) is job.dest
        if name == "reads-only-8x8M":  # its reads go to its ring only
            assert not job.dest.any()
            continue
        assert job.dest.numpy().tobytes() == wanted, name
    # the thread-copy reader with chunks small enough that each of its 3 threads takes many, through its 2 buffers
    copier = bench._thread_copy_reader()(torch.device("cpu"), slots=3, chunk_bytes=4 << 10, buffers=6, staged=True)
    job.dest.fill_(0)
    copier.read(job.pieces())
    copier.close()
    assert job.dest.numpy().tobytes() == wanted
    # the split-tail reader, with chunks small enough to split (32 KiB, 8 slots: 4 KiB pieces): the last 8 chunks of a
    # call become 8 pieces each, and the bytes are the ranges' still
    split = bench._split_tail_reader()(torch.device("cpu"), slots=8, chunk_bytes=32 << 10, staged=True)
    chunks = split._chunks(job.pieces())
    # 4 ranges of 4 chunks of 32 KiB and the clipped one of 76.8 KiB (32, 32, 12.8): 19 chunks; the last 8 (seven of
    # 32 KiB, then 12.8 KiB) become 7 x 8 pieces of 4 KiB and 4 pieces (3 x 4 KiB, 0.8 KiB): 11 + 56 + 4
    assert len(chunks) == 71 and [c.dest.numel() for c in chunks[:11]] == [32 << 10] * 11
    assert [c.dest.numel() for c in chunks[11:]] == [4 << 10] * 59 + [int(0.2 * 2**20) - (128 << 10) - 3 * (4 << 10) - (64 << 10)]
    job.dest.fill_(0)
    split.read(job.pieces())
    split.close()
    assert job.dest.numpy().tobytes() == wanted
    from moebake.loading import staged_reader

    original = staged_reader.open_without_readahead
    assert bench.METHODS["normal-8x16M"].context is bench.readahead_on
    with bench.readahead_on():
        assert staged_reader.open_without_readahead is not original  # patched inside
    assert staged_reader.open_without_readahead is original  # restored after
    assert bench.METHODS["limit-buffered"].read(job) is None

    out = tmp_path / "read_cpu.json"
    capsys.readouterr()
    bench.main(
        [
            "run",
            "--file",
            str(f),
            "--ranks",
            "4",
            "--rank",
            "1",
            "--segment-mib",
            "0.5",
            "--device",
            "cpu",
            "--rounds",
            "2",
            "--out",
            str(out),
            "--machine",
            "the CPU box",
        ]
    )
    stdout = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("note: the page cache cannot be dropped here") for line in stdout) == 1
    results = json.loads(out.read_text())
    runs = results["runs"]
    names = list(bench.METHODS)
    assert results["machine"] == "the CPU box"
    assert [run["method"] for run in runs] == names + names[1:] + names[:1]  # round 1 starts at the 2nd method
    assert [json.loads(line) for line in stdout if line.startswith("{")] == runs
    fields = {
        "method",
        "round",
        "cache",
        "file",
        "file_bytes",
        "segment_bytes",
        "ranks",
        "rank",
        "device",
        "slots",
        "chunk_bytes",
        "ring_seconds",
        "seconds",
        "bytes_requested",
        "bytes_read",
        "gbps",
    }
    for run in runs:
        assert fields <= set(run), run
        assert run["cache"] == "cold"
        assert (run["ring_seconds"] is None) == (run["method"].startswith("limit-") or bool(run.get("error"))), run
        assert (run["file_bytes"], run["segment_bytes"], run["ranks"], run["rank"], run["device"]) == (len(data), segment, 4, 1, "cpu")
        whole = run["method"].startswith("limit-")
        assert run["bytes_requested"] == (len(data) if whole else len(wanted)), run
        if run.get("error"):  # only O_DIRECT may be refused (tmpfs)
            assert run["method"] == "limit-direct" and run["gbps"] is None, run
            continue
        assert run["seconds"] > 0 and run["gbps"] == pytest.approx(run["bytes_requested"] / run["seconds"] / 1e9)
        assert run["bytes_read"] is None or run["bytes_read"] >= 0
    assert stdout[-len(names) - 1].split() == ["method", "rounds", "GB/s", "/", "limit", "read/req"]
    summary = {line.split()[0]: line.split() for line in stdout[-len(names) :]}
    assert list(summary) == names and summary["limit-buffered"][3] == "1.00x"

    bench.main(
        [
            "run",
            "--file",
            str(f),
            "--ranks",
            "4",
            "--rank",
            "1",
            "--segment-mib",
            "0.5",
            "--device",
            "cpu",
            "--rounds",
            "1",
            "--methods",
            "staged-8x16M",
            "--out",
            str(out),
        ]
    )
    assert len(json.loads(out.read_text())["runs"]) == len(runs) + 1  # appended to

    capsys.readouterr()
    bench.main(
        [
            "run",
            "--file",
            str(f),
            "--ranks",
            "1",
            "--rank",
            "0",
            "--segment-mib",
            "0.5",
            "--device",
            "cpu",
            "--cache",
            "warm",
            "--rounds",
            "1",
            "--methods",
            "limit-buffered",
            "staged-16x8M",
            "--out",
            str(out),
        ]
    )
    assert "note: the page cache cannot be dropped" not in capsys.readouterr().out  # warm: nothing dropped or evicted
    warm = json.loads(out.read_text())["runs"][-2:]
    assert [(r["method"], r["cache"], r["bytes_requested"]) for r in warm] == [
        ("limit-buffered", "warm", len(data)),
        ("staged-16x8M", "warm", len(data)),
    ]

    bench.main(["table", str(out)])
    text = out.with_suffix(".md").read_text()
    assert f"## warm: {f} ({len(data) / 1e9:.2f} GB), 0.5 MiB segments, rank 0 of 1, cpu" in text
    assert f"## cold: {f} ({len(data) / 1e9:.2f} GB), 0.5 MiB segments, rank 1 of 4, cpu" in text
    assert f"Generated by `python bench/read_bench.py table {out}`; do not edit by hand" in text
    assert "Machine: the CPU box." in text
    for name in names:
        assert f"| {name} | " in text, name
    assert "| staged-8x16M | 3 | " in text and "| limit-buffered | 2 | " in text and "| 1.00x |" in text
    staged = [r["gbps"] for r in json.loads(out.read_text())["runs"] if r["method"] == "staged-8x16M"]
    assert f"| {min(staged):.3f}-{max(staged):.3f} |" in text  # the slowest and fastest round
    pytest.importorskip("matplotlib")
    bench.main(["plot", str(out), "--png", str(tmp_path / "read.png")])
    assert (tmp_path / "read.png").stat().st_size > 10_000


# startup_bench.py: whole-model start-up through SGLang, stock vs the bake (GPU; the same code runs on the CPU here)


def test_startup_bench_on_the_cpu_loads_every_path_to_the_same_parameters(tmp_path):
    """A tiny GPT-OSS model made, baked and loaded three ways through SGLang's own code on the CPU (stock, SGLang's
    presharded dump and reload, the bake), as EP 1 on one node and as two simulated nodes of one rank each (one
    world of two ranks, loading node by node): every parameter hashes the same in every path, the bake path asks for each
    rank's share of the baked bytes only, the dumps are SGLang's own (its READY and plan files) and are deleted
    with ``--drop-dumps``, and the table and plot redraw from the results."""
    from engine_oracles import sglang_oracle

    if not sglang_oracle.sglang_installed():
        pytest.skip("sglang 0.5.23 is not installed")
    script = [sys.executable, str(BENCH / "startup_bench.py")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    subprocess.run([*script, "make", "--model", "tiny", "--dir", str(tmp_path)], check=True, env=env, capture_output=True)
    results = tmp_path / "results.json"
    done = subprocess.run(
        [
            *script,
            "all",
            "--dir",
            str(tmp_path),
            "--ep",
            "1",
            "--nodes",
            "2",
            "--cache",
            "warm",
            "--device",
            "cpu",
            "--drop-dumps",
            "--readahead",
            "both",
            "--out",
            str(results),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    every = json.loads(results.read_text())["runs"]
    off = [r for r in every if r.get("readahead_enabled") is False]  # --readahead both: each bake load off, on, on, off
    runs = {(r["path"], r["ep"], r["nodes"]): r for r in every if r not in off}
    assert [(r["path"], r["ep"], r["nodes"]) for r in off] == [("bake", 1, 1)] * 2 + [("bake", 2, 2)] * 2
    assert [r["readahead_enabled"] for r in every if r["path"] == "bake"] == [False, True, True, False] * 2
    for r in off:
        assert "readahead" not in r and (r["layer0_xxh3"], r["others_xxh3"]) == (
            runs["stock", r["ep"], r["nodes"]]["layer0_xxh3"],
            runs["stock", r["ep"], r["nodes"]]["others_xxh3"],
        )
    loads = {("stock", 1, 1), ("presharded", 1, 1), ("bake", 1, 1), ("stock", 2, 2), ("presharded", 2, 2), ("bake", 2, 2)}
    assert set(runs) == loads | {("presharded-dump", 1, 1), ("presharded-dump", 2, 1)}
    for ep, nodes in ((1, 1), (2, 2)):
        stock = runs["stock", ep, nodes]
        assert len(stock["layer0_xxh3"]) == len(stock["others_xxh3"]) == ep
        assert len(set(stock["layer0_xxh3"])) == ep  # each rank holds other experts
        for path in ("presharded", "bake", "presharded-dump"):
            twin = runs[path, ep, nodes if path != "presharded-dump" else 1]
            assert (twin["layer0_xxh3"], twin["others_xxh3"]) == (stock["layer0_xxh3"], stock["others_xxh3"]), path
        assert runs["bake", ep, nodes]["layer0_equal_to_stock"] is True and runs["bake", ep, nodes]["others_equal_to_stock"]
    assert len(runs["bake", 2, 2]["node_seconds"]) == 2 and runs["bake", 2, 2]["gpus_per_node"] == 1
    assert runs["presharded-dump", 2, 1]["dump_bytes"] > 0
    said = re.findall(
        r"^(\S+) ep=(\d): \d rank processes, (\d+) s from start to exit: setup (\d+) s \(slowest rank\), "
        r"loads and digests (\d+) s, page-cache drops (\d+) s, the rest (-?\d+) s$",
        done.stdout,
        re.M,
    )
    worlds = ["stock", "presharded-dump", "presharded"] + ["bake"] * 4  # each path's world; the bake's 4 read-ahead runs
    assert [(p, int(e)) for p, e, *_ in said] == [(p, 1) for p in worlds] + [(p, 2) for p in worlds]  # EP 1, 2 nodes
    assert all(int(wall) >= int(setup) > 0 for _, _, wall, setup, *_ in said)  # where each world's wall clock went
    for (path, ep, nodes), run in runs.items():  # the slowest rank's phases: what ran in the timed region, no more
        if path != "presharded-dump":
            parts = {"build", "other"} | ({"iterate", "post_load"} if path != "presharded" else set())
            shares = (
                {"iterate_reads", "iterate_ring", "pin_ring", "iterate_batches", "post_load_reads", "post_load_batches"}
                if path == "bake"
                else set()
            )
            assert parts | shares == set(run["phases"])
            whole = sum(v for k, v in run["phases"].items() if k not in shares)
            assert abs(whole - run["seconds"]) < 1e-6 and run["phases"]["build"] > 0
    bake = runs["bake", 1, 1]["phases"]
    assert 0 < bake["iterate_reads"] <= bake["iterate"] and 0 < bake["post_load_reads"] <= bake["post_load"]
    assert bake["iterate_ring"] == bake["pin_ring"] == 0.0  # a CPU device's reader reads into the parameters: no ring
    assert sum(seconds for seconds, _ in bake["iterate_batches"]) == pytest.approx(bake["iterate_reads"])
    assert sum(size for _, size in bake["iterate_batches"]) > 0
    layers = json.loads((tmp_path / "out" / "config.json").read_text())["num_hidden_layers"]
    assert len(bake["post_load_batches"]) == layers  # a read call per MoE layer
    assert sum(seconds for seconds, _ in bake["post_load_batches"]) == pytest.approx(bake["post_load_reads"])
    assert not list(tmp_path.glob("presharded-ep*.json")) and not any((tmp_path / "src" / "presharded").iterdir())
    from moebake.schema.manifest import Manifest, read_manifest

    manifest = Manifest.from_json(read_manifest(tmp_path / "out"), tmp_path / "out" / "moebake.json")
    baked = sum(
        int(torch.Size(t.shape).numel()) * torch.empty(0, dtype=t.dtype.torch).element_size()
        for layer in manifest.layers
        for t in layer.tensors.values()
    )
    others = runs["bake", 1, 1]["bytes_requested"] - baked  # EP 1 reads every baked byte once, then the other tensors
    assert others > 0 and runs["bake", 2, 2]["bytes_requested"] == baked + 2 * others  # each rank: its half, all the others
    png = subprocess.run([*script, "plot", str(results)], check=True, capture_output=True, text=True).stdout.strip()
    assert Path(png).stat().st_size > 10_000
    md = Path(subprocess.run([*script, "table", str(results)], check=True, capture_output=True, text=True).stdout.strip())
    text = md.read_text()
    assert "| 2 x 1 | bake |" in text and "| 2 x 1 | presharded |" in text and "presharded dumps" in text
    assert "| 1 | warm | bake |" in text and "Where the time goes" in text
    assert "| 1 x 1 | warm |" in text and "| 2 x 1 | cold |" in text and "off/on (means)" in text  # the read-ahead's table
    assert "| 2 x 1 | bake |" in text and text.count("| 2 x 1 | bake |") == 1  # the scale-out table: one bake row
    ahead = runs["bake", 1, 1]["readahead"]  # the plugin's read-ahead ran beside the bake's load and ended cleanly
    assert ahead["error"] is None and ahead["planned_bytes"] > 0 and "read-ahead (GB) |" in text
    assert all("readahead" not in run for (path, _, _), run in runs.items() if path != "bake")
    for (path, _, _), run in runs.items():  # the machine's memory before the slowest rank's first byte
        if path != "presharded-dump":
            memory = run["host_memory_before_load_gib"]
            assert {"free", "cached", "dirty", "writeback"} <= set(memory) and memory["cached"] > 0


def test_startup_bench_host_memory_is_read_from_meminfo_in_gib(tmp_path):
    """The machine's memory a rank records before its first byte: each of ``MEMINFO_FIELDS`` that the kernel reports,
    from kB to GiB, the other fields left out."""
    bench = load_bench("startup_bench.py")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       263000000 kB\nMemFree:        1048576 kB\nCached:         2097152 kB\n"
        "SwapCached:            0 kB\nDirty:             1024 kB\nWriteback:            0 kB\n"
    )
    assert bench._host_memory_gib(meminfo) == {"free": 1.0, "cached": 2.0, "dirty": 1 / 1024, "writeback": 0.0}


@pytest.mark.parametrize("name", ["startup_h200x2", "startup_cpu_2core", "startup_warm_h200x2"])
def test_startup_bench_redraws_the_committed_results(tmp_path, name):
    png = load_bench("startup_bench.py").plot(RESULTS / f"{name}.json", tmp_path / "startup.png")
    assert png.stat().st_size > 10_000


def _committed_startup_table(tmp_path, name: str) -> tuple[str, list[dict]]:
    """bench/results/NAME.md is what ``startup_bench.py table`` makes of the JSON beside it (regenerate it with that
    command after the results change): the Markdown, and the JSON's runs."""
    md = load_bench("startup_bench.py").table(RESULTS / f"{name}.json", tmp_path / "startup.md")
    assert md.read_text() == (RESULTS / f"{name}.md").read_text()
    return md.read_text(), json.loads((RESULTS / f"{name}.json").read_text())["runs"]


def test_startup_bench_table_is_the_committed_markdown(tmp_path):
    """bench/results/startup_h200x2.md is what ``startup_bench.py table`` makes of the JSON beside it (regenerate
    it with that command after the results change), and its numbers are the JSON's."""
    text, runs = _committed_startup_table(tmp_path, "startup_h200x2")
    assert "| 1 | warm | 4.41 | - | 1.48 | 2.97x | - | 1.37 | 1.08 |" in text  # 120B-shaped, EP 1 warm (no presharded)
    assert "| 2 | warm | 4.89 | - | 1.52 | 3.22x | - | 0.75 | 2.03 |" in text  # 120B-shaped, EP 2 warm
    assert "| 1 | warm | bake | 1.09 | 2.35 | 0.65 | 1.57 |" in text  # its host-memory split
    assert "Not measured" not in text and "2 x H200, 32 cores" in text
    # 2026-11-28, 120B-shaped, 6 layers, with the wrapped iterators: the three paths warm, and at 4 and 2 simulated nodes
    assert "| 1 | warm | 2.74 | 1.95 | 0.66 | 4.16x | 2.96x | 0.84 | 0.78 |" in text
    assert "| 4 x 1 | bake | 4.38 | 3.55, 3.97, 4.38, 3.95 | 5.42 | 5.41 | 3.18 | 1.38 | 2.24x | 0.00 |" in text
    assert "| 4 x 1 | presharded | 4.58 |" in text and "| 2 x 1 | bake | 6.07 |" in text
    # 2026-11-28, 2 nodes again with the reader of 8 MiB chunks: the bake under presharded, each node its need
    assert "| 2 x 1 | bake | 5.13 | 4.97, 5.13 | 8.19 | 8.18 | 4.20 | 1.22 | 1.63x | 0.00 |" in text
    assert "| 2 x 1 | presharded | 5.32 | 5.32, 5.11 | 8.19 | 8.18 | 4.20 | 1.27 | 1.57x | 1.70 |" in text
    assert "first read 0.762 s, 1.16 GB" in text  # the other tensors' first read call, cold
    # 2026-11-28, the 18-layer model at 4 simulated nodes: stock and the bake, presharded, the bake again (three runs)
    assert "| 4 x 1 | stock | 21.64 | 20.91, 20.18, 21.37, 21.64 | 33.80 | 11.60 | 6.43 | 3.37 | 1.00x |" in text
    assert "| 4 x 1 | bake | 7.24 | 6.98, 7.05, 7.06, 7.24 | 11.63 | 11.60 | 6.43 | 1.13 | 2.99x | 0.00 |" in text
    assert "| 4 x 1 | presharded | 8.61 |" in text and "| 4 x 1 | bake | 7.89 |" in text
    nodes18 = [r for r in runs if r["layers"] == 18 and r.get("nodes") == 4]
    stock18 = next(r for r in nodes18 if r["path"] == "stock")
    for run in (r for r in nodes18 if r["path"] in ("presharded", "bake")):
        assert (run["layer0_xxh3"], run["others_xxh3"]) == (stock18["layer0_xxh3"], stock18["others_xxh3"])
        assert max(run["node_bytes_read"]) <= 1.01 * run["node_bytes_needed"]  # each node reads its need
    six = [r for r in runs if r["layers"] == 6 and r["path"] in ("presharded", "bake")]
    assert len(six) == 14 and all(r["layer0_equal_to_stock"] and r["others_equal_to_stock"] for r in six)
    # 2026-11-28, 2 nodes, the read-ahead off, on, on, off: in its own table, each run against the limit
    readahead = [r for r in runs if r.get("session", "").endswith("the read-ahead off, on, on, off")]
    assert [r["readahead_enabled"] for r in readahead] == [False, True, True, False]
    assert "| 2 x 1 | bake | 5.38 | 5.21, 5.38 | 8.19 | 8.18 | 5.04 | 1.07 | - | 0.00 |" in text
    for run in (r for r in six if r["path"] == "bake" and r["cache"] == "cold"):  # no node read another rank's rows
        assert max(run["node_bytes_read"]) <= run["node_bytes_needed"] * 1.005
    # 2026-11-28, DeepSeek-V4-Flash's experts, 8 layers: 4 and 2 simulated nodes, then EP 2 and 1 warm
    assert "| 4 x 1 | bake | 5.37 | 5.17, 5.27, 5.07, 5.37 | 9.61 | 9.59 | 6.49 | 0.83 | 4.22x | 0.00 |" in text
    assert "| 4 x 1 | stock | 22.67 |" in text and "| 4 x 1 | presharded | 6.01 |" in text
    assert "| 2 x 1 | bake | 10.54 |" in text and "| 2 x 1 | presharded | 10.73 |" in text
    assert "| 2 | warm | 4.07 | 2.37 | 0.87 | 4.69x | 2.73x | 0.71 | 1.22 |" in text
    assert "| 1 | warm | 4.67 | 4.65 | 1.18 | 3.97x | 3.95x | 1.31 | 0.90 |" in text
    v4 = [r for r in runs if r["model"] == "deepseek-v4-flash" and r["path"] in ("presharded", "bake")]
    assert len(v4) == 8 and all(r["layer0_equal_to_stock"] and r["others_equal_to_stock"] for r in v4)
    for run in (r for r in v4 if r["path"] == "bake"):
        assert run["peak_gpu_extra_gib"] == 0.0
        if run["cache"] == "cold":
            assert max(run["node_bytes_read"]) <= run["node_bytes_needed"] * 1.002


def test_startup_bench_warm_table_is_the_committed_markdown(tmp_path):
    """bench/results/startup_warm_h200x2.md (warm, 2 x H200, each run set on a fresh machine: the 120B-shaped model of
    6 layers with each MoE layer's read call recorded; the DeepSeek-V4-shaped model's three paths against the physical
    limit, then the bake alone twice with the machine's memory recorded; the 120B-shaped model of 18 layers, the bake
    alone) is what ``startup_bench.py table`` makes of the JSON beside it: one section per run set, each with its own
    limits and notes only; its rows are the JSON's numbers, and every bake and presharded rank equals stock's."""
    text, runs = _committed_startup_table(tmp_path, "startup_warm_h200x2")
    text, v4, alone_v4, synced_v4 = text.split("## deepseek-v4-flash-shaped, 8 MoE layers of 256 experts, ")
    text, eighteen = text.split("## gpt-oss-120b-shaped, 18 MoE layers of 128 experts, ")
    head, six = text.split("## gpt-oss-120b-shaped, 6 MoE layers of 128 experts, ")
    assert six.startswith("each MoE layer's read call recorded") and six.count("Limits measured") == 1
    assert "| 1 | warm | 1.58 | - | 0.44 | 3.61x | - | 0.27 | 1.63 |" in six
    assert "| 2 | warm | 2.01 | - | 0.35 | 5.75x | - | 0.20 | 1.74 |" in six
    assert "110.0 GB/s pinned with 2 GPUs copying at once" in six  # the node's copies: no less than 2 x one GPU's
    layers = [
        run["phases"]["post_load_batches"]
        for run in runs
        if "post_load_batches" in run.get("phases", {}) and (run["model"], run["layers"]) == ("gpt-oss-120b", 6)
    ]
    assert len(layers) == 2 and all(len(calls) == 6 for calls in layers)  # a read call per MoE layer, EP 1 and 2
    assert v4.startswith("the three paths against the physical limit") and v4.count("Limits measured") == 2
    assert "| 1 | warm | 5.21 | 4.05 | 1.32 | 3.95x | 3.07x | 0.61 | 2.15 |" in v4
    assert "| 2 | warm | 5.17 | 3.03 | 1.14 | 4.55x | 2.67x | 0.46 | 2.49 |" in v4
    three = [r for r in runs if r["session"].startswith("the three paths")]
    assert sorted(r["path"] for r in three) == ["bake"] * 2 + ["presharded"] * 2 + ["presharded-dump"] * 2 + ["stock"] * 2
    assert alone_v4.startswith("the bake alone") and synced_v4.startswith("the same again after a sync")
    assert "| 1 | warm | - | - | 0.92 | - | - | 0.64 | 1.44 |" in alone_v4 and "reader alone" in alone_v4
    assert "| 1 | warm | - | - | 0.92 | - | - | 0.55 | 1.68 |" in synced_v4
    assert eighteen.startswith("the bake alone") and "| 1 | warm | - | - | 1.27 | - | - | 0.67 | 1.91 |" in eighteen
    memory = [r for r in runs if "host_memory_before_load_gib" in r]
    assert len(memory) == 3 and all(r["host_memory_before_load_gib"]["dirty"] < 0.01 for r in memory)
    assert all(
        r["layer0_equal_to_stock"] and r["others_equal_to_stock"]
        for r in runs
        if r["path"] in ("presharded", "bake") and r["layer0_equal_to_stock"] is not None
    )
    assert all(r["peak_gpu_extra_gib"] == 0.0 for r in runs if r["path"] == "bake")


def test_startup_bench_cpu_table_is_the_committed_markdown(tmp_path):
    """bench/results/startup_cpu_2core.md (the read-ahead off and on, on the CPU box, with the plugin's wrapped
    iterators) is what ``startup_bench.py table`` makes of the JSON beside it: the read-ahead's runs in a table of their
    own, beside the runs without it; every bake load equals stock's parameters, and each simulated node read its need
    and no more."""
    text, runs = _committed_startup_table(tmp_path, "startup_cpu_2core")
    assert "| 1 x 1 | cold | 3.61, 7.50 | 7.75, 6.66 | 0.77x | 4.87 | 1.48 | 6.12 / 6.12 |" in text
    assert "| 4 x 1 | cold | 1.65, 1.41 | 1.57, 1.54 | 0.98x | 2.66 | 0.58 | 3.35 / 3.35 |" in text
    assert "| 4 x 1 | bake | 1.65 | 1.65, 1.22, 1.22, 1.20 |" in text  # the scale-out table: the first run without it
    assert "| 4 x 1 | cold | bake, repeat | 1.41 |" in text and "| 4 x 1 | cold | bake, read-ahead | 1.57 |" in text
    for ep in (1, 4):
        loads = [r for r in runs if r["ep"] == ep and r["model"] == "gpt-oss-120b"]
        assert [r["path"] for r in loads] == ["stock"] + ["bake"] * 4
        assert len({(tuple(r["layer0_xxh3"]), tuple(r["others_xxh3"])) for r in loads}) == 1
    for run in (r for r in runs if r["path"] == "bake" and r["nodes"] == 4):  # the wrapped iterators read no other rank's rows
        assert max(run["node_bytes_read"]) <= run["node_bytes_needed"] * 1.0001
    v4 = [r for r in runs if r["model"] == "deepseek-v4-flash"]  # V4-Flash's experts through the bench, 4 nodes
    assert [r["path"] for r in v4] == ["stock", "bake"] and v4[1]["layer0_equal_to_stock"] and v4[1]["others_equal_to_stock"]


def _committed_read_table(tmp_path, name: str) -> tuple[str, list[dict]]:
    """bench/results/NAME.md is what ``read_bench.py table`` makes of the JSON beside it (regenerate it with that
    command after the results change): the Markdown, and the JSON's runs."""
    md = load_bench("read_bench.py").table(RESULTS / f"{name}.json", tmp_path / "read.md")
    text = md.read_text()
    assert text == (RESULTS / f"{name}.md").read_text().replace(f"table bench/results/{name}.json", f"table {RESULTS / (name + '.json')}")
    return text, json.loads((RESULTS / f"{name}.json").read_text())["runs"]


def test_read_bench_h200_table_is_the_committed_markdown(tmp_path):
    """bench/results/read_h200.md is what ``read_bench.py table`` makes of the JSON beside it (regenerate it with that
    command after the results change); its rows are the JSON's numbers, and moebake's reader read no byte beyond a
    rank's ranges but what the block layer rounds up (under 0.5%)."""
    text, runs = _committed_read_table(tmp_path, "read_h200")
    assert "| staged-8x16M | 3 | 2.768 | 1.553 | 1.499-1.597 | 0.93x | 1.002x |" in text  # rank 1 of 2
    assert "| normal-8x16M | 3 | 1.433 | 1.502 | 1.405-1.568 | 0.92x | 1.063x |" in text  # rank 1 of 4, readahead on
    first_cuda = {
        next(i for i, r in enumerate(runs) if r["ranks"] == ranks and r["method"].startswith("staged")) for ranks in (4, 2)
    }  # these two also loaded CUDA's libraries (26 and 13 MB; the bench now warms up)
    for i, run in enumerate(runs):
        if run["method"].startswith(("staged", "willneed")) and i not in first_cuda:
            assert run["bytes_read"] <= run["bytes_requested"] * 1.001, run


def test_read_bench_h200x2_table_is_the_committed_markdown(tmp_path):
    """bench/results/read_h200x2.md (a call per layer against one call for all, 2 GiB segments) is what
    ``read_bench.py table`` makes of the JSON beside it; every method read a rank's ranges and no more."""
    text, runs = _committed_read_table(tmp_path, "read_h200x2")
    assert "| per-range-8x16M | 3 | 1.601 | 1.343 | 1.270-1.391 | 0.90x | 1.000x |" in text
    assert "| staged-8x16M | 3 | 1.501 | 1.440 | 1.284-1.568 | 0.96x | 1.000x |" in text
    for run in runs:
        assert run["bytes_read"] <= run["bytes_requested"] * 1.0002, run


def test_startup_bench_peak_rss_is_the_rank_process_own_not_its_parents(tmp_path):
    """A rank's peak RSS is its own address space's high-water mark (``VmHWM``): a parent holding 512 MiB more than the
    rank starts it, and the rank's peak stays far under that, where ``ru_maxrss`` (the figure the benchmark took
    before) carries the parent's peak over fork and exec."""
    held = bytearray(512 << 20)
    held[::4096] = b"\1" * len(range(0, len(held), 4096))  # every page resident in this (the parent) process
    child = (
        "import json, resource, sys; sys.path.insert(0, 'bench'); import startup_bench; "
        "print(json.dumps([startup_bench._rss_gib()['peak'], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))"
    )
    parent_gib = load_bench("startup_bench.py")._rss_gib()["rss"]
    done = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True, check=True)
    peak_gib, maxrss_kib = json.loads(done.stdout)
    assert parent_gib > 0.5 and maxrss_kib * 1024 / 2**30 >= parent_gib - 0.05  # the old figure: the parent's
    assert peak_gib < parent_gib - 0.4  # the rank's own
    del held


def test_startup_bench_warm_limit_is_a_rank_share_of_the_node_page_cache_where_measured():
    """Warm, a rank's bytes at one rank's page-cache bandwidth, or at its share of the node's (``ep`` ranks reading
    at once) where that is less; cold, every rank's bytes through the one disk; never under the pinned copies (one
    GPU's, or a rank's share of ``ep`` GPUs copying at once where that is less)."""
    limit_seconds = load_bench("startup_limits.py").limit_seconds
    one = {"disk_gbps": 2.0, "page_cache_gbps": 20.0, "h2d_pinned_gbps": 50.0}
    assert limit_seconds(10e9, 2, "warm", one) == 10e9 / 20e9
    assert limit_seconds(10e9, 2, "warm", {**one, "page_cache_node_gbps": {"2": 30.0}}) == 10e9 / 15e9  # shared
    assert limit_seconds(10e9, 2, "warm", {**one, "page_cache_node_gbps": {"2": 50.0}}) == 10e9 / 20e9  # not less
    assert limit_seconds(10e9, 4, "warm", {**one, "page_cache_node_gbps": {"2": 30.0}}) == 10e9 / 20e9  # not measured
    assert limit_seconds(10e9, 2, "cold", {**one, "page_cache_node_gbps": {"2": 30.0}}) == 2 * 10e9 / 2e9
    assert limit_seconds(10e9, 1, "warm", {**one, "page_cache_gbps": 400.0}) == 10e9 / 50e9  # the copies bind
    copies = {**one, "page_cache_gbps": 400.0, "h2d_pinned_node_gbps": {"2": 80.0}}  # two GPUs copying: 40 GB/s each
    assert limit_seconds(10e9, 2, "warm", copies) == 10e9 / 40e9
    assert limit_seconds(10e9, 1, "warm", copies) == 10e9 / 50e9  # one rank: one GPU's copies
    assert limit_seconds(10e9, 2, "warm", {**copies, "h2d_pinned_node_gbps": {"2": 120.0}}) == 10e9 / 50e9  # not less


def test_startup_bench_node_copy_probe_copies_on_every_gpu_at_once(monkeypatch):
    """The node's pinned-copy probe (here with CPU tensors standing in for the GPUs' and the pinned buffers): one
    untimed copy per GPU, then each GPU's thread copies ``repeats`` times with its GPU current, all started by one
    barrier; the total bytes over the clock's seconds."""
    import contextlib
    import threading

    bench = load_bench("startup_limits.py")
    real_empty, current, copies = torch.empty, threading.local(), []
    monkeypatch.setattr(torch, "empty", lambda *shape, pin_memory=False, device=None, **kw: real_empty(*shape, **kw))

    @contextlib.contextmanager
    def device(g):
        current.g = g
        yield
        del current.g

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda g=None: copies.append(("sync", g, getattr(current, "g", None))))
    clock = iter([100.0, 104.0])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    real_copy = torch.Tensor.copy_

    def copy(self, other, non_blocking=False):
        copies.append(("copy", getattr(current, "g", None), non_blocking))
        return real_copy(self, other)

    monkeypatch.setattr(torch.Tensor, "copy_", copy)
    assert bench._h2d_gbps(True, 2, nbytes=1000, repeats=3) == 2 * 3 * 1000 / 4.0 / 1e9
    timed = [c for c in copies if c[0] == "copy" and c[2]]
    assert sorted(c[1] for c in timed) == [0, 0, 0, 1, 1, 1]  # each GPU's thread, its GPU current, non-blocking
    assert [c for c in copies if c[0] == "copy" and not c[2]] == [("copy", None, False)] * 2  # the untimed ones
    assert sorted(c[1:] for c in copies if c[0] == "sync" and c[2] is not None) == [(0, 0), (1, 1)]  # each thread
    assert sorted(c[1] for c in copies if c[0] == "sync" and c[2] is None) == [0, 1]  # waits for its GPU; untimed, too


def test_startup_bench_page_cache_probe_reads_every_chunk_with_the_threads_asked(tmp_path, monkeypatch):
    """The page-cache probe reads every chunk (the reader's ``DEFAULT_CHUNK_BYTES``) of the files once to warm them,
    then once on the clock, with ``threads`` reads at once even where the files are fewer (as a rank's reader has its
    threads on one file), and divides the timed bytes by the timed seconds."""
    import threading

    from moebake.loading.staged_reader import DEFAULT_CHUNK_BYTES as chunk

    bench = load_bench("startup_limits.py")
    files = [tmp_path / "a", tmp_path / "b"]
    files[0].write_bytes(b"\1" * (chunk * 5 // 2))  # 3 chunks, the last short
    files[1].write_bytes(b"\2" * (chunk * 5 // 8))  # 1 chunk
    calls, threads, real, lock = [], set(), os.preadv, threading.Lock()
    together = threading.Barrier(3, timeout=20)  # the first 3 reads wait for each other: 3 in flight, 2 files

    def preadv(fd, buffers, offset):
        with lock:
            calls.append(offset)
            first = len(calls) <= 3
        threads.add(threading.get_ident())
        if first:
            together.wait()
        return real(fd, buffers, offset)

    monkeypatch.setattr(bench.os, "preadv", preadv)
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    gbps = bench._page_cache_gbps(files, threads=3)
    assert gbps == (chunk * 5 // 2 + chunk * 5 // 8) / 2.0 / 1e9
    assert sorted(calls) == sorted([0, chunk, 2 * chunk, 0] * 2) and len(threads) == 3


def test_startup_bench_reader_alone_reads_every_byte_twice_through_the_plugins_reader(tmp_path, monkeypatch):
    """The reader-alone probe reads every byte of the files through the plugin's reader twice (untimed, then timed),
    in pieces of at most the window into one device buffer, and divides the timed read's bytes by its seconds."""
    import types

    from moebake.loading import staged_reader

    bench = load_bench("startup_limits.py")
    files = [tmp_path / "a", tmp_path / "b"]
    files[0].write_bytes(bytes(range(256)) * 9 + b"\7" * 5)  # 2309 bytes: windows of 1000, 1000 and 309
    files[1].write_bytes(b"\3" * 1000)  # one whole window, the last piece read
    calls, real_read = [], staged_reader.StagedReader.read

    def read(self, ranges):
        calls.append([(Path(r.path).name, r.offset, r.dest.numel(), r.dest.data_ptr()) for r in ranges])
        assert self.staged  # asked for: the pinned ring's pipeline, without a GPU
        return real_read(self, ranges)

    monkeypatch.setattr(staged_reader.StagedReader, "read", read)
    clock = iter([10.0, 14.0])
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    gbps = bench._reader_alone_gbps(files, "cpu", window_bytes=1000, staged=True)
    expected = [("a", 0, 1000), ("a", 1000, 1000), ("a", 2000, 309), ("b", 0, 1000)]
    assert [[c[:3] for c in call] for call in calls] == [expected, expected]
    assert len({c[3] for call in calls for c in call}) == 1  # one buffer, reused
    assert gbps == 3309 / 4.0 / 1e9


def test_startup_bench_table_of_a_tiny_results_file(tmp_path, capsys):
    """Ratios, the limit, GB and the missing (ep, cache) of a results file made up here, one node (a run repeated
    gets a row of its own) and simulated nodes; the ``table`` subcommand."""
    run = {
        "engine": "sglang",
        "model": "tiny",
        "layers": 2,
        "experts": 4,
        "bytes_read": 3e9,
        "peak_gpu_extra_gib": 0.5,
        "peak_host_rss_gib": 1.25,
        "limit_seconds": 2.0,
    }
    node = {**run, "ep": 2, "nodes": 2, "gpus_per_node": 1, "cache": "cold", "node_bytes_needed": 2e9}
    runs = [
        {**run, "path": "stock", "ep": 1, "cache": "cold", "seconds": 6.0},
        {**run, "path": "presharded", "ep": 1, "cache": "cold", "seconds": 4.0, "peak_gpu_extra_gib": 1.0},
        {**run, "path": "bake", "ep": 1, "cache": "cold", "seconds": 3.0, "peak_gpu_extra_gib": 0.0},
        {
            **run,
            "path": "bake",
            "ep": 2,
            "cache": "warm",
            "seconds": 1.0,
            "phases": {
                "build": 0.1,
                "iterate": 0.3,
                "iterate_reads": 0.2,
                "post_load": 0.5,
                "post_load_reads": 0.4,
                "sync": 0.05,
                "other": 0.05,
            },
        },
        {**run, "path": "bake", "ep": 2, "cache": "warm", "seconds": 1.5, "limit_seconds": 1.0},  # a repeat
        {**node, "path": "stock", "seconds": 8.0, "node_seconds": [8.0, 7.5], "node_bytes_read": [4e9, 3.9e9]},
        {**node, "path": "bake", "seconds": 2.5, "node_seconds": [2.5, 2.4], "node_bytes_read": [2.1e9, 2e9], "peak_gpu_extra_gib": 0.0},
        {
            "engine": "sglang",
            "model": "tiny",
            "layers": 2,
            "experts": 4,
            "path": "presharded-dump",
            "ep": 2,
            "nodes": 1,
            "gpus_per_node": 2,
            "cache": "-",
            "seconds": 1.5,
            "load_seconds": 6.5,
            "dump_bytes": 3.25e9,
        },
    ]
    results = tmp_path / "startup.json"
    results.write_text(json.dumps({"runs": runs, "limits": [{"model": "tiny", "layers": 2, "disk_gbps": 1.0, "page_cache_gbps": 10.0}]}))
    load_bench("startup_bench.py").main(["table", str(results)])
    md = Path(capsys.readouterr().out.strip())
    assert md == results.with_suffix(".md")
    text = md.read_text()
    assert (
        "| 1 | cold | 6.00 | 4.00 | 3.00 | 2.00x | 1.33x | 2.00 | 1.50 | 3.00 / 3.00 / 3.00 | 0.50 / 1.00 / 0.00 | 1.25 / 1.25 / 1.25 |"
    ) in text
    assert "| 2 | warm | - | - | 1.00 | - | - | 2.00 | 0.50 | - / - / 3.00 | - / - / 0.50 | - / - / 1.25 |" in text
    assert "| 2 | warm | - | - | 1.50 | - | - | 1.00 | 1.50 |" in text  # the repeat: a row of its own, after the first
    assert text.index("| 2 | warm | - | - | 1.00 |") < text.index("| 2 | warm | - | - | 1.50 |")
    assert "| 2 x 1 | stock | 8.00 | 8.00, 7.50 | 4.00 | 2.00 | 2.00 | 4.00 | 1.00x | 0.50 |" in text
    assert "| 2 x 1 | bake | 2.50 | 2.50, 2.40 | 2.10 | 2.00 | 2.00 | 1.25 | 3.20x | 0.00 |" in text
    assert "| 2 | 6.50 | 1.50 | 3.25 |" in text  # the dump: stock load, dump, GB
    assert "| 1 x 2 | warm | bake | 1.00 | 0.10 | 0.30 (0.20) | 0.50 (0.40) | 0.05 | 0.05 |" in text  # its phases alone
    assert "| 1 | cold | stock | 6.00 |" not in text
    assert "Not measured: EP 1 warm, EP 2 cold." in text and "disk 1.00 GB/s with O_DIRECT (the only disk probe" in text


def test_startup_bench_plot_bars_the_first_run_and_dots_each_repeat():
    """A path run more than once in a group: its bar is its first run (as the tables' first row), with a dot at each
    run's seconds; stock/bake over the first runs."""
    report = load_bench("startup_report.py")
    plt = report.benchkit.pyplot()
    run = {"limit_seconds": 1.0}
    runs = [{**run, "path": "stock", "seconds": 6.0}, {**run, "path": "bake", "seconds": 2.0}, {**run, "path": "bake", "seconds": 3.0}]
    fig, ax = plt.subplots()
    report._bars(ax, ["g"], lambda g: runs, str)
    assert sorted(p.get_height() for p in ax.patches) == [2.0, 6.0]
    dots = [line for line in ax.lines if line.get_marker() == "."]
    assert len(dots) == 1 and list(dots[0].get_ydata()) == [2.0, 3.0]
    assert [(t.get_text(), t.xy[1]) for t in ax.texts] == [("3.0x", 3.0)]  # above the highest dot
    plt.close(fig)


# real_server.py: a real SGLang server (SGLang 0.5.17's stack, carried to the GPU machine), stock vs bake


def test_real_server_compares_every_prompt_bit_for_bit():
    bench = load_bench("real_server.py")
    reference = [{"output_ids": [5, 6, 7], "logprobs": [-0.5, -1.25, -2.0]}, {"output_ids": [1], "logprobs": [-0.125]}]
    same = json.loads(json.dumps(reference))  # what a second server's JSON gives for the same floats
    assert bench.compare(same, reference) == (True, True)
    one_ulp = json.loads(json.dumps(reference))
    one_ulp[1]["logprobs"][0] = float(np.nextafter(-0.125, 0.0))
    assert bench.compare(one_ulp, reference) == (True, False)
    other_token = json.loads(json.dumps(reference))
    other_token[0]["output_ids"][2] = 8
    assert bench.compare(other_token, reference) == (False, True)
    assert bench.compare(reference[:1], reference) == (False, False)


def test_real_server_says_where_two_runs_part():
    bench = load_bench("real_server.py")
    reference = [{"output_ids": [5, 6, 7, 8], "logprobs": [-0.5, -1.25, -2.0, -3.0]}, {"output_ids": [1], "logprobs": [-0.125]}]
    other = [{"output_ids": [5, 6, 9, 8], "logprobs": [-0.5, -1.0, -2.5, -3.0]}, {"output_ids": [1], "logprobs": [-0.125]}]
    assert bench.differences(other, reference) == [
        {"first_token_differing": 2, "max_abs_logprob_difference": 0.25},
        {"first_token_differing": None, "max_abs_logprob_difference": 0.0},
    ]


def test_real_server_reads_sglangs_load_line():
    line = (
        "[2026-11-27 21:40:01] Load weight end. elapsed=1.87 s, type=GptOssForCausalLM, quant=mxfp4, avail mem=70.12 GB, mem usage=1.73 GB."
    )
    assert load_bench("real_server.py").parse_log(f"noise\n{line}\nmore") == {"load_seconds": 1.87, "sglang_load_mem_usage_gib": 1.73}
    assert load_bench("real_server.py").parse_log("no load line") == {"load_seconds": None, "sglang_load_mem_usage_gib": None}


def test_real_server_command_and_prompts():
    bench = load_bench("real_server.py")
    stock = bench.server_command(Path("/m/src"), "marlin", False, 30000, [])
    bake = bench.server_command(Path("/m/sm90-marlin"), "marlin", True, 30000, ["--x"])
    for flag in ("--skip-tokenizer-init", "--attention-backend", "--moe-runner-backend"):
        assert flag in stock
    assert "--disable-cuda-graph" not in stock and "--quantization" not in stock  # CUDA graphs on, the source's mxfp4
    assert bake[len(stock) :] == ["--quantization", "moebake", "--x"]
    asked = bench.prompts(2048)
    assert [len(p) for p in asked] == list(bench.PROMPT_LENGTHS) and asked == bench.prompts(2048)
    assert max(max(p) for p in asked) < 2046  # below the pad and eos ids


def test_real_server_makes_a_gpt_oss_config_sglang_reads(tmp_path):
    """The source config carries what SGLang's GptOssForCausalLM reads (layer types, sliding window, rope) and the
    bake made from it keeps them."""
    bench = load_bench("real_server.py")
    bench.make(tmp_path, layers=2, experts=2, vocab=256, bakes=["sm90-marlin"], engine=None, extra_convert=[])
    for model in ("src", "sm90-marlin"):
        config = json.loads((tmp_path / model / "config.json").read_text())
        assert config["layer_types"] == ["sliding_attention", "full_attention"] and config["sliding_window"] == 128
        assert config["rope_scaling"]["rope_type"] == "yarn" and config["hidden_size"] == config["intermediate_size"] == 2880
        assert (config["num_local_experts"], config["vocab_size"], config["eos_token_id"]) == (2, 256, 255)
    assert json.loads((tmp_path / "sm90-marlin" / "config.json").read_text())["quantization_config"]["quant_method"] == "moebake"


def test_real_server_makes_a_deepseek_v4_source_and_its_sglang_bake(tmp_path):
    """``make --model deepseek-v4``: the servable DeepSeek-V4-shaped source (V4-Flash's attention geometry, layers
    alternating compress ratios 4 and 128, eos/bos above the prompts) and its sm90-marlin bake for SGLang 0.5.17, which
    keeps the attention; the server command picks SGLang's dsv4 attention backend for it and triton for GPT-OSS."""
    bench = load_bench("real_server.py")
    bench.main(
        [
            "make",
            "--model",
            "deepseek-v4",
            "--dir",
            str(tmp_path),
            "--experts",
            "2",
            "--vocab",
            "256",
            "--bake",
            "sm90-marlin",
            "--engine",
            "sglang==0.5.17",
        ]
    )
    for model in ("src", "sm90-marlin"):
        config = json.loads((tmp_path / model / "config.json").read_text())
        assert config["model_type"] == "deepseek_v4" and config["compress_ratios"] == [4, 128, 0]
        assert (config["n_routed_experts"], config["vocab_size"], config["eos_token_id"]) == (2, 256, 255)
        assert (config["num_attention_heads"], config["head_dim"], config["index_n_heads"]) == (64, 512, 64)
        assert bench.attention_backend(tmp_path / model) == "dsv4"
        command = bench.server_command(tmp_path / model, "marlin", False, 1, [])
        assert command[command.index("--attention-backend") + 1] == "dsv4"
    bake = json.loads((tmp_path / "sm90-marlin" / "config.json").read_text())["quantization_config"]
    assert (bake["quant_method"], bake["target"], bake["engine_version"]) == ("moebake", "sm90-marlin", "0.5.17")
    index = json.loads((tmp_path / "sm90-marlin" / "model.safetensors.index.json").read_text())["weight_map"]
    assert "layers.0.attn.indexer.weights_proj.weight" in index and "mtp.0.e_proj.weight" in index
    assert bench.attention_backend(Path("/nonexistent")) == "triton"
    assert "deepseek-v4-shaped synthetic: 2 layers (+1 MTP), 2 experts" in bench._model_name(config)


def test_real_server_probe_hooks_a_method_sglang_has():
    """The probe's hook target is a method of the SGLang installed here (read from its source: importing SGLang's model
    runner needs its server's dependencies), and SGLang's HookRegistry has the AROUND hooks it registers."""
    import ast
    import importlib.util

    module, cls, method = load_bench("real_server_probe.py").TARGET.rsplit(".", 2)
    sglang = importlib.util.find_spec("sglang")
    if sglang is None:
        pytest.skip("sglang is not installed")
    root = Path(sglang.origin).parent.parent
    tree = ast.parse((root / (module.replace(".", "/") + ".py")).read_text())
    methods = {f.name for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls for f in c.body if isinstance(f, ast.FunctionDef)}
    assert method in methods
    registry = ast.parse((root / "sglang/srt/plugins/hook_registry.py").read_text())
    assert "AROUND" in {t.id for n in ast.walk(registry) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def test_real_server_names_the_release_and_the_compilers_it_waits_for():
    bench = load_bench("real_server.py")
    assert bench.release_of("sglang-0.5.17.dist-info") == "0.5.17"
    ps = (
        "   12 /usr/local/cuda/bin/nvcc -c /c/moe_wna16_marlin.cu -o /b/moe_wna16_marlin.cuda.o\n"
        "    3 /usr/bin/python3 -m sglang.launch_server --model-path m\n   40 /usr/bin/ninja -v -j 16\n"
    )
    assert bench.compilers_running(ps) == ["nvcc (12 s) /c/moe_wna16_marlin.cu /b/moe_wna16_marlin.cuda.o", "ninja (40 s) "]
    assert bench.compilers_running("    3 /usr/bin/python3 x.py\n") == []


def test_real_server_compares_each_run_with_its_backends_first_stock_run(tmp_path, monkeypatch):
    """Bakes and repeated stock runs against the first stock run of their backend that answered; the results file."""
    bench = load_bench("real_server.py")
    answers = {1: [[1, 2]], 2: [[1, 2]], 3: [[1, 3]], 4: None, 5: [[1, 2]]}

    def fake_run_one(directory, path, backend, target, new_tokens, timeout, extra, log_dir, order, engine):
        assert engine == "sglang"
        record = {
            "order": order,
            "path": path,
            "moe_runner_backend": backend,
            "target": target,
            "tokens_equal_to_stock": None,
            "logprobs_equal_to_stock": None,
        }
        if answers[order] is not None:
            record["outputs"] = [{"output_ids": ids, "logprobs": [-1.0] * len(ids)} for ids in answers[order]]
        return record

    monkeypatch.setattr(bench, "run_one", fake_run_one)
    out = tmp_path / "r.json"
    runs = bench.run(
        tmp_path,
        ["stock:marlin", "bake:marlin:sm90-marlin", "bake:marlin:sm90-marlin", "stock:flashinfer_mxfp4", "stock:marlin"],
        48,
        60,
        [],
        out,
        tmp_path,
    )
    assert [(r["tokens_equal_to_stock"], r.get("stock_order")) for r in runs] == [
        (None, None),
        (True, 1),
        (False, 1),
        (None, None),
        (True, 1),
    ]
    assert json.loads(out.read_text())["runs"] == runs


FAKE_SERVER_PRELUDE = """
import faulthandler, json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
faulthandler.register(signal.SIGUSR2, file=open(os.environ["MOEBAKE_REAL_SERVER_STACKS"], "a"), all_threads=True)


class JsonHandler(BaseHTTPRequestHandler):
    def reply(self, answer):
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass
"""
"""What both stand-in servers start with: the stacks on SIGUSR2 (as bench/real_server.py asks for) and a JSON reply."""


FAKE_LAUNCH_SERVER = (
    FAKE_SERVER_PRELUDE
    + '''
"""A stand-in for ``python -m sglang.launch_server``: SGLang's two log lines and its /generate answer format."""
port, model = int(args[args.index("--port") + 1]), args[args.index("--model-path") + 1]
if "hang" in model:
    time.sleep(600)
shift = 1 if "other" in model else 0  # a model that answers differently
flushes = []  # answered with one token too many when the radix cache was not flushed before the request


def answer(ids, new):
    out = [(sum(ids) + i + shift) % 97 for i in range(new)]
    return {"output_ids": out, "meta_info": {"output_token_logprobs": [[-1.0 / (t + 1), t, None] for t in out]}}


class Handler(JsonHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/flush_cache":
            flushes.append(1)
            reply = "Cache flushed."
        else:
            new, ids = body["sampling_params"]["max_new_tokens"], body["input_ids"]
            cached = len(flushes) not in ((1,) if isinstance(ids[0], list) else (0, 2))  # a prefix left in the cache
            reply = [answer(i, new + cached) for i in ids] if isinstance(ids[0], list) else answer(ids, new + cached)
        self.reply(reply)


server = HTTPServer(("127.0.0.1", port), Handler)
print("env SGLANG_JIT_DEEPGEMM_PRECOMPILE=" + os.environ.get("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "unset"), flush=True)
print("[t] Load weight end. elapsed=0.25 s, type=GptOssForCausalLM, avail mem=70.00 GB, mem usage=0.50 GB.", flush=True)
print("[t] The server is fired up and ready to roll!", flush=True)
server.serve_forever()
'''
)


def test_real_server_serves_compares_and_stops_each_server(tmp_path, monkeypatch):
    """bench/real_server.py end to end against a stand-in server process: it waits for the ready line, asks /generate
    for one prompt, a batch and the first prompt again, reads SGLang's answer format and load line, stops the server,
    compares the bake with stock (equal, and a bake that answers otherwise), and a server that never gets ready is
    stopped with its Python stacks recorded."""
    bench = load_bench("real_server.py")
    site = tmp_path / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER)
    (site / "sglang-0.5.17.dist-info").mkdir()
    monkeypatch.setattr(bench, "S17_SITE", str(site))
    work = tmp_path / "work"
    for model in ("src", "same", "other", "hang"):
        (work / model).mkdir(parents=True)
    (work / "src" / "config.json").write_text(
        json.dumps({"vocab_size": 2048, "num_hidden_layers": 4, "num_local_experts": 32, "hidden_size": 2880})
    )
    runs = bench.run(
        work,
        ["stock:marlin", "bake:marlin:same", "bake:marlin:other", "bake:marlin:hang:3"],
        8,
        60,
        [],
        tmp_path / "r.json",
        tmp_path / "logs",
    )
    stock, same, other, hang = runs
    assert stock["release"] == "0.5.17" and stock["ready_seconds"] > 0 and stock["new_tokens"] == [8] * 5
    assert (stock["load_seconds"], stock["sglang_load_mem_usage_gib"], stock["repeat_equal"]) == (0.25, 0.5, True)
    assert (same["tokens_equal_to_stock"], same["logprobs_equal_to_stock"]) == (True, True)
    assert (other["tokens_equal_to_stock"], other["logprobs_equal_to_stock"]) == (False, False)
    assert hang["error"] == "not ready after 3 s" and hang["ready_seconds"] is None
    assert any("time.sleep(600)" in line or "launch_server.py" in line for line in hang["stacks"]), hang["stacks"]
    # stacks files only where stacks were taken: bin/gpu-sglang-stack serve-wait returns at most 8 files
    assert [p.name for p in (tmp_path / "logs").glob("stacks-*")] == ["stacks-4-bake-marlin-hang.txt"]
    assert "--quantization" in same["server_flags"] and "--quantization" not in stock["server_flags"]
    assert json.loads((tmp_path / "r.json").read_text())["runs"] == runs
    assert stock["server_env"] == {}
    assert "SGLANG_JIT_DEEPGEMM_PRECOMPILE=unset" in (tmp_path / "logs" / "server-1-stock-marlin.log").read_text()

    # A DeepSeek-V4 source: both servers start with SGLang's no-warm-up settings (bench's DEEPSEEK_V4_SERVER_ENV).
    (work / "src" / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["DeepseekV4ForCausalLM"],
                "model_type": "deepseek_v4",
                "vocab_size": 2048,
                "num_hidden_layers": 2,
                "num_nextn_predict_layers": 1,
                "n_routed_experts": 8,
                "hidden_size": 4096,
                "moe_intermediate_size": 256,
            }
        )
    )
    monkeypatch.delenv("SGLANG_JIT_DEEPGEMM_PRECOMPILE", raising=False)
    v4_stock, v4_bake = bench.run(work, ["stock:marlin", "bake:marlin:same"], 8, 60, [], None, tmp_path / "v4logs")
    for record, label in ((v4_stock, "1-stock-marlin"), (v4_bake, "2-bake-marlin-same")):
        assert record["server_env"] == bench.DEEPSEEK_V4_SERVER_ENV, record["server_env"]
        assert "SGLANG_JIT_DEEPGEMM_PRECOMPILE=0" in (tmp_path / "v4logs" / f"server-{label}.log").read_text()
    assert v4_bake["tokens_equal_to_stock"] is True


def test_real_server_starts_no_server_when_the_reduced_module_does_not_load(tmp_path, monkeypatch):
    """A prebuilt reduced module that cannot load stops the sequence before the first server (each would fail the same
    way, after its whole start-up), with the loader's own last line."""
    pytest.importorskip("flashinfer")
    bench = load_bench("real_server.py")
    monkeypatch.setattr(bench, "S17_SITE", str(tmp_path / "empty-site"))
    monkeypatch.setenv("MOEBAKE_FLASHINFER_MOE_SO", str(tmp_path / "missing" / "fused_moe_90_moebake.so"))
    monkeypatch.setattr(bench, "run_one", lambda *a, **k: pytest.fail("a server was started"))
    with pytest.raises(SystemExit) as stopped:
        bench.run(tmp_path, ["stock:flashinfer_mxfp4"], 8, 60, [], None, tmp_path / "logs")
    message = str(stopped.value)
    assert message.startswith(f"error: the reduced FlashInfer module {tmp_path / 'missing'}") and "no server was started" in message
    assert "prebuilt FlashInfer MoE module not found" in message


# real_server.py --engine vllm: a real vLLM server (vLLM 0.26.0's stack, bin/gpu-vllm-stack), stock vs bake
VLLM_SERVER_RELEASE = "0.26.0"


def _vllm_tree():
    from tests.engine_releases.trees import release_tree

    try:
        return release_tree("vllm", VLLM_SERVER_RELEASE)
    except OSError as err:
        pytest.skip(f"cannot fetch vLLM {VLLM_SERVER_RELEASE}'s tree: {err}")


def test_real_server_vllm_command_parses_with_vllm_0_26s_own_arguments():
    """The stock and bake command lines, parsed by vLLM 0.26.0's own server parser (its released tree, on the CPU
    platform): Triton attention, FlashInfer CUTLASS MoE, token ids only, no prefix cache, no FlashInfer autotuning,
    CUDA graphs left on; the bake adds moebake's quantization and loader (its plugin from this checkout)."""
    vllm_server = load_bench("real_server_vllm.py")
    stock = vllm_server.VLLM.command(Path("/m/src"), "flashinfer_cutlass", False, 30000, [])
    bake = vllm_server.VLLM.command(Path("/m/sm90-cutlass"), "flashinfer_cutlass", True, 30000, [])
    assert stock[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert bake[len(stock) :] == ["--quantization", "moebake", "--load-format", "moebake"]
    script = (
        "import json, sys\nfrom vllm import platforms\nfrom vllm.platforms.cpu import CpuPlatform\n"
        "platforms._current_platform = CpuPlatform()\n"
        "from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    a = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)\n"
        "    print(json.dumps([a.model, str(a.attention_backend), a.moe_backend, a.skip_tokenizer_init,\n"
        "                      a.enable_prefix_caching, a.enable_flashinfer_autotune, a.enforce_eager,\n"
        "                      a.quantization, a.load_format, a.served_model_name]))\n"
    )
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", PYTHONPATH=os.pathsep.join([str(_vllm_tree()), str(REPO)]))
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps([stock[3:], bake[3:]])], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]
    assert [p[:9] for p in parsed] == [
        ["/m/src", "TRITON_ATTN", "flashinfer_cutlass", True, False, False, False, None, "auto"],
        ["/m/sm90-cutlass", "TRITON_ATTN", "flashinfer_cutlass", True, False, False, False, "moebake", "moebake"],
    ]
    assert parsed[0][9] in (vllm_server.SERVED_NAME, [vllm_server.SERVED_NAME])


def test_real_server_reads_vllms_load_line_and_completions_answer():
    vllm_server = load_bench("real_server_vllm.py")
    line = "(EngineCore pid=812) INFO 11-28 03:10:01 [gpu_model_runner.py:5348] Model loading took 1.73 GiB memory and 4.250000 seconds"
    assert vllm_server.VLLM.parse_log(f"noise\n{line}\nmore") == {"load_seconds": 4.25, "vllm_load_mem_usage_gib": 1.73}
    assert vllm_server.VLLM.parse_log("INFO Model loading took 0.5 GiB and 2.0 seconds")["load_seconds"] == 2.0  # the v2 runner's
    assert vllm_server.VLLM.parse_log("no load line") == {"load_seconds": None, "vllm_load_mem_usage_gib": None}
    response = {
        "choices": [
            {"index": 1, "text": "", "token_ids": [9], "logprobs": {"token_logprobs": [-0.5], "tokens": ["token_id:9"]}},
            {
                "index": 0,
                "text": "",
                "token_ids": [4, 5],
                "logprobs": {"token_logprobs": [-1.0, -0.25], "tokens": ["token_id:4", "token_id:5"]},
            },
        ]
    }
    assert vllm_server.VLLM.outputs(response) == [
        {"output_ids": [4, 5], "logprobs": [-1.0, -0.25], "logprob_ids": [4, 5]},
        {"output_ids": [9], "logprobs": [-0.5], "logprob_ids": [9]},
    ]
    body = vllm_server.VLLM.request([[1, 2], [3]], 48)
    assert (body["prompt"], body["max_tokens"], body["temperature"], body["ignore_eos"], body["logprobs"]) == (
        [[1, 2], [3]],
        48,
        0.0,
        True,
        0,
    )


def test_real_server_vllm_probe_wraps_a_method_vllm_0_26_has():
    """The vLLM probe's target is the GPU worker's ``load_model`` in vLLM 0.26.0's released tree, and that method is
    where the model runner loads the model."""
    import ast

    module, cls, method = load_bench("real_server_vllm_probe.py").TARGET.rsplit(".", 2)
    tree = ast.parse((_vllm_tree() / (module.replace(".", "/") + ".py")).read_text())
    (function,) = [
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == method
    ]
    assert "self.model_runner.load_model(" in ast.unparse(function)


def test_real_server_vllm_probe_measures_each_load_once(tmp_path, monkeypatch):
    """register() wraps the target once however often vLLM loads plugins; each load writes one JSON line."""
    import types

    probe = load_bench("real_server_vllm_probe.py")
    module, cls, method = probe.TARGET.rsplit(".", 2)
    loads = []

    class Worker:
        def load_model(self, *, load_dummy_weights=False):
            loads.append(load_dummy_weights)

    fake = types.ModuleType(module)
    fake.Worker = Worker
    monkeypatch.setitem(sys.modules, module, fake)
    for parent in ("vllm", "vllm.v1", "vllm.v1.worker"):
        monkeypatch.setitem(sys.modules, parent, sys.modules.get(parent) or types.ModuleType(parent))
    measured = load_bench("real_server_probe.py")
    monkeypatch.setattr(measured, "_measured_load", lambda original, *a, **k: (loads.append("measured"), original(*a, **k))[1])
    monkeypatch.setattr(probe, "_measured_load", measured._measured_load)
    monkeypatch.delenv("MOEBAKE_FLASHINFER_MOE_SO", raising=False)
    monkeypatch.delenv("MOEBAKE_REAL_SERVER_STACKS", raising=False)
    probe.register()
    probe.register()
    Worker().load_model(load_dummy_weights=True)
    assert loads == ["measured", True]


FAKE_VLLM_API_SERVER = (
    FAKE_SERVER_PRELUDE
    + '''
"""A stand-in for ``python -m vllm.entrypoints.openai.api_server``: vLLM's load line, /health and /v1/completions."""
port, model, name = int(args[args.index("--port") + 1]), args[args.index("--model") + 1], args[args.index("--served-model-name") + 1]
if "hang" in model:
    time.sleep(600)
shift = 1 if "other" in model else 0  # a model that answers differently
WANTED = {"model": name, "temperature": 0.0, "ignore_eos": True, "logprobs": 0, "return_token_ids": True,
          "return_tokens_as_token_ids": True}


def choice(index, ids, new):
    out = [(sum(ids) + i + shift) % 97 for i in range(new)]
    return {"index": index, "text": "", "token_ids": out,
            "logprobs": {"token_logprobs": [-1.0 / (t + 1) for t in out], "tokens": [f"token_id:{t}" for t in out]}}


class Handler(JsonHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/completions" and {k: body.get(k) for k in WANTED} == WANTED, body
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        choices = [choice(i, p, body["max_tokens"]) for i, p in enumerate(prompts)]
        self.reply({"choices": choices[::-1]})  # in any order: each has its index


print("(EngineCore pid=1) INFO [gpu_model_runner.py:5348] Model loading took 0.50 GiB memory and 0.250000 seconds",
      flush=True)
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''
)


def test_real_server_serves_vllm_compares_and_stops_each_server(tmp_path, monkeypatch):
    """bench/real_server.py --engine vllm end to end against a stand-in vLLM server process: it waits for /health,
    asks /v1/completions for one prompt, a batch and the first prompt again, reads vLLM's answer format and load line,
    publishes the probe as a vLLM general plugin, stops the server and compares the bake with stock."""
    bench = load_bench("real_server.py")
    site = tmp_path / "site"
    server_dir = site / "vllm" / "entrypoints" / "openai"
    server_dir.mkdir(parents=True)
    for package in (site / "vllm", site / "vllm" / "entrypoints", server_dir):
        (package / "__init__.py").write_text("")
    (server_dir / "api_server.py").write_text(FAKE_VLLM_API_SERVER)
    (site / "vllm-0.26.0.dist-info").mkdir()
    monkeypatch.setattr(sys.modules["real_server_vllm"], "V26_SITE", str(site))
    work = tmp_path / "work"
    for model in ("src", "same", "other", "hang"):
        (work / model).mkdir(parents=True)
    (work / "src" / "config.json").write_text(
        json.dumps({"vocab_size": 2048, "num_hidden_layers": 4, "num_local_experts": 32, "hidden_size": 2880})
    )
    backend = "flashinfer_cutlass"
    runs = bench.run(
        work,
        [f"stock:{backend}", f"bake:{backend}:same", f"bake:{backend}:other", f"bake:{backend}:hang:3"],
        8,
        60,
        [],
        tmp_path / "r.json",
        tmp_path / "logs",
        engine="vllm",
    )
    stock, same, other, hang = runs
    assert (stock["engine"], stock["release"], stock["new_tokens"]) == ("vllm", "0.26.0", [8] * 5)
    assert (stock["load_seconds"], stock["vllm_load_mem_usage_gib"], stock["repeat_equal"]) == (0.25, 0.5, True)
    assert stock["ready_seconds"] > 0 and stock["outputs"][1] == stock["outputs"][0]  # the batch's first is the prompt alone
    assert (same["tokens_equal_to_stock"], same["logprobs_equal_to_stock"]) == (True, True)
    assert (other["tokens_equal_to_stock"], other["logprobs_equal_to_stock"]) == (False, False)
    assert hang["error"] == "not ready after 3 s" and hang["ready_seconds"] is None
    assert ["--moe-backend", backend] == stock["server_flags"][stock["server_flags"].index("--moe-backend") :][:2]
    assert "--quantization" in same["server_flags"] and "--quantization" not in stock["server_flags"]
    entry_points = Path(
        "/tmp/moebake-real-server-meta/2-bake-flashinfer_cutlass-same/moebake_real_server_probe-0.dist-info/entry_points.txt"
    ).read_text()
    assert entry_points == "[vllm.general_plugins]\nmoebake_real_server_probe = real_server_vllm_probe:register\n"
    assert json.loads((tmp_path / "r.json").read_text())["runs"] == runs
