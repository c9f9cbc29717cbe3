"""Hub sources, model cards and `upload`, with an injected fake client (no network)."""

import json
import shutil
import types
from pathlib import Path

import pytest
from click.testing import CliRunner
from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled
from huggingface_hub.repocard import metadata_load
from huggingface_hub.utils import filter_repo_objects

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.verify import verify_output
from moebake.errors import MoebakeError
from moebake.hub import client as hub_client_module
from moebake.hub.download import SOURCE_PATTERNS, SUBFOLDERS, parse_repo_spec, resolve_source
from moebake.hub.model_card import hub_repo_of, render_model_card, write_model_card
from moebake.hub.publish import publish
from moebake.schema.manifest import Manifest

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Records every call; ``snapshot_download`` returns ``snapshot`` (or raises ``error``)."""

    def __init__(self, snapshot=None, error=None, upload_error=None):
        self.calls, self.snapshot, self.error, self.uploaded = [], snapshot, error, None
        self.upload_error = upload_error

    def _maybe_fail(self):
        if self.error:
            raise self.error

    def create_repo(self, repo_id, *, private, exist_ok):
        self.calls.append(("create_repo", repo_id, {"private": private, "exist_ok": exist_ok}))
        self._maybe_fail()

    def create_branch(self, repo_id, *, branch, exist_ok):
        self.calls.append(("create_branch", repo_id, {"branch": branch, "exist_ok": exist_ok}))

    def upload_folder(self, *, repo_id, folder_path, commit_message, revision, create_pr):
        self.calls.append(("upload_folder", repo_id, {"revision": revision, "create_pr": create_pr}))
        self.commit_message = commit_message
        if self.upload_error:
            raise self.upload_error
        self.uploaded = {p.name: p.read_bytes() for p in sorted(Path(folder_path).iterdir())}
        return types.SimpleNamespace(
            commit_url=f"https://hub.test/{repo_id}/commit/{SHA}", pr_url=f"https://hub.test/{repo_id}/discussions/1" if create_pr else None
        )

    def snapshot_download(self, repo_id, *, revision, allow_patterns, ignore_patterns):
        self.calls.append(
            ("snapshot_download", repo_id, {"revision": revision, "allow_patterns": allow_patterns, "ignore_patterns": ignore_patterns})
        )
        self._maybe_fail()
        return str(self.snapshot)


@pytest.fixture()
def baked(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    return out


def cached_snapshot(tmp_path, source, repo="acme/gpt-oss-tiny"):
    """A copy of ``source`` where the Hugging Face cache keeps a snapshot of ``repo`` at ``SHA``."""
    org, name = repo.split("/")
    return shutil.copytree(source, tmp_path / "hub" / f"models--{org}--{name}" / "snapshots" / SHA)


# ---- repo specs and downloads ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("openai/gpt-oss-20b", ("openai/gpt-oss-20b", None)),
        ("openai/gpt-oss-20b@main", ("openai/gpt-oss-20b", "main")),
        ("org/name.v2@refs/pr/7", ("org/name.v2", "refs/pr/7")),
        (f"org/name@{SHA}", ("org/name", SHA)),
        ("/abs/path", None),
        ("./rel/dir", None),
        ("single", None),
        ("a/b/c", None),
        ("org/name@", None),
    ],
)
def test_parse_repo_spec(text, expected):
    assert parse_repo_spec(text) == expected


def test_download_patterns_select_only_the_root_files_a_conversion_needs():
    gpt_oss_repo = [  # the file list of openai/gpt-oss-20b (checkpoint-formats-and-peers.md 1.1)
        ".gitattributes",
        "LICENSE",
        "README.md",
        "USAGE_POLICY",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "original/config.json",
        "original/model.safetensors",
        "original/dtypes.json",
        "metal/model.bin",
    ]
    chosen = set(filter_repo_objects(gpt_oss_repo, allow_patterns=SOURCE_PATTERNS, ignore_patterns=SUBFOLDERS))
    assert chosen == {
        "LICENSE",
        "USAGE_POLICY",
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_a_local_path_is_never_looked_up(gpt_oss_tiny):
    hub = FakeHub()
    assert resolve_source(str(gpt_oss_tiny), hub).path == gpt_oss_tiny and hub.calls == []
    assert resolve_source("missing/dir-that-is-not-a-spec/x", hub).repo_id is None and hub.calls == []


def test_a_repo_spec_downloads_the_needed_files_and_resolves_the_commit(tmp_path, gpt_oss_tiny):
    hub = FakeHub(snapshot=cached_snapshot(tmp_path, gpt_oss_tiny))
    resolved = resolve_source("acme/gpt-oss-tiny@v1", hub)
    assert (resolved.repo_id, resolved.revision, resolved.path) == ("acme/gpt-oss-tiny", SHA, hub.snapshot)
    assert hub.calls == [
        ("snapshot_download", "acme/gpt-oss-tiny", {"revision": "v1", "allow_patterns": SOURCE_PATTERNS, "ignore_patterns": SUBFOLDERS})
    ]


def _connect_error():
    """huggingface_hub's error when the Hub's host has no address: a LocalEntryNotFoundError raised from the HTTP
    library's ConnectError (its message starts ``Got: ConnectError: ...``)."""
    try:
        try:
            raise ConnectionError("[Errno -2] Name or service not known")
        except ConnectionError as cause:
            raise LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known\nAn error happened") from cause
    except LocalEntryNotFoundError as err:
        return err


