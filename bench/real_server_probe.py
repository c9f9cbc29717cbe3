"""An SGLang general plugin that measures the model load in a real server's scheduler process (bench/real_server.py).

``bench/real_server.py`` publishes it under SGLang's ``sglang.srt.plugins`` entry-point group (a dist-info of its own
on ``PYTHONPATH``), so SGLang's ``load_plugins()`` runs :func:`register` in every server process, for the stock and the
bake runs alike. It registers an AROUND hook (SGLang's ``HookRegistry``) on ``ModelRunner.load_model``: it resets
PyTorch's peak-memory counters before the load and, after it, appends one JSON line to ``$MOEBAKE_REAL_SERVER_PROBE``:
the load's wall seconds, the peak GPU memory allocated and reserved by PyTorch's allocator during the load (weights,
post-load step and its temporaries; no KV cache or CUDA graphs yet) and what is allocated once it returns. It changes
nothing the load does. It also arms :mod:`faulthandler` on SIGUSR2 (SGLang uses no SIGUSR signal), writing every
thread's Python stack to ``$MOEBAKE_REAL_SERVER_STACKS``: bench/real_server.py sends SIGUSR2 to a server that is not
ready in time, so its record says where each process was (a JIT build, a CUDA-graph capture, ...).

Where ``$MOEBAKE_FLASHINFER_MOE_SO`` names a prebuilt reduced FlashInfer SM90 MoE module (moebake.serve.jit.flashinfer_build:
FlashInfer's own W4A16 kernels for the installed FlashInfer, compiled for fewer GEMM tiles), :func:`register` also
makes FlashInfer's ``cutlass_fused_moe`` and SM90 weight interleave use it in that process
(``ensure_flashinfer_sm90_moe``), in the stock and the bake servers alike: FlashInfer's whole ``fused_moe_90`` JIT
build does not fit one device hold. Only the module FlashInfer's getter returns changes; every call into it is
FlashInfer's and SGLang's own.

Where ``$MOEBAKE_REAL_SERVER_JIT`` names a file, every kernel build the process runs is appended to it as one JSON line
(``{"kind", "name", "start", "end", "pid"}``, wall-clock seconds), for the phases of bench/real_server_phases.py:
FlashInfer's ``JitSpec.build`` (ninja; a no-op when the module is up to date; ``built`` says whether the ``.so``
changed), apache-tvm-ffi's ``tvm_ffi.cpp.load_inline`` and ``load`` (SGLang's ``load_jit`` calls them only when no
built module is cached) and Triton's ``JITFunction._do_compile`` (a compile, or a read of Triton's disk cache). The
wrappers time the call and change nothing else; DeepGEMM's and TileLang's builds (in C++ or their own launchers) are
not seen. Modules imported after ``register`` are wrapped when the load starts (before any forward).
"""

import faulthandler
import functools
import importlib
import json
import os
import signal
import sys
import time

TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
GIB = 2**30


def _jit_event(kind: str, name: str, start: float, end: float, **extra) -> None:
    path = os.environ.get("MOEBAKE_REAL_SERVER_JIT")
    if path:
        line = json.dumps({"kind": kind, "name": str(name)[:160], "start": start, "end": end, "pid": os.getpid(), **extra})
        with open(path, "a") as out:  # one short line per write: whole lines from every process
            out.write(line + "\n")


def _timed(kind: str, original, name_of, built_of=None):
    """``original`` wrapped: its wall time recorded as a ``kind`` build named ``name_of(args)``."""

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        before = built_of(args, None) if built_of else None
        start = time.time()
        try:
            return original(*args, **kwargs)
        finally:
            extra = {"built": built_of(args, before)} if built_of and before is not None else {}
            try:
                _jit_event(kind, name_of(args, kwargs), start, time.time(), **extra)
            except Exception:  # the measurement never breaks the server
                pass

    wrapper._moebake_timed = True
    return wrapper


