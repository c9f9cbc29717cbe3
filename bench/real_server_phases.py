"""A real SGLang server's time to ready, in phases: from its log's timestamps and the probe's kernel-build events.

SGLang (0.5.17, ``SGLANG_LOG_MS=1``: ``sglang/srt/utils/common.py configure_logger``) writes lines
``[YYYY-mm-dd HH:MM:SS.mmm<prefix>] message`` (local time; the scheduler's prefix is `` TP0``, ...). The boundaries,
each the first line of its kind (capture: the last ``end``):

* ``server_args=ServerArgs(`` (``sglang/srt/entrypoints/engine.py``): the main process has imported SGLang;
* ``Load weight begin.`` / ``Load weight end.`` (``sglang/srt/model_executor/model_runner.py load_model``);
* ``Capture ... CUDA graph begin.`` / ``... end.`` (``model_runner_components/cuda_graph_setup.py``: the prefill
  graphs, then the decode graphs);
* ``The server is fired up and ready to roll!`` (``sglang/srt/entrypoints/http_server.py``, after the warm-up request).

The sequential windows, from the process start (``start``, the driver's wall clock):

==================  ==============================================================================================
``imports``         process start to ``server_args``: the interpreter, ``import sglang.launch_server``, arguments
``scheduler_start`` to ``Load weight begin``: the scheduler process started, its imports, distributed init, the model
``load``            ``Load weight begin`` to ``end``
``post_load``       to the first capture ``begin``: KV cache, memory pools, attention backend
``cuda_graph_capture``  first capture ``begin`` to the last ``end``
``ready``           to the ready line: the warm-up request and the HTTP server
==================  ==============================================================================================

Kernel builds (bench/real_server_probe.py's events: FlashInfer, tvm-ffi, Triton, each ``{start, end}``) run inside
these windows, mostly in the capture. ``phases`` gives each window *net* of the builds inside it plus
``kernel_builds`` (the union of the build intervals), so they sum to ``ready_seconds``; ``phases_gross`` gives the
windows as they are. A boundary missing from the log (no CUDA graphs, a server that never got ready) merges its
window into the next one that is present.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d+)?[^\]]*\] (.*)$")
MARKS = (
    ("imports", re.compile(r"server_args=ServerArgs\("), "first"),
    ("scheduler_start", re.compile(r"Load weight begin\."), "first"),
    ("load", re.compile(r"Load weight end\."), "first"),
    ("post_load", re.compile(r"Capture .* begin\."), "first"),
    ("cuda_graph_capture", re.compile(r"Capture .* end\."), "last"),
    ("ready", re.compile(r"The server is fired up and ready to roll!"), "first"),
)
"""(window, the line that ends it, which occurrence): in order."""
WINDOWS = tuple(name for name, _, _ in MARKS)


def log_time(stamp: str, fraction: str | None) -> float:
    """A log line's local timestamp as epoch seconds."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + (float(fraction) if fraction else 0.0)


def boundaries(text: str) -> dict[str, float]:
    """``{window: epoch seconds of the line that ends it}`` for the windows whose line is in ``text``."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        message = match.group(3)
        for name, pattern, which in MARKS:
            if pattern.search(message) and (which == "last" or name not in found):
                found[name] = log_time(match.group(1), match.group(2))
    return found


def read_events(path: Path | None) -> list[dict]:
    """The probe's kernel-build events (a missing file: none; a torn last line is skipped)."""
    if path is None or not Path(path).is_file():
        return []
    events = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("start"), (int, float)) and isinstance(event.get("end"), (int, float)):
            events.append(event)
    return events


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def overlap(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def phases(text: str, start: float, events: list[dict] | None = None, ready: float | None = None) -> dict:
    """The phases of one server start (module docstring): ``{"phases", "phases_gross", "kernel_builds_by_kind",
    "kernel_builds_top", "ready_from_log"}``. ``start``: the process start (epoch seconds); ``ready``: when the driver
    saw the server ready, used if the log has no ready line."""
    marks = boundaries(text)
    if "ready" not in marks and ready is not None:
        marks["ready"] = ready
    gross: dict[str, float] = {}
    windows: dict[str, tuple[float, float]] = {}
    previous = start
    for name in WINDOWS:
        if name not in marks:
            continue
        end = max(marks[name], previous)
        gross[name] = end - previous
        windows[name] = (previous, end)
        previous = end
    builds = union([(e["start"], e["end"]) for e in events or []])
    net = {name: gross[name] - overlap(builds, *windows[name]) for name in gross}
    inside = overlap(builds, start, previous)
    by_kind: dict[str, dict] = {}
    for event in events or []:
        entry = by_kind.setdefault(event.get("kind", "?"), {"count": 0, "seconds": 0.0})
        entry["count"] += 1
        entry["seconds"] += event["end"] - event["start"]
    top = sorted(events or [], key=lambda e: e["start"] - e["end"])[:12]
    return {
        "phases": {**{k: round(v, 3) for k, v in net.items()}, "kernel_builds": round(inside, 3)},
        "phases_gross": {k: round(v, 3) for k, v in gross.items()},
        "kernel_builds_by_kind": {k: {"count": v["count"], "seconds": round(v["seconds"], 3)} for k, v in by_kind.items()},
        "kernel_builds_top": [
            {
                "kind": e.get("kind"),
                "name": e.get("name"),
                "seconds": round(e["end"] - e["start"], 3),
                **({"built": e["built"]} if "built" in e else {}),
            }
            for e in top
        ],
        "ready_from_log": round(previous - start, 3) if "ready" in windows else None,
    }
