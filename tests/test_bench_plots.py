"""The conversion benchmark's plots draw from its own CSV results: against model size, and against ``--workers``
where one size was measured with several (the scaling curve). Uses the committed results as input."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_bench

BENCH = Path(__file__).resolve().parent.parent / "bench"
pytest.importorskip("matplotlib")


def _convert_bench():
    return load_bench("convert_bench.py")


@pytest.mark.parametrize("name, scaling", [("convert_bench", False), ("convert_bench_16core", True)])
def test_plot_only_redraws_from_the_csv(tmp_path, name, scaling, monkeypatch):
    shutil.copy(BENCH / "results" / f"{name}.csv", tmp_path)
    bench = _convert_bench()
    drawn, real = [], bench.plot_scaling
    monkeypatch.setattr(bench, "plot_scaling", lambda *args: drawn.append("plot_scaling") or real(*args))
    monkeypatch.setattr(sys, "argv", ["convert_bench.py", "--plot-only", "--results", str(tmp_path), "--name", name])
    bench.main()
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    assert (drawn == ["plot_scaling"]) == scaling


def test_workers_of_a_row():
    bench = _convert_bench()
    assert [bench._workers(t) for t in ("moebake w1", "moebake w16", "moebake w1, plain I/O", "copy")] == [1, 16, None, None]


def test_the_benchmark_explains_itself():
    result = subprocess.run([sys.executable, str(BENCH / "convert_bench.py"), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--variant-workers" in result.stdout
