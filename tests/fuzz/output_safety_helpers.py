"""Shared checks of the output-side fuzz suites: how a refused or failed command must end.

Every case asserts: the exit status, exactly one ``error:`` line naming the thing, no traceback,
nothing left behind (the directories it could write in list the same entries as before), and the
source tree unchanged (hashed before and after, symbolic links and FIFOs included).
"""

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from moebake.cli import main

TARGET = ["--target", "sm90-cutlass", "--quiet"]
SLOW_SITE = Path(__file__).parent / "slow_site"
"""A ``sitecustomize`` that, with ``MOEBAKE_TEST_SLOW_CHUNK=<seconds>`` set, sleeps before each
chunk a conversion writes (in every process, workers included): long enough runs to interrupt."""


def tree_state(root: Path) -> dict[str, str]:
    """``{relative path: what it is}`` of everything under ``root``: a file's SHA-256, a link's
    target, a directory, a FIFO (never opened)."""
    state = {}
    if not os.path.lexists(root):
        return state
    for path in [root, *sorted(root.rglob("*"))]:
        mode = os.lstat(path).st_mode
        key = str(path.relative_to(root))
        if stat.S_ISLNK(mode):
            state[key] = "link -> " + os.readlink(path)
        elif stat.S_ISDIR(mode):
            state[key] = "dir"
        elif stat.S_ISREG(mode):
            state[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            state[key] = f"special {stat.S_IFMT(mode):o}"
    return state


def invoke(*args: str):
    """Run the ``moebake`` CLI in this process; returns click's Result."""
    return CliRunner().invoke(main, [str(a) for a in args])


def run_cli(*args, cwd=None, timeout=120, env=None, slow: float | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m moebake ARGS`` in a subprocess (text output, never hangs past ``timeout``)."""
    return subprocess.run(
        [sys.executable, "-m", "moebake", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=cli_env(env, slow)
    )


def cli_env(extra: dict | None = None, slow: float | None = None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(extra or {})}
    if slow is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(SLOW_SITE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["MOEBAKE_TEST_SLOW_CHUNK"] = str(slow)
    return env


def error_line(exit_code: int, output: str, *needles: str, status: int = 2) -> str:
    """The single ``error:`` line of a refused command (asserting status, one line, no traceback)."""
    assert exit_code == status, output
    assert "Traceback" not in output, output
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]


def assert_refused(result, *needles: str) -> str:
    """For a CliRunner result or a CompletedProcess."""
    if isinstance(result, subprocess.CompletedProcess):
        return error_line(result.returncode, result.stdout + result.stderr, *needles)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return error_line(result.exit_code, result.output, *needles)


class Watched:
    """Directories whose whole trees must be unchanged by a refused command."""

    def __init__(self, *roots: Path):
        self.roots = roots
        self.before = [tree_state(root) for root in roots]

    def assert_unchanged(self) -> None:
        for root, before in zip(self.roots, self.before):
            after = tree_state(root)
            assert after == before, (root, sorted(set(after.items()) ^ set(before.items()))[:6])


def copy_checkpoint(source: Path, to: Path) -> Path:
    return Path(shutil.copytree(source, to))
