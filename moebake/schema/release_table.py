"""The engine-release matrix as a table: releases x (target, source format), each cell its rule or refused, and why.

``moebake list`` prints it and docs/serving.md holds it (``tests/test_release_matrix.py`` keeps the doc equal to
:func:`markdown`). A cell names the rule (:data:`moebake.schema.profiles.RULES`) whose bytes that release's own code
was proven to build; ``refused`` cells are explained below the table, one line per reason.
"""

from moebake.schema import release_matrix
from moebake.schema.profiles import ENGINES, RULES, pinned_flashinfer, pinned_layout, refused_because, releases
from moebake.schema.release_matrix import Cell


def cells() -> list[Cell]:
    """Every (target, source format) some rule of some engine holds, in rule order."""
    seen: dict[tuple[str, str], None] = {}
    for rule in RULES.values():
        seen.update(dict.fromkeys(rule.targets))
    return list(seen)


def rows() -> tuple[list[str], list[list[str]], dict[str, list[str]]]:
    """The header, one row per engine release (newest first within each engine), and each refusal reason -> the
    ``engine release target/source`` cells it explains."""
    header = ["engine", "release", "FlashInfer (SM90 layout)"] + [f"{target} {source}" for target, source in cells()]
    table: list[list[str]] = []
    reasons: dict[str, list[str]] = {}
    for engine in ENGINES:
        for release in reversed(releases(engine)):
            pinned = pinned_flashinfer(release)
            row = [engine, release.version, f"{pinned} ({pinned_layout(release)})" if pinned else "-"]
            rules = release_matrix.MATRIX[engine][release.version].cells
            for target, source in cells():
                if (target, source) in rules:
                    row.append(RULES[rules[(target, source)]].first.version)
                else:
                    row.append("refused")
                    reasons.setdefault(refused_because(release, target, source), []).append(f"{engine} {release.version} {target}/{source}")
            table.append(row)
    return header, table, reasons


def markdown() -> str:
    """docs/engines.md's release-matrix block."""
    header, table, reasons = rows()
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    lines += ["", "Refused, and why:", ""]
    lines += [f"- {_compress(where)}: {why}" for why, where in reasons.items()]
    return "\n".join(lines)


def _compress(where: list[str]) -> str:
    """``sglang 0.5.17 a/b``, ``sglang 0.5.18 a/b`` -> ``sglang 0.5.17, 0.5.18: a/b`` (grouped by cell)."""
    by_cell: dict[tuple[str, str], list[str]] = {}
    for item in where:
        engine, release, cell = item.split(" ")
        by_cell.setdefault((engine, cell), []).append(release)
    return "; ".join(f"{engine} {', '.join(sorted(rs))} `{cell}`" for (engine, cell), rs in by_cell.items())


def text() -> str:
    """The table for a terminal (``moebake list``): one line per engine release, one column per numbered cell."""
    header, table, reasons = rows()
    names = header[3:]
    lines = [f"  [{i}] {name}" for i, name in enumerate(names, 1)]
    widths = [max(len(f"[{i}]"), *(len(row[3 + i - 1]) for row in table)) for i in range(1, len(names) + 1)]
    lead = max(len(f"{row[0]} {row[1]}  FlashInfer {row[2]}") for row in table)
    lines.append("engine release".ljust(lead) + "  " + " ".join(f"[{i}]".ljust(w) for i, w in enumerate(widths, 1)))
    for row in table:
        lines.append(
            f"{row[0]} {row[1]}  FlashInfer {row[2]}".ljust(lead) + "  " + " ".join(cell.ljust(w) for cell, w in zip(row[3:], widths))
        )
    lines += ["(a cell: the rule, named by its first release, whose bytes that release's own code builds)", "refused, and why:"]
    lines += [f"  {_compress(where)}: {why}" for why, where in reasons.items()]
    return "\n".join(lines)
