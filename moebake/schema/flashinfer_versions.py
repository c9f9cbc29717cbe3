"""Which FlashInfer releases read which SM90 fp4 weight layout (the one place this table lives).

FlashInfer changed the SM90 W4A16 fp4 byte interleave twice (``moe_gemm_mixed_utils.cu``):
PR #3084 introduced layout ``v1``; PR #3738 replaced it with ``v2``; the 0.6.17 release branch
reverted #3738, so the two layouts alternate across releases. A checkpoint baked for one layout
gives wrong numbers, silently, on a FlashInfer that reads the other.
"""

from packaging.version import InvalidVersion, Version

from moebake.errors import PlatformError
from moebake.schema.enums import FlashInferLayout

# [first, next) release ranges (post releases included, pre-releases count as their release) -> layout read.
_RANGES = (
    (Version("0.6.10"), Version("0.6.16"), "v1"),
    (Version("0.6.16"), Version("0.6.16.post3"), "v2"),
    (Version("0.6.16.post3"), Version("0.6.18"), "v1"),
    (Version("0.6.18"), None, "v2"),
)

LAYOUTS = tuple(layout.value for layout in FlashInferLayout)
"""The SM90 fp4 layout ids (``--flashinfer-layout``; :class:`~moebake.schema.enums.FlashInferLayout`); v2 is the default."""

_HOW = {
    "v2": "bit-scrambled words, PR #3738",
    "v1": "nibble swap between rows r and r+8, PR #3084, scales folded [E, K/128, 4*rows]",
}
"""What each layout does to the bytes (the releases that read it are the table's)."""


def release_ranges(layout: str) -> str:
    """The FlashInfer releases that read ``layout``, in words, from the table above (``0.6.10 to before 0.6.16, ...``)."""
    return ", ".join(
        f"{first} and later" if following is None else f"{first} to before {following}"
        for first, following, read in _RANGES
        if read == layout
    )


DESCRIPTIONS = {layout: f"FlashInfer {release_ranges(layout)}: {_HOW[layout]}" for layout in LAYOUTS}
"""Each layout as a manifest's ``flashinfer_layout.description`` says it: the releases that read it and how."""


def markdown() -> str:
    """docs/targets-and-layouts.md's table of the layouts and the releases that read them (``tests/test_docs.py``
    keeps the page equal to it)."""
    lines = ["| `--flashinfer-layout` | FlashInfer releases that read it |", "|---|---|"]
    lines += [f"| `{layout}` | {release_ranges(layout)} |" for layout in LAYOUTS]
    return "\n".join(lines)


def _release(version: str) -> Version:
    """``version``'s release and post numbers (``0.7.2rc1+cu128`` -> ``0.7.2``); PlatformError if unparseable."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise PlatformError(f"cannot parse FlashInfer version {version!r}") from None
    post = f".post{parsed.post}" if parsed.post is not None else ""
    return Version(".".join(map(str, parsed.release)) + post)


def layout_for_flashinfer(version: str) -> str | None:
    """The SM90 fp4 layout id a FlashInfer release reads, or None if it has no SM90 W4A16 interleave."""
    release = _release(version)
    for first, following, layout in _RANGES:
        if first <= release and (following is None or release < following):
            return layout
    return None
