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
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                             "moebake", "bench", "tests"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
