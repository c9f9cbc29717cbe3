"""The kinds of kernel files a bake can carry, and where each library reads and writes them on a machine.

A kind is the first folder of a kernel file's path in a bake (``kernels/<set>/<kind>/...``); the rest of the path is
its path under the kind's folder on a machine (its *root*). Defaults, as the libraries' own code computes them
(``HOME`` is ``~``):

``tvm-ffi``
    SGLang's JIT kernels (``sglang.kernels.jit.utils.compile.load_jit``, SGLang 0.5.17): a module is
    ``$TVM_FFI_CACHE_DIR/<module>__arch_<arch>__tvmffi_<version>/<module>.so``, ``TVM_FFI_CACHE_DIR`` defaulting to
    ``~/.cache/tvm-ffi`` (also apache-tvm-ffi's own default, ``tvm_ffi/cpp/extension.py``); a module found there is
    loaded without building (the module name carries a hash of its sources). Harvested: the ``<dir>/<file>.so`` files
    (no objects or ninja files).
``flashinfer``
    FlashInfer's JIT modules (``flashinfer/jit/env.py`` and ``flashinfer/jit/core.py``, FlashInfer 0.6.x and 0.7.x).
    They are built into ``<base>/.cache/flashinfer/<flashinfer version>/<arch list>/cached_ops/<name>/<name>.so``,
    ``<base>`` being ``$FLASHINFER_WORKSPACE_BASE`` or ``~``; there FlashInfer runs ninja before every load, which
    rebuilds unless the object files, ninja's logs and every source's modification time agree. So the modules are
    harvested from there (``<name>/<name>.so`` only) and installed into FlashInfer's AOT folder, which
    ``JitSpec.build_and_load`` loads from without ninja (``is_aot``): ``flashinfer_jit_cache.get_jit_cache_dir()``
    if the ``flashinfer-jit-cache`` package is installed, else ``<the flashinfer package>/data/aot``, as
    ``<name>/<name>.so``. moebake's reduced SM90 MoE module (``fused_moe_90_moebake``) goes there too, with its
    sidecar ``.json``; :func:`moebake.serve.jit.flashinfer_build.reduced_module_spec`'s JIT spec then loads it.
``flashinfer-cubins``
    FlashInfer's downloaded cubins: the ``flashinfer-cubin`` package's folder if installed, else
    ``$FLASHINFER_CUBIN_DIR``, else ``<base>/.cache/flashinfer/cubins``.
``deep-gemm``
    DeepGEMM's JIT cache (``<root>/cache/kernel.<name>.<hash>/...``): SGLang 0.5.17 sets ``DG_JIT_CACHE_DIR`` to
    ``$SGLANG_DG_CACHE_DIR`` or ``~/.cache/deep_gemm`` when it imports its DeepGEMM wrapper
    (``sglang/srt/layers/deep_gemm_wrapper/compile_utils.py``), overriding any ``DG_JIT_CACHE_DIR`` set before;
    elsewhere DeepGEMM reads ``$DG_JIT_CACHE_DIR``, default ``~/.deep_gemm``. Harvested: the files under ``cache/``.
``triton``
    Triton's cache (``triton/knobs.py``): ``$TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache``, else
    ``~/.triton/cache``; one folder per kernel hash, and Triton's compiled launchers.
``tilelang``
    TileLang's kernel cache (``tilelang/env.py``): ``$TILELANG_CACHE_DIR``, else ``~/.tilelang/cache``.

Every root can be given instead (``--root KIND=DIR``), which is how tests point all of them at temporary folders.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

from moebake.errors import InvalidArgumentError

KINDS = ("flashinfer", "flashinfer-cubins", "tvm-ffi", "deep-gemm", "triton", "tilelang")
"""The kinds, in the order they are listed and installed."""

NEEDS = {
    "flashinfer": "flashinfer",
    "flashinfer-cubins": "flashinfer",
    "tvm-ffi": "tvm_ffi",
    "deep-gemm": "deep_gemm",
    "triton": "triton",
    "tilelang": "tilelang",
}
"""The library version (:data:`moebake.kernels.environment.VERSION_FIELDS`) each kind's files are tied to."""

