"""A reduced (or prebuilt) FlashInfer SM90 fused-MoE module: MXFP4 weights, as W4A16 and as Humming W4A8.

Why this exists
---------------
``flashinfer.fused_moe.cutlass_fused_moe`` and ``interleave_moe_weights_for_sm90_mixed_gemm`` both
load the JIT module ``fused_moe_90`` on first use. FlashInfer builds that module from about 250
CUDA translation units: every activation x weight dtype pair the CUTLASS MoE backend supports,
times every tile, cluster and schedule, even with ``-DFAST_BUILD`` (its build time:
docs/benchmarks.md). moebake's SM90 targets use two of those paths
(:data:`moebake.serve.jit.flashinfer_paths.PATHS`, which says what is compiled for each):

* ``W4A16``: BF16 activations x MXFP4 weights, ``use_w4_group_scaling=True`` (``sm90-cutlass``);
* ``W4A8_HUMMING``: BF16 activations quantized online to FP8 x MXFP4 weights with Humming's pre-MMA
  E8M0 scales, ``use_wfp4afp8_humming=True`` (``sm90-cutlass-w4a8``),

so almost all of that build is dead weight.

What it does
------------
:func:`gen_reduced_sm90_module` returns a FlashInfer ``JitSpec`` with the *same* compiler flags,
include paths and link flags as FlashInfer's own ``gen_cutlass_fused_moe_sm90_module()`` (it is a
``dataclasses.replace`` of that spec), but a different module name and a short source list:

* the TMA-WS input helper, the weight-interleave kernels (``moe_gemm_mixed_utils.cu``), the DeepGEMM
  include-dir hook the Python wrapper calls after loading, and the small common .cpp/.cu files;
* a copy of FlashInfer's binding whose ``FusedMoeRunner`` constructor is reduced to the two paths'
  branches (the stock constructor names ~25 other ``CutlassMoeFCRunner`` instantiations);
* one file instantiating the paths' ``CutlassMoeFCRunner`` types, and one per path instantiating its
  ``MoeGemmRunner`` (the tile/cluster/schedule dispatcher);
* one translation unit per selected GEMM configuration (tile, cluster, mainloop schedule) of each path,
  each holding the exact explicit instantiation FlashInfer's kernel generator emits for it;
* one stub translation unit that defines every *other* instantiation of the two paths that the dispatchers
  reference as a function that throws ``"... not compiled in the moebake reduced module"``, so
  the library links and loads without undefined symbols.

The tactic list the runner reports is FlashInfer's unchanged list. Calls without autotuning use
the first tactic (tile 64x16x128, cluster 1x1x1, ping-pong), which is compiled by default for both paths,
as is the 128x64x256 cooperative configuration FlashInfer uses to size the GEMM workspace. Autotuning
meets the stub for tactics that are not compiled; FlashInfer's autotuner skips tactics that raise.

moebake's runtime calls the module through a getter of its own
(:func:`moebake.serve.flashinfer_ops.sm90_moe_ops`): FlashInfer's ``cutlass_fused_moe`` and its module
getter rebuilt over FlashInfer's own code with the SM90 generator bound to :func:`reduced_module_spec`,
so FlashInfer's module, getter and cache stay as they are for anything else in the process (an engine's
own FlashInfer calls). :func:`ensure_flashinfer_sm90_moe` instead replaces
``flashinfer.fused_moe.core.gen_cutlass_fused_moe_sm90_module`` and clears the getter's cache, for
tests and benchmarks that run an engine's own code. With a prebuilt library (``MOEBAKE_FLASHINFER_MOE_SO``
or ``prebuilt=``), nothing is compiled: the ``.so`` is loaded with ``tvm_ffi.load_module`` after its
sidecar JSON is checked against the installed FlashInfer and apache-tvm-ffi versions and the file's sha256.

The sources are written for the FlashInfer releases of :data:`moebake.serve.jit.flashinfer_paths.REVISIONS` (0.7.2.post1,
and 0.6.15.post1 and 0.6.14 with the W4A16 path only, for SGLang 0.5.17's and vLLM 0.26.0's own servers); the
source patches assert their anchors, so another version fails loudly instead of building something wrong. A prebuilt ``.so`` is tied to the
FlashInfer and apache-tvm-ffi versions it was built with (checked from its sidecar). Build time, size
and what the GPU tests check: docs/benchmarks.md and docs/testing.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from moebake.errors import PlatformError
from moebake.serve.jit.flashinfer_paths import (
    REVISIONS,
    ConfigChoice,
    SourceRevision,
    revision_for,
    selected_configs,
    write_reduced_sources,
)

MODULE_NAME = "fused_moe_90_moebake"
"""Name of the reduced JIT module (its cache directory and ``.so`` are named after it)."""

TESTED_FLASHINFER_VERSIONS = REVISIONS[0].releases
"""The FlashInfer releases moebake's runtime (``moebake.serve``) is proven with: the ``gpu`` extra's pin. The reduced
module's sources are written for every release of :data:`moebake.serve.jit.flashinfer_paths.REVISIONS` (older ones for
engines' own code that pins an older FlashInfer, such as SGLang 0.5.17's and vLLM 0.26.0's servers)."""

