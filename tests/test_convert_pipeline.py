"""The conversion pipeline: source hashing in the same pass, the writer thread, worker processes, --profile."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import xxhash
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.hashing import StreamHash
from moebake.convert.options import ConvertOptions
from moebake.convert.plan import OutputShard, OutputTensor
from moebake.convert.run import convert
from moebake.convert.stages import STAGES
from moebake.convert.writer import write_shard


@pytest.fixture()
def data_file(tmp_path):
    data = torch.randint(0, 256, (10_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "data.bin"
    path.write_bytes(data.numpy().tobytes())
    return path, data, xxhash.xxh3_128(data.numpy().tobytes()).hexdigest()


def fed(path, data, pieces, prefix=100):
    stream = StreamHash(path, prefix)
    for start, stop in pieces:
        stream.feed(start, data[start:stop])
    return stream.hexdigest()


def test_stream_hash_of_in_order_reads_needs_no_second_read(data_file):
    path, data, expected = data_file
    STAGES.reset()
    assert fed(path, data, [(100, 4000), (4000, 10_000)]) == expected
    assert STAGES.snapshot()["hash"][2] == 10_000 - 100  # every byte hashed once, none read again


@pytest.mark.parametrize(
    "pieces",
    [
        [],  # never read: hashed from the file
        [(4000, 10_000), (100, 4000)],  # out of order
        [(100, 3000), (2000, 5000), (5000, 6000)],  # overlapping
        [(100, 3000), (5000, 10_000)],  # a gap
        [(0, 10_000)],  # a read that covers the prefix too
    ],
)
def test_stream_hash_is_exact_in_any_reading_order(data_file, pieces):
    path, data, expected = data_file
    assert fed(path, data, pieces) == expected


def test_page_cache_read_ahead_advises_the_range_after_each_read(data_file, monkeypatch):
    import os
    import time

    from moebake.convert.conversion import PageCacheReadAhead

    path, _, _ = data_file
    advised = []
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: advised.append((offset, length, advice)))
    monkeypatch.setattr(PageCacheReadAhead, "AHEAD", 4000)
    monkeypatch.setattr(PageCacheReadAhead, "PIECE", 1000)
    read_ahead = PageCacheReadAhead()
    read_ahead.advance(str(path / "missing"), 0)  # a hint only: no error, and it goes on
    read_ahead.advance(str(path), 3000)
    read_ahead.advance(str(path), 7500)  # the file holds 10_000 bytes
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (not advised or advised[-1][0] < 9500):
        time.sleep(0.01)
    starts = [offset for offset, _, _ in advised]
    assert starts[-1] == 9500 and all(b > a for a, b in zip(starts, starts[1:]))
    assert {length for _, length, _ in advised} == {1000} and {advice for *_, advice in advised} == {os.POSIX_FADV_WILLNEED}


def shard_of(chunks):
    def produce():
        yield from chunks

    size = sum(chunk.numel() for chunk in chunks)
    return OutputShard("s.safetensors", (OutputTensor(name="t", dtype="U8", shape=(size,), sources=("t",), produce=produce),))


def test_writer_hashes_exactly_the_bytes_written(tmp_path):
    chunks = [torch.full((1000,), i, dtype=torch.uint8) for i in range(7)]
    seen = []
    digest = write_shard(shard_of(chunks), tmp_path / "s.safetensors", seen.append)
    assert digest == xxhash.xxh3_128((tmp_path / "s.safetensors").read_bytes()).hexdigest()
    assert seen == [1000] * 7


def test_writer_stops_its_thread_when_the_producer_fails(tmp_path):
    def produce():
        yield torch.zeros(10, dtype=torch.uint8)
        raise RuntimeError("producer broke")

    threads = threading.active_count()
    shard = OutputShard("s.safetensors", (OutputTensor(name="t", dtype="U8", shape=(20,), sources=("t",), produce=produce),))
    with pytest.raises(RuntimeError, match="producer broke"):
        write_shard(shard, tmp_path / "s.safetensors")
    assert threading.active_count() == threads


def test_writer_thread_errors_reach_the_caller(tmp_path):
    def full_disk(n):
        raise OSError(28, "No space left on device")

    chunks = [torch.zeros(1000, dtype=torch.uint8) for _ in range(10)]
    with pytest.raises(OSError, match="No space left"):
        write_shard(shard_of(chunks), tmp_path / "s.safetensors", full_disk)


def test_workers_write_the_same_bytes_and_hashes_and_profile(gpt_oss_tiny, tmp_path):
    """--workers 2 (processes forked by the fork server) against one process; --profile's table lists every stage."""
    one = convert(gpt_oss_tiny, tmp_path / "one", ConvertOptions("sm90-cutlass"), progress=False).to_json()
    result = CliRunner().invoke(
        main,
        [
            "convert",
            str(gpt_oss_tiny),
            str(tmp_path / "two"),
            "--target",
            "sm90-cutlass",
            "--quiet",
            "--workers",
            "2",
            "--writers-per-device",
            "2",
            "--profile",
        ],
    )
    assert result.exit_code == 0, result.output
    two = json.loads((tmp_path / "two" / "moebake.json").read_text())
    assert one["files"] == two["files"] and one["source"]["files"] == two["source"]["files"]
    assert one["options"] == two["options"]  # workers is no conversion option
    for name, digest in two["source"]["files"].items():
        assert digest == "xxh3-128:" + xxhash.xxh3_128((gpt_oss_tiny / name).read_bytes()).hexdigest(), name
    for name in one["files"]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    lines = [line for line in result.output.splitlines() if line.startswith("profile:")]
    assert [line.split()[1] for line in lines[1:5]] == ["read", "transform", "hash", "write"]
    assert float(lines[4].split()[2]) * 1e9 == pytest.approx(
        json.loads((tmp_path / "two" / "model.safetensors.index.json").read_text())["metadata"]["total_size"], abs=0.01e9
    )


