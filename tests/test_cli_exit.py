"""``moebake`` as a program (``python -m moebake``): it leaves with os._exit after the command, so its
output, exit status and written files must all be complete by then."""

import json
import subprocess
import sys


def moebake(*args):
    return subprocess.run([sys.executable, "-m", "moebake", *map(str, args)], capture_output=True, text=True, timeout=300)


def test_convert_as_a_program_writes_everything_and_exits_0(gpt_oss_tiny, tmp_path):
    done = moebake("convert", gpt_oss_tiny, tmp_path / "out", "--target", "sm90-cutlass", "--quiet", "--profile")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {tmp_path / 'out'} (2 MoE layers") and "profile: wall" in done.stderr
    assert json.loads((tmp_path / "out" / "moebake.json").read_text())["target"] == "sm90-cutlass"
    verified = moebake("verify", tmp_path / "out")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_exit_statuses_are_kept(tmp_path):
    missing = moebake("verify", tmp_path / "missing")
    assert missing.returncode == 2 and missing.stderr.startswith("error: ")
    assert moebake("no-such-command").returncode == 2
    assert moebake("--version").returncode == 0


def test_workers_leave_no_leaked_semaphore_warning(gpt_oss_tiny, tmp_path):
    """The program leaves with os._exit; the semaphores of --workers' queues are released before it, so
    multiprocessing's resource tracker has none to warn about (it did in most runs before)."""
    for run in range(3):
        done = moebake(
            "convert",
            gpt_oss_tiny,
            tmp_path / f"out{run}",
            "--target",
            "sm90-cutlass",
            "--quiet",
            "--workers",
            "2",
            "--writers-per-device",
            "2",
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr
