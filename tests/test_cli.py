"""The command line a newcomer meets: fast help (no torch at import), targets that fit, dry runs,
logging levels, the sources x targets list, verify's report and JSON, --revision, inspect's answers."""

import json
import logging
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.targets import TARGETS
from moebake.formats import SOURCE_FORMATS
from moebake.names import SOURCE_FORMAT_NAMES, TARGET_NAMES
from moebake.reference.synthetic_sources import write_deepseek_v4, write_modelopt_nvfp4


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_names_match_the_registries():
    assert TARGET_NAMES == tuple(TARGETS) and SOURCE_FORMAT_NAMES == tuple(SOURCE_FORMATS)


def test_the_cli_imports_without_torch():
    code = "import sys, moebake.cli; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:3]"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_target_that_does_not_fit_lists_those_that_do(tmp_path):
    source = write_modelopt_nvfp4(tmp_path / "src")
    result = run("convert", source, tmp_path / "out", "--target", "sm90-cutlass", "--quiet")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "target sm90-cutlass bakes gpt-oss or deepseek-v4 checkpoints, this one is modelopt-nvfp4" in result.output
    assert "targets that fit it: cutedsl, cutedsl-deepep, deepep-bf16" in result.output


@pytest.fixture(scope="module")
def nvfp4_tiny(tmp_path_factory):
    return write_modelopt_nvfp4(tmp_path_factory.mktemp("nvfp4") / "src")


ENGINE_REFUSAL = (
    "error: --engine vllm: vllm 0.33.0 cannot serve cutedsl-deepep bakes of modelopt-nvfp4 checkpoints exactly (no verified "
    "profile); sglang 0.5.17-0.5.23 can (--engine sglang==RELEASE); pass --allow-inexact to bake it anyway, recorded as NOT "
    "engine-exact\n"
)


@pytest.mark.parametrize("dry_run", [False, True])
def test_an_engine_that_cannot_serve_the_pair_exactly_is_refused_naming_those_that_can(nvfp4_tiny, tmp_path, dry_run):
    result = run(
        "convert",
        nvfp4_tiny,
        tmp_path / "out",
        "--target",
        "cutedsl-deepep",
        "--engine",
        "vllm",
        "--quiet",
        *(["--dry-run"] if dry_run else []),
    )
    assert (result.exit_code, result.output) == (2, ENGINE_REFUSAL)
    assert list(tmp_path.iterdir()) == []  # neither OUT nor its staging directory


def test_an_inexact_bake_asked_for_explicitly_is_written_and_says_not_engine_exact(nvfp4_tiny, tmp_path):
    result = run("convert", nvfp4_tiny, tmp_path / "out", "--target", "cutedsl-deepep", "--engine", "vllm", "--quiet", "--allow-inexact")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == (
        "engine vllm 0.33.0: NOT engine-exact: no profile of this engine for this target "
        "and source, so no flags serve it: moebake's vllm plugin refuses this bake"
    )
    assert "unknown" not in result.output  # no runner backend to name (issue 37: it said --moe-backend unknown)
    inspected = run("inspect", tmp_path / "out")
    assert "unknown" not in inspected.output and "no flags serve it" in inspected.output, inspected.output
    manifest = json.loads((tmp_path / "out" / "moebake.json").read_text())
    assert manifest["engine"]["exact"] is False and manifest["serves"] == []
    assert "allow_inexact" not in manifest["options"]  # it changes no byte: not a recorded option
    assert run("verify", tmp_path / "out", "--quiet").exit_code == 0


def test_other_explicit_inexact_choices_need_no_allow_inexact(gpt_oss_tiny, tmp_path):
    result = run(
        "convert", gpt_oss_tiny, tmp_path / "out", "--target", "sm90-cutlass", "--engine", "vllm", "--quiet", "--hidden-multiple", "512"
    )
    assert result.exit_code == 0, result.output
    assert "NOT engine-exact: padding multiples overridden\n" in result.output