PREBUILT_ENV = "MOEBAKE_FLASHINFER_MOE_SO"
"""Environment variable naming a prebuilt reduced ``.so`` to load instead of building."""

_STOCK_SOURCES_KEPT = (
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_tma_warp_specialized_input.cu",
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu",
    "fused_moe/cutlass_backend/deepgemm_jit_setup.cu",
    "nv_internal/cpp/common/envUtils.cpp",
    "nv_internal/cpp/common/logger.cpp",
    "nv_internal/cpp/common/stringUtils.cpp",
    "nv_internal/cpp/common/tllmException.cpp",
    "nv_internal/cpp/common/memoryUtils.cu",
    "nv_internal/tensorrt_llm/kernels/preQuantScaleKernel.cu",
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp",
    "nv_internal/tensorrt_llm/kernels/lora/lora.cpp",
)
"""FlashInfer sources of the stock ``fused_moe_90`` module that the compiled paths still need."""


def check_flashinfer_version() -> str:
    """The installed FlashInfer's version, if moebake's runtime is proven with it (:data:`TESTED_FLASHINFER_VERSIONS`);
    else ``PlatformError``, unless ``MOEBAKE_FLASHINFER_ANY_VERSION`` is set."""
    import flashinfer

    version = flashinfer.__version__
    if version not in TESTED_FLASHINFER_VERSIONS and not os.environ.get("MOEBAKE_FLASHINFER_ANY_VERSION"):
        raise PlatformError(
            f"moebake's runtime is proven with FlashInfer {', '.join(TESTED_FLASHINFER_VERSIONS)}, found {version}; "
            f"install that (pip install 'moebake[gpu]'), or set MOEBAKE_FLASHINFER_ANY_VERSION=1 to try anyway"
        )
    return version


def installed_revision() -> SourceRevision:
    """The reduced module's :class:`SourceRevision` for the installed FlashInfer (``PlatformError`` for one it is not
    written for, unless ``MOEBAKE_FLASHINFER_ANY_VERSION`` is set)."""
    import flashinfer

    return revision_for(flashinfer.__version__, any_version=bool(os.environ.get("MOEBAKE_FLASHINFER_ANY_VERSION")))


def _stock_sm90_generator():
    """FlashInfer's own SM90 spec generator, even after :func:`ensure_flashinfer_sm90_moe` patched core."""
    import flashinfer.jit.fused_moe as jit_fused_moe

    return jit_fused_moe.gen_cutlass_fused_moe_sm90_module


