"""Byte-unchanged guard: every target x source bake still writes the bytes recorded in ``fixtures/bake_hashes.json``.

The fixture was recorded from ``main`` before the schema refactor (issue 14) by ``tests/bake_hashes.py``;
it is the truth, not something the code under test computes at test time. Each case bakes a tiny
synthetic checkpoint (:mod:`moebake.synthetic`, :mod:`moebake.reference.synthetic_sources`) and compares the SHA-256 of every output file
(shards, index, copied side files) and of every stable manifest field
(:data:`bake_hashes.MANIFEST_FIELDS`: not ``created``, ``moebake_version`` or the source's location).

RULE: a refactor must leave this test green without touching the fixture. A change that alters
output bytes ON PURPOSE (e.g. a new default padding, a new manifest field) regenerates the fixture in
the same commit, by its author, with a one-line reason that the fixture keeps::

    .venv/bin/python tests/bake_hashes.py "sglang: GPT-OSS sm90-cutlass pads H to 256, scale padding 127"

and says in the commit message which cases changed and why. A new target or source adds its case
to :data:`bake_hashes.CASES` and records it the same way.

The synthetic BF16 values come from torch's vectorised normal sampler (identical under its AVX2 and
AVX-512 kernels, not its scalar fallback): if ``moebake.json:source.files`` differs, the synthetic
source itself differs on this machine, not the baking.
"""

import json

import pytest

from bake_hashes import CASES, FIXTURE, bake_case

RECORDED = json.loads(FIXTURE.read_text())["cases"]


def test_the_fixture_covers_every_case():
    assert sorted(RECORDED) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_baked_bytes_are_unchanged(case, tmp_path):
    hashes = bake_case(case, tmp_path)
    expected = RECORDED[case]
    changed = sorted(name for name in expected.keys() | hashes.keys() if expected.get(name) != hashes.get(name))
    assert not changed, f"{case}: bytes differ from {FIXTURE.name} in {changed}"
