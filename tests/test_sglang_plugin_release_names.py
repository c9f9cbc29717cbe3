"""Every SGLang name the plugin imports exists in every SGLang release of the matrix.

A real SGLang 0.5.17 server (issue 35, ``bench/real_server.py``) refused bakes twice where the CPU oracles had passed:
the plugin's ``register`` imported the ``--quantization`` choices from ``sglang.srt.arg_groups.choices`` (added in
0.5.20), so argparse knew no ``moebake``; then its GPU refusal imported ``runtime_context.get_platform`` (added in
0.5.19). Here each ``from sglang... import NAME`` in ``moebake/engines/sglang/`` must find NAME bound at the top of
that module (or as its submodule) in each release's own tree, fetched from PyPI once (``tests/engine_releases/trees.py``);
where :mod:`moebake.engines.sglang.internals` tries a newer release's name and falls back on ``ImportError``, one of
the two must resolve.
"""

import ast
import os
import sys
from pathlib import Path

import pytest

from moebake.schema import release_matrix

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "moebake" / "engines" / "sglang"


Import = tuple[str, int, str, list[str]]
"""``(file, line, module, names)`` of one ``from sglang... import``."""


def _sglang_imports(nodes, file: str) -> list[Import]:
    return [
        (file, node.lineno, node.module, [alias.name for alias in node.names])
        for root in nodes
        for node in ast.walk(root)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sglang"
    ]


def plugin_imports() -> list[list[list[Import]]]:
    """Every ``from sglang... import`` in the plugin (function-level ones too), as requirements: each a list of
    alternatives, each alternative the imports that must all resolve. An import stands alone; a ``try:`` whose handler
    catches ``ImportError`` offers its body's imports or else its handler's (where a release moved a name)."""
    requirements = []
    for path in sorted(PLUGIN.glob("*.py")):
        tree = ast.parse(path.read_text())
        guarded = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
            ):
                body = _sglang_imports(node.body, path.name)
                handlers = _sglang_imports(node.handlers, path.name)
                if body:
                    requirements.append([body, handlers])
                    guarded |= {(i[1], i[2]) for i in body + handlers}
        requirements += [[[i]] for i in _sglang_imports([tree], path.name) if (i[1], i[2]) not in guarded]
    return requirements


