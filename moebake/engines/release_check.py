"""Whether the installed engine release may serve a bake: the one place both plugins ask.

An engine release may serve a bake when the release matrix (:mod:`moebake.schema.release_matrix`) holds that release
(the plugin's private names are proven there) and the bake's ``engine`` record lists it among the releases whose own
load-time code builds its bytes. A refusal names the releases that can serve the bake and the command that bakes for
the running release.
"""

from moebake.schema.profiles import release_span, releases, serving_releases


def unknown_release_refusal(engine: str, installed: str) -> str | None:
    """Why ``engine`` ``installed`` cannot run moebake's plugin at all (a release the matrix does not hold), or None."""
    known = releases(engine)
    if installed in known:
        return None
    proven = release_span(engine, serving_releases(engine))
    return (f"this moebake's {engine} plugin is proven on {engine} {proven} (their private names and load-time "
            f"bytes), and {engine} {installed} is installed; install one of those (`pip install \".[{engine}]\"` from a "
            f"moebake clone takes the newest), or prove {installed} first (docs/contributing.md: bin/prove-releases)")


def release_refusal(engine: str, installed: str, manifest) -> str | None:
    """Why ``engine`` ``installed`` cannot serve the bake of ``manifest`` (its ``engine`` record, or the ``serves``
    record of ``engine`` where the bake's bytes are another engine's too), or None."""
    if unknown := unknown_release_refusal(engine, installed):
        return unknown
    record = next((r for r in (manifest.engine, *manifest.serves) if r is not None and r.name == engine), None)
    if record is None or installed in record.serving_releases:
        return None  # another engine's bake: the plugin's own engine check words that refusal
    can = f"{engine} {release_span(engine, record.serving_releases)} can serve it" if record.serving_releases else \
        "no release can serve it exactly"
    return (f"this bake's bytes are proven for {can}, not {engine} {installed}; install one of those, or bake for this "
            f"release: moebake convert SRC OUT --target {manifest.target} --engine {engine}=={installed}")
