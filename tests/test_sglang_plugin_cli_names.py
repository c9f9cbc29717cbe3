"""The SGLang plugin registers ``--quantization moebake`` on every SGLang release of the matrix.

A real SGLang 0.5.17 server (issue 35, ``bench/real_server.py``) refused ``--quantization moebake``: the plugin's
``register`` imported the CLI's choices from ``sglang.srt.arg_groups.choices``, a module SGLang added in 0.5.20, so
``load_plugins`` logged ``ModuleNotFoundError`` and argparse knew no ``moebake``. Here the module ``register`` imports
them from must bind both names at module level in each release's own tree (fetched from PyPI once,
``tests/engine_releases/trees.py``).
"""

import ast
import inspect
import os
import sys
from pathlib import Path

import pytest

import moebake.engines.sglang as plugin
from moebake.schema import release_matrix

REPO = Path(__file__).resolve().parents[1]
NAMES = {"QUANTIZATION_CHOICES", "add_quantization_method_choices"}


def _import_source() -> str:
    """The module ``register`` imports the CLI choice names from."""
    for node in ast.walk(ast.parse(inspect.getsource(plugin.register))):
        if isinstance(node, ast.ImportFrom) and NAMES <= {alias.name for alias in node.names}:
            return node.module
    raise AssertionError("register() no longer imports QUANTIZATION_CHOICES and add_quantization_method_choices")


def module_binds(tree: Path, module: str) -> set[str]:
    """The top-level names ``module``'s file in ``tree`` binds (assignments, imports, definitions)."""
    node = ast.parse((tree / (module.replace(".", "/") + ".py")).read_text())
    bound = set()
    for item in node.body:
        if isinstance(item, ast.ImportFrom | ast.Import):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in item.names}
        elif isinstance(item, ast.Assign):
            bound |= {target.id for target in item.targets if isinstance(target, ast.Name)}
        elif isinstance(item, ast.FunctionDef | ast.ClassDef):
            bound.add(item.name)
    return bound


def test_the_check_can_fail(tmp_path):
    """A tree whose module lacks the names (0.5.17's tree has no sglang/srt/arg_groups/choices.py at all)."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x.py").write_text("from a import QUANTIZATION_CHOICES\ndef other(): pass\n")
    assert NAMES - module_binds(tmp_path, "m.x") == {"add_quantization_method_choices"}


@pytest.mark.parametrize("release", list(release_matrix.MATRIX["sglang"]))
def test_register_imports_the_cli_names_from_where_the_release_has_them(release):
    sys.path.insert(0, str(REPO))
    from tests.engine_releases import trees

    try:
        tree = trees.release_tree("sglang", release)
    except OSError as err:  # no network: only where the engines are not required
        if os.environ.get("MOEBAKE_REQUIRE_ENGINES") == "1":
            raise
        pytest.skip(f"cannot fetch sglang {release}'s tree: {err}")
    module = _import_source()
    assert (tree / (module.replace(".", "/") + ".py")).is_file(), f"sglang {release} has no {module}"
    assert NAMES <= module_binds(tree, module), f"sglang {release}'s {module} lacks {NAMES - module_binds(tree, module)}"
