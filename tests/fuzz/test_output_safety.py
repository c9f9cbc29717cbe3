"""Fuzz matrix of the output side of `convert` (and `verify`, `upload`, `demo`): nothing moebake did
not create is ever deleted or written, and every refusal or failure is one `error:` line, exit 2.

Each case watches the whole test directory (source included): a refused command leaves every file,
link and directory exactly as it was; a failed one leaves nothing behind.
"""

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from output_safety_helpers import TARGET, Watched, assert_refused, copy_checkpoint, invoke, run_cli, tree_state

SHARD0 = "model-00001-of-00002.safetensors"


@pytest.fixture()
def workspace(tmp_path, gpt_oss_tiny):
    """``tmp/p/model`` (a private copy of the tiny checkpoint) beside a user's file ``tmp/p/user.txt``."""
    copy_checkpoint(gpt_oss_tiny, tmp_path / "p" / "model")
    (tmp_path / "p" / "user.txt").write_text("the user's own file\n")
    return tmp_path


def baked(source, out):
    convert(source, out, ConvertOptions("sm90-cutlass"), progress=False)
    return out


# ---- OUT equal to, inside, or containing SRC (symbolic links resolved) -------------------------

OVERLAPS = {  # case: (working directory under tmp, SRC, OUT, what the error says)
    "out is src": ("", "p/model", "p/model", "is the source"),
    "out is src's parent": ("", "p/model", "p", "contains the source"),
    "out inside src": ("", "p/model", "p/model/baked", "inside the source"),
    "out is src, trailing /.": ("", "p/model/", "p/model/.", "is the source"),
    "convert . . in src": ("p/model", ".", ".", "is the source"),
    "convert model . in parent": ("p", "model", ".", "contains the source"),
    "out is .. of src": ("p/model", ".", "..", "contains the source"),
    "out is a link to src": ("", "p/model", "link-to-model", "is the source"),
    "out through a linked parent": ("", "p/model", "link-to-p/model", "is the source"),
    "src through a linked parent": ("", "link-to-p/model", "p/model", "is the source"),
}


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"], ["--overwrite", "--resume"]], ids=["", "overwrite", "resume"])
@pytest.mark.parametrize("case", OVERLAPS)
def test_out_overlapping_the_source_is_refused(workspace, monkeypatch, case, overwrite):
    cwd, source, out, needle = OVERLAPS[case]
    (workspace / "link-to-model").symlink_to(workspace / "p" / "model")
    (workspace / "link-to-p").symlink_to(workspace / "p")
    watched = Watched(workspace)
    monkeypatch.chdir(workspace / cwd)
    assert_refused(invoke("convert", source, out, *TARGET, *overwrite), needle, "choose another OUT")
    watched.assert_unchanged()


# ---- --overwrite deletes only a previous moebake output ----------------------------------------


def _user_directory(out: Path) -> None:
    out.mkdir()
    (out / "notes.txt").write_text("mine")


def _empty_directory(out: Path) -> None:
    out.mkdir()


def _regular_file(out: Path) -> None:
    out.write_text("a file, not a directory")


def _fifo(out: Path) -> None:
    os.mkfifo(out)


def _link_to_an_output(out: Path) -> None:
    baked(out.parent / "p" / "model", out.parent / "real-output")
    out.symlink_to(out.parent / "real-output")


def _output_plus_a_user_file(out: Path) -> None:
    baked(out.parent / "p" / "model", out)
    (out / "my-notes.md").write_text("added by the user")


def _output_plus_a_directory(out: Path) -> None:
    baked(out.parent / "p" / "model", out)
    (out / "runs").mkdir()


def _output_with_a_corrupt_manifest(out: Path) -> None:
    baked(out.parent / "p" / "model", out)
    (out / "moebake.json").write_text("{ not json")


def _output_with_a_foreign_schema(out: Path) -> None:
    baked(out.parent / "p" / "model", out)
    manifest = json.loads((out / "moebake.json").read_text())
    (out / "moebake.json").write_text(json.dumps({**manifest, "schema": "someone-else/1"}))


def _manifest_that_moebake_did_not_write(out: Path) -> None:
    out.mkdir()
    (out / "moebake.json").write_text(json.dumps({"schema": "moebake.manifest/1"}))
    (out / "data.bin").write_bytes(b"precious")


def _manifest_is_a_directory(out: Path) -> None:
    out.mkdir()
    (out / "moebake.json").mkdir()