def test_the_api_refuses_as_the_cli_does_and_writes_nothing(nvfp4_tiny, tmp_path):
    from moebake.convert.options import ConvertOptions
    from moebake.convert.run import convert
    from moebake.errors import UnsupportedError
    from moebake.schema.profiles import check_servable, parse_engine, release_profile

    options = ConvertOptions("cutedsl-deepep", engine="vllm")
    with pytest.raises(UnsupportedError) as refusal:
        convert(nvfp4_tiny, tmp_path / "out", options, progress=False)
    assert f"error: {refusal.value}\n" == ENGINE_REFUSAL and list(tmp_path.iterdir()) == []
    assert convert(nvfp4_tiny, tmp_path / "out", options, progress=False, allow_inexact=True).engine.exact is False
    with pytest.raises(UnsupportedError, match=r"; no engine release moebake knows can; pass --allow-inexact"):
        check_servable(release_profile(parse_engine("sglang")), "toy-target", "bf16-moe", "sglang")
    check_servable(release_profile(parse_engine("vllm")), "sm90-cutlass", "gpt-oss", "vllm")  # a verified pair: no refusal


def test_verify_of_a_missing_path_says_it_does_not_exist(tmp_path):
    result = run("verify", tmp_path / "nope")
    assert result.exit_code == 2 and result.output == f"error: {tmp_path / 'nope'}: does not exist\n"


def test_dry_run_prints_the_plan_and_writes_nothing(gpt_oss_tiny, tmp_path):
    result = run("convert", gpt_oss_tiny, tmp_path / "out", "--target", "sm90-cutlass", "--dry-run")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
    assert "dry run: would write" in result.output and "hidden 160 -> 256" in result.output
    assert "* model.layers.0.mlp.experts.w13_weight  U8 [3, 256, 128]  98304 bytes" in result.output
    assert "  lm_head.weight  BF16 [64, 160]  20480 bytes" in result.output


def test_verbose_logs_a_line_per_shard_and_warnings_are_prefixed(gpt_oss_copy, tmp_path):
    (gpt_oss_copy / "moebake.json").write_text("{}")
    quiet = run("convert", gpt_oss_copy, tmp_path / "a", "--target", "sm90-cutlass", "--quiet")
    assert quiet.exit_code == 0 and "debug:" not in quiet.output
    assert f"warning: {gpt_oss_copy / 'moebake.json'}: not copied (moebake writes its own moebake.json)" in quiet.output
    verbose = run("-v", "convert", gpt_oss_copy, tmp_path / "b", "--target", "sm90-cutlass", "--quiet")
    assert verbose.exit_code == 0
    assert "debug: baked shard 1/2: model-00001-of-00002.safetensors" in verbose.output
    assert "debug: baked shard 2/2: model-00002-of-00002.safetensors" in verbose.output
    logging.getLogger("moebake").setLevel(logging.INFO)


@pytest.mark.parametrize(
    "command",
    [["convert", "{src}", "{out}", "--target", "sm90-cutlass", "--quiet"], ["verify", "{out}"], ["inspect", "{out}"], ["list"]],
    ids=["convert", "verify", "inspect", "list"],
)
def test_verbose_is_accepted_after_the_subcommand(gpt_oss_tiny, tmp_path, command):
    """Issue 37: `moebake convert ... -v` said "No such option '-v'" (it worked only before the subcommand)."""
    if command[0] != "convert":
        assert run("convert", gpt_oss_tiny, tmp_path / "out", "--target", "sm90-cutlass", "--quiet").exit_code == 0
    try:
        result = run(*(a.format(src=gpt_oss_tiny, out=tmp_path / "out") for a in command), "-v")
        assert result.exit_code == 0, result.output
        assert logging.getLogger("moebake").level == logging.DEBUG
        if command[0] == "convert":
            assert "debug: baked shard 1/2: model-00001-of-00002.safetensors" in result.output
    finally:
        logging.getLogger("moebake").setLevel(logging.INFO)


