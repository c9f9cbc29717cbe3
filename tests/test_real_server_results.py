"""The committed real-server records (bench/results/real_server_<machine>.json) say what their outputs show.

Each run carries the fields issue 35 asks for, and a bake's verdict against stock is re-derived here from the two runs'
recorded token ids and logprobs, so a hand-edited or mis-merged record fails."""

import json
from pathlib import Path

import pytest

RESULTS = sorted((Path(__file__).resolve().parents[1] / "bench" / "results").glob("real_server_*.json"))
FIELDS = {
    "engine",
    "release",
    "model",
    "target",
    "path",
    "ready_seconds",
    "load_seconds",
    "peak_gpu_gib",
    "tokens_equal_to_stock",
    "logprobs_equal_to_stock",
}


def _runs(path: Path) -> list[dict]:
    return json.loads(path.read_text())["runs"]


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_every_run_has_the_fields_and_a_path(path):
    assert RESULTS, "no real-server record under bench/results"
    for run in _runs(path):
        assert FIELDS <= set(run), (path.name, run.get("sequence"), run.get("order"), FIELDS - set(run))
        assert run["path"] in ("stock", "bake")
        if run["path"] == "stock":
            assert run["target"] is None


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_a_bake_verdict_matches_the_recorded_outputs(path):
    runs = _runs(path)
    judged = [r for r in runs if r["path"] == "bake" and r.get("stock_order") is not None]
    for bake in judged:
        (stock,) = [r for r in runs if r.get("sequence") == bake.get("sequence") and r["order"] == bake["stock_order"]]
        assert stock["path"] == "stock"
        assert (stock["engine"], stock["release"], stock["model"]) == (bake["engine"], bake["release"], bake["model"])
        pairs = list(zip(bake["outputs"], stock["outputs"], strict=True))
        assert bake["tokens_equal_to_stock"] == all(b["output_ids"] == s["output_ids"] for b, s in pairs)
        assert bake["logprobs_equal_to_stock"] == all(b["logprobs"] == s["logprobs"] for b, s in pairs)
