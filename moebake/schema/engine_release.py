"""An engine release as a value: ``EngineRelease("sglang", "0.5.20")``, compared by version, printed one way.

A release enters moebake as text in three places only: the command line (``--engine sglang==0.5.20``,
:func:`moebake.schema.profiles.parse_engine`), a manifest's ``engine`` record, and a plugin's start-up (the installed
engine's ``__version__``). Each makes an :class:`EngineRelease` there; below them releases travel as values.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import total_ordering

from packaging.version import InvalidVersion, Version


def normal_version(version: str) -> str:
    """``version`` as packaging normalises it (``0.5.020`` -> ``0.5.20``); unchanged where it is no version at all."""
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


@total_ordering
@dataclass(frozen=True)
class EngineRelease:
    """One release of one serving engine: ``engine`` (``sglang``, ``vllm``) and its ``version``, normalised.

    Releases of one engine order by version; ``str()`` is ``sglang 0.5.20`` (how messages name it) and :attr:`spec` is
    ``sglang==0.5.20`` (how ``--engine`` and pip name it)."""

    engine: str
    version: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "version", normal_version(self.version))

    @property
    def parsed(self) -> Version:
        """The version, comparable (InvalidVersion for an installed release whose version does not parse)."""
        return Version(self.version)

    @property
    def spec(self) -> str:
        """``sglang==0.5.20``: the form ``--engine`` takes and a manifest's options record."""
        return f"{self.engine}=={self.version}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, EngineRelease):
            return NotImplemented
        return (self.engine, self.parsed) < (other.engine, other.parsed)

    def __str__(self) -> str:
        return f"{self.engine} {self.version}"