def test_resume_of_a_fresh_run_says_nothing_and_of_a_finished_one_that_there_is_nothing_to_do(gpt_oss_tiny, tmp_path):
    from conftest import load_all  # noqa: F401  (the tests' helpers are importable)
    from moebake.convert.output_dir import output_paths

    out = tmp_path / "out"
    first = run("convert", gpt_oss_tiny, out, "--target", "sm90-cutlass", "--quiet", "--resume")
    assert first.exit_code == 0 and "resume:" not in first.output and "reused" not in first.output, first.output
    assert first.output.startswith(f"wrote {out} (")
    assert not output_paths(out).staging.exists()
    manifest = (out / "moebake.json").read_bytes()
    again = run("convert", gpt_oss_tiny, out, "--target", "sm90-cutlass", "--quiet", "--resume", "--chunk-mb", "8")
    assert again.exit_code == 0, again.output
    assert again.output == (
        f"nothing to do: {out} is already a finished bake of {gpt_oss_tiny} with these options "
        f"(`moebake verify {out}` checks it; --overwrite bakes it again)\n"
    )
    assert (out / "moebake.json").read_bytes() == manifest
    other = run("convert", gpt_oss_tiny, out, "--target", "sm90-cutlass", "--quiet", "--resume", "--flashinfer-layout", "v1")
    assert other.exit_code == 2
    assert other.output == (
        f"error: {out}: already a finished bake, from another source or with other options; --resume "
        "continues only an interrupted conversion (pass --overwrite to replace it)\n"
    )
    assert (out / "moebake.json").read_bytes() == manifest


def test_resume_of_a_bake_from_another_folder_of_the_same_name_is_not_nothing_to_do(gpt_oss_tiny, tmp_path):
    """The manifest names a local source by its folder only (issue 37: never its path); a different model in a folder
    of the same name (its config.json differs) is not "the same source"."""
    import shutil

    other = shutil.copytree(gpt_oss_tiny, tmp_path / "elsewhere" / gpt_oss_tiny.name)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "rope_theta": 1234.0}))
    out = tmp_path / "out"
    assert run("convert", gpt_oss_tiny, out, "--target", "sm90-cutlass", "--quiet").exit_code == 0
    assert json.loads((out / "moebake.json").read_text())["source"]["location"] == gpt_oss_tiny.name
    again = run("convert", other, out, "--target", "sm90-cutlass", "--quiet", "--resume")
    assert again.exit_code == 2 and again.output.startswith(f"error: {out}: already a finished bake, from another source"), again.output


def test_a_bake_given_as_the_source_is_named_a_bake(gpt_oss_tiny, tmp_path):
    """Issue 37: it said "unsupported model (model_type="gpt_oss", quant_method="moebake")"."""
    assert run("convert", gpt_oss_tiny, tmp_path / "baked", "--target", "sm90-cutlass", "--quiet").exit_code == 0
    result = run("convert", tmp_path / "baked", tmp_path / "again", "--target", "sm90-marlin", "--quiet")
    assert result.exit_code == 2 and result.output == (
        f"error: {tmp_path / 'baked'}: is already a moebake bake for target sm90-cutlass, from source gpt-oss-tiny (config.json's "
        f"quant_method is moebake); convert its source checkpoint instead (`moebake inspect {tmp_path / 'baked'}` describes "
        "this bake)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baked"]


@pytest.mark.parametrize(
    "target, option, line",
    [
        (
            "sm100-trtllm",
            ["--flashinfer-layout", "v1"],
            "error: --flashinfer-layout v1: changes nothing for target sm100-trtllm, which "
            "bakes no FlashInfer SM90 fp4 layout (only sm90-cutlass does); drop the option",
        ),
        (
            "sm90-marlin",
            ["--flashinfer-layout", "v2"],
            "error: --flashinfer-layout v2: changes nothing for target sm90-marlin, which "
            "bakes no FlashInfer SM90 fp4 layout (only sm90-cutlass does); drop the option",
        ),
        (
            "sm90-cutlass",
            ["--gate-up-globals", "keep"],
            "error: --gate-up-globals keep: changes nothing for target sm90-cutlass, which "
            "bakes no NVFP4 experts (only cutedsl, cutedsl-deepep do); drop the option",
        ),
    ],
)
def test_an_option_that_changes_nothing_for_the_target_is_refused(gpt_oss_tiny, tmp_path, target, option, line):
    """Issue 37: such options were accepted and recorded in the manifest, as if they mattered."""
    result = run("convert", gpt_oss_tiny, tmp_path / "out", "--target", target, *option, "--quiet")
    assert (result.exit_code, result.output) == (2, line + "\n")
    assert list(tmp_path.iterdir()) == []
    sm90 = run("convert", gpt_oss_tiny, tmp_path / "sm90", "--target", "sm90-cutlass", "--flashinfer-layout", "v1", "--quiet")
    assert sm90.exit_code == 0 and json.loads((tmp_path / "sm90" / "moebake.json").read_text())["options"]["flashinfer_layout"] == "v1"


