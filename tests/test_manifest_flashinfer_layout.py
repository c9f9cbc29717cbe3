"""The manifest records the SM90 fp4 layout only for targets whose bytes depend on it."""

from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.targets import TARGETS


def test_only_sm90_cutlass_depends_on_the_flashinfer_layout():
    assert {name for name, target in TARGETS.items() if target.spec.uses_flashinfer_layout} == {"sm90-cutlass"}


def test_layout_recorded_for_sm90_and_null_otherwise(gpt_oss_tiny, tmp_path):
    sm90 = convert(gpt_oss_tiny, tmp_path / "sm90", ConvertOptions("sm90-cutlass", flashinfer_layout="v1"), progress=False).to_json()
    sm100 = convert(gpt_oss_tiny, tmp_path / "sm100", ConvertOptions("sm100-trtllm"), progress=False).to_json()
    assert sm90["flashinfer_layout"]["id"] == "v1"
    assert sm100["flashinfer_layout"] is None
    shown = CliRunner().invoke(main, ["inspect", str(tmp_path / "sm100")])
    assert shown.exit_code == 0 and "FlashInfer     layout" not in shown.output
    assert "layout v1" in CliRunner().invoke(main, ["inspect", str(tmp_path / "sm90")]).output
    assert CliRunner().invoke(main, ["verify", str(tmp_path / "sm100"), "--source", str(gpt_oss_tiny)]).exit_code == 0


# FlashInfer releases and the SM90 fp4 layout each reads, as docs/targets-and-layouts.md tabulates them.
RELEASES_READING = {
    "0.6.10": "v1",
    "0.6.15.post1": "v1",
    "0.6.16": "v2",
    "0.6.16.post1": "v2",
    "0.6.16.post2": "v2",
    "0.6.16.post3": "v1",
    "0.6.16.post4": "v1",
    "0.6.17": "v1",
    "0.6.18": "v2",
    "0.7.2.post1": "v2",
}


def test_convert_help_names_the_releases_each_layout_is_for():
    """Issue 37: --help said "v1 = FlashInfer 0.6.10-0.6.17", though 0.6.16-0.6.16.post2 read v2. Each release
    falls in the ranges --help gives for the layout it reads, and in no other layout's."""
    import re

    from packaging.version import Version

    text = " ".join(CliRunner().invoke(main, ["convert", "--help"], terminal_width=1000).output.split())
    help_text = text[text.index("--flashinfer-layout") : text.index("--engine ENGINE")]
    ranges = {}
    for layout, spans in re.findall(r"(v\d) = ([^;]+?)(?:;|\.\s|\.$)", help_text):
        for span in spans.split(", "):
            bounds = re.fullmatch(r"(\S+) to before (\S+)|(\S+) and later", span.strip())
            assert bounds, span
            first, following = (bounds[1], bounds[2]) if bounds[1] else (bounds[3], None)
            ranges.setdefault(layout, []).append((Version(first), Version(following) if following else None))
    assert sorted(ranges) == ["v1", "v2"], help_text
    for release, layout in RELEASES_READING.items():
        holding = [
            name
            for name, spans in ranges.items()
            if any(first <= Version(release) and (following is None or Version(release) < following) for first, following in spans)
        ]
        assert holding == [layout], (release, holding, help_text)
