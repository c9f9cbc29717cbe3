"""The documentation keeps up with the code: every registered target is in a target table and has a serving
route (or docs/engines.md says it has none), engines.md's serving-routes table is the registries' truth,
every relative link resolves, the README stays short and no docs page is empty.

The registries are imported, never listed here: the converter's (:data:`moebake.convert.targets.TARGETS`)
and the schema's (:data:`moebake.schema.targets.TARGET_SPECS`) targets, the SGLang plugin's per-target
methods (``METHODS``), the vLLM plugin's served kinds (``SERVED``) and ``moebake.serve``'s ``RUNTIMES``.
"""

import re
from pathlib import Path

import click
import pytest

import moebake.serve
from moebake.convert.targets import TARGETS
from moebake.schema.targets import TARGET_SPECS

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
PAGES = sorted(DOCS.glob("*.md"))
GPU_SESSIONS = REPO / "bench" / "results" / "gpu-sessions.md"  # the dated record the docs cite
README_MAX_LINES = 260
NO_ROUTE = re.compile(r"^- `(?P<target>[^`]+)`: no serving route \((?P<why>[^)]+)\)$", re.M)
"""How docs/engines.md says a target has no serving route: a line ``- `<target>`: no serving route (<why>)``."""
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def _sglang_methods() -> dict:
    from moebake.engines.sglang.moe_methods import METHODS

    return METHODS


def _vllm_served() -> dict:
    from moebake.engines.vllm.bake import SERVED

    return SERVED


def registered_targets() -> list[str]:
    return sorted(set(TARGETS) | set(TARGET_SPECS))


def table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """``{first cell without backticks: the other cells}`` of the first Markdown table under ``## heading``."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"no table under '## {heading}'"
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]
    return {row[0].strip("`"): row[1:] for row in cells}


def no_route_targets() -> dict[str, str]:
    return {m["target"]: m["why"] for m in NO_ROUTE.finditer((DOCS / "engines.md").read_text())}


def serving_routes(target: str) -> dict[str, str]:
    """What the registries say serves ``target``: cells as engines.md's serving-routes table writes them."""
    vllm = sorted(source for (served, source) in _vllm_served() if served == target)
    return {"SGLang": "yes" if target in _sglang_methods() else "no",
            "vLLM": ", ".join(f"`{source}`" for source in vllm) or "no",
            "moebake.serve": "yes" if target in moebake.serve.RUNTIMES else "no"}


def test_the_two_registries_agree():
    assert set(TARGETS) == set(TARGET_SPECS)


@pytest.mark.parametrize("target", registered_targets())
def test_every_target_is_in_a_target_table(target):
    tables = {page: table_rows((DOCS / page).read_text(), heading)
              for page, heading in (("contributing.md", "The target table"), ("targets-and-layouts.md", "Target table"))}
    assert any(target in rows for rows in tables.values()), (
        f"target {target} is in no target table (docs/contributing.md's or docs/targets-and-layouts.md's)")


@pytest.mark.parametrize("target", registered_targets())
def test_every_target_has_a_serving_route_or_says_it_has_none(target):
    routes = serving_routes(target)
    served = any(value != "no" for value in routes.values())
    says_none = target in no_route_targets()
    assert served or says_none, (
        f"target {target} has no serving route (not in the SGLang plugin's METHODS, the vLLM plugin's SERVED or "
        f"moebake.serve's RUNTIMES): add one, or the line '- `{target}`: no serving route (<why>)' to docs/engines.md")
    assert not (served and says_none), f"docs/engines.md says {target} has no serving route, but {routes} serve it"


def test_the_serving_routes_table_is_the_registries():
    rows = table_rows((DOCS / "engines.md").read_text(), "Serving routes")
    documented = {target: dict(zip(("SGLang", "vLLM", "moebake.serve"), cells)) for target, cells in rows.items()}
    assert documented == {target: serving_routes(target) for target in registered_targets()
                          if target not in no_route_targets()}


def test_no_route_lines_name_registered_targets():
    assert set(no_route_targets()) <= set(registered_targets())


