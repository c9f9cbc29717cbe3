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
