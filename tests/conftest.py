"""Shared fixtures: small synthetic checkpoints in exact source formats."""

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from moebake.synthetic import write_gpt_oss

ENGINE_PACKAGES = {"sglang": "0.5.23", "vllm": "0.33.0", "flashinfer-python": "0.7.2.post1"}
"""The oracles' packages and versions the CPU suite runs against; ``bin/test`` requires them all
(``MOEBAKE_REQUIRE_ENGINES=1``): their tests skip where one is absent, so CI must not lack one."""


def _installed(package: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class _HidingFinder:
    """A ``sys.path`` entry's finder that does not find the ``hidden`` top-level packages (the rest as before)."""

    def __init__(self, finder, hidden: set[str]):
        self.finder, self.hidden = finder, hidden

    def find_spec(self, name, target=None):
        return None if name.split(".")[0] in self.hidden else self.finder.find_spec(name, target)

    def invalidate_caches(self):
        self.finder.invalidate_caches()


def _hide_installed(names: str) -> None:
    """In a release-matrix run, make installed top-level packages that the release's environment would lack (named by
    ``tests/engine_releases/prove.py``) unimportable from site-packages."""
    import importlib.machinery
    import sys

    hidden = {name for name in names.split(",") if name}
    if not hidden:
        return
    for entry in [e for e in sys.path if e.endswith("site-packages")]:
        finder = sys.path_importer_cache.get(entry) or importlib.machinery.FileFinder(
            entry, *importlib.machinery._bootstrap_external._get_supported_file_loaders()
        )
        sys.path_importer_cache[entry] = _HidingFinder(finder, hidden)


def pytest_configure(config):
    """A release-matrix discovery run (``tests/engine_releases/prove.py``) tries one rule for a release the matrix does
    not hold yet: every (target, source) of that rule is taken as that release's, so the oracles test the rule."""
    import os

    _hide_installed(os.environ.get("MOEBAKE_ORACLE_HIDE", ""))
    rule, engine = os.environ.get("MOEBAKE_ORACLE_RULE"), os.environ.get("MOEBAKE_ORACLE_ENGINE", "")
    if rule and "==" in engine:
        from moebake.schema import release_matrix
        from moebake.schema.engine_release import EngineRelease
        from moebake.schema.profiles import RULES

        name, version = engine.split("==")
        release = EngineRelease(name, version)
        release_matrix.MATRIX[name][release.version] = release_matrix.MatrixRow(
            release, os.environ.get("MOEBAKE_ORACLE_FLASHINFER") or None, dict.fromkeys(RULES[rule].targets, rule)
        )


def pytest_sessionstart(session):
    import os

    if os.environ.get("MOEBAKE_REQUIRE_ENGINES") != "1":
        return
    wrong = [
        f"{package} {_installed(package) or 'absent'} (want {version})"
        for package, version in ENGINE_PACKAGES.items()
        if _installed(package) != version
    ]
    if wrong:
        pytest.exit(f"MOEBAKE_REQUIRE_ENGINES=1 but {', '.join(wrong)}: run bin/setup", returncode=2)


def pytest_report_header(config):
    """The machine's numerics: CPU, torch's and numpy's BLAS (the suite must pass on MKL and OpenBLAS alike)."""
    import platform
    import re

    import numpy

    build = torch.__config__.show()
    torch_blas, capability = (
        next(iter(re.findall(pattern, build)), "unknown") for pattern in (r"BLAS_INFO=([^,\s]+)", r"CPU capability usage: (\S+)")
    )
    numpy_blas = numpy.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    cpu = (
        next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    engines = ", ".join(f"{p} {_installed(p) or 'absent'}" for p in ENGINE_PACKAGES)
    return [
        f"cpu: {cpu}",
        f"torch {torch.__version__}: BLAS {torch_blas}, CPU kernels {capability}; numpy {numpy.__version__}: BLAS "
        f"{numpy_blas.get('name', 'unknown')} {numpy_blas.get('version', '')}".rstrip(),
        f"oracles: {engines}",
    ]


# A GPT-OSS shape whose dims need padding: H=160 -> 256, I=96 -> 128.
TINY = {"num_layers": 2, "num_experts": 3, "hidden": 160, "intermediate": 96, "vocab": 64}


@pytest.fixture(scope="session")
def gpt_oss_tiny(tmp_path_factory):
    """A 2-layer, 3-expert GPT-OSS checkpoint (one shard per layer), read-only for tests."""
    return write_gpt_oss(tmp_path_factory.mktemp("src") / "gpt-oss-tiny", **TINY)


@pytest.fixture()
def gpt_oss_copy(tmp_path, gpt_oss_tiny):
    """A private copy of the tiny checkpoint that a test may damage."""
    import shutil

    return shutil.copytree(gpt_oss_tiny, tmp_path / "src")


def load_bench(name: str):
    """The script ``bench/NAME`` as a module, imported as ``python bench/NAME`` runs it (``bench/`` first on the path,
    where its shared ``benchkit`` is)."""
    import importlib.util
    import sys

    bench = Path(__file__).resolve().parent.parent / "bench"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), bench / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def benchkit():
    """``bench/benchkit.py``, the benchmarks' shared helpers; the tests use its page-cache ones
    (``evict_from_page_cache``) and its I/O accounting (``io_read_bytes``) too."""
    return load_bench("benchkit.py")


def resident_pages(path, start: int, stop: int) -> int:
    """Pages of ``path`` overlapping bytes ``[start, stop)`` that are in the page cache (Linux ``mincore`` over a
    read-only mapping, which reads nothing); skips the test where mincore fails."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        view = np.frombuffer(mapping, dtype=np.uint8)
        pages = -(-size // mmap.PAGESIZE)
        vector = (ctypes.c_ubyte * pages)()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vector) != 0:
            pytest.skip(f"mincore failed: {os.strerror(ctypes.get_errno())}")
        del view
        first, last = start // mmap.PAGESIZE, -(-stop // mmap.PAGESIZE)
        return sum(vector[i] & 1 for i in range(first, min(last, pages)))
    finally:
        mapping.close()


def random_u8(*shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def assert_parameters_equal(plugin: torch.nn.Module, stock, what: str) -> list[str]:
    """Every parameter of ``plugin`` byte for byte equal (dtype, shape, bytes) to ``stock``'s (a module, or its
    ``{name: tensor}``), on the same device, and no other; the names, sorted. ``what`` names ``stock`` in a failure."""
    stock_params = dict(stock.named_parameters()) if isinstance(stock, torch.nn.Module) else dict(stock)
    checked = []
    for name, tensor in plugin.named_parameters():
        assert name in stock_params, f"{name}: not a parameter of {what}"
        reference = stock_params[name]
        assert (tensor.dtype, tensor.shape, tensor.device) == (reference.dtype, reference.shape, reference.device), name
        assert torch.equal(tensor.reshape(-1).view(torch.uint8), reference.reshape(-1).view(torch.uint8)), f"{name} differs from {what}"
        checked.append(name)
    assert sorted(checked) == sorted(stock_params), f"{sorted(checked)} != {what}'s {sorted(stock_params)}"
    return sorted(checked)


def load_all(directory) -> dict:
    """Every tensor of every shard in a checkpoint directory, via safetensors' own reader."""
    tensors = {}
    for shard in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


