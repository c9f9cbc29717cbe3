"""moebake installed read-only and run by a user who can write neither the package nor their home
(issue 29): numba finds no cache location for the compiled kernels, which then compile in memory,
with the same output bytes and one ``-v`` line saying so.

This box may run as root, which chmod does not stop, so the unwritable places are made so for
anyone: every ``__pycache__`` of the package copy is a regular file (no directory can be made there)
and HOME is a regular file too (no ``~/.cache`` under it); the copy is also chmod'ed read-only,
which is what stops a non-root user.
"""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import moebake
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.layouts.compiled import DISABLE_ENV

IN_MEMORY_LINE = (
    "debug: compiled kernels: no writable numba cache location (NUMBA_CACHE_DIR, the package's __pycache__, "
    "the user cache); compiling them in memory for this run"
)


@pytest.fixture(scope="module")
def read_only_install(tmp_path_factory):
    """A copy of the moebake package that no one can write a cache beside, and a HOME no one can write under."""
    root = tmp_path_factory.mktemp("readonly")
    package = shutil.copytree(Path(moebake.__file__).parent, root / "site" / "moebake", ignore=shutil.ignore_patterns("__pycache__"))
    directories = [package, *(p for p in package.rglob("*") if p.is_dir())]
    for directory in directories:
        (directory / "__pycache__").write_bytes(b"")
    for path in [*package.rglob("*"), package]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    home = root / "home"
    home.write_bytes(b"")
    yield root / "site", home
    for path in [package, *package.rglob("*")]:
        if path.is_dir():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def run_read_only(site: Path, home: Path, cwd: Path, *args):
    environment = {
        key: value for key, value in os.environ.items() if key not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME", DISABLE_ENV, "PYTHONPATH")
    }
    environment.update(PYTHONPATH=str(site), HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "moebake", *map(str, args)], cwd=cwd, env=environment, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_convert_from_a_read_only_install_compiles_in_memory(gpt_oss_tiny, tmp_path, read_only_install, workers):
    site, home = read_only_install
    reference = convert(gpt_oss_tiny, tmp_path / "reference", ConvertOptions("sm90-cutlass"), progress=False)
    done = run_read_only(
        site,
        home,
        tmp_path,
        "-v",
        "convert",
        gpt_oss_tiny,
        tmp_path / "out",
        "--target",
        "sm90-cutlass",
        "--quiet",
        "--workers",
        workers,
        "--writers-per-device",
        workers,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines().count(IN_MEMORY_LINE) == 1, done.stderr
    assert sum("compiled kernels" in line for line in done.stderr.splitlines()) == 1
    # the copy ran (not the installed moebake), and wrote nothing beside itself
    assert not any(p.is_dir() for p in site.rglob("__pycache__"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in (tmp_path / "reference").iterdir())
    for name in reference.files:
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name
    quiet = run_read_only(site, home, tmp_path, "convert", gpt_oss_tiny, tmp_path / "quiet", "--target", "sm90-cutlass", "--quiet")
    assert quiet.returncode == 0 and "compiled kernels" not in quiet.stderr, quiet.stderr


def test_a_writable_cache_is_still_used(tmp_path, gpt_oss_tiny, read_only_install):
    """NUMBA_CACHE_DIR, where writable, keeps the on-disk cache (and no in-memory line)."""
    site, home = read_only_install
    environment = {key: value for key, value in os.environ.items() if key not in ("XDG_CACHE_HOME", DISABLE_ENV)}
    environment.update(PYTHONPATH=str(site), HOME=str(home), NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    done = subprocess.run(
        [sys.executable, "-m", "moebake", "-v", "convert", str(gpt_oss_tiny), str(tmp_path / "out"), "--target", "sm90-cutlass", "--quiet"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "compiled kernels" not in done.stderr
    assert any(p.suffix == ".nbi" for p in (tmp_path / "numba-cache").rglob("*"))