NOT_OUTPUTS = {
    "user directory": (_user_directory, "has no moebake.json"),
    "empty directory": (_empty_directory, "has no moebake.json"),
    "regular file": (_regular_file, "is a regular file"),
    "fifo": (_fifo, "is a FIFO"),
    "link to an output": (_link_to_an_output, "is a symbolic link"),
    "output plus a user file": (_output_plus_a_user_file, "holds my-notes.md"),
    "output plus a directory": (_output_plus_a_directory, "holds runs"),
    "corrupt manifest": (_output_with_a_corrupt_manifest, "moebake.json"),
    "foreign schema": (_output_with_a_foreign_schema, "unknown manifest schema"),
    "manifest moebake did not write": (_manifest_that_moebake_did_not_write, "unusable moebake.json"),
    "manifest is a directory": (_manifest_is_a_directory, "moebake.json"),
}


@pytest.mark.parametrize("case", NOT_OUTPUTS)
def test_overwrite_refuses_anything_but_a_previous_output(workspace, case):
    make, needle = NOT_OUTPUTS[case]
    out = workspace / "out"
    make(out)
    watched = Watched(workspace)
    assert_refused(
        invoke("convert", workspace / "p" / "model", out, *TARGET, "--overwrite"),
        str(out),
        "--overwrite replaces only a previous moebake output",
        needle,
    )
    watched.assert_unchanged()


@pytest.mark.parametrize("case", ["user directory", "regular file", "output plus a user file"])
def test_without_overwrite_an_existing_out_is_refused(workspace, case):
    """Issue 37: a user's folder or file is not offered to --overwrite (which would refuse it too): choose another OUT."""
    make, needle = NOT_OUTPUTS[case]
    out = workspace / "out"
    make(out)
    watched = Watched(workspace)
    line = assert_refused(invoke("convert", workspace / "p" / "model", out, *TARGET), "already exists", needle, "choose another OUT")
    assert "pass --overwrite" not in line
    watched.assert_unchanged()


def test_without_overwrite_a_previous_output_is_refused_naming_overwrite(workspace):
    out = baked(workspace / "p" / "model", workspace / "out")
    watched = Watched(workspace)
    assert_refused(invoke("convert", workspace / "p" / "model", out, *TARGET), "already exists", "pass --overwrite to replace it")
    watched.assert_unchanged()


def test_overwrite_replaces_a_previous_output_and_nothing_else(workspace):
    out = baked(workspace / "p" / "model", workspace / "out")
    (out / ".gitattributes").write_text("*.safetensors filter=lfs\n")  # a Hub download adds it
    source_before = tree_state(workspace / "p")
    result = invoke("convert", workspace / "p" / "model", out, *TARGET, "--overwrite", "--flashinfer-layout", "v1")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "moebake.json").read_text())["flashinfer_layout"]["id"] == "v1"
    assert sorted(p.name for p in workspace.iterdir()) == ["out", "p"] and tree_state(workspace / "p") == source_before
    assert invoke("verify", out).exit_code == 0


# ---- user directories named like moebake's staging and retired directories ----------------------


@pytest.mark.parametrize("flags", [[], ["--resume"], ["--overwrite"], ["--overwrite", "--resume"]], ids=str)
@pytest.mark.parametrize("kind", ["directory", "file", "link"])
def test_a_user_entry_named_like_the_staging_directory_is_left_alone(workspace, flags, kind):
    staging = workspace / ".out.partial"
    if kind == "directory":
        staging.mkdir()
        (staging / "keep.txt").write_text("mine")
    elif kind == "file":
        staging.write_text("mine")
    else:
        staging.symlink_to(workspace / "p")
    watched = Watched(workspace)
    assert_refused(invoke("convert", workspace / "p" / "model", workspace / "out", *TARGET, *flags), ".out.partial")
    watched.assert_unchanged()


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_user_entry_named_like_the_retired_directory_is_left_alone(workspace, kind):
    out = baked(workspace / "p" / "model", workspace / "out")
    retired = workspace / ".out.replaced"
    if kind == "directory":
        retired.mkdir()
        (retired / "keep.txt").write_text("mine")
    else:
        retired.write_text("mine")
    watched = Watched(workspace)
    assert_refused(invoke("convert", workspace / "p" / "model", out, *TARGET, "--overwrite"), ".out.replaced", "move it away")
    watched.assert_unchanged()


# ---- shard names from the index: plain file names only ------------------------------------------

TRAVERSALS = {
    "parent": "../evil.safetensors",
    "absolute": "{tmp}/evil.safetensors",
    "subdirectory": "sub/model-00001-of-00002.safetensors",
    "dot dot": "..",
    "backslash": "..\\evil.safetensors",
    "nul": "model-00001-of-00002.safetensors\x00.txt",
    "newline": "model-00001-of-00002\n.safetensors",
    "empty": "",
    "a number": 5,
    "null": None,
    "not safetensors": "config.json",
    "the manifest's name": "moebake.json",
    "self then back": "model-00001-of-00002.safetensors/../model-00001-of-00002.safetensors",
}


