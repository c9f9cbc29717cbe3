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

Where ``$MOEBAKE_FLASHINFER_MOE_SO`` names a prebuilt reduced FlashInfer SM90 MoE module (moebake.serve.flashinfer_build:
FlashInfer's own W4A16 kernels for the installed FlashInfer, compiled for fewer GEMM tiles), :func:`register` also
makes FlashInfer's ``cutlass_fused_moe`` and SM90 weight interleave use it in that process
(``ensure_flashinfer_sm90_moe``), in the stock and the bake servers alike: FlashInfer's whole ``fused_moe_90`` JIT
build does not fit one device hold. Only the module FlashInfer's getter returns changes; every call into it is
FlashInfer's and SGLang's own.
"""

import faulthandler
import json
import os
import signal
import time

TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
GIB = 2**30


def _measured_load(original, *args, **kwargs):
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    result = original(*args, **kwargs)
    torch.cuda.synchronize()
    record = {"load_model_seconds": time.perf_counter() - start, "allocated_before_gib": before / GIB,
              "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
              "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
              "allocated_after_gib": torch.cuda.memory_allocated() / GIB, "pid": os.getpid()}
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
        from moebake.serve.flashinfer_build import ensure_flashinfer_sm90_moe

        ensure_flashinfer_sm90_moe()  # reads $MOEBAKE_FLASHINFER_MOE_SO, checks its sidecar against this FlashInfer


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    arm_stacks()
    HookRegistry.register(TARGET, _measured_load, HookType.AROUND)
    install_reduced_module()
