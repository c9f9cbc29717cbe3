"""Bake output shards in parallel worker processes (``moebake convert --workers N``).

Each worker (a fresh ``spawn`` process) opens and plans the conversion once, then bakes whole
shards as they are handed out, with the same pipeline as a single-process run. The chunk size (the
memory budget) and the cores (torch's thread count, which layout transforms use: see
:func:`~moebake.convert.conversion.transform_threads`) are shared out between the workers; neither
changes an output byte. Workers report the
bytes they write through a queue, which feeds the progress bar here; each finished shard comes back
with its checksum, its source shard's checksum and the worker's stage times.
"""

import multiprocessing
import os
import queue
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

import torch

from moebake.convert.allocator import reuse_freed_buffers
from moebake.convert.conversion import Conversion, open_conversion, transform_threads
from moebake.convert.options import MIN_CHUNK_BYTES, ConvertOptions
from moebake.convert.stages import STAGES
from moebake.convert.writer import write_shard

_worker: dict = {}  # in a worker process: its Conversion, shards by name, and the progress queue


def bake_in_workers(source: str | os.PathLike, options: ConvertOptions, names: list[str], staging: Path, workers: int,
                    on_bytes: Callable[[int], None], on_shard: Callable[[str, str, str | None], None]) -> None:
    """Bake the output shards ``names`` into ``staging`` with ``workers`` processes.

    ``on_bytes(n)`` is called here as workers write; ``on_shard(name, digest, source checksum or None)``
    as each shard is finished (fsynced). The first error raised in a worker is raised here, after
    the shards already running have ended.
    """
    context = multiprocessing.get_context("spawn")
    progress = context.Queue()
    threads = transform_threads(workers)
    share = replace(options, chunk_bytes=max(MIN_CHUNK_BYTES, options.chunk_bytes // workers))
    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                               initargs=(str(source), share, progress, threads))
    pending = {pool.submit(_bake, name, str(staging)) for name in names}
    try:
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(progress, on_bytes)
            for future in finished:
                name, digest, source_digest, stages = future.result()
                STAGES.merge(stages)
                on_shard(name, digest, source_digest)
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # the shards already running end first
        raise
    _drain(progress, on_bytes)
    # Every shard is written and fsynced: the workers exit on their own, without this process
    # waiting out their interpreter teardown (~2 s with torch loaded).
    pool.shutdown(wait=False)


def _drain(progress, on_bytes: Callable[[int], None]) -> None:
    while True:
        try:
            on_bytes(progress.get_nowait())
        except queue.Empty:
            return


def _start_worker(source: str, options: ConvertOptions, progress, threads: int) -> None:
    torch.set_num_threads(threads)
    reuse_freed_buffers()  # a baking process: keep freed chunk buffers for the next chunk (glibc)
    conversion: Conversion = open_conversion(source, options)
    _worker.update(conversion=conversion, shards={s.file_name: s for s in conversion.shards}, progress=progress)


def _bake(name: str, staging: str) -> tuple[str, str, str | None, dict]:
    STAGES.reset()
    digest, source_digest = _worker["conversion"].bake(_worker["shards"][name], Path(staging) / name,
                                                        _worker["progress"].put, write_shard)
    return name, digest, source_digest, STAGES.snapshot()
