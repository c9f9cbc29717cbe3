"""Let freed chunk-sized buffers be reused within the process instead of being unmapped (glibc).

A conversion allocates a few chunk-sized buffers (tens of MiB: source reads, transform outputs) per
step and frees them a step later, from several threads. glibc serves allocations above its mmap
threshold (at most 32 MiB by default) with fresh mappings and unmaps them on free, and threads other
than the main one allocate from arenas that cannot hold such buffers at all, so every step
page-faults and zeroes its buffers anew (how much that costs, as measured: docs/benchmarks.md,
"Measurements without a results file"). Raising
the mmap and trim thresholds and keeping one arena keeps freed buffers in the heap for the next step;
peak memory is unchanged (the same few buffers are alive at once), but the process keeps that memory
until it exits. Process-wide; a no-op where the C library is not glibc.
"""

import ctypes
import platform

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameter numbers (malloc.h)
LIMIT = 1 << 30


def reuse_freed_buffers() -> bool:
    """Serve allocations below :data:`LIMIT` from the (one) heap and keep freed ones; True if applied."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, LIMIT), (_M_TRIM_THRESHOLD, LIMIT))
    return all([bool(libc.mallopt(parameter, value)) for parameter, value in settings])
