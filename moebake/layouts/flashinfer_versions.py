"""Which FlashInfer releases read which SM90 fp4 weight layout (the one place this table lives).

FlashInfer changed the SM90 W4A16 fp4 byte interleave twice (``moe_gemm_mixed_utils.cu``):
PR #3084 introduced layout ``v1``; PR #3738 replaced it with ``v2``; the 0.6.17 release branch
reverted #3738, so the two layouts alternate across releases. A checkpoint baked for one layout
gives wrong numbers, silently, on a FlashInfer that reads the other.
"""

import re

# (first, last) release, inclusive, as version tuples; the layout that range reads.
_RANGES = (
    ((0, 6, 10, 0), (0, 6, 15, 1), "v1"),
    ((0, 6, 16, 0), (0, 6, 16, 2), "v2"),
    ((0, 6, 16, 3), (0, 6, 17, 999), "v1"),
    ((0, 6, 18, 0), (99, 0, 0, 0), "v2"),
)

LAYOUTS = ("v2", "v1")
"""The SM90 fp4 layout ids (``--flashinfer-layout``); v2 is the default."""

DESCRIPTIONS = {
    "v2": "FlashInfer 0.6.16, 0.6.16.post1/.post2 and >= 0.6.18 (incl. 0.7.x): bit-scrambled words, PR #3738",
    "v1": "FlashInfer 0.6.10-0.6.15.post1, 0.6.16.post3/.post4, 0.6.17: nibble swap between rows r and r+8, PR #3084",
}


def _parse(version: str) -> tuple[int, int, int, int]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?", version)
    if not match:
        raise ValueError(f"cannot parse FlashInfer version {version!r}")
    major, minor, patch, post = match.groups()
    return int(major), int(minor), int(patch), int(post or 0)


def layout_for_flashinfer(version: str) -> str | None:
    """The SM90 fp4 layout id a FlashInfer release reads, or None if it has no SM90 W4A16 interleave."""
    parsed = _parse(version)
    for first, last, layout in _RANGES:
        if first <= parsed <= last:
            return layout
    return None