def gen_reduced_sm90_module(configs: ConfigChoice = None):
    """FlashInfer ``JitSpec`` of the reduced SM90 fused-MoE module (see the module docstring).

    Writes the generated sources under FlashInfer's generated-source directory
    (``FLASHINFER_GEN_SRC_DIR/moebake_90``). Building it is ``spec.build_and_load()``.
    """
    from flashinfer.jit import env as jit_env

    revision = installed_revision()
    stock = _stock_sm90_generator()(False)  # also (re)generates FlashInfer's kernel instantiation files
    generated = Path(jit_env.FLASHINFER_GEN_SRC_DIR) / "cutlass_instantiations" / "90"
    out_dir = Path(jit_env.FLASHINFER_GEN_SRC_DIR) / "moebake_90"
    csrc = Path(jit_env.FLASHINFER_CSRC_DIR)
    sources = [csrc / rel for rel in _STOCK_SOURCES_KEPT + revision.stock_sources]

    sources += write_reduced_sources(out_dir, csrc, generated, MODULE_NAME, configs, revision)
    for source in sources:
        if not source.exists():
            raise FileNotFoundError(f"FlashInfer source missing (trimmed wheel?): {source}")
    return dataclasses.replace(stock, name=MODULE_NAME, sources=sources)


def _sidecar(so_path: Path) -> Path:
    return Path(so_path).with_suffix(".json")


def describe_build(configs: ConfigChoice = None) -> dict[str, Any]:
    """What a built library is valid for; written next to a saved ``.so`` and checked at load."""
    import flashinfer
    import tvm_ffi

    return {
        "module": MODULE_NAME,
        "flashinfer": flashinfer.__version__,
        "tvm_ffi": tvm_ffi.__version__,
        "configs": {name: ["/".join(c) for c in chosen] for name, chosen in selected_configs(configs, installed_revision().paths).items()},
        "arch": "sm_90a",
    }


class PrebuiltModuleSpec:
    """Stand-in for a FlashInfer ``JitSpec`` whose ``build_and_load()`` loads a prebuilt ``.so``."""

    def __init__(self, so_path: Path):
        self.name = MODULE_NAME
        self.so_path = Path(so_path)

    def get_library_path(self) -> Path:
        return self.so_path

    def build_and_load(self):
        import tvm_ffi

        return tvm_ffi.load_module(str(self.so_path))


def check_prebuilt(so_path: Path) -> dict[str, Any]:
    """Check a prebuilt ``.so`` against the installed FlashInfer; returns its sidecar metadata."""
    so_path = Path(so_path)
    if not so_path.is_file():
        raise FileNotFoundError(f"prebuilt FlashInfer MoE module not found: {so_path}")
    meta_path = _sidecar(so_path)
    if not meta_path.is_file():
        raise FileNotFoundError(f"prebuilt module has no metadata file {meta_path}")
    meta = json.loads(meta_path.read_text())
    import flashinfer
    import tvm_ffi

    if meta.get("module") != MODULE_NAME or meta.get("flashinfer") != flashinfer.__version__:
        raise PlatformError(
            f"prebuilt module {so_path} is for {meta.get('module')} / FlashInfer {meta.get('flashinfer')}, "
            f"not {MODULE_NAME} / FlashInfer {flashinfer.__version__}"
        )
    # The module subclasses tvm-ffi C++ classes inline from the headers it was compiled with: the
    # runtime library must be the same apache-tvm-ffi release (0.1.11 and 0.1.15 differ in layout).
    if meta.get("tvm_ffi", tvm_ffi.__version__) != tvm_ffi.__version__:
        raise PlatformError(
            f"prebuilt module {so_path} was built with apache-tvm-ffi {meta['tvm_ffi']}, but {tvm_ffi.__version__} is installed; rebuild it"
        )
    if "sha256" in meta and hashlib.sha256(so_path.read_bytes()).hexdigest() != meta["sha256"]:
        raise PlatformError(f"prebuilt module {so_path} does not match the sha256 in {meta_path}")
    return meta


