"""Bake output shards in parallel worker processes (``moebake convert --workers N``).

Each worker (a fresh ``spawn`` process) opens and plans the conversion once, then bakes whole
shards as they are handed out, with the same pipeline as a single-process run. The chunk size (the
memory budget) and the cores (torch's thread count, which layout transforms use: see
:func:`~moebake.convert.conversion.transform_threads`) are shared out between the workers; neither
changes an output byte. Workers report the
bytes they write through a queue, which feeds the progress bar here; each finished shard comes back
with its checksum, its source shard's checksum and the worker's stage times.

Workers never outlive the conversion: each asks the kernel to kill it when its parent dies
(``PR_SET_PDEATHSIG`` on Linux) and also watches for that itself (:func:`_exit_with_parent`,
where prctl is missing); an error or Ctrl-C in the parent kills the workers at once instead of
waiting for the shards they are baking. Workers ignore SIGINT (inherited from the parent while it
starts them), so Ctrl-C at a terminal reaches only the parent, which reports it in one line.
"""

import ctypes
import ctypes.util
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

import torch

from moebake.convert.allocator import reuse_freed_buffers
from moebake.convert.conversion import Conversion, open_conversion, transform_threads
from moebake.convert.options import MIN_CHUNK_BYTES, ConvertOptions
from moebake.convert.stages import STAGES
from moebake.convert.writer import write_shard
from moebake.schema.files import child

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
                               initargs=(str(source), share, progress, threads, os.getpid()))
    try:
        with _sigint_ignored():  # the workers start (and inherit SIG_IGN) as the shards are submitted
            pending = {pool.submit(_bake, name, str(staging)) for name in names}
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(progress, on_bytes)
            for future in finished:
                name, digest, source_digest, stages = future.result()
                STAGES.merge(stages)
                on_shard(name, digest, source_digest)
    except BaseException:
        _kill_workers(pool)
        raise
    _drain(progress, on_bytes)
    # Every shard is written and fsynced: the workers exit on their own, without this process
    # waiting out their interpreter teardown (~2 s with torch loaded).
    pool.shutdown(wait=False)


@contextmanager
def _sigint_ignored():
    """Ignore SIGINT in the ``with`` body (when called from the main thread, which alone may)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's worker processes now (their half-written shards are re-baked on resume)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def _drain(progress, on_bytes: Callable[[int], None]) -> None:
    while True:
        try:
            on_bytes(progress.get_nowait())
        except queue.Empty:
            return


def _start_worker(source: str, options: ConvertOptions, progress, threads: int, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent)
    torch.set_num_threads(threads)
    reuse_freed_buffers()  # a baking process: keep freed chunk buffers for the next chunk (glibc)
    conversion: Conversion = open_conversion(source, options)
    _worker.update(conversion=conversion, shards={s.file_name: s for s in conversion.shards}, progress=progress)


def _bake(name: str, staging: str) -> tuple[str, str, str | None, dict]:
    STAGES.reset()
    digest, source_digest = _worker["conversion"].bake(_worker["shards"][name], child(staging, name),
                                                        _worker["progress"].put, write_shard)
    return name, digest, source_digest, STAGES.snapshot()


PR_SET_PDEATHSIG = 1


def _exit_with_parent(parent: int) -> None:
    """End this worker when process ``parent`` dies: by the kernel's ``PR_SET_PDEATHSIG`` (SIGKILL)
    where prctl exists, and by a thread that polls the parent's pid (a portable fallback)."""
    libc_name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    if libc_name:
        try:
            ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, *(ctypes.c_ulong(a) for a in (signal.SIGKILL, 0, 0, 0)))
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="moebake-parent-watch", daemon=True).start()
