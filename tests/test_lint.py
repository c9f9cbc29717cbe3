"""ruff (configured in pyproject.toml, ``[tool.ruff]``) finds nothing in moebake/, bench/ and tests/: CI runs only
``bin/test``, so the lint runs as this test. ruff comes with the ``test`` extra; where it is absent, the test
skips, except under ``MOEBAKE_REQUIRE_ENGINES=1`` (``bin/test``, CI), where it fails."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        if os.environ.get("MOEBAKE_REQUIRE_ENGINES") == "1":
            pytest.fail("ruff is not installed (the test extra has it: run bin/setup)")
        pytest.skip("ruff is not installed (the test extra has it)")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "moebake", "bench", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_changes_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed (the test extra has it)")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "moebake", "bench", "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_at_least_95_percent_of_moebakes_parameters_are_annotated():
    """``bin/annotation-coverage`` over moebake/: the share of function parameters with a type annotation."""
    import ast
    import runpy

    parameters = runpy.run_path(str(REPO / "bin" / "annotation-coverage"))["parameters"]
    found = [has for path in (REPO / "moebake").rglob("*.py") for *_, has in parameters(ast.parse(path.read_text()))]
    assert sum(found) >= 0.95 * len(found), f"{sum(found)}/{len(found)} parameters annotated"
