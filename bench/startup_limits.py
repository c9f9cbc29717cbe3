"""The machine's physical limits for the start-up benchmark (``bench/startup_bench.py``), measured in its session:
the disk (O_DIRECT and buffered), the page cache as a rank's reader and as a node's ranks read it, host-to-device
copies on one GPU and on a node's GPUs at once, and beside them, not a limit, the plugin's reader alone; and from
those, the fastest a rank's bytes can reach its GPU (:func:`limit_seconds`). Every probe returns GB/s (1e9 bytes a
second)."""

import os
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import benchkit


def drop_page_cache(directory: Path) -> None:
    """Empty the page cache (root); where that is refused, evict every file under ``directory`` (the source, the bake
    and the dumps: this benchmark's own files) from it (:func:`benchkit.drop_page_cache`). Either way the next read of
    the model's bytes comes from the disk (each run records the bytes it read from the block device)."""
    benchkit.drop_page_cache(
        (p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()),
        lambda refused, evicted: (
            f"note: the page cache cannot be dropped here ({refused}): each cold run evicts the "
            f"{evicted} files under {directory} from it instead (posix_fadvise DONTNEED)"
        ),
    )


def _dd_direct_gbps(files: list[Path], streams: int = 8) -> float:
    """Disk read bandwidth: ``streams`` parallel ``dd iflag=direct`` over the files (whole), GB/s."""
    files = files[:streams]
    began = time.perf_counter()
    procs = [subprocess.Popen(["dd", f"if={f}", "of=/dev/null", "bs=16M", "iflag=direct"], stderr=subprocess.DEVNULL) for f in files]
    for p in procs:
        p.wait()
    return sum(f.stat().st_size for f in files) / (time.perf_counter() - began) / 1e9


def _buffered_disk_gbps(files: list[Path]) -> float:
    """Read bandwidth of whatever the page cache holds now (after a drop: the disk with the kernel's readahead, which
    beats O_DIRECT on some machines): a thread per file, each reading it whole in order with ``preadv`` of 16 MiB, GB/s."""
    from concurrent.futures import ThreadPoolExecutor

    def read(path):
        buffer = bytearray(16 << 20)
        fd, offset = os.open(path, os.O_RDONLY), 0
        try:
            while got := os.preadv(fd, [buffer], offset):
                offset += got
        finally:
            os.close(fd)
        return offset

    began = time.perf_counter()
    with ThreadPoolExecutor(len(files)) as pool:
        total = sum(pool.map(read, files))
    return total / (time.perf_counter() - began) / 1e9


def _page_cache_gbps(files: list[Path], threads: int | None = None) -> float:
    """Read bandwidth out of a warm page cache as a rank's reader reads it: ``threads`` threads (default: the reader's,
    ``DEFAULT_SLOTS``), each ``preadv`` of the reader's chunks (``DEFAULT_CHUNK_BYTES``) into a buffer of its own, over
    every chunk of ``files`` (each read once first), GB/s. With ``DEFAULT_SLOTS * G`` threads it stands for G ranks of
    one node reading at once: a read from the page cache is a copy the kernel makes in the calling thread, outside the
    GIL, so threads of one process copy in parallel as the ranks' processes do."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from moebake.loading.staged_reader import DEFAULT_CHUNK_BYTES, DEFAULT_SLOTS

    threads, chunk = threads or DEFAULT_SLOTS, DEFAULT_CHUNK_BYTES
    local = threading.local()
    fds = {path: os.open(path, os.O_RDONLY) for path in files}
    try:
        chunks = [(fds[path], offset) for path in files for offset in range(0, path.stat().st_size, chunk)]

        def read(job):
            if not hasattr(local, "buffer"):
                local.buffer = bytearray(chunk)
            return os.preadv(job[0], [local.buffer], job[1])

        with ThreadPoolExecutor(threads) as pool:
            sum(pool.map(read, chunks))  # warm: every page in the cache before the clock
            began = time.perf_counter()
            total = sum(pool.map(read, chunks))
        return total / (time.perf_counter() - began) / 1e9
    finally:
        for fd in fds.values():
            os.close(fd)


def _reader_alone_gbps(files: list[Path], device: str, window_bytes: int = 1 << 30, staged: bool | None = None) -> float:
    """The plugin's reader (:func:`~moebake.loading.staged_reader.own_reader`, its defaults) reading every byte
    of ``files`` out of the page cache onto ``device``, in this process, outside any server, GB/s: a read of the
    whole once first (its ring pinned, every page cached), then the timed read. Each file goes in pieces of
    ``window_bytes`` into one device buffer of that size, reused (its bytes are not kept). Not a limit: the reads and
    the copies the bake's ranks make, without the server around them, to tell the copies' cost from the server's."""
    import torch

    from moebake.loading.staged_reader import ByteRange, own_reader

    window = torch.empty(window_bytes, dtype=torch.uint8, device=device)
    ranges = [
        ByteRange(str(path), offset, window[: min(window_bytes, size - offset)], path.name)
        for path in files
        for size in [path.stat().st_size]
        for offset in range(0, size, window_bytes)
    ]
    reader = own_reader(device, staged=staged)
    try:
        reader.read(ranges)
        began = time.perf_counter()
        total = reader.read(ranges).bytes
        return total / (time.perf_counter() - began) / 1e9
    finally:
        reader.close()


