"""Build the CUDA op ``gptq_marlin_repack`` from vLLM's source on a GPU machine, as a Python extension.

The GPU machines have torch and nvcc but no vLLM or sgl-kernel CUDA build and no internet, so the op's
source is carried in the ignored folder ``.gpu-cache/marlin/`` (``bin/marlin-oracle-source VLLM_CHECKOUT``
copies exactly the files ``gptq_marlin_repack.cu`` includes, paths kept relative to vLLM's ``csrc/``).
:func:`build` compiles it with ``torch.utils.cpp_extension.load`` next to two files made here:

* a stand-in ``core/registration.h`` (searched before vLLM's own): vLLM's source registers the op with
  its ``_C`` library's schema (``torch_bindings.cpp``, not carried); the stand-in turns those registration
  blocks into unused static functions, so the extension registers no operator at all;
* a pybind11 wrapper calling vLLM's ``gptq_marlin_repack`` C++ function directly, its prototype read from
  the carried source (vLLM versions differ: with or without the act-order ``perm``, with or without
  ``is_a_8bit``), with no ``perm`` and 4 bits, as the engines call it for MXFP4.

``repack(b_q_weight int32 [K/8, N] on CUDA, size_k, size_n) -> int32 [K/16, 2N]`` is the result.
Nothing of vLLM's is in this repository.
"""

import os
import re
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIR = Path(os.environ.get("MOEBAKE_MARLIN_SRC", REPO / ".gpu-cache" / "marlin"))
REPACK_SOURCE = "gptq_marlin_repack.cu"

REGISTRATION_STANDIN = r"""#pragma once
// moebake stand-in for vLLM's core/registration.h: registration blocks become unused functions.
#include <torch/library.h>
#define _CONCAT(A, B) A##B
#define CONCAT(A, B) _CONCAT(A, B)
#define _STRINGIFY(A) #A
#define STRINGIFY(A) _STRINGIFY(A)
#define TORCH_LIBRARY_EXPAND(NAME, MODULE) \
  [[maybe_unused]] static void CONCAT(moebake_unused_def_, __LINE__)(torch::Library & MODULE)
#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) \
  [[maybe_unused]] static void CONCAT(moebake_unused_impl_, __LINE__)(torch::Library & MODULE)
#define REGISTER_EXTENSION(NAME)
"""

_ARGUMENTS = {"b_q_weight": "b_q_weight", "perm": "perm", "size_k": "size_k", "size_n": "size_n", "num_bits": "4", "is_a_8bit": "false"}


def repack_source(source_dir: Path = SOURCE_DIR) -> Path | None:
    """The carried ``gptq_marlin_repack.cu`` (anywhere under ``source_dir``), or None."""
    found = sorted(source_dir.rglob(REPACK_SOURCE)) if source_dir.is_dir() else []
    return found[0] if found else None


def parameters(cu_text: str) -> list[tuple[str, str]]:
    """``[(C++ type, name)]`` of the host function ``torch::Tensor gptq_marlin_repack(...)`` defined in ``cu_text``."""
    match = re.search(r"torch::Tensor\s+gptq_marlin_repack\s*\(([^)]*)\)\s*\{", cu_text)
    if match is None:
        raise RuntimeError(f"no `torch::Tensor gptq_marlin_repack(...) {{` definition in {REPACK_SOURCE}")
    params = []
    for part in match.group(1).split(","):
        part = " ".join(part.split())
        name = re.search(r"(\w+)$", part).group(1)
        if name not in _ARGUMENTS:
            raise RuntimeError(f"{REPACK_SOURCE}: gptq_marlin_repack takes `{part}`, which this wrapper does not know")
        params.append((part[: -len(name)].strip(), name))
    return params


def wrapper_source(params: list[tuple[str, str]]) -> str:
    """The pybind11 wrapper for vLLM's host function with parameters ``params``."""
    prototype = ", ".join(f"{ctype} {name}" for ctype, name in params)
    call = ", ".join(_ARGUMENTS[name] for _, name in params)
    return f"""#include <torch/extension.h>
torch::Tensor gptq_marlin_repack({prototype});

torch::Tensor moebake_repack(torch::Tensor b_q_weight, int64_t size_k, int64_t size_n) {{
  torch::Tensor perm = torch::empty({{0}}, b_q_weight.options().dtype(torch::kInt));
  return gptq_marlin_repack({call});
}}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{
  m.def("repack", &moebake_repack, "vLLM's gptq_marlin_repack, no perm, 4 bits");
}}
"""


def build(source_dir: Path = SOURCE_DIR, build_dir: Path = Path("/tmp/moebake-marlin-oracle"), verbose: bool = True):
    """Compile the carried source for this machine's GPU; the loaded extension (its ``repack``)."""
    import torch
    from torch.utils import cpp_extension

    cu = repack_source(source_dir)
    if cu is None:
        raise FileNotFoundError(f"no {REPACK_SOURCE} under {source_dir} (run bin/marlin-oracle-source on a vLLM checkout)")
    shutil.rmtree(build_dir, ignore_errors=True)
    standin = build_dir / "standin"
    (standin / "core").mkdir(parents=True)
    (standin / "core" / "registration.h").write_text(REGISTRATION_STANDIN)
    wrapper = build_dir / "moebake_marlin_wrapper.cpp"
    wrapper.write_text(wrapper_source(parameters(cu.read_text())))
    # the .cu's own folder is searched first for "..." includes: take vLLM's registration.h out of the copy compiled
    tree = build_dir / "src"
    shutil.copytree(source_dir, tree, ignore=shutil.ignore_patterns("registration.h"))
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}" + ("a" if major >= 9 else "")
    roots = {p.parent for p in tree.rglob("*") if p.is_file()} | {tree}
    return cpp_extension.load(
        name="moebake_marlin_repack",
        sources=[str(wrapper), str(tree / cu.relative_to(source_dir))],
        extra_include_paths=[str(standin), *sorted(str(r) for r in roots)],
        extra_cuda_cflags=["-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}"],
        build_directory=str(build_dir),
        verbose=verbose,
    )