def patch_jit(import_missing: bool = False) -> None:
    """Wrap the JIT builders of the module docstring (those imported; with ``import_missing``, importing the rest)."""
    if not os.environ.get("MOEBAKE_REAL_SERVER_JIT"):
        return
    for module_name in ("flashinfer.jit.core", "tvm_ffi.cpp", "triton.runtime.jit"):
        module = sys.modules.get(module_name)
        if module is None and import_missing:
            try:
                module = importlib.import_module(module_name)
            except Exception:
                module = None
        if module is None:
            continue
        if module_name == "flashinfer.jit.core" and hasattr(module, "JitSpec"):
            spec = module.JitSpec
            if not getattr(spec.build, "_moebake_timed", False):
                spec.build = _timed("flashinfer", spec.build, lambda a, k: getattr(a[0], "name", "?"), _so_changed)
        elif module_name == "tvm_ffi.cpp":
            for name in ("load_inline", "load"):
                function = getattr(module, name, None)
                if function is not None and not getattr(function, "_moebake_timed", False):
                    setattr(module, name, _timed("tvm-ffi", function, lambda a, k: a[0] if a else k.get("name", "?")))
        elif module_name == "triton.runtime.jit" and hasattr(module, "JITFunction"):
            jit = module.JITFunction
            if hasattr(jit, "_do_compile") and not getattr(jit._do_compile, "_moebake_timed", False):
                jit._do_compile = _timed(
                    "triton",
                    jit._do_compile,
                    lambda a, k: getattr(a[0], "__name__", None) or getattr(getattr(a[0], "fn", None), "__name__", "?"),
                )


def _so_changed(args, before):
    """FlashInfer's build: called before it (``before`` None) it returns the ``.so``'s (mtime,) or () if absent; after
    it, whether the ``.so`` is new or changed."""
    try:
        path = args[0].jit_library_path
        now = (path.stat().st_mtime_ns,) if path.exists() else ()
    except Exception:
        return None if before is None else False
    return now if before is None else now != before


def _measured_load(original, *args, **kwargs):
    import torch

    patch_jit(import_missing=True)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    result = original(*args, **kwargs)
    torch.cuda.synchronize()
    record = {
        "load_model_seconds": time.perf_counter() - start,
        "allocated_before_gib": before / GIB,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
        "allocated_after_gib": torch.cuda.memory_allocated() / GIB,
        "pid": os.getpid(),
    }
    path = os.environ.get("MOEBAKE_REAL_SERVER_PROBE")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")
    return result


_stacks_file = None


def arm_stacks() -> None:
    """SIGUSR2 writes every thread's Python stack to ``$MOEBAKE_REAL_SERVER_STACKS`` (once per process)."""
    global _stacks_file
    stacks = os.environ.get("MOEBAKE_REAL_SERVER_STACKS")
    if stacks and _stacks_file is None:
        _stacks_file = open(stacks, "a")  # kept open for faulthandler's lifetime
        _stacks_file.write(f"== pid {os.getpid()}: {' '.join(os.sys.argv)[:200]}\n")
        _stacks_file.flush()
        faulthandler.register(signal.SIGUSR2, file=_stacks_file, all_threads=True)


def install_reduced_module() -> None:
    """FlashInfer's SM90 MoE getter returns the prebuilt reduced module ``$MOEBAKE_FLASHINFER_MOE_SO`` names, if any."""
    if os.environ.get("MOEBAKE_FLASHINFER_MOE_SO"):
        from moebake.serve.jit.flashinfer_build import ensure_flashinfer_sm90_moe

        ensure_flashinfer_sm90_moe()  # reads $MOEBAKE_FLASHINFER_MOE_SO, checks its sidecar against this FlashInfer


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    arm_stacks()
    patch_jit()
    HookRegistry.register(TARGET, _measured_load, HookType.AROUND)
    install_reduced_module()
