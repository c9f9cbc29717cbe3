"""Prove engine releases against moebake's bakes: each release's own load-time code, run on CPU, is the oracle.

For each release of an engine, its Python tree and its pinned FlashInfer's (:mod:`trees`) go first on ``PYTHONPATH``
and the engine's oracle tests (``tests/test_engine_profiles.py`` for SGLang, ``tests/test_vllm_profile.py`` for vLLM)
and the plugin's CPU tests (:data:`PLUGIN_FILES`) run against bakes made for that release
(``MOEBAKE_ORACLE_ENGINE=sglang==0.5.17``). A (target, source) cell is proven when its oracle test (``ORACLE_TESTS``)
passes and so does every plugin test about it (:func:`plugin_cells`).

  python -m tests.engine_releases.prove                 check: every release of the matrix proves what it says
  python -m tests.engine_releases.prove --write sglang==0.5.24
                                                        discover: try each rule (newest first) on that release, write
                                                        the cells it proves into moebake/schema/release_matrix.json,
                                                        and what the oracle run printed where no rule matched into
                                                        tests/engine_releases/unproven.json

Run from the repository root with the full ``.venv`` (``bin/prove-releases`` does).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from packaging.version import Version

from moebake.schema.release_matrix import MatrixRow

REPO = Path(__file__).resolve().parents[2]
ORACLE_FILES = {"sglang": "tests/test_engine_profiles.py", "vllm": "tests/test_vllm_profile.py"}
PLUGIN_FILES = {
    "sglang": ("tests/test_sglang_plugin.py", "tests/test_sglang_plugin_targets.py", "tests/test_sglang_whole_model.py"),
    "vllm": ("tests/vllm_plugin",),
}
"""The plugin's CPU tests, run against the same release: a cell is proven only where the plugin serves it there too."""
RELEASE_ENV = {"sglang": "MOEBAKE_SGLANG_RELEASE", "vllm": "MOEBAKE_VLLM_RELEASE"}
MATRIX_FILE = REPO / "moebake" / "schema" / "release_matrix.json"
UNPROVEN_FILE = Path(__file__).with_name("unproven.json")
"""What each release's oracle run printed for the cells no rule's bytes matched (the proof's log, never user output)."""


def pinned_flashinfer(tree: Path) -> str | None:
    """The ``flashinfer-python`` release the engine tree's metadata pins (``==``), or None."""
    for metadata in tree.glob("*.dist-info/METADATA"):
        for line in metadata.read_text().splitlines():
            found = re.match(r"Requires-Dist: flashinfer[_-]python(\[[^\]]*\])?\s*==\s*([^\s;,]+)", line)
            if found:
                return found.group(2)
    return None


def top_level_packages(distribution: str) -> set[str]:
    """The top-level packages the installed ``distribution`` puts on ``sys.path`` (from its RECORD)."""
    import importlib.metadata

    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    return {
        f.parts[0].removesuffix(".py")
        for f in files
        if len(f.parts) > 1 and not f.parts[0].endswith((".dist-info", ".data")) and f.parts[0] != ".."
    }


def shadowed_leftovers(trees: dict[str, Path]) -> set[str]:
    """Top-level packages of the installed distributions the release trees replace, that those trees lack (FlashInfer
    0.7.2.post1's ``b12x``): the oracle run hides them, as that release's own environment would not have them."""
    hidden = set()
    for distribution, tree in trees.items():
        hidden |= {name for name in top_level_packages(distribution) if not (tree / name).exists()}
    return hidden


