"""Bake output shards in parallel worker processes (``moebake convert --workers N``).

Each worker opens and plans the conversion once, then bakes whole shards as they are handed out,
with the same pipeline as a single-process run. Workers are forked by multiprocessing's fork server
(``forkserver``, started here), which has loaded what they need once (:mod:`moebake.convert.fork_server`:
torch, numba, the conversion's modules and the compiled kernels): they share those pages with it
copy-on-write instead of each loading them afresh (~330 MiB apiece), so a worker adds mostly its
buffers to the process tree's memory (PSS). The server lives as long as this process (a later
conversion here reuses it). The chunk size (the memory budget: :func:`worker_chunk_bytes`) and the cores
(torch's thread count, which layout transforms use:
see :func:`~moebake.convert.conversion.transform_threads`) are shared out between the workers;
neither changes an output byte. Workers report the bytes they write through a queue, which feeds
the progress bar here; each finished shard comes back with its checksum, its source shard's checksum
and the worker's stage times.

Workers never outlive the conversion: each watches the converting process (its sentinel pipe, which
closes when that process dies, however it dies) and exits at once when it is gone
(:func:`_exit_with_parent`); an error or Ctrl-C in the converting process kills the workers at once
instead of waiting for the shards they are baking. Workers ignore SIGINT and SIGTERM (the fork server
is started with them ignored, and forks them so), so Ctrl-C at a terminal, or a SIGTERM to the whole
process group (a service manager stopping it), reaches only the converting process, which reports it
in one line. A worker that dies anyway (killed, out of memory) ends the conversion with a
:class:`~moebake.errors.WorkerError` naming how it died.
"""

import multiprocessing
import multiprocessing.forkserver
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import moebake
from moebake.convert.allocator import reuse_freed_buffers
from moebake.convert.conversion import Conversion, open_conversion, transform_threads
from moebake.convert.options import MAX_WORKERS, MIN_CHUNK_BYTES, WRITERS_PER_DEVICE, ConvertOptions
from moebake.convert.stages import STAGES
from moebake.convert.writer import write_shard
from moebake.errors import WorkerError
from moebake.schema.files import child


