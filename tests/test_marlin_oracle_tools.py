"""The CPU side of the Marlin GPU oracle: ``bin/marlin-oracle-source`` copies exactly what ``gptq_marlin_repack.cu``
includes, and ``tests/gpu/marlin_oracle.py`` wraps whichever host signature the carried vLLM source has.

The checkouts here are made up (a few lines each, not vLLM's code); the GPU build itself runs on the device
(``bin/gpu-harness marlin-oracle``)."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "gpu"))
import marlin_oracle  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OLD = (
    "torch::Tensor gptq_marlin_repack(torch::Tensor& b_q_weight, torch::Tensor& perm,\n    int64_t size_k, int64_t size_n,\n"
    "    int64_t num_bits) {"
)
NEW = "torch::Tensor gptq_marlin_repack(torch::Tensor& b_q_weight, int64_t size_k,\n    int64_t size_n, int64_t num_bits, bool is_a_8bit) {"


@pytest.mark.parametrize(
    "signature, call",
    [
        (OLD, "gptq_marlin_repack(b_q_weight, perm, size_k, size_n, 4)"),
        (NEW, "gptq_marlin_repack(b_q_weight, size_k, size_n, 4, false)"),
    ],
)
def test_the_wrapper_calls_the_carried_signature_without_perm_at_4_bits(signature, call):
    params = marlin_oracle.parameters("torch::Tensor gptq_marlin_repack_meta(int x);\n" + signature + "\n  return x;\n}")
    source = marlin_oracle.wrapper_source(params)
    assert call in source and "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in source


def test_the_wrapper_refuses_an_unknown_parameter():
    with pytest.raises(RuntimeError, match="does not know"):
        marlin_oracle.parameters("torch::Tensor gptq_marlin_repack(torch::Tensor& b_q_weight, int64_t group) {")


def test_source_script_copies_the_include_closure_only(tmp_path):
    csrc = tmp_path / "vllm" / "csrc"
    files = {
        "quantization/gptq_marlin/gptq_marlin_repack.cu": '#include "marlin.cuh"\n#include "core/registration.h"\n#include <cuda.h>\n',
        "quantization/gptq_marlin/marlin.cuh": '#include "../../core/math.hpp"\n#include "missing.h"\n',
        "core/registration.h": "#pragma once\n",
        "core/math.hpp": "#pragma once\n",
        "quantization/gptq_marlin/gptq_marlin.cu": "// not included\n",
    }
    for rel, text in files.items():
        (csrc / rel).parent.mkdir(parents=True, exist_ok=True)
        (csrc / rel).write_text(text)
    dest = tmp_path / "dest"
    (dest / "stale.txt").parent.mkdir(parents=True)
    (dest / "stale.txt").write_text("left from before")
    result = subprocess.run(
        [sys.executable, str(REPO / "bin" / "marlin-oracle-source"), str(tmp_path / "vllm"), str(dest)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == [
        "SOURCE.txt",
        "core/math.hpp",
        "core/registration.h",
        "quantization/gptq_marlin/gptq_marlin_repack.cu",
        "quantization/gptq_marlin/marlin.cuh",
    ]
    assert "not found (left to the compiler's include path): missing.h" in result.stdout
    assert marlin_oracle.repack_source(dest) == dest / "quantization/gptq_marlin/gptq_marlin_repack.cu"


def test_source_script_refuses_a_folder_that_is_not_a_vllm_checkout(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "bin" / "marlin-oracle-source"), str(tmp_path), str(tmp_path / "d")], capture_output=True, text=True
    )
    assert result.returncode == 2 and "is not a vLLM source checkout" in result.stderr and not (tmp_path / "d").exists()
