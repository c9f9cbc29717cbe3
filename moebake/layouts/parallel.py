"""Run a transform's independent jobs (e.g. one per expert) on several threads.

numpy releases the GIL inside every operation, so jobs made of numpy steps share the cores. The
number of threads is ``torch.get_num_threads()`` (set it to 1 to keep a transform on one core).
The helper threads' CPU time is totalled (:func:`helper_cpu_seconds`), so that a profiler timing
the calling thread can count it too.
"""

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

_helpers: dict[int, ThreadPoolExecutor] = {}  # pools by helper count
_cpu_lock = threading.Lock()
_helper_cpu = 0.0


def run_in_threads(jobs: list[Callable[[], None]]) -> None:
    """Run ``jobs`` (in no particular order) on up to ``torch.get_num_threads()`` threads, this one included."""
    threads = min(torch.get_num_threads(), len(jobs))
    if threads <= 1:
        _run_all(jobs)
        return
    if threads - 1 not in _helpers:
        _helpers[threads - 1] = ThreadPoolExecutor(max_workers=threads - 1, thread_name_prefix="moebake-layout")
    helpers = [_helpers[threads - 1].submit(_run_timed, jobs[i::threads]) for i in range(1, threads)]
    _run_all(jobs[::threads])
    for helper in helpers:
        helper.result()


def helper_cpu_seconds() -> float:
    """CPU seconds the helper threads have spent on jobs so far (in this process)."""
    return _helper_cpu


def _run_all(jobs: list[Callable[[], None]]) -> None:
    for job in jobs:
        job()


def _run_timed(jobs: list[Callable[[], None]]) -> None:
    global _helper_cpu
    start = time.thread_time()
    try:
        _run_all(jobs)
    finally:
        with _cpu_lock:
            _helper_cpu += time.thread_time() - start
