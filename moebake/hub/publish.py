"""``moebake upload``: verify a baked output, write its model card, and upload it to a Hub model repo.

Steps: refuse unless ``verify`` passes (and, given the source, the deep bit-exactness check);
make ``README.md`` (:mod:`moebake.hub.model_card`) and the ``moebake.json`` that records it, in
memory; create the repo if missing (and the branch ``revision`` if given); ``upload_folder`` a
temporary folder that links to OUT's files, with the new card and manifest in it; and only once
the upload succeeded, write the card and manifest into OUT. A failed upload (no network, refused)
leaves OUT byte for byte as it was. With ``hf_xet`` installed (the default)
``upload_folder`` streams, splits large folders into several commits and resumes an interrupted
upload when re-run (files already committed are skipped, uploaded chunks deduplicated); without
it, one commit that skips unchanged files. ``create_pr`` opens a new pull request each run; to
resume one, re-run with ``revision="refs/pr/N"``. :func:`preview` makes the same checks and returns what would
be sent, without the Hub (``upload --dry-run``).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from moebake.convert.source_check import compare_with_source
from moebake.convert.verify import verify_output
from moebake.errors import HubError, IntegrityError, OptionError, OutputError
from moebake.hub.client import HUB_ERRORS, OFFLINE, UNREACHABLE, hub_error, hub_reason
from moebake.hub.download import resolve_source
from moebake.hub.model_card import CARD_NAME, card_files, source_label, write_model_card
from moebake.kernels.pack import link_upload_files, upload_paths
from moebake.schema.manifest import read_manifest, read_manifest_record

if TYPE_CHECKING:
    from huggingface_hub import HfApi

PR_REF_PREFIX = "refs/pr/"


def publish(
    out: str | os.PathLike,
    repo_id: str,
    client: HfApi,
    *,
    private: bool = False,
    revision: str | None = None,
    create_pr: bool = False,
    source: str | None = None,
    progress: bool = False,
):
    """Upload verified output ``out`` to model repo ``repo_id`` with ``client``; returns its ``CommitInfo``.

    ``source``: a local checkpoint or Hub repo spec to prove bit-exactness against before uploading.
    """
    out = Path(out)
    message, updated = _checked(out, repo_id, client, revision, create_pr, source, progress)
    with tempfile.TemporaryDirectory(prefix="moebake-upload-") as folder:
        _link_upload_folder(out, Path(folder), updated)
        try:
            client.create_repo(repo_id, private=private, exist_ok=True)
            if revision and not revision.startswith(PR_REF_PREFIX):
                client.create_branch(repo_id, branch=revision, exist_ok=True)
            commit = client.upload_folder(
                repo_id=repo_id, folder_path=folder, commit_message=message, revision=revision, create_pr=create_pr
            )
        except HUB_ERRORS as err:
            raise _upload_error(out, repo_id, err) from None
    try:
        write_model_card(out, repo_id)
    except OSError as err:
        raise OutputError(
            f"{out}: uploaded to {repo_id}, but writing its model card into it failed ({err.strerror}); "
            "re-run the same command once it is writable"
        ) from None
    return commit


@dataclass(frozen=True)
class UploadPreview:
    """What :func:`publish` would send, found without the Hub: the commit message, the model card, and every file
    of the commit (name, bytes, and whether the upload writes it: the card and the manifest recording it)."""

    message: str
    card: str
    files: list[tuple[str, int, bool]]


def preview(
    out: str | os.PathLike,
    repo_id: str,
    client=None,
    *,
    revision: str | None = None,
    create_pr: bool = False,
    source: str | None = None,
    progress: bool = False,
) -> UploadPreview:
    """The checks :func:`publish` makes (``verify``, and the comparison with ``source`` if given; ``client`` only
    downloads a Hub ``source``), then what it would upload; sends and writes nothing."""
    out = Path(out)
    message, updated = _checked(out, repo_id, client, revision, create_pr, source, progress)
    sizes = {entry.name: entry.stat().st_size for entry in os.scandir(out) if entry.is_file()}
    sizes.update({rel: (out / rel).stat().st_size for rel in upload_paths(out, read_manifest(out))})
    sizes.update({name: len(data) for name, data in updated.items()})
    return UploadPreview(
        message, updated[CARD_NAME].decode("utf-8"), [(name, size, name in updated) for name, size in sorted(sizes.items())]
    )


def _checked(
    out: Path, repo_id: str, client, revision: str | None, create_pr: bool, source: str | None, progress: bool
) -> tuple[str, dict[str, bytes]]:
    """Refuse the options or ``out`` as :func:`publish` does; the commit message and the files the upload writes."""
    if create_pr and revision:
        raise OptionError(
            "--create-pr opens a pull request against the default branch and cannot be combined with "
            f"--revision {revision} (to resume an interrupted pull request, pass --revision {PR_REF_PREFIX}N)"
        )
    problems = verify_output(out)
    if not problems and source is not None:
        problems = compare_with_source(out, resolve_source(source, client).path, progress)
    if problems:
        raise IntegrityError(f"{out}: refusing to upload, verify found {len(problems)} problem(s); first: {problems[0]}")
    manifest = read_manifest_record(out)
    return f"moebake {manifest.target} bake of {source_label(manifest.source)}", card_files(out, repo_id)


def _upload_error(out: Path, repo_id: str, err: BaseException) -> HubError:
    """The one line for a failed upload: what to do about offline mode or a Hub that cannot be reached; else the
    Hub's own error, and that re-running resumes."""
    reason = hub_reason(err)
    if reason == OFFLINE:
        return HubError(
            f"uploading {out} to {repo_id}: {reason}, so nothing was sent; unset HF_HUB_OFFLINE to upload, or "
            "see what would be sent with --dry-run"
        )
    if reason is not None and reason.startswith(UNREACHABLE):
        return HubError(
            f"uploading {out} to {repo_id} failed: {reason}; re-run the same command once it can be (an interrupted upload resumes)"
        )
    return hub_error(f"uploading {out} to {repo_id} failed (re-run the same command to resume)", err)


def _link_upload_folder(out: Path, folder: Path, updated: dict[str, bytes]) -> None:
    """Fill ``folder`` with what is uploaded: symbolic links to OUT's files (the Hub client reads
    through them) and to the kernel files its manifest records, and the ``updated`` files' new bytes."""
    for entry in sorted(os.scandir(out), key=lambda e: e.name):
        if entry.name not in updated and entry.is_file():
            os.symlink(os.path.realpath(entry.path), folder / entry.name)
    for name, data in updated.items():
        (folder / name).write_bytes(data)
    link_upload_files(out, folder, read_manifest(out))  # kernels/<set>/...: the compiled kernels the manifest records
