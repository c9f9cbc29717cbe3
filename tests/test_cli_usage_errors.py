"""A command line moebake cannot take (an unknown command or option, a missing argument, a value an option refuses) is
bad input like any other: one line ``error: ...`` on stderr, nothing on stdout, exit status 2; never click's
``Usage:`` / ``Try ...`` / ``Error: ...`` block."""

import subprocess
import sys

import pytest
from click.testing import CliRunner

from moebake.cli import main

TARGET = ("--target", "sm90-cutlass")

CASES = {
    "unknown command": (("bogus",), "error: no such command 'bogus' (see: "),
    "unknown group option": (("--frob", "list"), "error: no such option '--frob' (see: "),
    "unknown option": (("inspect", "--jsn", "x"), "error: no such option '--jsn'. Did you mean '--json'? (see: "),
    "missing argument": (("convert", "src"), "error: missing argument 'OUT' (see: "),
    "missing option": (("convert", "src", "out"), "error: missing option '--target'. Choose from: sm90-cutlass, sm90-cutlass-w4a8, "),
    "choice": (("convert", "src", "out", "--target", "nope"), "error: invalid value for '--target': 'nope' is not one of "),
    "range": (("convert", "src", "out", *TARGET, "--chunk-mb", "0"), "error: invalid value for '--chunk-mb': 0 is not in the range"),
    "integer": (("convert", "src", "out", *TARGET, "--hidden-multiple", "x"), "error: invalid value for '--hidden-multiple': 'x' is "),
    "engine release": (
        ("convert", "src", "out", *TARGET, "--engine", "vllm==9.9"),
        "error: invalid value for '--engine': vllm 9.9 is newer than any release moebake has proven",
    ),
    "option without its value": (("demo", "--workdir"), "error: option '--workdir' requires an argument"),
    "extra argument": (("demo", "userdir"), "error: got unexpected extra argument (userdir) (see: "),
    "verify without OUT": (("verify",), "error: missing argument 'OUT' (see: "),
    "upload without REPO_ID": (("upload",), "error: missing REPO_ID (ORG/NAME): moebake upload REPO_ID [PATH]"),
    "upload's repo twice": (("upload", "a/b", "out", "--repo-id", "c/d"), "error: give the repo once: moebake upload REPO_ID PATH"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_usage_error_is_one_error_line_and_status_2(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, start = CASES[case]
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2 and result.stdout == "", (result.exit_code, result.output)
    assert result.stderr.startswith(start) and result.stderr.count("\n") == 1, result.stderr
    assert "Usage:" not in result.stderr and "Try " not in result.stderr and "Error:" not in result.stderr


def test_the_program_prints_one_line_for_a_usage_error():
    """``python -m moebake``, as a user runs it (click's standalone mode, its own exit)."""
    done = subprocess.run(
        [sys.executable, "-m", "moebake", "convert", "src", "out", "--target", "nope"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("error: invalid value for '--target': 'nope'") and done.stderr.count("\n") == 1, done.stderr


def test_help_and_version_are_unchanged():
    for args in (["--help"], ["convert", "--help"], ["-h"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0 and result.stdout.startswith("Usage: "), result.output
    assert CliRunner().invoke(main, ["--version"]).stdout.startswith("moebake, version ")
