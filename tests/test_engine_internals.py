"""Every private name of another package that moebake touches goes through one module per engine.

``moebake/engines/sglang/internals.py`` and ``moebake/engines/vllm/internals.py`` are the only modules that may
read, set or import a private name (``_x``) that moebake does not define itself: an engine release that moves one
then breaks in one place, which the release matrix (``tests/test_release_matrix.py``) runs against every release.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "moebake"
INTERNALS = {PACKAGE / "engines" / "sglang" / "internals.py", PACKAGE / "engines" / "vllm" / "internals.py"}


ALLOWED = {
    "_exit": "os._exit: how a forked worker leaves without running its parent's exit handlers",
    "_run_finalizers": "multiprocessing.util._run_finalizers: the semaphore finalizers a fast exit would skip",
    "_time": "tqdm's own clock (tqdm.update reads it), for a bar whose rate starts at the first byte",
    "_moebake": "moebake's marker on the function it installs into FlashInfer's module",
}
"""Private names of the standard library and non-engine libraries, each with why it is touched."""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _modules():
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def _defined_by_moebake(modules) -> set[str]:
    """Private names moebake defines: its functions, classes, module globals and attributes it assigns."""
    names = set()
    for _, tree in modules:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            names.add(leaf.id)
                        elif isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id in ("self", "cls"):
                            names.add(leaf.attr)
    return {name for name in names if _private(name)}


def _foreign_private_uses(path: Path, tree: ast.AST, ours: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("moebake"):
            found += [f"{path.name}:{node.lineno} imports {node.module}.{a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in ours:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} touches .{node.attr}")
    return found


def test_only_the_internals_modules_touch_another_packages_private_names():
    modules = _modules()
    ours = _defined_by_moebake(modules) | set(ALLOWED)
    found = [use for path, tree in modules if path not in INTERNALS for use in _foreign_private_uses(path, tree, ours)]
    assert not found, "private names of engines or libraries outside engines/*/internals.py:\n" + "\n".join(found)


def test_the_check_sees_a_private_engine_name():
    """The check can fail: SGLang's ``layer._mxfp4_backend`` set outside the internals module is caught."""
    tree = ast.parse("def f(layer):\n    layer._mxfp4_backend = 'marlin'\n")
    assert _foreign_private_uses(PACKAGE / "x.py", tree, set()) == ["x.py:2 touches ._mxfp4_backend"]
