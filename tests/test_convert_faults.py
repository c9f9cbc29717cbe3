"""A conversion stopped by a fault keeps its finished shards for --resume, and says so truly (issue 37):
a full disk, Ctrl-C, SIGTERM and a worker process that dies. With no shard finished nothing is kept, and
the same command runs again. The free space the plan needs is checked before the first byte."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from conftest import TINY
from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.synthetic import write_gpt_oss

TARGET = ["--target", "sm90-cutlass", "--quiet"]
SLOW_SITE = Path(__file__).parent / "fuzz" / "slow_site"  # MOEBAKE_TEST_SLOW_CHUNK=<s>: every chunk written s late
PROGRESS = ".moebake-progress.json"


@pytest.fixture(scope="module")
def three_shards(tmp_path_factory):
    """The tiny GPT-OSS checkpoint with three layers, one shard each; and its bake in one uninterrupted run."""
    root = tmp_path_factory.mktemp("three")
    source = write_gpt_oss(root / "src", **{**TINY, "num_layers": 3})
    reference = convert(source, root / "reference", ConvertOptions("sm90-cutlass"), progress=False)
    return source, root / "reference", sorted(name for name in reference.files if name.endswith(".safetensors"))


def assert_same_bake(out: Path, reference: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    for path in reference.iterdir():
        if path.name not in ("moebake.json", "config.json"):  # these name the run's OUT-independent facts only
            assert (out / path.name).read_bytes() == path.read_bytes(), path.name
    ours, theirs = (json.loads((d / "moebake.json").read_text()) for d in (out, reference))
    assert ours["files"] == theirs["files"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def stop_writing_at(monkeypatch, shard_index: int, error: BaseException) -> None:
    """Make the conversion raise ``error`` while it writes its ``shard_index``-th shard (counting from 0), after its header."""
    from moebake.convert import writer

    shards, original = [], writer._write_shard

    def writing(shard, path, on_bytes):
        shards.append(shard.file_name)
        if len(shards) - 1 != shard_index:
            return original(shard, path, on_bytes)

        def failing(produced):
            raise error
            yield  # a generator, as the real one

        with monkeypatch.context() as patch:
            patch.setattr(writer, "_timed_chunks", failing)
            return original(shard, path, on_bytes)

    monkeypatch.setattr(writer, "_write_shard", writing)


def test_disk_full_keeps_the_finished_shards_and_resume_finishes(three_shards, tmp_path, monkeypatch):
    source, reference, shards = three_shards
    stop_writing_at(monkeypatch, 1, OSError(errno.ENOSPC, "No space left on device"))
    result = invoke("convert", source, tmp_path / "out", *TARGET)
    staging = tmp_path / ".out.partial"
    assert result.exit_code == 2
    assert one_line(result) == (
        f"error: {staging / shards[1]}: No space left on device; 1 of 3 shard(s) are finished and kept "
        f"in {staging}; re-run the same command with --resume to bake the rest"
    )
    assert sorted(p.name for p in staging.glob("*.safetensors")) == shards[:1]  # the half-written one is gone
    monkeypatch.undo()
    resumed = invoke("convert", source, tmp_path / "out", *TARGET, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert_same_bake(tmp_path / "out", reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


NOTHING_KEPT = "no shard was finished, so nothing was kept; run the same command again to start over"


@pytest.mark.parametrize(
    "fault, status, start",
    [
        (KeyboardInterrupt(), 130, "interrupted: "),
        (OSError(errno.ENOSPC, "No space left on device"), 2, "error: {shard}: No space left on device; "),
    ],
)
def test_a_fault_in_the_first_shard_keeps_nothing_and_says_so(three_shards, tmp_path, monkeypatch, fault, status, start):
    source, reference, shards = three_shards
    stop_writing_at(monkeypatch, 0, fault)
    result = invoke("convert", source, tmp_path / "out", *TARGET)
    assert result.exit_code == status
    assert one_line(result) == start.format(shard=tmp_path / ".out.partial" / shards[0]) + NOTHING_KEPT
    assert sorted(tmp_path.iterdir()) == []
    monkeypatch.undo()
    again = invoke("convert", source, tmp_path / "out", *TARGET)  # the same command, as the line says
    assert again.exit_code == 0, again.output
    assert_same_bake(tmp_path / "out", reference)


def test_ctrl_c_after_a_shard_says_how_many_are_kept(three_shards, tmp_path, monkeypatch):
    source, reference, shards = three_shards
    stop_writing_at(monkeypatch, 2, KeyboardInterrupt())
    result = invoke("convert", source, tmp_path / "out", *TARGET)
    staging = tmp_path / ".out.partial"
    assert result.exit_code == 130
    assert one_line(result) == (
        f"interrupted: 2 of 3 shard(s) are finished and kept in {staging}; re-run the same command with --resume to bake the rest"
    )
    assert sorted(p.name for p in staging.glob("*.safetensors")) == shards[:2]


def test_too_little_free_space_is_refused_before_the_first_byte(three_shards, tmp_path, monkeypatch):
    """The plan's bytes (every shard's header and tensors, and the side files) against statvfs' free blocks."""
    from moebake.convert import output_dir, writer

    source, reference, shards = three_shards
    needed = sum((reference / name).stat().st_size for name in shards)
    real_statvfs, written = os.statvfs, []
    free_blocks = needed // 4096  # a little less than the shards alone

    def small(path):
        st = real_statvfs(path)
        return os.statvfs_result((st.f_bsize, 4096, st.f_blocks, free_blocks, free_blocks, *st[5:]))

    monkeypatch.setattr(output_dir.os, "statvfs", small)
    monkeypatch.setattr(writer, "_write_shard", lambda *args: written.append(args))
    result = invoke("convert", source, tmp_path / "out", *TARGET)
    assert result.exit_code == 2 and not written
    line = one_line(result)
    assert line.startswith(f"error: {tmp_path / 'out'}: not enough free space: the bake writes ") and "or choose an OUT" in line
    assert sorted(tmp_path.iterdir()) == []
    free_blocks = needed // 4096 + 1000  # room for the shards and side files (a few kB): baked
    monkeypatch.undo()
    monkeypatch.setattr(output_dir.os, "statvfs", small)
    assert invoke("convert", source, tmp_path / "out", *TARGET).exit_code == 0


