"""The conversion pipeline: source hashing in the same pass, the writer thread, worker processes, --profile."""

import json
import threading

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


@pytest.mark.parametrize("pieces", [
    [],                                          # never read: hashed from the file
    [(4000, 10_000), (100, 4000)],               # out of order
    [(100, 3000), (2000, 5000), (5000, 6000)],   # overlapping
    [(100, 3000), (5000, 10_000)],               # a gap
    [(0, 10_000)],                               # a read that covers the prefix too
])
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
    return OutputShard("s.safetensors", (OutputTensor("t", "U8", (size,), ("t",), produce),))


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
    shard = OutputShard("s.safetensors", (OutputTensor("t", "U8", (20,), ("t",), produce),))
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
    """--workers 2 (spawned processes) against one process; --profile's table lists every stage."""
    one = convert(gpt_oss_tiny, tmp_path / "one", ConvertOptions("sm90-cutlass"), progress=False)
    result = CliRunner().invoke(main, ["convert", str(gpt_oss_tiny), str(tmp_path / "two"), "--target", "sm90-cutlass",
                                       "--quiet", "--workers", "2", "--profile"])
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
        json.loads((tmp_path / "two" / "model.safetensors.index.json").read_text())["metadata"]["total_size"], abs=0.01e9)