SLOW_SITE = Path(__file__).parent / "fuzz" / "slow_site"  # MOEBAKE_TEST_SLOW_CHUNK=<s>: every chunk written s late


def _sigint_default() -> None:
    """In the child before exec: SIGINT's default action, as at a terminal. A test run started in the background
    (``cmd &`` in a non-interactive shell) inherits SIGINT ignored, and so would moebake, which then rightly
    ignores the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ignores_sigint(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT now (``SigIgn`` of /proc/PID/status, a hex mask of signals 1..64)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    return False


def started_workers(source: Path, out: Path) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """``moebake convert --workers 2`` in a session of its own, slowed down, once both workers bake and the
    converting process handles SIGINT again (it ignores it while it starts them): the process and its
    descendants (resource tracker, fork server, workers)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "MOEBAKE_TEST_SLOW_CHUNK": "0.5",
        "PYTHONPATH": os.pathsep.join([str(SLOW_SITE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "moebake",
            "convert",
            str(source),
            str(out),
            "--target",
            "sm90-cutlass",
            "--quiet",
            "--workers",
            "2",
            "--writers-per-device",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_sigint_default,
    )
    staging, deadline = out.parent / f".{out.name}.partial", time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        descendants = psutil.Process(process.pid).children(recursive=True)
        baking = [p for p in descendants if p.ppid() != process.pid]  # forked by the fork server
        if len(baking) == 2 and len(list(staging.glob("*.safetensors"))) == 2 and not ignores_sigint(process.pid):
            return process, descendants
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"workers did not start: {process.communicate()[0]}")


@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_workers_end_with_the_converting_process(gpt_oss_tiny, tmp_path, how):
    """Ctrl-C at a terminal (SIGINT to the whole process group) is reported in one line by the converting
    process, and its workers end at once; so do they (and the fork server) when it is killed."""
    process, descendants = started_workers(gpt_oss_tiny, tmp_path / "out")
    if how == "ctrl-c":
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.kill()
    output = process.communicate(timeout=60)[0]
    if how == "ctrl-c":  # both shards were being baked, none finished: nothing is kept, and it says so
        assert process.returncode == 130 and output.splitlines() == [
            "interrupted: no shard was finished, so nothing was kept; run the same command again to start over"
        ], output
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    _, alive = psutil.wait_procs(descendants, timeout=10)
    assert not alive, alive


ONE_WRITER = (
    "1 writer per storage device: the output is on one, and more writers to one disk were measured slower "
    "than one; --writers-per-device raises it where your storage measures faster"
)


@pytest.mark.parametrize(
    "requested, shards, cores, writers, expected",
    [
        (1, 5, 16, 1, (1, None)),
        (2, 5, 16, 1, (1, ONE_WRITER)),
        (8, 5, 16, 1, (1, ONE_WRITER)),
        (2, 5, 16, 2, (2, None)),
        (
            8,
            5,
            16,
            2,
            (
                2,
                "2 writers per storage device: the output is on one, and more writers to one disk were measured "
                "slower than one; --writers-per-device raises it where your storage measures faster",
            ),
        ),
        (8, 5, 16, 3, (2, "at most 2: more were measured no faster, and over 1 GB of peak memory")),
        (2, 5, 1, 2, (1, "1 usable core")),
        (4, 1, 16, 2, (1, "1 shard to bake")),
        (2, 0, 16, 2, (1, "0 shards to bake")),
    ],
)
def test_workers_are_capped_to_what_the_machine_can_use(requested, shards, cores, writers, expected):
    from moebake.convert.workers import usable_workers

    assert usable_workers(requested, shards, cores, writers_per_device=writers) == expected


def test_workers_default_to_one_writer_per_device(gpt_oss_tiny, tmp_path):
    """--workers 2 without --writers-per-device bakes in this process: the line says why, the bytes are the same."""
    result = CliRunner().invoke(
        main, ["convert", str(gpt_oss_tiny), str(tmp_path / "out"), "--target", "sm90-cutlass", "--quiet", "--workers", "2"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == f"--workers 2: using 1 ({ONE_WRITER})"


def test_more_workers_than_usable_say_how_many_run(gpt_oss_tiny, tmp_path):
    """--workers 8 with two writers allowed: 2 workers (the tiny source has 2 shards), the same bytes as one process."""
    result = CliRunner().invoke(
        main,
        [
            "convert",
            str(gpt_oss_tiny),
            str(tmp_path / "out"),
            "--target",
            "sm90-cutlass",
            "--quiet",
            "--workers",
            "8",
            "--writers-per-device",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("--workers 8: using 2 ("), result.output
    one = convert(gpt_oss_tiny, tmp_path / "one", ConvertOptions("sm90-cutlass"), progress=False)
    for name in one.files:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "out" / name).read_bytes(), name