def release_env(engine: str, release: str, rule: str | None = None) -> dict[str, str]:
    """The environment a pytest process runs ``engine`` ``release``'s code in: its tree and its pinned FlashInfer's
    first on ``PYTHONPATH`` (fetched once, :mod:`trees`), bakes made for it, installed packages it would lack hidden,
    and none of the caller's torch.distributed rendezvous; with ``rule``, that rule taken as the release's (discovery)."""
    from tests.engine_releases.trees import release_tree

    tree = release_tree(engine, release)
    flashinfer = pinned_flashinfer(tree)
    trees = {engine: tree} | ({"flashinfer-python": release_tree("flashinfer-python", flashinfer)} if flashinfer else {})
    path = [str(t) for t in trees.values()]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        MOEBAKE_ORACLE_ENGINE=f"{engine}=={release}",
        HF_HUB_OFFLINE="1",
        **{RELEASE_ENV[engine]: release},
        MOEBAKE_ORACLE_HIDE=",".join(sorted(shadowed_leftovers(trees))),
    )
    for inherited in ("MOEBAKE_REQUIRE_ENGINES", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(inherited, None)  # a caller's torch.distributed rendezvous (its gloo group listens on that port)
    if rule:
        env.update(MOEBAKE_ORACLE_RULE=rule, MOEBAKE_ORACLE_FLASHINFER=flashinfer or "")
    return env


def run_oracles(engine: str, release: str, rule: str | None = None) -> dict[str, list[tuple[str, str]]]:
    """Run ``engine`` ``release``'s oracle tests; ``{test function: [(outcome, first message line)]}``."""
    env = release_env(engine, release, rule)
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                ORACLE_FILES[engine],
                *PLUGIN_FILES[engine],
                f"--junitxml={report}",
                f"--basetemp={scratch}/tmp",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not report.is_file():
            raise RuntimeError(f"{engine} {release}: the oracle run wrote no report")
        results: dict[str, list[tuple[str, str]]] = {}
        for case in ElementTree.parse(report).iter("testcase"):
            function = case.get("name", "")
            if "plugin" not in case.get("classname", ""):
                function = function.split("[")[0]  # an oracle test: its cell is its function's
            else:
                function = f"plugin:{case.get('classname').split('.')[-1]}::{function}"
            problem = next(iter(case.findall("failure") + case.findall("error")), None)
            skipped = case.find("skipped")
            outcome = "failed" if problem is not None else "skipped" if skipped is not None else "passed"
            message = (problem if problem is not None else skipped).get("message", "") if outcome != "passed" else ""
            results.setdefault(function, []).append((outcome, message.splitlines()[0][:200] if message else ""))
        if not results:
            raise RuntimeError(f"{engine} {release}: no oracle test ran (collection failed)")
        return results


def cells_of(engine: str) -> dict[tuple[str, str], str]:
    """(target, source) -> the oracle test function that proves it, for ``engine``."""
    from tests.engine_releases.cells import ORACLE_TESTS

    return {(target, source): test for (name, target, source), (_, test) in ORACLE_TESTS.items() if name == engine}


def plugin_cells(engine: str, test: str) -> list[tuple[str, str]] | None:
    """The cells a plugin test (``plugin:<module>::<name[params]>``) is about; None: every cell of the engine (a test of
    the plugin as a whole)."""
    module, _, name = test.removeprefix("plugin:").partition("::")
    mentioned = [cell for cell in cells_of(engine) if f"{cell[0]}/{cell[1]}" in name]
    if mentioned:
        return mentioned
    if any(word in name for word in ("fp8_precision", "humming", "w4a8")):  # SGLang's Humming W4A8 path
        return [cell for cell in cells_of(engine) if cell[0] == "sm90-cutlass-w4a8"]
    if "cutedsl" in name:
        return [("cutedsl", "modelopt-nvfp4")]
    by_module = {
        "test_sglang_plugin": [("sm90-cutlass", "gpt-oss")],
        "test_gpt_oss": [("sm90-cutlass", "gpt-oss")],
        "test_sglang_whole_model": [("sm90-cutlass", "gpt-oss")],
        "test_gpt_oss_sm100": [("sm100-trtllm", "gpt-oss")],
        "test_modelopt_nvfp4": [("cutedsl", "modelopt-nvfp4")],
    }
    if module == "test_deepseek_v4":
        target = "sm100-trtllm" if "sm100" in name else "sm90-marlin" if "marlin" in name else "sm90-cutlass"
        return [(target, "deepseek-v4")]
    return by_module.get(module)


def cell_outcome(results, test: str, cell: tuple[str, str] | None = None, engine: str | None = None) -> tuple[bool, str]:
    """Whether ``cell`` is proven in an oracle run's ``results``: its oracle ``test`` passed, and (with ``engine``) every
    plugin test about it, or about the plugin as a whole, passed or was skipped."""
    if cell is not None and engine is not None:
        for name, runs in results.items():
            if name.startswith("plugin:") and (plugin_cells(engine, name) is None or cell in plugin_cells(engine, name)):
                bad = [message for outcome, message in runs if outcome == "failed"]
                if bad:
                    return False, f"{name.removeprefix('plugin:')}: {bad[0]}"
    runs = results.get(test, [])
    bad = [message for outcome, message in runs if outcome == "failed"]
    return bool(runs) and not bad and any(o == "passed" for o, _ in runs), (bad[0] if bad else "no test ran")


def discover(engine: str, release: str) -> tuple[MatrixRow, dict[str, str]]:
    """The matrix row of ``engine`` ``release`` (each cell's first rule, newest first, whose bytes its code builds), and
    what the oracle run printed for the cells no rule matched."""
    from moebake.schema.engine_release import EngineRelease
    from moebake.schema.profiles import RULES
    from tests.engine_releases.trees import release_tree

    rules = sorted((r for r in RULES.values() if r.first.engine == engine), key=lambda r: r.first, reverse=True)
    cells: dict[tuple[str, str], str] = {}
    unproven: dict[str, str] = {}
    for rule in rules:
        wanted = [cell for cell in rule.targets if cell not in cells]
        if not wanted:
            continue
        results = run_oracles(engine, release, rule.name)
        for cell in wanted:
            test = cells_of(engine).get(cell)
            ok, why = cell_outcome(results, test, cell, engine) if test else (False, "no oracle test")
            key = f"{cell[0]}/{cell[1]}"
            if ok:
                cells[cell] = rule.name
                unproven.pop(key, None)
            else:
                unproven.setdefault(key, f"{rule.name}: {why}")
    flashinfer = pinned_flashinfer(release_tree(engine, release))
    return MatrixRow(EngineRelease(engine, release), flashinfer, cells), dict(sorted(unproven.items()))


def check(engine: str, release: str, row: MatrixRow) -> list[str]:
    """What ``engine`` ``release``'s oracle run contradicts in its matrix ``row`` (empty: proven as written)."""
    if not row.cells:
        return []  # nothing claimed: every cell is refused
    results = run_oracles(engine, release)
    problems = []
    for cell, test in cells_of(engine).items():
        ok, why = cell_outcome(results, test, cell, engine)
        if cell in row.cells and not ok:
            problems.append(f"{engine} {release} {cell[0]}/{cell[1]}: the matrix says {row.cells[cell]}, but {test}: {why}")
    return problems


def write_matrix(matrix: dict[str, dict[str, MatrixRow]], unproven: dict[str, dict[str, dict[str, str]]]) -> None:
    """Write the matrix's data file and, beside the tests, the oracle runs' words for the cells left unproven."""
    from moebake.schema.release_matrix import to_json

    MATRIX_FILE.write_text(to_json(matrix))
    ordered = {
        engine: {release: cells for release, cells in sorted(unproven[engine].items(), key=lambda item: Version(item[0])) if cells}
        for engine in sorted(unproven)
    }
    UNPROVEN_FILE.write_text(json.dumps(ordered, indent=2) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", nargs="+", metavar="ENGINE==RELEASE", help="discover these releases and write the matrix")
    parser.add_argument("--engine", choices=sorted(ORACLE_FILES), help="check only this engine's releases")
    args = parser.parse_args(argv)
    from moebake.schema import release_matrix

    matrix = {engine: dict(rows) for engine, rows in release_matrix.MATRIX.items()}
    if args.write:
        unproven = json.loads(UNPROVEN_FILE.read_text()) if UNPROVEN_FILE.is_file() else {}
        for spec in args.write:
            engine, release = spec.split("==")
            row, words = discover(engine, release)
            matrix.setdefault(engine, {})[row.release.version] = row
            unproven.setdefault(engine, {})[row.release.version] = words
            print(
                f"{engine} {release} (FlashInfer {row.flashinfer}): proven {len(row.cells)} cells; unproven: {words or 'none'}", flush=True
            )
        write_matrix(matrix, unproven)
        return 0
    problems = []
    for engine, entries in matrix.items():
        if args.engine and engine != args.engine:
            continue
        for release, row in entries.items():
            found = check(engine, release, row)
            print(
                f"{engine} {release}: {len(row.cells) - len(found)}/{len(row.cells)} cells proven" + "".join(f"\n  {p}" for p in found),
                flush=True,
            )
            problems += found
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