def reduced_module_spec(prebuilt: os.PathLike | str | None = None, configs: ConfigChoice = None):
    """The reduced module's spec: a checked prebuilt ``.so`` (``prebuilt`` or ``$MOEBAKE_FLASHINFER_MOE_SO``), or the
    JIT spec that builds it on first ``build_and_load()``. Changes nothing in FlashInfer."""
    prebuilt = prebuilt or os.environ.get(PREBUILT_ENV) or None
    if prebuilt:
        check_prebuilt(Path(prebuilt))
        return PrebuiltModuleSpec(Path(prebuilt))
    return gen_reduced_sm90_module(configs)


_installed: Any | None = None
_installed_key: tuple | None = None


def ensure_flashinfer_sm90_moe(prebuilt: os.PathLike | str | None = None, configs: ConfigChoice = None):
    """Make FlashInfer's SM90 ``cutlass_fused_moe`` and weight interleave use the reduced module, process-wide.

    For tests and benchmarks that run an engine's own code, which calls FlashInfer's getter, on a machine
    where FlashInfer's full module cannot be built; moebake's own runtime does not call it
    (:func:`moebake.serve.flashinfer_ops.sm90_moe_ops` has a getter of its own).

    ``prebuilt`` (or ``$MOEBAKE_FLASHINFER_MOE_SO``) names a saved ``.so`` (with its ``.json``
    sidecar) to load without compiling; otherwise the reduced module is JIT-built on first use
    (a small fraction of the stock module's build, see docs/benchmarks.md). Idempotent: a repeated
    call with the same arguments keeps the module already loaded. Returns the spec installed.
    Note: FlashInfer 0.7.2's ``cutlass_fused_moe`` returns a list ``[output, ...]``, not a tensor.
    """
    global _installed, _installed_key
    import flashinfer.fused_moe.core as core

    prebuilt = prebuilt or os.environ.get(PREBUILT_ENV) or None
    key = (str(Path(prebuilt).resolve()) if prebuilt else None, tuple(selected_configs(configs, installed_revision().paths).items()))
    if _installed is not None and _installed_key == key and getattr(core.gen_cutlass_fused_moe_sm90_module, "_moebake", False):
        return _installed
    spec = reduced_module_spec(prebuilt, configs)

    def gen_cutlass_fused_moe_sm90_module(use_fast_build: bool = False):
        return spec

    gen_cutlass_fused_moe_sm90_module.__doc__ = f"moebake: returns the reduced module spec {MODULE_NAME}."
    setattr(gen_cutlass_fused_moe_sm90_module, "_moebake", True)
    core.gen_cutlass_fused_moe_sm90_module = gen_cutlass_fused_moe_sm90_module
    core.get_cutlass_fused_moe_module.cache_clear()
    _installed, _installed_key = spec, key
    return spec


def build_reduced_sm90_module(
    dest_dir: os.PathLike | str | None = None, configs: ConfigChoice = None, verbose: bool = False
) -> tuple[Path, float]:
    """Build the reduced module now (ninja, ``MAX_JOBS`` cores); copy ``.so`` + ``.json`` to ``dest_dir``.

    Returns ``(path of the .so, build seconds)``. The ``.so`` only needs the CUDA driver, libnvrtc
    and the same FlashInfer + apache-tvm-ffi versions to be loaded on another SM90 machine.
    """
    spec = gen_reduced_sm90_module(configs)
    start = time.monotonic()
    spec.build(verbose=verbose)
    seconds = time.monotonic() - start
    so_path = Path(spec.get_library_path())
    if dest_dir is not None:
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / so_path.name
        shutil.copyfile(so_path, target)
        meta = describe_build(configs)
        meta["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
        meta["build_seconds"] = round(seconds, 1)
        _sidecar(target).write_text(json.dumps(meta, indent=2) + "\n")
        so_path = target
    return so_path, seconds
