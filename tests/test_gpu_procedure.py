"""The GPU procedure's scripts, run on CPU: ``bin/gpu-harness all`` collects the GPU tests on a machine without vLLM or
SGLang; ``bin/gpu-sglang-stack``'s (and ``bin/gpu-vllm-stack``'s) ``check`` fails when an import fails; its ``module``
says at once that it needs the full ``bin/setup``; its ``serve-wait`` returns at most 8 files (what the GPU host
returns from ``$OUT``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

WITHOUT_ENGINES = """
import importlib.machinery, sys

HIDDEN = {"vllm", "sglang"}


class WithoutEngines(importlib.machinery.PathFinder):
    \"\"\"sys.path's finder, which finds neither the engines' modules nor their metadata (as on the GPU host).\"\"\"

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in HIDDEN else super().find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args, **kwargs):
        return (d for d in super().find_distributions(*args, **kwargs) if (d.metadata["Name"] or "").lower() not in HIDDEN)


sys.meta_path[:] = [WithoutEngines if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
for name in HIDDEN:
    try:
        __import__(name)
    except ImportError:
        continue
    sys.exit(f"{name} is still importable")
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def test_the_gpu_tests_collect_without_vllm_or_sglang():
    """``bin/gpu-harness all`` runs ``pytest -m gpu tests/`` where neither engine is installed: every test module
    imports (an engine is imported where a test runs, or the module skips), so collection does not stop."""
    env = {k: v for k, v in os.environ.items() if k != "MOEBAKE_REQUIRE_ENGINES"}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ENGINES, "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "error" not in done.stdout.splitlines()[-1] and "tests/gpu/test_sm90_serve.py::" in done.stdout, done.stdout[-2000:]


def _stand_in_site(tmp_path: Path) -> Path:
    """A site folder whose ``torch`` fails to import (as a broken or missing wheel would)."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("raise ImportError('stand-in: this torch does not load')\n")
    return site


@pytest.mark.parametrize("script, site_variable", [("gpu-sglang-stack", "S17_SITE"), ("gpu-vllm-stack", "V26_SITE")])
def test_check_fails_when_an_import_fails(tmp_path, script, site_variable):
    """``check && serve-bg ...`` must not start a server on a stack that does not import."""
    env = dict(
        os.environ, **{site_variable: str(_stand_in_site(tmp_path))}, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    done = subprocess.run(["bash", str(REPO / "bin" / script), "check"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "FAIL torch: ImportError: stand-in" in done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith("check: "), done.stderr[-2000:]


def test_module_says_at_once_that_it_needs_the_full_setup(tmp_path):
    """After ``bin/setup --light`` (no pynvml, no requests) the module build stops before downloading anything, in one
    line."""
    light = tmp_path / "python"
    light.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')  # no site-packages: none of the full setup's packages
    light.chmod(0o755)
    work = tmp_path / "work"
    env = dict(os.environ, RM_PYTHON=str(light), RM_WORK=str(work), S17_MODULE=str(tmp_path / "module"))
    done = subprocess.run(["bash", str(REPO / "bin" / "gpu-sglang-stack"), "module"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: {light} lacks pynvml"), done.stderr
    assert "full bin/setup (not --light)" in done.stderr
    assert not work.exists()


def test_serve_wait_returns_at_most_8_files(tmp_path):
    """Two servers (log, probe, stacks each), the run's log and results, and three JIT caches: 12 files, of which the
    GPU host would return 8. The results and run.log stay files; the servers' files travel as one archive."""
    bg, caches, out = tmp_path / "bg", tmp_path / "caches", tmp_path / "out"
    bg.mkdir()
    (bg / "done").write_text("0\n")
    (bg / "run.log").write_text("finished\n")
    (bg / "real_server.json").write_text("{}\n")
    for label in ("1-stock-deep_gemm", "2-bake-deep_gemm-deepep-bf16"):
        for name in (f"server-{label}.log", f"probe-{label}.jsonl", f"stacks-{label}.txt"):
            (bg / name).write_text(name)
    for cache in ("tvm-ffi", "tilelang", "deep_gemm"):
        (caches / cache).mkdir(parents=True)
        (caches / cache / "kernel.so").write_bytes(b"\0")
    env = dict(os.environ, S17_SERVE_DIR=str(bg), MOEBAKE_REAL_SERVER_CACHES=str(caches), OUT=str(out))
    done = subprocess.run(
        ["bash", str(REPO / "bin" / "gpu-sglang-stack"), "serve-wait", "0"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "finished, rc=0" in done.stdout, done.stdout + done.stderr
    returned = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert len(returned) <= 8 and {"real_server.json", "run.log", "server-logs.tar.gz"} <= set(returned), returned
    listed = subprocess.run(["tar", "tzf", str(out / "server-logs.tar.gz")], capture_output=True, text=True, check=True)
    assert sorted(listed.stdout.split()) == sorted(
        p.name for p in bg.iterdir() if p.suffix in (".log", ".jsonl", ".txt") and p.name != "run.log"
    )

    # One server, no JIT cache: its files come back as they are.
    for p in out.iterdir():
        p.unlink()
    for p in bg.glob("*2-bake*"):
        p.unlink()
    env["MOEBAKE_REAL_SERVER_CACHES"] = str(tmp_path / "no-caches")
    done = subprocess.run(
        ["bash", str(REPO / "bin" / "gpu-sglang-stack"), "serve-wait", "0"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in bg.iterdir() if p.name != "done")