@pytest.fixture(scope="session")
def sm90_gpu():
    """The CUDA device, with FlashInfer's SM90 fused-MoE module ready; skips without an SM90 GPU or FlashInfer."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 GPU")
    pytest.importorskip("flashinfer")
    from moebake.serve.flashinfer_ops import sm90_moe_ops
    from moebake.serve.jit.flashinfer_build import ensure_flashinfer_sm90_moe

    sm90_moe_ops()  # moebake's runtime: its own getter of the reduced module
    # The engines' own code run by the GPU tests (stock vLLM's post-load interleave, ...) calls FlashInfer's getter,
    # whose full module takes 30+ minutes to build: route it to the reduced module for the test session.
    ensure_flashinfer_sm90_moe()
    return torch.device("cuda")


@pytest.fixture(scope="session")
def vllm_on_sm90(sm90_gpu):
    """``engine_oracles.vllm_oracle`` with vLLM's general plugins (moebake's) loaded, for the vLLM GPU tests; skips
    without an SM90 GPU, FlashInfer or vLLM 0.33.0 (on the device: ``bin/gpu-wheels --vllm``, carry ``.whl-vllm``)."""
    vllm_oracle = pytest.importorskip("engine_oracles.vllm_oracle")
    if not vllm_oracle.vllm_installed():
        pytest.skip(f"vllm {vllm_oracle.VLLM_VERSION} is not installed (bin/gpu-wheels --vllm, carry .whl-vllm)")
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    return vllm_oracle
