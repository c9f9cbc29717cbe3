"""The installed serving stack's versions and the GPU architecture, as a kernel set's compatibility record names them.

Versions are read from the distributions' metadata on ``sys.path`` (``importlib.metadata``: the same folders
``import`` searches, so a stack unpacked into a folder on ``PYTHONPATH`` is the one reported), without importing
the libraries; CUDA's is torch's ``torch.version.cuda``, read from ``torch/version.py`` without importing torch.
The GPU architecture is ``sm<major><minor>`` of the first CUDA device (``torch.cuda.get_device_capability``), e.g.
``sm90`` for an H100 or H200.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re

from moebake.errors import InvalidArgumentError
from moebake.kernels.locations import _package_dir

VERSION_FIELDS = ("flashinfer", "deep_gemm", "tvm_ffi", "triton", "tilelang", "torch", "cuda")
"""The library versions a kernel set records (null: the library was not installed where the kernels were made)."""
REQUIRED_FIELDS = ("torch", "cuda")
"""Versions every kernel set records."""

DISTRIBUTIONS = {
    "flashinfer": ("flashinfer-python", "flashinfer"),
    "deep_gemm": ("sgl-deep-gemm", "deep-gemm", "deep_gemm"),
    "tvm_ffi": ("apache-tvm-ffi",),
    "triton": ("triton",),
    "tilelang": ("tilelang",),
    "torch": ("torch",),
}
"""The distributions (first found wins) whose version is each field's (SGLang pins DeepGEMM as ``sgl-deep-gemm``)."""

ENGINES = {"sglang": "sglang", "vllm": "vllm"}
"""Engine name -> its distribution."""

_ARCH = re.compile(r"^(?:sm_?)?(\d+)\.?(\d)[af]?$")


def distribution_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def torch_cuda_version() -> str | None:
    """``torch.version.cuda`` of the torch on ``sys.path`` (None for a CPU build or no torch), without importing it."""
    package = _package_dir("torch")
    if package is None or not (package / "version.py").is_file():
        return None
    tree = ast.parse((package / "version.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "cuda" for t in targets) and isinstance(node.value, ast.Constant):
                return node.value.value if isinstance(node.value.value, str) else None
    return None


def installed_versions() -> dict[str, str | None]:
    """``{field: version or None}`` for :data:`VERSION_FIELDS`."""
    versions = {field: distribution_version(names) for field, names in DISTRIBUTIONS.items()}
    versions["cuda"] = torch_cuda_version()
    return {field: versions.get(field) for field in VERSION_FIELDS}


def engine_release(engine: str) -> str | None:
    """The installed release of ``engine`` (``sglang``, ``vllm``), or None."""
    return distribution_version((ENGINES.get(engine, engine),))


def normalize_arch(text: str) -> str:
    """``sm90``, ``sm_90``, ``sm90a``, ``9.0``, ``90`` -> ``sm90``; ValueError otherwise."""
    match = _ARCH.match(text.strip().lower())
    if not match:
        raise InvalidArgumentError(f"{text!r} is not a GPU architecture (expected e.g. sm90, sm_90a or 9.0)")
    return f"sm{match.group(1)}{match.group(2)}"


def gpu_arch() -> str | None:
    """``sm<major><minor>`` of CUDA device 0, or None without a CUDA device (or torch)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm{major}{minor}"