@pytest.mark.parametrize(
    "error, offline, reason",
    [
        (
            LocalEntryNotFoundError("Cannot find an appropriate cached snapshot folder\nmore"),
            True,
            "offline mode is on (HF_HUB_OFFLINE=1) and the Hugging Face cache does not have it",
        ),
        (
            OfflineModeIsEnabled("offline mode is enabled"),
            False,
            "offline mode is on (HF_HUB_OFFLINE=1) and the Hugging Face cache does not have it",
        ),
        (_connect_error(), False, "the Hub cannot be reached (Name or service not known)"),
    ],
    ids=["offline, not cached", "offline mode error", "no connection"],
)
def test_a_source_neither_local_nor_on_the_hub_is_one_line(error, offline, reason, monkeypatch):
    """A mistyped local path with a slash is tried on the Hub: one line saying it is neither, and why the Hub could not
    be read, never the library's exceptions (``LocalEntryNotFoundError: Got: ConnectError: ...``)."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)
    with pytest.raises(MoebakeError) as caught:
        resolve_source("acme/missing@main", FakeHub(error=error))
    assert str(caught.value) == f"acme/missing@main: neither a local folder nor reachable on the Hugging Face Hub: {reason}"


def test_a_mistyped_local_path_says_its_folder_exists(tmp_path, monkeypatch):
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["convert", "models/gpt-oss-mnii", "out", "--target", "sm90-cutlass", "--quiet"])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr == (
        "error: models/gpt-oss-mnii: neither a local folder nor reachable on the Hugging Face Hub: "
        "offline mode is on (HF_HUB_OFFLINE=1) and the Hugging Face cache does not have it; ./models is a "
        "local folder: check the path\n"
    )


def test_another_failed_download_is_one_line_with_the_hubs_error():
    with pytest.raises(MoebakeError) as caught:
        resolve_source("acme/missing@main", FakeHub(error=OSError("disk full\nmore")))
    assert str(caught.value) == (
        "acme/missing@main: not a local path, and downloading it from the Hugging Face Hub failed: OSError: disk full"
    )


def test_a_download_outside_the_cache_layout_is_refused(tmp_path):
    with pytest.raises(MoebakeError, match="not a cache snapshot folder"):
        resolve_source("acme/x", FakeHub(snapshot=tmp_path))


def test_cli_convert_from_the_hub_records_repo_and_commit(tmp_path, gpt_oss_tiny, monkeypatch):
    hub = FakeHub(snapshot=cached_snapshot(tmp_path, gpt_oss_tiny))
    monkeypatch.setattr(hub_client_module, "hub_client", lambda token=None: hub)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", "acme/gpt-oss-tiny@v1", str(out), "--target", "sm90-cutlass", "--quiet"])
    assert result.exit_code == 0, result.output
    source = json.loads((out / "moebake.json").read_text())["source"]
    assert (source["location"], source["revision"]) == ("acme/gpt-oss-tiny", SHA)
    result = CliRunner().invoke(main, ["convert", "acme/gpt-oss-tiny", str(out), "--target", "sm90-cutlass"])
    assert result.exit_code == 2 and "already exists" in result.output and len(hub.calls) == 1  # refused before downloading


# ---- model card --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "location, repo",
    [
        ("openai/gpt-oss-20b", "openai/gpt-oss-20b"),
        (f"/srv/hf/.cache/huggingface/hub/models--openai--gpt-oss-120b/snapshots/{SHA}", "openai/gpt-oss-120b"),
        ("/data/checkpoints/gpt-oss-20b", None),
        (None, None),
    ],
)
def test_hub_repo_of_a_source_location(location, repo):
    assert hub_repo_of(location) == repo


def card_metadata(tmp_path, card):
    (tmp_path / "card.md").write_text(card)
    return metadata_load(tmp_path / "card.md")


def test_card_of_a_hub_source(baked, tmp_path):
    manifest = json.loads((baked / "moebake.json").read_text())
    manifest["source"].update(location="openai/gpt-oss-20b", revision=SHA)
    card = render_model_card(Manifest.from_json(manifest, "m"), "acme/gpt-oss-20b-sm90")
    meta = card_metadata(tmp_path, card)
    assert meta["base_model"] == "openai/gpt-oss-20b" and meta["base_model_relation"] == "quantized"
    assert meta["library_name"] == "moebake" and {"moebake", "sm90-cutlass", "gpt-oss"} <= set(meta["tags"])
    assert "Hopper (SM90)" in card and "| FlashInfer layout | `v2`:" in card
    assert "hidden 160 -> 256, intermediate 96 -> 128" in card
    assert f"moebake verify gpt-oss-20b-sm90 --source openai/gpt-oss-20b@{SHA}" in card
    assert 'moebake.serve.open(snapshot_download("acme/gpt-oss-20b-sm90"))' in card


def test_card_of_a_local_source_names_no_base_model_and_no_path(baked, tmp_path, gpt_oss_tiny):
    card = render_model_card(Manifest.from_json(json.loads((baked / "moebake.json").read_text()), "m"), "acme/tiny")
    meta = card_metadata(tmp_path, card)
    assert "base_model" not in meta and "base_model_relation" not in meta and "moebake" in meta["tags"]
    assert str(gpt_oss_tiny.parent) not in card and f"`{gpt_oss_tiny.name}`" in card


def test_a_source_card_with_broken_front_matter_is_replaced_without_a_licence(gpt_oss_copy, tmp_path):
    (gpt_oss_copy / "README.md").write_text("---\nlicense: [apache\n---\n# broken\n")
    out = tmp_path / "out"
    convert(gpt_oss_copy, out, ConvertOptions("sm90-cutlass"), progress=False)
    write_model_card(out, "acme/tiny")
    assert "license" not in metadata_load(out / "README.md") and verify_output(out) == []


def test_card_names_several_or_no_source_tensors(baked):
    manifest = json.loads((baked / "moebake.json").read_text())
    layer = manifest["layers"][0]
    layer["tensors"]["w13_weight"]["source"] = [layer["prefix"] + "gate.weight", layer["prefix"] + "up.weight"]
    layer["tensors"]["w2_weight_bias"]["source"] = None
    card = render_model_card(Manifest.from_json(manifest, "m"), "acme/tiny")
    assert "| `w13_weight` | U8 | [3, 256, 128] | `gate.weight`, `up.weight` |" in card
    assert "| `w2_weight_bias` | BF16 | [3, 256] | derived |" in card


def test_card_shows_moebake_serve_only_for_targets_it_runs(baked, monkeypatch):
    from moebake.schema import serving

    manifest = json.loads((baked / "moebake.json").read_text())
    assert "moebake.serve.open(" in render_model_card(Manifest.from_json(manifest, "m"), "acme/tiny")
    monkeypatch.setattr(serving, "RECORDS", tuple(r for r in serving.RECORDS if (r.server, r.target) != (serving.SERVE, "sm90-cutlass")))
    card = render_model_card(Manifest.from_json(manifest, "m"), "acme/tiny")
    assert "moebake.serve" not in card and "## Load it in an engine" in card


def test_write_model_card_keeps_verify_green_and_the_source_licence(gpt_oss_copy, tmp_path):
    (gpt_oss_copy / "README.md").write_text("---\nlicense: apache-2.0\n---\n# The source model\n")
    out = tmp_path / "out"
    convert(gpt_oss_copy, out, ConvertOptions("sm90-cutlass"), progress=False)
    card = write_model_card(out, "acme/tiny")
    assert (out / "README.md").read_text() == card and "# The source model" not in card
    assert metadata_load(out / "README.md")["license"] == "apache-2.0"
    assert verify_output(out) == []
    manifest_before = (out / "moebake.json").read_bytes()
    assert write_model_card(out, "acme/tiny") == card and (out / "moebake.json").read_bytes() == manifest_before


# ---- upload ------------------------------------------------------------------------------------


def test_upload_verifies_writes_the_card_and_uploads(baked):
    hub = FakeHub()
    commit = publish(baked, "acme/tiny", hub, private=True)
    assert [c[0] for c in hub.calls] == ["create_repo", "upload_folder"]
    assert hub.calls[0] == ("create_repo", "acme/tiny", {"private": True, "exist_ok": True})
    assert hub.calls[1][2] == {"revision": None, "create_pr": False}
    assert "README.md" in hub.uploaded and "moebake.json" in hub.uploaded and commit.commit_url.endswith(SHA)
    assert hub.uploaded == {p.name: p.read_bytes() for p in sorted(baked.iterdir())}  # OUT now holds what was uploaded
    assert hub.commit_message == "moebake sm90-cutlass bake of gpt-oss-tiny"
    assert verify_output(baked) == []


def test_upload_to_a_branch_creates_it_but_not_a_pr_ref(baked):
    hub = FakeHub()
    publish(baked, "acme/tiny", hub, revision="v2-layout")
    assert hub.calls[1] == ("create_branch", "acme/tiny", {"branch": "v2-layout", "exist_ok": True})
    hub = FakeHub()
    publish(baked, "acme/tiny", hub, revision="refs/pr/3")
    assert [c[0] for c in hub.calls] == ["create_repo", "upload_folder"] and hub.calls[1][2]["revision"] == "refs/pr/3"


def test_upload_refuses_an_output_that_fails_verify(baked):
    shard = baked / "model-00001-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0x10
    shard.write_bytes(bytes(data))
    hub = FakeHub()
    with pytest.raises(MoebakeError, match=r"refusing to upload, verify found 1 problem\(s\); first: .*xxh3-128 mismatch"):
        publish(baked, "acme/tiny", hub)
    assert hub.calls == [] and not (baked / "README.md").exists()


def test_upload_with_source_refuses_an_output_that_is_not_bit_exact(baked, tmp_path):
    from moebake.synthetic import write_gpt_oss
    from tests.conftest import TINY

    other = write_gpt_oss(tmp_path / "other", **TINY, seed=7)
    hub = FakeHub()
    with pytest.raises(MoebakeError, match="refusing to upload"):
        publish(baked, "acme/tiny", hub, source=str(other))
    assert hub.calls == []


def test_create_pr_with_a_revision_is_refused(baked):
    with pytest.raises(MoebakeError, match="cannot be combined with --revision main"):
        publish(baked, "acme/tiny", FakeHub(), revision="main", create_pr=True)


def test_a_hub_failure_is_one_line_and_says_how_to_resume(baked):
    with pytest.raises(MoebakeError) as caught:
        publish(baked, "acme/tiny", FakeHub(upload_error=OSError("500 Server Error\nmore")))
    assert str(caught.value) == (f"uploading {baked} to acme/tiny failed (re-run the same command to resume): OSError: 500 Server Error")


def test_an_upload_in_offline_mode_says_so_and_what_to_do(baked):
    """Offline, or with the Hub out of reach, the line says what to do (re-running in offline mode cannot help)."""
    with pytest.raises(MoebakeError) as caught:
        publish(baked, "acme/tiny", FakeHub(error=OfflineModeIsEnabled("Cannot reach https://hub.test: offline mode")))
    assert str(caught.value) == (
        f"uploading {baked} to acme/tiny: offline mode is on (HF_HUB_OFFLINE=1), so nothing was "
        "sent; unset HF_HUB_OFFLINE to upload, or see what would be sent with --dry-run"
    )
    with pytest.raises(MoebakeError) as caught:
        publish(baked, "acme/tiny", FakeHub(error=_connect_error()))
    assert str(caught.value) == (
        f"uploading {baked} to acme/tiny failed: the Hub cannot be reached (Name or service not "
        "known); re-run the same command once it can be (an interrupted upload resumes)"
    )


@pytest.mark.parametrize(
    "hub",
    [FakeHub(error=OfflineModeIsEnabled("offline")), FakeHub(upload_error=OSError("connection reset"))],
    ids=["no network", "upload fails"],
)
def test_a_failed_upload_leaves_out_byte_identical(baked, hub):
    before = {p.name: p.read_bytes() for p in sorted(baked.iterdir())}
    with pytest.raises(MoebakeError, match=f"uploading {baked} to acme/tiny"):
        publish(baked, "acme/tiny", hub)
    assert {p.name: p.read_bytes() for p in sorted(baked.iterdir())} == before
    assert "README.md" not in before


def test_cli_upload(baked, monkeypatch):
    hub = FakeHub()
    monkeypatch.setattr(hub_client_module, "hub_client", lambda token=None: hub)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    result = CliRunner().invoke(main, ["upload", "acme/tiny", str(baked), "--create-pr"])  # as `hf upload REPO_ID PATH`
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"uploaded {baked} to acme/tiny: https://hub.test/acme/tiny/discussions/1"
    assert hub.calls[-1][2]["create_pr"] is True


def test_cli_upload_dry_run_prints_the_card_and_the_files_and_sends_nothing(baked, tmp_path):
    """The offline preview of an upload: ``--dry-run`` runs offline (HF_HUB_OFFLINE=1, the real client) and
    without a token: the commit's files (the card and the manifest as the upload writes them) and the card itself."""
    import os
    import subprocess
    import sys

    from moebake.hub.model_card import card_files

    before = {p.name: p.read_bytes() for p in sorted(baked.iterdir())}
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE")}
    env.update(HF_HUB_OFFLINE="1", HF_TOKEN_PATH=str(tmp_path / "no-token"), HF_HOME=str(tmp_path / "hf-home"))
    done = subprocess.run(
        [sys.executable, "-m", "moebake", "upload", "acme/tiny", str(baked), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stderr == "", done.stdout + done.stderr
    card = card_files(baked, "acme/tiny")["README.md"].decode()
    head, shown_card = done.stdout.split("\nmodel card (README.md):\n\n", 1)
    assert shown_card == card.rstrip("\n") + "\n"
    lines = head.splitlines()
    names = sorted({*before, "README.md"})
    assert lines[0].startswith(f"would upload {baked} to acme/tiny: {len(names)} files, ") and lines[0].endswith(
        'commit "moebake sm90-cutlass bake of gpt-oss-tiny" (--dry-run: nothing sent)'
    ), lines[0]
    assert [line.split()[0] for line in lines[1:]] == names and head.endswith("\n")
    written = {line.split()[0] for line in lines[1:] if line.endswith("(written by the upload)")}
    assert written == {"README.md", "moebake.json"}
    assert {p.name: p.read_bytes() for p in sorted(baked.iterdir())} == before


def test_cli_upload_dry_run_makes_the_uploads_checks_and_no_hub_call(baked, monkeypatch, tmp_path):
    hub = FakeHub()
    monkeypatch.setattr(hub_client_module, "hub_client", lambda token=None: hub)
    result = CliRunner().invoke(main, ["upload", "acme/tiny", str(baked), "--dry-run", "--create-pr", "--revision", "main"])
    assert result.exit_code == 2 and result.stderr.startswith("error: --create-pr opens a pull request"), result.output
    result = CliRunner().invoke(main, ["upload", "acme/tiny", str(baked), "--dry-run", "--revision", "v1"])
    assert result.exit_code == 0 and result.stdout.startswith(f"would upload {baked} to acme/tiny (v1): "), result.output
    damaged = Path(shutil.copytree(baked, tmp_path / "damaged"))
    (damaged / "config.json").write_text("{}")
    result = CliRunner().invoke(main, ["upload", "acme/tiny", str(damaged), "--dry-run"])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {damaged}: refusing to upload, verify found"), result.output
    assert hub.calls == []


def test_cli_upload_without_a_token_fails_before_any_network_access(baked, monkeypatch, tmp_path):
    import huggingface_hub.constants

    hub = FakeHub()
    monkeypatch.setattr(hub_client_module, "hub_client", lambda token=None: hub)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    before = {p.name: p.read_bytes() for p in sorted(baked.iterdir())}
    result = CliRunner().invoke(main, ["upload", "acme/tiny", str(baked)])
    assert result.exit_code == 2 and hub.calls == []
    assert result.output == "error: no Hugging Face token: log in with `hf auth login` (or set HF_TOKEN), or pass --token\n"
    assert {p.name: p.read_bytes() for p in sorted(baked.iterdir())} == before
    (tmp_path / "no-token").write_text("hf_saved_login\n")  # a saved login is a token
    assert CliRunner().invoke(main, ["upload", "acme/tiny", str(baked)]).exit_code == 0 and hub.calls


def test_cli_upload_old_argument_order_still_works_with_a_deprecation_line(baked, monkeypatch):
    hub = FakeHub()
    monkeypatch.setattr(hub_client_module, "hub_client", lambda token=None: hub)
    result = CliRunner().invoke(main, ["upload", str(baked), "--repo-id", "acme/tiny", "--token", "hf_test"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "deprecated: `moebake upload OUT --repo-id REPO_ID` is now `moebake upload REPO_ID OUT`",
        f"uploaded {baked} to acme/tiny: https://hub.test/acme/tiny/commit/{SHA}",
    ]
    assert hub.uploaded == {p.name: p.read_bytes() for p in sorted(baked.iterdir())}


def test_model_card_claims_bit_exactness_only_where_no_value_was_changed(baked, tmp_path):
    from moebake.reference.synthetic_sources import write_modelopt_nvfp4
    from moebake.schema.manifest import read_manifest_record

    exact = render_model_card(read_manifest_record(baked), "acme/tiny")
    assert "`moebake verify --source` proves them bit-exact" in exact
    source = write_modelopt_nvfp4(tmp_path / "nvfp4")  # gate/up globals differ in 4 of 8 experts
    convert(source, tmp_path / "shared", ConvertOptions("cutedsl"), progress=False)
    card = render_model_card(read_manifest_record(tmp_path / "shared"), "acme/nv")
    assert "proves them bit-exact" not in card
    assert (
        "the experts invert to the source's bytes except, by design (`--gate-up-globals share`), the gate/up block "
        "scales of 4 of 8 experts, which were rescaled to one shared gate/up global (largest relative change 75.00%) "
        "and are not bit-exact to the source."
    ) in card


@pytest.mark.parametrize(
    "args, line",
    [
        (["{out}"], "error: {out}: not a Hub repo id (expected ORG/NAME); the repo comes first: moebake upload ORG/NAME {out}"),
        (["up1"], "error: up1: not a Hub repo id (expected ORG/NAME)"),
        (["acme/tiny"], "error: no PATH given, and the current directory ({cwd}) is not a moebake output: moebake upload acme/tiny PATH"),
        (["acme/tiny", "{cwd}/missing"], "error: {cwd}/missing: does not exist"),
    ],
    ids=["output as the one argument", "not a repo id", "current directory", "missing PATH"],
)
def test_cli_upload_argument_mistakes_come_before_the_token_and_say_what_to_run(baked, monkeypatch, tmp_path, args, line):
    """Issue 37: `upload up1 --token x` said "error: .: not a moebake output" (the one argument taken as the repo, PATH
    defaulted without saying so); without a token, the token error came before any argument check."""
    import huggingface_hub.constants

    hub = FakeHub()
    monkeypatch.setattr(hub_client_module, "hub_client", lambda token=None: hub)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    values = {"out": baked, "cwd": tmp_path / "cwd"}
    result = CliRunner().invoke(main, ["upload", *(a.format(**values) for a in args)])  # no token anywhere
    assert result.exit_code == 2 and result.output == line.format(**values) + "\n"
    assert hub.calls == []