def usable_workers(
    requested: int, shards: int, cores: int | None = None, writers_per_device: int = WRITERS_PER_DEVICE
) -> tuple[int, str | None]:
    """How many worker processes ``--workers requested`` gets for ``shards`` shards to bake on ``cores`` usable
    cores (default: this process's), and why fewer (None when as asked): ``writers_per_device`` for the one
    storage device the output is written to, at most :data:`MAX_WORKERS`, one per usable core and one per shard."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limits = [
        (
            writers_per_device,
            f"{writers_per_device} writer{'s' if writers_per_device != 1 else ''} per storage "
            "device: the output is on one, and more writers to one disk were measured slower than one; "
            "--writers-per-device raises it where your storage measures faster",
        ),
        (MAX_WORKERS, f"at most {MAX_WORKERS}: more were measured no faster, and over 1 GB of peak memory"),
        (cores, f"{cores} usable core{'s' if cores != 1 else ''}"),
        (shards, f"{shards} shard{'s' if shards != 1 else ''} to bake"),
    ]
    limit, reason = min(limits, key=lambda item: item[0])
    if requested <= limit:
        return requested, None
    return max(1, limit), reason


_worker: dict = {}  # in a worker process: its Conversion, shards by name, and the progress queue


def bake_in_workers(
    source: str | os.PathLike,
    options: ConvertOptions,
    names: list[str],
    staging: Path,
    workers: int,
    on_bytes: Callable[[int], object],
    on_shard: Callable[[str, str, str | None], None],
) -> None:
    """Bake the output shards ``names`` into ``staging`` with ``workers`` processes.

    ``on_bytes(n)`` is called here as workers write; ``on_shard(name, digest, source checksum or None)``
    as each shard is finished (fsynced). The first error raised in a worker is raised here, after
    the shards already running have ended.
    """
    context = multiprocessing.get_context("forkserver")
    _start_fork_server(context)
    progress = context.Queue()
    threads = transform_threads(workers)
    share = replace(options, chunk_bytes=worker_chunk_bytes(options.chunk_bytes, workers))
    pool = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(str(source), share, progress, threads, dict(os.environ))
    )
    processes = []
    try:
        with _signals_ignored():  # the workers start as the shards are submitted (in milliseconds), never half-way
            pending = {pool.submit(_bake, name, str(staging)) for name in names}
        processes = list((getattr(pool, "_processes", None) or {}).values())
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            _drain(progress, on_bytes)
            for future in finished:
                name, digest, source_digest, stages = future.result()
                STAGES.merge(stages)
                on_shard(name, digest, source_digest)
    except BrokenProcessPool:
        how = _how_it_died(processes)  # before the others are killed here
        _kill_workers(pool)
        raise WorkerError(f"a worker process (--workers) {how} before finishing its shard") from None
    except BaseException:
        _kill_workers(pool)
        raise
    _drain(progress, on_bytes)
    # Every shard is written and fsynced: the workers exit on their own, without this process
    # waiting out their interpreter teardown (~2 s with torch loaded).
    pool.shutdown(wait=False)


def worker_chunk_bytes(chunk_bytes: int, workers: int) -> int:
    """Each worker's chunk size: half its even share of ``chunk_bytes``. A baking process keeps about six
    chunks alive (read ahead, transformed, queued for hashing and writing); besides the workers, the
    process tree holds the converting process and the fork server (their torch, ~380 MiB together), so
    the halved share keeps ``--workers 2`` near one process's peak memory (16 MiB instead of 32 per worker
    at the default 64 MiB). Smaller chunks change no byte."""
    return max(MIN_CHUNK_BYTES, chunk_bytes // (2 * workers))


def _start_fork_server(context: Any) -> None:
    """Start the fork server, with SIGINT and SIGTERM ignored (as every process it forks then starts), and wait
    until it has loaded :mod:`moebake.convert.fork_server` (a second or two: it forks a process that
    does nothing, joined here) with Ctrl-C still working here.

    The server is a new interpreter, ``python -c``, whose ``sys.path`` starts with its working directory
    (Python 3.11's fork server ignores the ``sys.path`` it is handed). Started in a folder that holds a
    ``moebake/`` directory (a clone, beside an editable install), it would import that folder as a namespace
    package in place of the installed moebake, and every worker would fail. So it is started in the directory
    that holds the installed package, where ``moebake`` is this one; each worker still runs in this process's
    working directory (multiprocessing moves it there)."""
    context.set_forkserver_preload(["moebake.convert.fork_server"])
    with _signals_ignored(), _working_directory(INSTALL_PARENT):
        multiprocessing.forkserver.ensure_running()
    ready = context.Process(name="moebake-fork-server-ready")
    ready.start()
    ready.join()


INSTALL_PARENT = Path(moebake.__file__).resolve().parent.parent
"""The directory that holds the ``moebake`` package this process imported (site-packages, or a clone's root)."""


@contextmanager
def _working_directory(directory: Path):
    """Run the ``with`` body in ``directory`` (the process's working directory), then return to the one before."""
    previous = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(previous)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _signals_ignored():
    """Ignore SIGINT and SIGTERM in the ``with`` body (when called from the main thread, which alone may)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, signal.SIG_IGN) for number in _STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


STATUS_SETTLE_SECONDS = 1.0
"""How long :func:`_how_it_died` leaves a dead worker's exit status to the pool's own thread before reading it."""


def _status_read(process: Any) -> bool:
    """Whether multiprocessing has read ``process``'s exit status already (its ``Popen.returncode`` is set; False
    where this Python keeps it elsewhere), without reading it."""
    return getattr(getattr(process, "_popen", None), "returncode", None) is not None


def _how_it_died(processes: list, settle: float = STATUS_SETTLE_SECONDS) -> str:
    """How the worker among ``processes`` that has ended (the others, ignoring the pool's SIGTERM, still run) ended:
    ``was killed by SIGKILL``, ``exited with status N``, or ``died`` when it cannot be told.

    The pool's own thread reads the workers' exit statuses too (it joins them, in order, once the pool is broken). A
    forkserver worker's status is 8 bytes its pipe holds once: of two threads reading it at once, one gets it and the
    other nothing, which multiprocessing records as status 255, over the true one if it comes last. So the statuses
    are read here only once the pool's thread has read one, or after ``settle`` seconds (it is then waiting on a
    worker still running, and reads no other)."""
    deadline = time.monotonic() + settle
    while not any(_status_read(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.01)
    codes = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
    if not codes:
        return "died"
    if codes[0] < 0:
        return f"was killed by {signal.Signals(-codes[0]).name}{' (the out-of-memory killer sends it too)' if codes[0] == -9 else ''}"
    return f"exited with status {codes[0]}"


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    """Kill the pool's worker processes now (their half-written shards are re-baked on resume)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def _drain(progress: Any, on_bytes: Callable[[int], object]) -> None:
    while True:
        try:
            on_bytes(progress.get_nowait())
        except queue.Empty:
            return


def _start_worker(source: str, options: ConvertOptions, progress: Any, threads: int, environment: dict[str, str]) -> None:
    for number in _STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    _exit_with_parent()
    if os.environ != environment:  # forked with the server's (the converting process's when it started it)
        os.environ.clear()
        os.environ.update(environment)
    torch.set_num_threads(threads)
    reuse_freed_buffers()  # a baking process: keep freed chunk buffers for the next chunk (glibc)
    conversion: Conversion = open_conversion(source, options)
    _worker.update(conversion=conversion, shards={s.file_name: s for s in conversion.shards}, progress=progress)


def _bake(name: str, staging: str) -> tuple[str, str, str | None, dict]:
    STAGES.reset()
    digest, source_digest = _worker["conversion"].bake(_worker["shards"][name], child(staging, name), _worker["progress"].put, write_shard)
    return name, digest, source_digest, STAGES.snapshot()


def _exit_with_parent() -> None:
    """End this worker as soon as the process that asked for it (not the fork server, its parent
    by pid) dies: a thread waits on that process's sentinel, a pipe that closes when it exits."""
    parent = multiprocessing.parent_process()

    def watch() -> None:
        assert parent is not None  # a worker has the process that asked for it
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="moebake-parent-watch", daemon=True).start()
