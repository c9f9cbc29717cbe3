"""Whether the installed engine release may serve a bake: the one place both plugins ask.

An engine release may serve a bake when the release matrix (:mod:`moebake.schema.release_matrix`) holds that release
(the plugin's private names are proven there) and the bake's ``engine`` record lists it among the releases whose own
load-time code builds its bytes. A refusal names the releases that can serve the bake and the command that bakes for
the running release.
"""

import importlib

from moebake.schema.engine_release import EngineRelease
from moebake.schema.manifest import Manifest
from moebake.schema.profiles import release_span, releases, serving_releases


def installed_release(engine: str) -> EngineRelease:
    """The installed release of ``engine`` (``sglang``, ``vllm``): its package's ``__version__``, read where a plugin
    starts or checks a bake (the one place either plugin asks)."""
    return EngineRelease(engine, importlib.import_module(engine).__version__)


def unknown_release_refusal(installed: EngineRelease) -> str | None:
    """Why ``installed`` cannot run moebake's plugin at all (a release the matrix does not hold), or None."""
    engine = installed.engine
    if installed in releases(engine):
        return None
    proven = release_span(engine, serving_releases(engine))
    return (
        f"this moebake's {engine} plugin is proven on {engine} {proven} (their private names and load-time "
        f'bytes), and {installed} is installed; install one of those (`pip install ".[{engine}]"` from a '
        f"moebake clone takes the newest), or prove {installed.version} first (docs/contributing.md: bin/prove-releases)"
    )


def release_refusal(installed: EngineRelease, manifest: Manifest) -> str | None:
    """Why ``installed`` cannot serve the bake of ``manifest`` (its ``engine`` record, or the ``serves`` record of that
    engine where the bake's bytes are another engine's too), or None."""
    if unknown := unknown_release_refusal(installed):
        return unknown
    engine = installed.engine
    record = next((r for r in (manifest.engine, *manifest.serves) if r is not None and r.name == engine), None)
    if record is None or installed in record.serving_releases:
        return None  # another engine's bake: the plugin's own engine check words that refusal
    can = (
        f"{engine} {release_span(engine, record.serving_releases)} can serve it"
        if record.serving_releases
        else "no release can serve it exactly"
    )
    return (
        f"this bake's bytes are proven for {can}, not {installed}; install one of those, or bake for this "
        f"release: moebake convert SRC OUT --target {manifest.target} --engine {installed.spec}"
    )