def top_level_names(path: Path) -> set[str]:
    """Names a module binds at its top level (also inside top-level ``if``/``try``): imports, assignments, definitions."""
    bound = set()
    for item in ast.parse(path.read_text()).body:
        for node in ast.walk(item) if isinstance(item, ast.If | ast.Try) else [item]:
            if isinstance(node, ast.ImportFrom | ast.Import):
                bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
            elif isinstance(node, ast.Assign):
                bound |= {target.id for target in node.targets if isinstance(target, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                bound.add(node.target.id)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
    return bound


def missing_names(tree: Path, module: str, names: list[str]) -> list[str]:
    """Which of ``names`` ``from module import ...`` would not find in ``tree`` (the module's own file, or submodules)."""
    base = tree / module.replace(".", "/")
    source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    if not source.is_file() and not base.is_dir():
        return list(names)
    bound = top_level_names(source) if source.is_file() else set()
    return [name for name in names if name not in bound and not (base / f"{name}.py").is_file() and not (base / name).is_dir()]


def test_the_check_can_fail(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x.py").write_text("from a import A\nif True:\n    B = 1\ndef f(): pass\n")
    (tmp_path / "m" / "sub.py").write_text("")
    assert missing_names(tmp_path, "m.x", ["A", "B", "f", "get_platform"]) == ["get_platform"]
    assert missing_names(tmp_path, "m", ["sub", "other"]) == ["other"]
    assert missing_names(tmp_path, "m.arg_groups.choices", ["QUANTIZATION_CHOICES"]) == ["QUANTIZATION_CHOICES"]


def test_the_plugin_imports_what_the_scan_reads():
    modules = {i[2] for requirement in plugin_imports() for alternative in requirement for i in alternative}
    assert {"sglang.srt.server_args", "sglang.srt.arg_groups.choices", "sglang.srt.layers.quantization.mxfp4"} <= modules


def release_tree(release: str) -> Path:
    """SGLang ``release``'s Python tree (fetched once, then cached); a skip without the network, unless the engines
    are required."""
    sys.path.insert(0, str(REPO))
    from tests.engine_releases import trees

    try:
        return trees.release_tree("sglang", release)
    except OSError as err:  # no network: only where the engines are not required
        if os.environ.get("MOEBAKE_REQUIRE_ENGINES") == "1":
            raise
        pytest.skip(f"cannot fetch sglang {release}'s tree: {err}")


@pytest.mark.parametrize("release", list(release_matrix.MATRIX["sglang"]))
def test_every_plugin_import_exists_in_the_release(release):
    tree = release_tree(release)
    problems = []
    for requirement in plugin_imports():
        gaps = [
            [
                f"{file}:{line} from {module} import {missing}"
                for file, line, module, names in alternative
                if (missing := missing_names(tree, module, names))
            ]
            for alternative in requirement
        ]
        if all(gaps):  # no alternative resolves in this release
            problems += [" or ".join("; ".join(gap) for gap in gaps)]
    assert not problems, f"sglang {release} lacks:\n" + "\n".join(problems)


def test_the_plugin_serves_a_gpt_oss_marlin_bake_in_sglang_0_5_17():
    """The release the real server runs (``bench/real_server.py``): the plugin's ``sm90-marlin`` GPT-OSS layer in
    SGLang 0.5.17's own ``FusedMoE`` equals stock 0.5.17's Marlin preparation of the source, and refuses another GPU
    (``tests/test_sglang_plugin_targets.py``, run with 0.5.17's tree and its FlashInfer's first on ``PYTHONPATH``, as
    ``tests/engine_releases/prove.py`` runs the oracles)."""
    import subprocess

    sys.path.insert(0, str(REPO))
    from tests.engine_releases import prove

    try:
        env = prove.release_env("sglang", "0.5.17")
    except OSError as err:
        if os.environ.get("MOEBAKE_REQUIRE_ENGINES") == "1":
            raise
        pytest.skip(f"cannot fetch sglang 0.5.17's tree: {err}")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_sglang_plugin_targets.py",
            "-k",
            "sm90-marlin/gpt-oss",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:]


def iterator_gaps(tree: Path) -> list[str]:
    """What the plugin's wrap of SGLang's safetensors iterators (``internals.wrap_safetensors_iterators``) would not
    find in ``tree``: each name bound in ``model_loader/loader.py``, and defined in ``model_loader/weight_utils.py``
    with ``hf_weights_files`` first and the options the wrapper reads."""
    from moebake.engines.sglang.internals import SAFETENSORS_ITERATOR_OPTIONS, SAFETENSORS_ITERATORS

    loader = tree / "sglang" / "srt" / "model_loader" / "loader.py"
    utils = tree / "sglang" / "srt" / "model_loader" / "weight_utils.py"
    bound = top_level_names(loader) if loader.is_file() else set()
    defined = (
        {node.name: [a.arg for a in node.args.args] for node in ast.parse(utils.read_text()).body if isinstance(node, ast.FunctionDef)}
        if utils.is_file()
        else {}
    )
    gaps = [f"loader.py binds no {name}" for name in SAFETENSORS_ITERATORS if name not in bound]
    for name in SAFETENSORS_ITERATORS:
        parameters = defined.get(name)
        if parameters is None or parameters[:1] != ["hf_weights_files"] or not set(SAFETENSORS_ITERATOR_OPTIONS) <= set(parameters):
            gaps.append(f"weight_utils.py: {name}({', '.join(parameters or [])})")
    return gaps


def test_the_iterator_check_can_fail(tmp_path):
    folder = tmp_path / "sglang" / "srt" / "model_loader"
    folder.mkdir(parents=True)
    (folder / "loader.py").write_text("from .weight_utils import safetensors_weights_iterator\n")
    (folder / "weight_utils.py").write_text("def safetensors_weights_iterator(hf_weights_files, disable_mmap=False): pass\n")
    gaps = iterator_gaps(tmp_path)
    assert "loader.py binds no buffered_multi_thread_safetensors_weights_iterator" in gaps
    assert "weight_utils.py: safetensors_weights_iterator(hf_weights_files, disable_mmap)" in gaps


@pytest.mark.parametrize("release", list(release_matrix.MATRIX["sglang"]))
def test_the_wrapped_iterators_exist_in_the_release(release):
    tree = release_tree(release)
    assert not iterator_gaps(tree), f"sglang {release}: {iterator_gaps(tree)}"
