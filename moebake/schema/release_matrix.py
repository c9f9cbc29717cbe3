"""Which engine releases' own load-time code reproduces which bakes: ``release_matrix.json``, read once.

``bin/prove-releases --write`` (``tests/engine_releases/prove.py``) writes the file: it runs each release's own
preparation code on CPU (the oracle tests) against moebake's bakes. For each engine and release, the file holds:

* ``flashinfer``: the FlashInfer release that engine release pins; the SM90 fp4 layout its servers read is derived
  from it (:func:`moebake.schema.flashinfer_versions.layout_for_flashinfer`), not stored;
* ``cells``: ``"target/source format"`` -> the rule (:data:`moebake.schema.profiles.RULES`) whose entry that release
  was proven to build, byte for byte; a cell absent here is refused for that release
  (:func:`moebake.schema.profiles.refused_because` says why).

What the oracle runs printed where no rule matched stays beside the tests (``tests/engine_releases/unproven.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from moebake.schema.engine_release import EngineRelease
from moebake.schema.flashinfer_versions import layout_for_flashinfer

MATRIX_FILE = "release_matrix.json"
"""The data file, beside this module (package data)."""

Cell = tuple[str, str]
"""A (target, source format) pair."""


@dataclass(frozen=True)
class MatrixRow:
    """One release's row: the FlashInfer it pins (None: none pinned) and, for each cell it was proven on, the rule."""

    release: EngineRelease
    flashinfer: str | None
    cells: dict[Cell, str]

    @property
    def flashinfer_layout(self) -> str | None:
        """The SM90 fp4 layout (``v1``/``v2``) the pinned FlashInfer reads, or None (no pin, or no such layout)."""
        return layout_for_flashinfer(self.flashinfer) if self.flashinfer else None

    def to_json(self) -> dict:
        return {"flashinfer": self.flashinfer, "cells": dict(sorted((f"{t}/{s}", rule) for (t, s), rule in self.cells.items()))}


def cell_of(key: str) -> Cell:
    """``"sm90-cutlass/gpt-oss"`` -> ``("sm90-cutlass", "gpt-oss")``: how the data file writes a cell."""
    target, _, source = key.partition("/")
    return target, source


def from_json(data: dict) -> dict[str, dict[str, MatrixRow]]:
    """``engine -> version -> row``, each engine's releases oldest first."""
    matrix: dict[str, dict[str, MatrixRow]] = {}
    for engine, rows in data.items():
        built = [
            MatrixRow(EngineRelease(engine, version), row.get("flashinfer"), {cell_of(key): rule for key, rule in row["cells"].items()})
            for version, row in rows.items()
        ]
        matrix[engine] = {row.release.version: row for row in sorted(built, key=lambda row: row.release)}
    return matrix


def to_json(matrix: dict[str, dict[str, MatrixRow]]) -> str:
    """The data file's text for ``matrix``: engines by name, releases oldest first, cells sorted."""
    ordered = {
        engine: {row.release.version: row.to_json() for row in sorted(matrix[engine].values(), key=lambda r: r.release)}
        for engine in sorted(matrix)
    }
    return json.dumps(ordered, indent=2) + "\n"


MATRIX = from_json(json.loads(resources.files(__package__).joinpath(MATRIX_FILE).read_text()))
"""``engine -> version -> row`` of every release moebake has proven (or tried)."""


def releases(engine: str) -> list[EngineRelease]:
    """The releases of ``engine`` the matrix holds, oldest first (none for an engine it does not know)."""
    return [row.release for row in MATRIX.get(engine, {}).values()]


def row(release: EngineRelease) -> MatrixRow | None:
    """``release``'s row, or None where the matrix does not hold it."""
    return MATRIX.get(release.engine, {}).get(release.version)