def test_list_shows_sources_by_targets():
    result = run("list")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].split()[2:] == list(TARGET_NAMES)
    assert lines[1].split() == ["gpt-oss", "yes", "yes", "-", "-", "-", "yes", "yes"]
    assert any(line.split()[:2] == ["deepep-bf16", "DeepGEMM"] for line in lines)
    rows = lines[lines.index("targets") + 1 : lines.index("targets") + 1 + len(TARGET_NAMES)]
    assert [row.split()[0] for row in rows] == list(TARGET_NAMES), rows  # issue 37: "sm90-cutlass-w4a8FlashInfer ..."
    assert len({len(row) - len(row[2:].split(" ", 1)[1].lstrip()) for row in rows}) == 1, rows  # descriptions in one column


def test_verify_says_what_it_checked_and_speaks_json(gpt_oss_tiny, tmp_path):
    assert run("convert", gpt_oss_tiny, tmp_path / "out", "--target", "sm90-cutlass", "--quiet").exit_code == 0
    result = run("verify", tmp_path / "out")
    assert result.exit_code == 0
    assert result.output.startswith(f"ok: {tmp_path / 'out'} (moebake.json intact; 6 files, ")
    from moebake.schema.engine_release import EngineRelease
    from moebake.schema.profiles import release_span

    proven = [EngineRelease("sglang", v) for v in json.loads((tmp_path / "out" / "moebake.json").read_text())["engine"]["releases"]]
    assert (
        f"index and 2 shard headers valid; 12 baked tensors as recorded; proven on sglang {release_span('sglang', proven)})"
        in result.output
    )
    report = json.loads(run("verify", tmp_path / "out", "--json").output)
    assert report["ok"] is True and report["problems"] == [] and "moebake.json intact" in report["checked"]
    (tmp_path / "out" / "extra.txt").write_text("x")
    failed = run("verify", tmp_path / "out", "--json")
    assert failed.exit_code == 1
    report = json.loads(failed.output)
    assert report["ok"] is False and report["problems"] == [f"{tmp_path / 'out' / 'extra.txt'}: not listed in moebake.json"]


def test_verify_json_reports_an_error_as_json(tmp_path):
    result = run("verify", tmp_path / "nope", "--json")
    assert result.exit_code == 2
    assert json.loads(result.output) == {
        "ok": False,
        "out": str(tmp_path / "nope"),
        "source": None,
        "error": f"{tmp_path / 'nope'}: does not exist",
    }


def test_revision_is_for_hub_sources(gpt_oss_tiny, tmp_path):
    result = run("convert", gpt_oss_tiny, tmp_path / "out", "--target", "sm90-cutlass", "--revision", "main")
    assert result.exit_code == 2 and "--revision main applies to a Hub source" in result.output


def test_revision_goes_to_the_hub_download(gpt_oss_tiny, tmp_path, monkeypatch):
    from moebake.hub import download

    asked = []
    monkeypatch.setattr(
        download,
        "download_source",
        lambda repo, revision, client: asked.append((repo, revision)) or download.ResolvedSource(gpt_oss_tiny, repo, "1" * 40),
    )
    result = run("convert", "acme/tiny", tmp_path / "out", "--target", "sm90-cutlass", "--quiet", "--revision", "v1.0")
    assert result.exit_code == 0, result.output
    assert asked == [("acme/tiny", "v1.0")]


@pytest.mark.parametrize("multiple", ["100", "0", "1000000000", "8192"])
def test_a_huge_or_odd_padding_multiple_is_refused_at_once(gpt_oss_tiny, tmp_path, multiple):
    result = run("convert", gpt_oss_tiny, tmp_path / "out", "--target", "sm90-cutlass", "--hidden-multiple", multiple)
    assert result.exit_code == 2 and result.output.startswith("error: --hidden-multiple") and result.output.count("\n") == 1