@pytest.mark.parametrize("where", ["out beside src", "out elsewhere"])
@pytest.mark.parametrize("case", TRAVERSALS)
def test_shard_names_that_are_not_plain_file_names_are_refused(workspace, case, where):
    source = workspace / "p" / "model"
    shutil.copyfile(source / SHARD0, workspace / "p" / "evil.safetensors")  # what "../" would reach
    shutil.copyfile(source / SHARD0, workspace / "evil.safetensors")
    (source / "sub").mkdir()
    shutil.copyfile(source / SHARD0, source / "sub" / SHARD0)
    name = TRAVERSALS[case]
    name = name.format(tmp=workspace) if isinstance(name, str) else name
    index = json.loads((source / "model.safetensors.index.json").read_text())
    tensor = next(t for t, s in index["weight_map"].items() if s == SHARD0)
    index["weight_map"][tensor] = name
    (source / "model.safetensors.index.json").write_text(json.dumps(index))
    out = workspace / "p" / "out" if where == "out beside src" else workspace / "elsewhere" / "out"
    out.parent.mkdir(exist_ok=True)
    watched = Watched(workspace)
    line = assert_refused(invoke("convert", source, out, *TARGET), "model.safetensors.index.json", tensor)
    assert "not a plain file name" in line or "expected a shard file name" in line, line
    watched.assert_unchanged()


def test_output_paths_are_built_only_from_plain_names(tmp_path):
    from moebake.schema.files import child

    for name in ("../x", "/etc/passwd", "a/b", "..", "", "a\\b", "a\x00b"):
        with pytest.raises(ValueError, match="not a plain file name"):
            child(tmp_path, name)
    assert child(tmp_path, "model-00001-of-00002.safetensors") == tmp_path / "model-00001-of-00002.safetensors"


# ---- FIFOs and other non-regular files never hang, and are named ---------------------------------


