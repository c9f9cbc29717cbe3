"""bench/real_server_phases.py and bench/real_server_matrix.py on CPU: phases from an SGLang 0.5.17 log, the plan
checks, and the report (table and plot) of a results file. The server runs themselves need the GPU machine."""

import json

import pytest

from conftest import load_bench

phases_module = load_bench("real_server_phases.py")
matrix = load_bench("real_server_matrix.py")

# SGLang 0.5.17's own lines with SGLANG_LOG_MS=1 (engine.py, model_runner.py, cuda_graph_setup.py, http_server.py),
# as a GPT-OSS-20B-shaped server on one H200 writes them; the scheduler's lines carry its " TP0" prefix.
LOG = """\
[2026-11-29 10:00:18.512] server_args=ServerArgs(model_path='/tmp/rm/src', tokenizer_path='/tmp/rm/src', skip_tokenizer_init=True)
[2026-11-29 10:00:44.020 TP0] Init torch distributed begin.
[2026-11-29 10:00:50.100 TP0] Load weight begin. avail mem=138.50 GB
[2026-11-29 10:00:59.170 TP0] Load weight end. elapsed=9.07 s, type=GptOssForCausalLM, quant=mxfp4, avail mem=126.90 GB, mem usage=11.60 GB.
[2026-11-29 10:01:02.000 TP0] KV Cache is allocated. #tokens: 1000000, K size: 10.00 GB, V size: 10.00 GB
[2026-11-29 10:01:05.000 TP0] Capture target prefill CUDA graph begin. backend=full, num_tokens=[4, 8], avail mem=90.00 GB
[2026-11-29 10:02:48.200 TP0] Capture target prefill CUDA graph end. elapsed=103.20 s, mem usage=1.20 GB, avail mem=88.80 GB.
[2026-11-29 10:02:48.300 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2], avail mem=88.80 GB
[2026-11-29 10:02:57.500 TP0] Capture target decode CUDA graph end. elapsed=9.20 s, mem usage=0.30 GB, avail mem=88.50 GB.
[2026-11-29 10:02:58.000] INFO:     Started server process [1234]
[2026-11-29 10:03:10.100] The server is fired up and ready to roll!
"""


def at(clock: str) -> float:
    return phases_module.log_time(f"2026-11-29 {clock[:8]}", clock[8:] or None)


def test_phases_from_the_log_and_the_build_events():
    start = at("10:00:00.000")
    events = [
        {"kind": "tvm-ffi", "name": "sgl_kernel_jit_kvcache", "start": at("10:00:55.000"), "end": at("10:00:57.000")},
        {"kind": "flashinfer", "name": "norm", "start": at("10:01:10.000"), "end": at("10:01:51.000"), "built": True},
        {"kind": "triton", "name": "_fwd_kernel", "start": at("10:01:50.000"), "end": at("10:01:52.000")},
    ]
    found = phases_module.phases(LOG, start, events)
    gross = found["phases_gross"]
    assert gross == pytest.approx(
        {"imports": 18.512, "scheduler_start": 31.588, "load": 9.07, "post_load": 5.83, "cuda_graph_capture": 112.5, "ready": 12.6},
        abs=1e-3,
    )
    net = found["phases"]
    assert net["kernel_builds"] == pytest.approx(2 + 42)  # the two overlapping builds counted once
    assert net["load"] == pytest.approx(9.07 - 2) and net["cuda_graph_capture"] == pytest.approx(112.5 - 42)
    assert sum(net.values()) == pytest.approx(found["ready_from_log"]) == pytest.approx(190.1)
    assert found["kernel_builds_by_kind"]["flashinfer"] == {"count": 1, "seconds": 41.0}
    assert found["kernel_builds_top"][0]["name"] == "norm"


def test_phases_of_a_server_without_graphs_or_ready_line():
    text = "\n".join(line for line in LOG.splitlines() if "Capture" not in line and "ready to roll" not in line)
    found = phases_module.phases(text, at("10:00:00.000"), [], ready=at("10:03:00.000"))
    assert set(found["phases_gross"]) == {"imports", "scheduler_start", "load", "ready"}
    assert found["phases_gross"]["ready"] == pytest.approx(180 - 59.17)
    assert found["ready_from_log"] == pytest.approx(180)


def test_events_file_with_a_torn_line(tmp_path):
    path = tmp_path / "jit.jsonl"
    path.write_text(json.dumps({"kind": "triton", "name": "k", "start": 1.0, "end": 2.0}) + '\n{"kind": "tri')
    assert [e["name"] for e in phases_module.read_events(path)] == ["k"]
    assert phases_module.read_events(tmp_path / "missing.jsonl") == []


def test_sequences_are_valid_plans_and_bad_ones_are_refused():
    for cells in matrix.SEQUENCES.values():
        plan = matrix.check_plan(cells)
        assert {(p, n) for p, n, _ in plan} >= {
            ("stock", "fresh"),
            ("bake", "fresh"),
            ("bake", "fresh+kernels"),
            ("stock", "restarted"),
            ("bake", "restarted"),
        }
    for bad in (["stock:restarted:warm"], ["bake:fresh+kernels"], ["stock:fresh:warm"], ["bake:rebooted"]):
        with pytest.raises(ValueError):
            matrix.check_plan(bad)


def run_record(order, path, node, cache, ready, install=None):
    found = phases_module.phases(LOG, at("10:00:00.000"), [])
    scale = ready / found["ready_from_log"]
    return {
        "order": order,
        "path": path,
        "node": node,
        "cache": cache,
        "ready_seconds": ready,
        "load_seconds": 9.07,
        "kernels_install": {"seconds": install} if install else None,
        "phases": {k: v * scale for k, v in found["phases"].items()},
    }


def test_report_table_and_plot(tmp_path):
    meta = {
        "date": "2026-11-29T10:00:00+00:00",
        "machine": {"gpus": ["NVIDIA H200, 580.159.04, 143771 MiB"], "cpus": 16},
        "commit": "0" * 40,
        "command": "python bench/real_server_matrix.py run --dir /tmp/rm --sequence A",
        "sequence": "A",
        "release": "0.5.17",
        "layers": 24,
        "experts": 32,
        "target": "sm90-cutlass",
        "backend": "flashinfer_mxfp4",
    }
    runs = [
        run_record("A1-bake-fresh-cold", "bake", "fresh", "cold", 150.0),
        run_record("A2-bake-fresh-kernels-cold", "bake", "fresh+kernels", "cold", 95.0, install=4.0),
        run_record("A3-stock-fresh-cold", "stock", "fresh", "cold", 201.2),
        run_record("A4-bake-restarted-warm", "bake", "restarted", "warm", 90.0),
    ]
    results = tmp_path / "A.json"
    results.write_text(json.dumps({"meta": meta, "runs": runs}))
    matrix.main(["report", str(results)])
    text = results.with_suffix(".md").read_text()
    assert text.splitlines()[0].startswith("| run | path | node | page cache | ready s | install s |")
    assert "| A 3: stock, fresh, cold | stock | fresh | cold | 201.20 |" in text
    assert "fresh node with its kernels (install included) 99.0 s vs restarted node (warm page cache) 90.0 s: 1.10x" in text
    assert results.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