def test_inspect_answers_as_convert_does(tmp_path):
    modelopt = run("inspect", write_modelopt_nvfp4(tmp_path / "modelopt"), "--json")
    report = json.loads(modelopt.output)
    assert report["targets"]["deepep-bf16"]["convertible"] is True  # its BF16 MTP layer, as convert bakes it
    assert report["quantization"].startswith("NVFP4 experts (ModelOpt") and report["quant_method"] == "modelopt"
    assert run("convert", tmp_path / "modelopt", tmp_path / "out", "--target", "deepep-bf16", "--quiet").exit_code == 0
    dsv4 = json.loads(run("inspect", write_deepseek_v4(tmp_path / "dsv4"), "--json").output)
    assert dsv4["quantization"].startswith("MXFP4 routed experts") and dsv4["quant_method"] == "fp8"
    text = run("inspect", tmp_path / "dsv4").output
    assert "quantization   MXFP4 routed experts" in text and "(config.json quant_method: fp8)" in text


def test_progress_rate_starts_with_the_first_bytes():
    """Workers take seconds to start: that wait, and the first few bytes, must not make the ETA hours."""
    import io

    from moebake.progress_bars import ByteBar

    bar = ByteBar(total=10**9, initial=10**8, file=io.StringIO(), smoothing=0, unit_divisor=1000)
    bar.start_t -= 60  # the bar was made a minute before any worker reported
    bar.update(4096)
    assert bar.format_dict["elapsed"] < 1 and bar.initial == 10**8 + 4096
    assert bar.format_dict["n"] == 10**8 + 4096
    bar.close()


@pytest.mark.parametrize("mode", ["direct", "plain"])
def test_io_mode_is_passed_to_the_conversion_and_changes_no_byte(gpt_oss_tiny, tmp_path, monkeypatch, mode):
    """--io sets the I/O mode every file of the conversion is opened with (workers included); same bytes."""
    from moebake.convert import direct_io
    from moebake.convert.io_mode import IO_ENV

    monkeypatch.setenv(IO_ENV, "auto")  # restored after the test: the CLI sets it in this process
    seen = []
    real = direct_io.direct_io_wanted
    monkeypatch.setattr(direct_io, "direct_io_wanted", lambda path: seen.append(os.environ.get(IO_ENV)) or real(path))
    result = run("convert", gpt_oss_tiny, tmp_path / mode, "--target", "sm90-cutlass", "--quiet", "--io", mode)
    assert result.exit_code == 0, result.output
    assert seen and set(seen) == {mode}
    monkeypatch.setenv(IO_ENV, "auto")
    reference = run("convert", gpt_oss_tiny, tmp_path / "auto", "--target", "sm90-cutlass", "--quiet")
    assert reference.exit_code == 0
    for name in json.loads((tmp_path / "auto" / "moebake.json").read_text())["files"]:
        assert (tmp_path / mode / name).read_bytes() == (tmp_path / "auto" / name).read_bytes(), name


def test_convert_summary_gives_files_bytes_time_and_speed(gpt_oss_tiny, tmp_path):
    import re

    result = run("convert", gpt_oss_tiny, tmp_path / "out", "--target", "sm90-cutlass", "--quiet")
    assert result.exit_code == 0
    first = result.output.splitlines()[0]
    match = re.fullmatch(
        re.escape(f"wrote {tmp_path / 'out'} (2 MoE layers, target sm90-cutlass, FlashInfer layout v2): 6 files, 868.4 kB in ")
        + r"(\d+\.\d) s \((\d+\.\d) (kB|MB|GB)/s\)",
        first,
    )
    assert match, first
    written = sum(p.stat().st_size for p in (tmp_path / "out").iterdir() if p.name != "moebake.json")
    assert written == 868_370  # the 868.4 kB said
    dry = run("convert", gpt_oss_tiny, tmp_path / "dry", "--target", "sm90-cutlass", "--dry-run")
    assert dry.exit_code == 0 and "0.000 GB" not in dry.output and " kB" in dry.output, dry.output