def test_the_no_route_format_is_what_the_test_reads():
    text = "- `toy-target`: no serving route (a layout for an engine nobody ships yet)\n"
    assert [(m["target"], m["why"]) for m in NO_ROUTE.finditer(text)] == [
        ("toy-target", "a layout for an engine nobody ships yet")]
    assert not NO_ROUTE.search("`toy-target`: no serving route\n")  # the reason is required


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("page", [README, *PAGES, GPU_SESSIONS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for match in LINK.finditer(text):
        target = match["target"]
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading with anchor #{anchor} in {file.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


def test_the_docs_pages_exist_and_none_is_empty():
    names = {page.name for page in PAGES}
    assert {"targets-and-layouts.md", "engines.md", "manifest.md", "runtime.md", "integrity-and-hub.md",
            "security-and-failures.md", "benchmarks.md", "testing.md", "contributing.md"} <= names
    for page in PAGES:
        body = [line for line in page.read_text().splitlines() if line.strip() and not line.startswith("#")]
        assert len(body) >= 3, f"{page.name} is empty"


def test_the_readme_links_every_docs_page():
    text = README.read_text()
    assert [page.name for page in PAGES if f"(docs/{page.name})" not in text] == []


def test_the_contributing_checklists_name_the_registries():
    """The checklists point at the files a new target or engine profile must touch."""
    text = (DOCS / "contributing.md").read_text()
    for heading in ("## Adding a target", "## Adding an engine profile"):
        assert heading in text
    for needle in ("moebake/convert/targets/__init__.py", "moebake/schema/targets.py", "moebake/schema/profiles.py",
                   "moebake/engines/sglang/moe_methods.py", "`METHODS`", "moebake/engines/vllm/bake.py", "`SERVED`",
                   "moebake/serve/__init__.py", "`RUNTIMES`", "tests/bake_hashes.py", "tests/fixtures/bake_hashes.json",
                   "tests/test_target_contract.py", "tests/test_engine_profiles.py", "`ORACLE_TESTS`"):
        assert needle in text, needle


def test_the_readme_targets_table_names_every_target():
    assert set(table_rows(README.read_text(), "Targets")) == set(registered_targets())


def test_the_inspect_example_is_what_the_command_prints(tmp_path, monkeypatch):
    """docs/integrity-and-hub.md's `moebake inspect gpt-oss-tiny` is that command's output, every target included
    (issue 37: the page showed 5 targets where the command printed 7)."""
    from click.testing import CliRunner

    from conftest import TINY
    from moebake.cli import main
    from moebake.synthetic import write_gpt_oss

    text = (DOCS / "integrity-and-hub.md").read_text()
    block = text.split("```\n$ moebake inspect gpt-oss-tiny\n", 1)[1].split("```\n", 1)[0]
    write_gpt_oss(tmp_path / "gpt-oss-tiny", **TINY)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["inspect", "gpt-oss-tiny"])
    assert result.exit_code == 0 and result.output == block


@pytest.mark.parametrize("page", [README, DOCS / "command-line.md"], ids=["README", "command-line.md"])
def test_the_command_summaries_name_every_option(page):
    """The `moebake COMMAND ...` summary lines of the README and of docs/command-line.md give every option each command
    takes (issue 37: --io and --writers-per-device were missing)."""
    from moebake.cli import main

    block = page.read_text().split("\nmoebake [-v] COMMAND", 1)[1].split("```", 1)[0]
    entries: list[list[str]] = []  # a `moebake NAME ...` line and the indented lines that continue it
    for line in block.splitlines()[1:]:
        if line.startswith("moebake "):
            entries.append([line])
        elif line.startswith(" ") and entries:
            entries[-1].append(line)
    missing = []
    for name, command in main.commands.items():
        text = "\n".join(line for entry in entries if entry[0].split()[1] == name for line in entry)
        assert text, f"{page.name}: no `moebake {name}` line"
        for option in command.params:
            if isinstance(option, click.Option) and not option.hidden:
                flag = max(option.opts, key=len)
                if flag not in ("--help", "--verbose") and flag not in text:
                    missing.append(f"{name} {flag}")
    assert missing == [], f"{page.name} lacks {missing}"


def test_the_readme_tour_runs_on_the_demo_it_follows(tmp_path, monkeypatch):
    """Issue 37: the tour began with `moebake inspect gpt-oss-20b`, a folder a newcomer does not have. Its first block
    runs, command by command, where `bin/demo` left its example."""
    import shlex

    from click.testing import CliRunner

    from moebake.cli import main
    from moebake.demo import run_demo

    readme = README.read_text()
    block = readme.split("## 5-minute tour", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    run_demo(Path("moebake-demo"))  # bin/demo, from the clone's folder
    for line in block.splitlines():
        args = shlex.split(line.split("#", 1)[0])
        assert args[0] == "moebake", line
        result = CliRunner().invoke(main, args[1:])
        assert result.exit_code == 0, (line, result.output)
