"""Every file, module and function the docs name in backticks exists: a path under the repository's own folders
(``moebake/...``, ``tests/...``, ``bench/...``, ``bin/...``, ``docs/...``) is a file or folder of the checkout, and a
dotted ``moebake.`` name is a module, or an attribute of one. A rename that leaves a page behind fails here."""

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    REPO / "CHANGELOG.md",
    REPO / "bench" / "results" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
]
ROOTS = ("moebake/", "tests/", "bench/", "bin/", "docs/", ".ci/")
CODE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^moebake(\.[A-Za-z_]\w*)+$")
FILE_NAME = re.compile(r"\.(json|md|toml|txt|py|so)$")  # `moebake.json` is a file, not a module
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b")  # `bench/NAME.py`: a pattern, not a path


def named_paths(text: str) -> set[str]:
    """Repository paths named in backticks, without a ``:line`` or ``::test`` suffix; patterns are left out."""
    names = set()
    for code in CODE.findall(text):
        for word in code.split():
            word = word.strip("(),;'\"")
            if word.startswith(ROOTS) and not re.search(r"[*<>{}$\[\]]|\.\.\.", word) and not PLACEHOLDER.search(word):
                names.add(re.split(r"::|:(?=\d)", word)[0].rstrip(".:"))
    return names


def named_dotted(text: str) -> set[str]:
    """Dotted ``moebake.`` names in backticks (a trailing ``()`` dropped)."""
    return {code.removesuffix("()") for code in CODE.findall(text) if DOTTED.match(code.removesuffix("()")) and not FILE_NAME.search(code)}


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_path_exists(page):
    missing = sorted(name for name in named_paths(page.read_text()) if not (REPO / name).exists())
    assert missing == [], f"{page.relative_to(REPO)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_named_module_and_function_exists(page):
    missing = sorted(name for name in named_dotted(page.read_text()) if not resolves(name))
    assert missing == [], f"{page.relative_to(REPO)} names modules or functions that do not exist: {missing}"


def test_the_name_finders_find_what_they_are_for():
    text = "see `moebake/cli.py:36`, `tests/test_docs.py::test_x`, `moebake.serve.open()` and `bin/setup --light`"
    assert named_paths(text) == {"moebake/cli.py", "tests/test_docs.py", "bin/setup"}
    assert named_dotted(text) == {"moebake.serve.open"}
    assert resolves("moebake.serve") and not resolves("moebake.no_such_module.thing")