def _fifo_in_place_of(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name, needle", [(SHARD0, "FIFO"), ("model.safetensors.index.json", "FIFO"), ("config.json", "FIFO")])
def test_convert_refuses_a_fifo_in_the_source(workspace, name, needle):
    source = workspace / "p" / "model"
    _fifo_in_place_of(source / name)
    watched = Watched(workspace)
    assert_refused(run_cli("convert", source, workspace / "out", *TARGET, timeout=60), name, needle)
    watched.assert_unchanged()


def test_convert_skips_a_fifo_beside_the_weights(workspace):
    source = workspace / "p" / "model"
    os.mkfifo(source / "chat_template.jinja")
    result = run_cli("convert", source, workspace / "out", *TARGET, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not (workspace / "out" / "chat_template.jinja").exists()


@pytest.mark.parametrize("name", [SHARD0, "model.safetensors.index.json", "moebake.json", "config.json"])
def test_verify_reports_a_fifo_without_hanging(workspace, name):
    out = baked(workspace / "p" / "model", workspace / "out")
    _fifo_in_place_of(out / name)
    result = run_cli("verify", out, timeout=60)
    assert "Traceback" not in result.stderr and result.returncode in (1, 2), result.stderr
    assert name in result.stderr and ("FIFO" in result.stderr or "not a moebake output" in result.stderr), result.stderr


def test_inspect_refuses_a_fifo_without_hanging(workspace):
    _fifo_in_place_of(workspace / "p" / "model" / SHARD0)
    assert_refused(run_cli("inspect", workspace / "p" / "model", timeout=60), SHARD0, "FIFO")


# ---- OUT's parent missing, a file, read-only; disk full; unreadable side files -------------------


@pytest.mark.parametrize(
    "case, out, needle",
    [
        ("missing parent", "no/such/dir/out", "does not exist"),
        ("parent is a file", "p/user.txt/out", "is not a directory"),
        ("out is the root", "/", "file-system root"),
    ],
)
def test_unusable_out_locations_are_refused(workspace, case, out, needle):
    watched = Watched(workspace)
    assert_refused(invoke("convert", workspace / "p" / "model", workspace / out if out != "/" else out, *TARGET), needle)
    watched.assert_unchanged()


def _namespace_available() -> bool:
    """Whether this machine lets the tests mount a small tmpfs in a user+mount namespace."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || mount -t tmpfs -o size=64k tmpfs /tmp"],
        capture_output=True,
    )
    return probe.returncode == 0


def _convert_on_a_tmpfs(workspace: Path, mount_options: str) -> subprocess.CompletedProcess:
    """``convert`` into ``workspace/mnt/out`` where ``mnt`` is a fresh tmpfs with ``mount_options``,
    in a namespace of its own; prints the tmpfs's listing after the command, on stdout's last line."""
    import sys

    (workspace / "mnt").mkdir()
    script = (
        f'mount -t tmpfs -o {mount_options} tmpfs "$1" || exit 99; shift; '
        '"$@"; rc=$?; echo; echo "LEFT:$(ls -A "$MNT" | tr "\\n" " ")"; exit $rc'
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MNT": str(workspace / "mnt")}
    return subprocess.run(
        [
            "unshare",
            "-rm",
            "sh",
            "-c",
            script,
            "sh",
            str(workspace / "mnt"),
            sys.executable,
            "-m",
            "moebake",
            "convert",
            str(workspace / "p" / "model"),
            str(workspace / "mnt" / "out"),
            *TARGET,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.skipif(not _namespace_available(), reason="cannot mount a tmpfs in a user namespace here")
@pytest.mark.parametrize(
    "mount_options, needle",
    [("size=256k", "not enough free space: the bake writes"), ("ro,size=1m", "read-only file system")],
    ids=["disk full", "read-only"],
)
def test_disk_full_and_read_only_on_a_real_tmpfs(workspace, mount_options, needle):
    source_before = tree_state(workspace / "p")
    result = _convert_on_a_tmpfs(workspace, mount_options)
    assert result.returncode != 99, result.stderr
    *output, left = result.stdout.strip().splitlines()
    assert left == "LEFT:", (left, result.stderr)  # nothing left behind on the tmpfs
    assert_refused(subprocess.CompletedProcess([], result.returncode, "\n".join(output), result.stderr), needle)
    assert tree_state(workspace / "p") == source_before


@pytest.mark.parametrize("after_chunks", [0, 3])
def test_disk_full_while_writing_is_one_line_and_leaves_nothing(workspace, monkeypatch, after_chunks):
    """ENOSPC from the write itself (simulated: the writer's file raises it after some chunks)."""
    from moebake.convert import writer

    written, original = [], writer._timed_chunks

    def filling(chunks):
        for chunk in original(chunks):
            if len(written) >= after_chunks:
                raise OSError(errno.ENOSPC, "No space left on device")
            written.append(len(chunk))
            yield chunk

    monkeypatch.setattr(writer, "_timed_chunks", filling)
    watched = Watched(workspace)
    assert_refused(
        invoke("convert", workspace / "p" / "model", workspace / "out", *TARGET), "No space left on device", ".out.partial/model-0000"
    )
    watched.assert_unchanged()


def test_read_only_parent_is_refused_before_anything_is_written(workspace, monkeypatch):
    """The parent check (os.access) alone, which root passes on a writable file system: simulated."""
    from moebake.convert import output_dir

    real_access = os.access
    monkeypatch.setattr(output_dir.os, "access", lambda path, mode: False if Path(path) == workspace / "ro" else real_access(path, mode))
    (workspace / "ro").mkdir()
    watched = Watched(workspace)
    assert_refused(invoke("convert", workspace / "p" / "model", workspace / "ro" / "out", *TARGET), "cannot write in", "ro")
    watched.assert_unchanged()


def test_an_unreadable_side_file_is_refused_before_baking(workspace, monkeypatch):
    from moebake.schema import files

    source = workspace / "p" / "model"
    real_open = os.open

    def refusing(path, flags, *args):
        if Path(path) == source / "tokenizer_config.json":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(files.os, "open", refusing)
    watched = Watched(workspace)
    assert_refused(invoke("convert", source, workspace / "out", *TARGET), "tokenizer_config.json", "Permission denied")
    watched.assert_unchanged()


# ---- upload leaves OUT byte-identical when the Hub cannot be reached; demo; determinism ---------


def test_upload_without_network_leaves_out_byte_identical(workspace):
    out = baked(workspace / "p" / "model", workspace / "out")
    watched = Watched(workspace)
    result = run_cli("upload", "acme/tiny-moe", out, env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_test"})
    assert_refused(result, "uploading", "acme/tiny-moe", "offline mode is on", "--dry-run")
    watched.assert_unchanged()


@pytest.mark.parametrize("kind", ["user directory", "file", "link"])
def test_demo_refuses_a_workdir_it_did_not_make(tmp_path, kind):
    workdir = tmp_path / "work"
    if kind == "user directory":
        workdir.mkdir()
        (workdir / "thesis.tex").write_text("mine")
    elif kind == "file":
        workdir.write_text("mine")
    else:
        (tmp_path / "elsewhere").mkdir()
        workdir.symlink_to(tmp_path / "elsewhere")
    watched = Watched(tmp_path)
    assert_refused(invoke("demo", "--workdir", workdir), str(workdir), "--workdir")
    watched.assert_unchanged()


def test_identical_runs_write_identical_bytes(workspace, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    first = tree_state(baked(workspace / "p" / "model", workspace / "one"))
    shutil.rmtree(workspace / "one")
    assert tree_state(baked(workspace / "p" / "model", workspace / "one")) == first
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    manifest = json.loads((baked(workspace / "p" / "model", workspace / "two") / "moebake.json").read_text())
    assert manifest["created"] == "2023-11-14T22:13:20+00:00"