# ---- in a real process: SIGTERM, and a worker killed ------------------------------------------------


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def slow_convert(source: Path, out: Path, *flags: str) -> subprocess.Popen:
    """``moebake convert`` in a session of its own, every chunk written 0.3 s late."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "MOEBAKE_TEST_SLOW_CHUNK": "0.3",
        "PYTHONPATH": os.pathsep.join([str(SLOW_SITE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "moebake", "convert", str(source), str(out), *TARGET, *flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_sigint_default,
    )


def wait_for_finished_shards(process: subprocess.Popen, staging: Path, count: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if len(json.loads((staging / PROGRESS).read_text())["shards"]) >= count:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"no shard finished: {process.communicate()[0]}")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_sigterm_is_reported_like_ctrl_c_and_resume_finishes(three_shards, tmp_path, workers):
    """SIGTERM to the whole process group (as a service manager stops a job) once a shard is finished."""
    source, reference, shards = three_shards
    out, staging = tmp_path / "out", tmp_path / ".out.partial"
    process = slow_convert(source, out, "--workers", workers, "--writers-per-device", workers)
    wait_for_finished_shards(process, staging, 1)
    os.killpg(process.pid, signal.SIGTERM)
    output = process.communicate(timeout=60)[0]
    finished = len(json.loads((staging / PROGRESS).read_text())["shards"])
    assert process.returncode == 143 and output.splitlines() == [
        f"terminated (SIGTERM): {finished} of 3 shard(s) are finished and kept in {staging}; "
        "re-run the same command with --resume to bake the rest"
    ], output
    resumed = invoke("convert", source, out, *TARGET, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert_same_bake(out, reference)


@pytest.mark.parametrize("after_shards", [0, 1])
def test_a_killed_worker_is_one_line_and_what_is_left_can_be_resumed(three_shards, tmp_path, after_shards):
    """A worker killed (SIGKILL, as the out-of-memory killer does) while it bakes: one line naming how it died and
    what was kept; the next run (--resume when shards were kept, else the same command) finishes the bake."""
    source, reference, shards = three_shards
    out, staging = tmp_path / "out", tmp_path / ".out.partial"
    process = slow_convert(source, out, "--workers", "2", "--writers-per-device", "2")
    if after_shards:
        wait_for_finished_shards(process, staging, after_shards)
    deadline = time.monotonic() + 60
    while True:  # until a worker bakes a shard not finished yet
        workers = [p for p in psutil.Process(process.pid).children(recursive=True) if p.ppid() != process.pid]
        if workers and len(list(staging.glob("*.safetensors"))) > after_shards:
            break
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[0]
        time.sleep(0.05)
    workers[0].kill()
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 2, output
    kept = len(json.loads((staging / PROGRESS).read_text())["shards"]) if staging.exists() else 0
    assert kept >= after_shards
    what = (
        f"{kept} of 3 shard(s) are finished and kept in {staging}; re-run the same command with --resume to bake the rest"
        if kept
        else "no shard was finished, so nothing was kept; run the same command again to start over"
    )
    assert output.splitlines() == [
        "error: a worker process (--workers) was killed by SIGKILL (the out-of-memory killer sends it too) before finishing "
        f"its shard; {what}"
    ], output
    again = invoke("convert", source, out, *TARGET, *(["--resume"] if kept else []))
    assert again.exit_code == 0, again.output
    assert_same_bake(out, reference)


def test_a_conversion_killed_before_its_first_shard_is_started_over_by_the_same_command(three_shards, tmp_path):
    """SIGKILL (nothing can clean up) before any shard is finished leaves a partial conversion with nothing in it to
    resume: the same command starts over, saying so (it refused: "a partial conversion ... (0 shard(s) finished)")."""
    source, reference, shards = three_shards
    out, staging = tmp_path / "out", tmp_path / ".out.partial"
    process = slow_convert(source, out)
    deadline = time.monotonic() + 60
    while not list(staging.glob("*.safetensors")):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[0]
        time.sleep(0.05)
    process.kill()
    process.communicate(timeout=60)
    assert staging.is_dir() and json.loads((staging / PROGRESS).read_text())["shards"] == {}
    again = invoke("convert", source, out, *TARGET)
    assert again.exit_code == 0, again.output
    assert again.output.splitlines()[0] == f"{staging}: a partial conversion with no finished shard; starting over"
    assert_same_bake(out, reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize(
    "exit_codes, how",
    [
        ([None, -9], "was killed by SIGKILL (the out-of-memory killer sends it too)"),
        ([3, None], "exited with status 3"),
        ([None, -11], "was killed by SIGSEGV"),
        ([None, None], "died"),
    ],
)
def test_the_dead_worker_is_told_from_those_still_running(exit_codes, how):
    """At the broken pool, the other workers still run (they ignore the pool's SIGTERM): their exit code is None."""
    from types import SimpleNamespace

    from moebake.convert.workers import _how_it_died

    assert _how_it_died([SimpleNamespace(exitcode=code) for code in exit_codes], settle=0.0) == how


def test_the_dead_workers_status_is_left_to_the_pools_thread_when_it_reads_it():
    """The pool's thread joins the workers too: a status read while it reads the same one comes back as 255 (what
    multiprocessing records when the pipe is empty). Here the pool's thread reads the dead worker's status after
    0.1 s; a read before that gets 255. The status told is the one the pool's thread read (SIGKILL), and a worker the
    pool's thread never reads (it waits on another) is read here after ``settle``."""
    import threading
    from types import SimpleNamespace

    from moebake.convert.workers import _how_it_died

    class Worker:
        def __init__(self, status):
            self.status, self._popen = status, SimpleNamespace(returncode=None)

        @property
        def exitcode(self):  # a read of its own: 255 while the pool's thread has not read the status yet
            return self._popen.returncode if self._popen.returncode is not None else self.status

    running, dead = Worker(None), Worker(255)
    threading.Timer(0.1, lambda: setattr(dead._popen, "returncode", -9)).start()  # the pool's thread reads it
    assert _how_it_died([running, dead], settle=10.0) == "was killed by SIGKILL (the out-of-memory killer sends it too)"
    alone = Worker(-9)  # never read by the pool's thread: read here once ``settle`` has passed
    assert _how_it_died([Worker(None), alone], settle=0.05) == "was killed by SIGKILL (the out-of-memory killer sends it too)"
