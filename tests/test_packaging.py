"""What a user installs: the license, and the two sizes of bin/setup (light for bin/demo, full for bin/test)."""

import hashlib
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_the_apache_2_0_text_pyproject_names():
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_bytes()
    # the canonical https://www.apache.org/licenses/LICENSE-2.0.txt
    assert hashlib.md5(text).hexdigest() == "3b83ef96387f14655fc854ddc3c6bd57"
    assert b"Apache License\n                           Version 2.0, January 2004" in text


STUB_PYTHON = """#!/usr/bin/env bash
# .venv/bin/python for bin/setup's test: logs pip commands (installing nothing), reports nothing installed; a pip
# command matching the extended regex $SETUP_PIP_FAILS fails (as pip does for a distribution it cannot find)
if [ "$1" = -m ] && [ "$2" = pip ]; then
  echo "pip ${*:3}" >> "$SETUP_LOG"
  if [ -n "$SETUP_PIP_FAILS" ] && echo "${*:3}" | grep -qE "$SETUP_PIP_FAILS"; then exit 1; fi
  exit 0
fi
case "$*" in *print*) echo stub ;; *) exit 1 ;; esac
"""


def setup_commands(tmp_path: Path, *args: str, pip_fails: str = "") -> list[str]:
    """The pip commands ``bin/setup ARGS`` runs in a copy of the repo whose .venv has nothing installed
    (a stub python that logs pip instead of running it): what each size installs, without a network."""
    import shutil
    import subprocess

    repo = tmp_path / "repo"
    (repo / "bin").mkdir(parents=True)
    for name in ("bin/setup", "bin/pip-noise-filter", "pyproject.toml"):
        shutil.copy2(ROOT / name, repo / name)
    python = repo / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STUB_PYTHON)
    python.chmod(0o755)
    log = tmp_path / "pip.log"
    log.write_text("")
    done = subprocess.run(
        ["bash", str(repo / "bin" / "setup"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "SETUP_LOG": str(log), "SETUP_PIP_FAILS": pip_fails},
    )
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()


CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU-only wheel index


def test_light_setup_installs_moebake_and_cpu_torch_only(tmp_path):
    """Issue 37: it ran `pip install torch==2.13.0`, which on plain PyPI brings the CUDA wheels. Only a CPU build can
    match: a torch+cpu wheel pip has at hand (a local wheel, no download), else PyTorch's CPU wheel index."""
    commands = setup_commands(tmp_path, "--light")
    assert commands == ["pip -q --disable-pip-version-check install torch==2.13.0+cpu", "pip -q --disable-pip-version-check install -e ."]
    assert (tmp_path / "repo" / ".venv" / ".moebake-installed").read_text().endswith(" light\n")
    fallback = setup_commands(tmp_path / "no-local-wheel", "--light", pip_fails=r"torch==2\.13\.0\+cpu$")
    assert fallback == [
        "pip -q --disable-pip-version-check install torch==2.13.0+cpu",
        f"pip -q --disable-pip-version-check install torch==2.13.0 --index-url {CPU_INDEX}",
        "pip -q --disable-pip-version-check install -e .",
    ]
    readme = (ROOT / "README.md").read_text()
    assert f"pip install torch==2.13.0 --index-url {CPU_INDEX}" in readme  # the user's command: the same torch, the same index


def test_the_installed_torch_is_the_cpu_build():
    """The .venv bin/setup made (either size: the full one adds to the light one) holds torch's CPU build, and no CUDA
    wheel came with anything installed after it."""
    import importlib.metadata
    import re
    import sys

    import pytest
    import torch

    if not (Path(sys.prefix) / ".moebake-installed").is_file():
        pytest.skip("not running in a .venv made by bin/setup")
    assert torch.version.cuda is None and torch.__version__.endswith("+cpu"), torch.__version__
    cuda = sorted(
        name
        for d in importlib.metadata.distributions()
        if (name := d.metadata["Name"] or "") and re.match(r"(nvidia-(?!ml-py)|triton$|cuda-)", name.lower())
    )
    assert cuda == [], cuda


def test_full_setup_adds_the_test_tools_and_the_engines_oracles(tmp_path):
    commands = setup_commands(tmp_path)
    assert commands[:2] == [
        "pip -q --disable-pip-version-check install torch==2.13.0+cpu",
        "pip -q --disable-pip-version-check install -e .[test,bench]",
    ]
    installed = " ".join(commands)
    for package in ("flashinfer-python==0.7.2.post1", "vllm==0.33.0", "sglang==0.5.23"):
        assert f"--no-deps {package}" in installed, package
    assert (ROOT / "bin" / "test").read_text().count("\nbin/setup\n") == 1  # bin/test (and so CI) runs the full size
    assert "\nbin/setup --light\n" in (ROOT / "bin" / "demo").read_text()


def test_pip_resolver_noise_about_the_partial_engine_installs_is_filtered_and_nothing_else():
    import subprocess

    noise = [
        "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed. "
        "This behaviour is the source of the following dependency conflicts.",
        "sglang 0.5.23 requires sgl-kernel==0.3.9, which is not installed.",
        "xgrammar 0.2.8 requires triton, which is not installed.",
        "vllm 0.33.0 requires torch==2.14.0, but you have torch 2.13.0 which is incompatible.",
        "flashinfer-python 0.7.2.post1 requires nvidia-cudnn-frontend>=1.13.0, which is not installed.",
        "compressed-tensors 0.18.0 requires frozendict, which is not installed.",
        # specifiers with commas (issue 37: these leaked through)
        "vllm 0.33.0 requires mcp<3.0.0,>=2.2.0, which is not installed.",
        "sglang 0.5.23 requires torch<2.15,>=2.14, but you have torch 2.13.0+cpu which is incompatible.",
    ]
    kept = [
        "requests 2.0 requires urllib3<3, which is not installed.",
        "ERROR: No matching distribution found for foo",
        "requests 2.0 requires urllib3<3,>=1.21.1, which is not installed.",
    ]
    done = subprocess.run(
        [str(ROOT / "bin" / "pip-noise-filter")], input="\n".join(noise + kept) + "\n", capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and done.stdout.splitlines() == kept


BLOCK_ENGINES = """import sys
class _NoEngines:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sglang", "vllm", "flashinfer", "triton", "sgl_kernel"):
            raise ImportError(f"{name} is blocked: the light install has no engine package")
sys.meta_path.insert(0, _NoEngines())
"""


def test_demo_runs_without_any_engine_package(tmp_path):
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_ENGINES)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    blocked = subprocess.run([sys.executable, "-c", "import sglang"], capture_output=True, text=True, env=env, timeout=60)
    assert blocked.returncode == 1 and "blocked" in blocked.stderr
    done = subprocess.run(
        [sys.executable, "-m", "moebake", "demo", "--workdir", str(tmp_path / "demo")], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "verify        checksums, index and headers ok" in done.stdout
    assert (
        "writing example GPT-OSS checkpoint to "
        f"{tmp_path / 'demo' / 'gpt-oss-mini'} (2 layers, 4 experts, hidden 2880, "
        "intermediate 2880)\n"
    ) in done.stdout
    assert "activation    swiglu_oai (alpha 1.702, beta 1.0, limit 7.0)\n" in done.stdout
    assert not any(mark in done.stdout for mark in "{}'"), done.stdout  # issue 37: it printed Python dicts
    assert "resume:" not in done.stderr and "Traceback" not in done.stderr


def test_pyproject_extras_pin_exactly_the_versions_the_code_is_proven_for():
    """The extras a user installs are the span of engine releases the release matrix proves (each serving some bake)
    and the FlashInfer the runtime's reduced module is written for (pyproject is read as text: no packaging needed)."""
    from moebake.schema.profiles import serving_releases
    from moebake.serve.jit.flashinfer_build import TESTED_FLASHINFER_VERSIONS

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for engine in ("sglang", "vllm"):
        proven = serving_releases(engine)
        assert extras[engine] == [f"{engine}>={proven[0].version},<={proven[-1].version}"]
    assert extras["gpu"] == [f"flashinfer-python=={v}" for v in TESTED_FLASHINFER_VERSIONS]
