"""``moebake convert --workers`` started from a folder that holds a ``moebake/`` directory (the folder a clone
was made in, with moebake installed in editable mode, as ``bin/demo`` does): the workers import the installed
moebake, not that folder (issue 37: they imported it as a namespace package, and every worker failed)."""

import os
import subprocess
import sys
from pathlib import Path

import moebake
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert

PACKAGE_PARENT = Path(moebake.__file__).resolve().parent.parent

EDITABLE_FINDER = f'''
import importlib.machinery, importlib.util, sys

class EditableFinder:
    """As setuptools' editable install does: a finder after the path finder, so sys.path is searched first."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "moebake":
            return importlib.util.spec_from_file_location(
                "moebake", {str(PACKAGE_PARENT / "moebake" / "__init__.py")!r},
                submodule_search_locations=[{str(PACKAGE_PARENT / "moebake")!r}])
        return None

sys.meta_path.insert(sys.meta_path.index(importlib.machinery.PathFinder) + 1, EditableFinder)
'''

CONSOLE_SCRIPT = """import sys
from moebake.cli import run
if __name__ == "__main__":
    sys.exit(run())
"""


def test_workers_started_beside_a_moebake_folder_import_the_installed_package(gpt_oss_tiny, tmp_path):
    site, scripts, here = tmp_path / "site", tmp_path / "bin", tmp_path / "here"
    for directory in (site, scripts, here / "moebake" / "moebake"):  # ./moebake: a clone's root (no __init__.py)
        directory.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(EDITABLE_FINDER)
    (scripts / "moebake").write_text(CONSOLE_SCRIPT)  # as pip's console script: sys.path[0] is its folder, not the cwd
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["PYTHONPATH"] = str(site)
    done = subprocess.run(
        [
            sys.executable,
            str(scripts / "moebake"),
            "convert",
            str(gpt_oss_tiny),
            "out",
            "--target",
            "sm90-cutlass",
            "--quiet",
            "--workers",
            "2",
            "--writers-per-device",
            "2",
        ],
        cwd=here,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert sorted(p.name for p in here.iterdir()) == ["moebake", "out"]
    reference = convert(gpt_oss_tiny, tmp_path / "reference", ConvertOptions("sm90-cutlass"), progress=False)
    for name in reference.files:
        assert (here / "out" / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name