def _h2d_gbps(pinned: bool, gpus: int = 1, nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Host-to-device copies on GPUs ``0..gpus-1`` at once (one: a rank's; several: as a node's ranks copy theirs),
    from pinned or pageable host memory: a thread per GPU, each copying ``nbytes`` from a host buffer of its own
    ``repeats`` times on its current stream (non-blocking where pinned), all started together (a barrier) after one
    untimed copy each; the GPUs' total GB/s."""
    import threading

    import torch

    hosts = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(gpus)]
    devices = [torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{g}") for g in range(gpus)]
    for g in range(gpus):
        devices[g].copy_(hosts[g])
        torch.cuda.synchronize(g)
    start = threading.Barrier(gpus + 1)

    def copy(g: int) -> None:
        with torch.cuda.device(g):
            start.wait()
            for _ in range(repeats):
                devices[g].copy_(hosts[g], non_blocking=pinned)
            torch.cuda.synchronize(g)

    threads = [threading.Thread(target=copy, args=(g,)) for g in range(gpus)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return gpus * repeats * nbytes / (time.perf_counter() - began) / 1e9


def measure_limits(directory: Path, node_ranks: Iterable[int] = ()) -> dict:
    """The machine's physical limits, measured now: disk (O_DIRECT, 8 streams; buffered, a thread per file), the page
    cache as one rank's reader reads it (``page_cache_gbps``) and, for each G of ``node_ranks`` above 1, as G such
    ranks of one node read it at once (``page_cache_node_gbps[str(G)]``: the node's total), pinned/pageable H2D on one
    GPU, and, for each such G the machine has the GPUs for, pinned H2D on G GPUs at once (``h2d_pinned_node_gbps``,
    the total: :func:`_h2d_gbps`). Beside them, not a limit: the plugin's reader alone onto one GPU, reading the
    page-cache probe's files (``reader_alone_gbps``: :func:`_reader_alone_gbps`)."""
    from moebake.loading.staged_reader import DEFAULT_SLOTS

    files = sorted((directory / "out").glob("*.safetensors"), key=lambda p: -p.stat().st_size)
    drop_page_cache(directory)
    direct = _dd_direct_gbps(files)
    drop_page_cache(directory)
    buffered = _buffered_disk_gbps(files[:8])
    limits = {
        "disk_direct_gbps": direct,
        "disk_buffered_gbps": buffered,
        "disk_gbps": max(direct, buffered),
        "page_cache_gbps": _page_cache_gbps(files[:4]),
        "page_cache_threads": DEFAULT_SLOTS,
    }
    together = sorted({g for g in node_ranks if g > 1})  # ranks of one node reading (and copying) at once
    node = {str(g): _page_cache_gbps(files[:4], DEFAULT_SLOTS * g) for g in together}
    if node:
        limits["page_cache_node_gbps"] = node
    import torch

    if torch.cuda.is_available():
        limits.update(
            h2d_pinned_gbps=_h2d_gbps(True), h2d_pageable_gbps=_h2d_gbps(False), reader_alone_gbps=_reader_alone_gbps(files[:4], "cuda:0")
        )
        copies = {str(g): _h2d_gbps(True, g) for g in together if g <= torch.cuda.device_count()}
        if copies:
            limits["h2d_pinned_node_gbps"] = copies
    return limits


def _share(limits: dict, one: str, node: str, ep: int) -> float:
    """GB/s a rank gets of ``limits[one]`` (one rank alone), or its share of ``limits[node][str(ep)]`` (``ep`` ranks
    at once, their total) where the run measured that and it is less; infinite where neither was measured."""
    together = limits.get(node, {}).get(str(ep))
    return min(limits.get(one, float("inf")), together / ep if together else float("inf"))


def limit_seconds(bytes_per_rank: int, ep: int, cache: str, limits: dict) -> float:
    """The fastest a rank's bytes can get to its GPU, its ``ep`` ranks on one node: cold, all ranks' bytes through
    the one disk; warm, a rank's bytes out of the page cache, at one rank's probed bandwidth or, where the session
    measured ``ep`` ranks reading at once, at its share of theirs if that is less; never faster than pinned
    host-to-device copies of a rank's bytes (one GPU's, or its share of ``ep`` GPUs copying at once, likewise)."""
    if cache == "cold":
        source = bytes_per_rank * ep / (limits["disk_gbps"] * 1e9)
    else:
        source = bytes_per_rank / (_share(limits, "page_cache_gbps", "page_cache_node_gbps", ep) * 1e9)
    h2d = bytes_per_rank / (_share(limits, "h2d_pinned_gbps", "h2d_pinned_node_gbps", ep) * 1e9)
    return max(source, h2d)