LEDGER = ".moebake-kernels.json"
"""In a root: the files ``moebake kernels install`` placed there (path under the root, sha256, bake, set)."""


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or os.path.expanduser("~"))


def _package_dir(module: str) -> Path | None:
    """The folder of an importable package (found on ``sys.path`` without importing it), or None."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def flashinfer_base(env: Mapping[str, str]) -> Path:
    """``<base>/.cache/flashinfer``: FlashInfer's cache folder (``FLASHINFER_CACHE_DIR``)."""
    return Path(env.get("FLASHINFER_WORKSPACE_BASE") or _home(env)) / ".cache" / "flashinfer"


def flashinfer_aot_dir() -> Path | None:
    """FlashInfer's ``FLASHINFER_AOT_DIR`` for the FlashInfer on ``sys.path``: ``flashinfer-jit-cache``'s folder if
    that package is installed, else ``<flashinfer>/data/aot``; None without FlashInfer."""
    if _package_dir("flashinfer_jit_cache") is not None:
        import flashinfer_jit_cache  # a small package: its folder and version

        return Path(flashinfer_jit_cache.get_jit_cache_dir())
    package = _package_dir("flashinfer")
    return None if package is None else package / "data" / "aot"


def deep_gemm_root(env: Mapping[str, str], engine: str | None) -> Path:
    """DeepGEMM's JIT cache folder for a server of ``engine`` (see the module docstring)."""
    if engine == "sglang":
        return Path(env.get("SGLANG_DG_CACHE_DIR") or _home(env) / ".cache" / "deep_gemm")
    return Path(env.get("DG_JIT_CACHE_DIR") or _home(env) / ".deep_gemm")


def triton_root(env: Mapping[str, str]) -> Path:
    if env.get("TRITON_CACHE_DIR"):
        return Path(env["TRITON_CACHE_DIR"])
    return Path(env.get("TRITON_HOME") or _home(env)) / ".triton" / "cache"


def cubin_root(env: Mapping[str, str]) -> Path:
    package = _package_dir("flashinfer_cubin")
    if package is not None:
        import flashinfer_cubin

        return Path(flashinfer_cubin.get_cubin_dir())
    return Path(env["FLASHINFER_CUBIN_DIR"]) if env.get("FLASHINFER_CUBIN_DIR") else flashinfer_base(env) / "cubins"


def install_roots(env: Mapping[str, str], engine: str | None, given: Mapping[str, Path] | None = None) -> dict[str, Path | None]:
    """Where ``install`` places each kind's files (``given`` roots first); None where the library is absent."""
    roots = {
        "flashinfer": flashinfer_aot_dir(),
        "flashinfer-cubins": cubin_root(env),
        "tvm-ffi": Path(env.get("TVM_FFI_CACHE_DIR") or _home(env) / ".cache" / "tvm-ffi"),
        "deep-gemm": deep_gemm_root(env, engine),
        "triton": triton_root(env),
        "tilelang": Path(env.get("TILELANG_CACHE_DIR") or _home(env) / ".tilelang" / "cache"),
    }
    return roots | dict(given or {})


def harvest_roots(env: Mapping[str, str], engine: str | None, given: Mapping[str, Path] | None = None) -> dict[str, Path | None]:
    """Where ``harvest`` reads each kind's files (``given`` roots first): as :func:`install_roots`, but FlashInfer's
    modules are read from its JIT cache folder (``<base>/.cache/flashinfer``), where a server builds them."""
    roots = install_roots(env, engine) | {"flashinfer": flashinfer_base(env)}
    return roots | dict(given or {})


def parse_roots(values: tuple[str, ...] | list[str]) -> dict[str, Path]:
    """``KIND=DIR`` options as ``{kind: Path}``; ValueError naming the bad one."""
    roots = {}
    for value in values:
        kind, sep, folder = value.partition("=")
        if not sep or kind not in KINDS or not folder:
            raise InvalidArgumentError(f"--root {value}: expected KIND=DIR, KIND one of {', '.join(KINDS)}")
        roots[kind] = Path(folder)
    return roots
