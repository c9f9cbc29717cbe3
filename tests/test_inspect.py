"""`moebake inspect`: source and baked reports, target answers, text and JSON output."""

import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.targets import TARGETS, Target, get_target
from moebake.errors import MoebakeError
from moebake.inspection import inspect_path, render_text


@pytest.fixture(scope="module")
def baked(gpt_oss_tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect") / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass", flashinfer_layout="v1", hidden_multiple=256), progress=False)
    return out


def sm90_expert_bytes(E, H, I, Hp, Ip):
    """Bytes of one layer's six sm90-cutlass tensors, from the shapes the README documents."""
    return (
        E * 2 * Ip * Hp // 2
        + E * (2 * Ip // 64) * (Hp // 128) * 256
        + E * 2 * Ip * 2
        + E * Hp * Ip // 2
        + E * (Hp // 64) * (Ip // 128) * 256
        + E * Hp * 2
    )


def test_source_report(gpt_oss_tiny):
    report = inspect_path(gpt_oss_tiny)
    assert report["kind"] == "source" and report["format"] == "gpt-oss" and report["problem"] is None
    assert report["model_type"] == "gpt_oss" and report["architectures"] == ["GptOssForCausalLM"]
    assert report["quantization"].startswith("MXFP4 experts") and report["quant_method"] == "mxfp4" and report["shards"] == 2
    assert report["moe"] == {
        "layers": 2,
        "hidden_layers": 2,
        "experts": 3,
        "experts_per_token": 3,
        "hidden": 160,
        "intermediate": 96,
        "activation": {"kind": "swiglu_oai", "alpha": 1.702, "beta": 1.0, "limit": 7.0},
    }
    answer = report["targets"]["sm90-cutlass"]
    assert answer["convertible"] and "SM90" in answer["kernel"]
    assert answer["default_padding"] == {"hidden": 160, "hidden_padded": 256, "intermediate": 96, "intermediate_padded": 128}
    assert answer["baked_expert_bytes"] == 2 * sm90_expert_bytes(3, 160, 96, 256, 128)
    text = render_text(report)
    assert "format         gpt-oss" in text and re.search(r"\n  sm90-cutlass +yes:", text) and "hidden 160 -> 256" in text


def test_unsupported_source_says_why(gpt_oss_copy):
    config = json.loads((gpt_oss_copy / "config.json").read_text())
    config["model_type"] = "mixtral"
    (gpt_oss_copy / "config.json").write_text(json.dumps(config))
    report = inspect_path(gpt_oss_copy)
    assert report["format"] is None and report["moe"] is None
    assert 'unsupported model (model_type="mixtral"' in report["problem"]
    assert not report["targets"]["sm90-cutlass"]["convertible"]
    assert re.search(r"\n  sm90-cutlass +no: the source is not a supported checkpoint", render_text(report))


def test_target_answers_line_up_and_do_not_repeat_the_path(gpt_oss_tiny):
    """Issue 37: the target column overflowed (sm90-cutlass-w4a8), and every "no:" reason began with the path
    the report's first line gives."""
    text = render_text(inspect_path(gpt_oss_tiny))
    rows = text.split("\ntargets\n", 1)[1].splitlines()
    assert [row.split()[0] for row in rows] == list(TARGETS)
    answers = [re.search(r" (yes|no): ", row) for row in rows]
    assert all(answers) and len({match.start() for match in answers}) == 1, rows  # one column, after a space
    for row in rows:
        assert str(gpt_oss_tiny) not in row, row
    assert any(" no: target cutedsl bakes modelopt-nvfp4 checkpoints" in row for row in rows), rows


def test_each_target_gives_its_own_reason(gpt_oss_tiny, monkeypatch):
    class Picky(Target):
        spec = replace(get_target("sm90-cutlass").spec, name="picky")

        def plan(self, model, options):
            raise MoebakeError(f"target picky needs 8 experts, {model.checkpoint.root} has {model.num_experts}")

    monkeypatch.setitem(TARGETS, "picky", Picky())
    answer = inspect_path(gpt_oss_tiny)["targets"]["picky"]
    assert answer == {"convertible": False, "reason": f"target picky needs 8 experts, {gpt_oss_tiny} has 3"}


def test_baked_report(baked, gpt_oss_tiny):
    report = inspect_path(baked)
    manifest = json.loads((baked / "moebake.json").read_text())
    assert report["kind"] == "baked" and report["target"] == "sm90-cutlass" and report["flashinfer_layout"]["id"] == "v1"
    assert report["source"] == {"format": "gpt-oss", "location": "gpt-oss-tiny", "revision": None}  # the folder, never its path
    assert report["moe"] == {"layers": 2, "experts": 3, "hidden": 160, "hidden_padded": 256, "intermediate": 96, "intermediate_padded": 128}
    assert report["options"] == manifest["options"] and report["files"] == len(manifest["files"])
    assert report["bytes"] == sum(p.stat().st_size for p in baked.iterdir() if p.name != "moebake.json")
    assert report["expert_tensors"]["w2_weight"] == {"dtype": "U8", "shape": [3, 256, 64]}
    text = render_text(report)
    assert "baked checkpoint" in text and "layout v1" in text and "w13_weight_scale" in text


@pytest.mark.parametrize("damage", ["missing shard", "flipped byte", "none"])
def test_inspect_of_a_bake_says_what_it_did_not_check(baked, tmp_path, damage):
    """Issue 37: inspect of a bake with a shard missing or flipped said nothing of it, and exited 0. It reads no file's
    bytes: a missing or resized file is a problem line and exit status 1; every answer says where the bytes are checked."""
    import shutil

    out = shutil.copytree(baked, tmp_path / "out")
    shard = out / "model-00001-of-00002.safetensors"
    if damage == "missing shard":
        shard.unlink()
    elif damage == "flipped byte":
        data = bytearray(shard.read_bytes())
        data[-1] ^= 0xFF
        shard.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["inspect", str(out)])
    lines = result.output.splitlines()
    assert lines[-1] == (
        f"checked: the manifest, and each listed file's presence and size, not its bytes: `moebake verify {out}` "
        "checks every file's checksum and header"
    )
    problems = [line for line in lines if line.startswith("  problem ")]
    if damage == "missing shard":
        assert result.exit_code == 1 and problems == ["  problem        model-00001-of-00002.safetensors: missing"]
    else:
        assert result.exit_code == 0 and problems == []
    assert (CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0) == (damage == "none")


@pytest.mark.parametrize(
    "spec, download",
    [
        ("openai/gpt-oss-20b", "hf download openai/gpt-oss-20b --local-dir gpt-oss-20b"),
        ("acme/moe@v2", "hf download acme/moe --revision v2 --local-dir moe"),
    ],
)
def test_inspect_of_a_hub_repo_says_to_download_it(tmp_path, monkeypatch, spec, download):
    """Issue 37: `inspect openai/gpt-oss-20b` said only "not a checkpoint directory"."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["inspect", spec])
    assert result.exit_code == 2 and result.output == (
        f"error: {spec}: no such local directory; inspect reads a checkpoint on disk and downloads nothing: download the "
        f"Hub repo first ({download}) and inspect that folder\n"
    )


def test_cli_text_json_and_errors(baked, tmp_path):
    result = CliRunner().invoke(main, ["inspect", str(baked), "--json"])
    assert result.exit_code == 0 and json.loads(result.output) == inspect_path(baked)
    result = CliRunner().invoke(main, ["inspect", str(baked)])
    assert result.exit_code == 0 and result.output == render_text(inspect_path(baked))
    result = CliRunner().invoke(main, ["inspect", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and result.output.startswith("error: ") and "nothing" in result.output


def test_multimodal_configs_are_read_through_text_config(gpt_oss_copy):
    config = json.loads((gpt_oss_copy / "config.json").read_text())
    config["text_config"] = {"num_hidden_layers": config.pop("num_hidden_layers"), "num_experts_per_tok": config.pop("num_experts_per_tok")}
    (gpt_oss_copy / "config.json").write_text(json.dumps(config))
    moe = inspect_path(gpt_oss_copy)["moe"]
    assert (moe["hidden_layers"], moe["experts_per_token"]) == (2, 3)


def test_baked_report_shows_the_engine_record(baked, tmp_path):
    manifest = json.loads((baked / "moebake.json").read_text())
    report = inspect_path(baked)
    assert report["engine"] == manifest["engine"] | {"serving_flags": "--quantization moebake --moe-runner-backend flashinfer_mxfp4"}
    assert report["engine"]["exact"] is True
    text = render_text(report)
    assert (
        "  engine         sglang 0.5.18: engine-exact; proven on sglang 0.5.17-0.5.18; serve with --quantization moebake "
        "--moe-runner-backend flashinfer_mxfp4\n"
    ) in text
    assert json.loads(CliRunner().invoke(main, ["inspect", str(baked), "--json"]).output)["engine"] == report["engine"]
    from moebake.reference.synthetic_sources import write_modelopt_nvfp4

    source = write_modelopt_nvfp4(tmp_path / "nvfp4")  # gate/up globals differ in 4 experts: shared by default
    assert CliRunner().invoke(main, ["convert", str(source), str(tmp_path / "nv"), "--target", "cutedsl", "--quiet"]).exit_code == 0
    report = inspect_path(tmp_path / "nv")
    assert report["engine"]["exact"] is False and report["serves"] == []
    assert (
        "  engine         sglang 0.5.23: NOT engine-exact: gate and up global scales shared in 4 experts (sglang 0.5.23 "
        "keeps both and applies the gate's to both halves); serve with --quantization moebake "
        "--moe-runner-backend flashinfer_cutedsl\n"
    ) in render_text(report)


def test_sizes_use_decimal_units_that_fit():
    from moebake.progress_bars import rate_text, size_text

    assert [size_text(n) for n in (0, 999, 1000, 868_352, 1_234_567, 999_999_999, 13_790_000_000, 2_500_000_000_000)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "868.4 kB",
        "1.2 MB",
        "1000.0 MB",
        "13.79 GB",
        "2.50 TB",
    ]
    assert rate_text(3_000_000, 2.0) == "1.5 MB/s" and rate_text(1, 0.0) == "-"


def test_no_binary_units_and_no_zero_gigabytes_in_what_commands_print(baked):
    for args in (["inspect", str(baked)], ["verify", str(baked)]):
        output = CliRunner().invoke(main, args).output
        assert "868.4 kB" in output, output
        assert not any(unit in output for unit in ("MiB", "GiB", "KiB", "0.00 GB")), output


@pytest.mark.parametrize("target", ["sm100-trtllm", "sm90-marlin"])
def test_a_bake_without_the_flashinfer_sm90_layout_neither_records_nor_prints_one(tmp_path, target):
    """``--flashinfer-layout`` is refused for these targets (it changes nothing): the manifest's options hold no layout,
    and inspect prints none."""
    from moebake.synthetic import write_gpt_oss

    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=256, intermediate=128, vocab=32)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(source), str(out), "--target", target, "--quiet"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "moebake.json").read_text())
    assert manifest["flashinfer_layout"] is None and "flashinfer_layout" not in manifest["options"]
    shown = CliRunner().invoke(main, ["inspect", str(out)])
    assert shown.exit_code == 0 and "flashinfer_layout" not in shown.output and "FlashInfer layout" not in shown.output
    assert "flashinfer_layout" not in inspect_path(out)["options"]
