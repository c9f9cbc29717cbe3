"""The Hub client moebake talks to, and how its failures are reported.

moebake calls only these ``huggingface_hub.HfApi`` methods, so tests inject a fake with the same
signatures (or a real ``HfApi(endpoint=...)`` pointed at a loopback server):

* ``create_repo(repo_id, *, private, exist_ok=True)``
* ``create_branch(repo_id, *, branch, exist_ok=True)``
* ``upload_folder(*, repo_id, folder_path, commit_message, revision, create_pr)`` -> ``CommitInfo``
* ``snapshot_download(repo_id, *, revision, allow_patterns, ignore_patterns)`` -> snapshot folder path
"""

import importlib

from huggingface_hub import HfApi

from moebake.errors import HubError, OptionError


def hub_client(token: str | None = None) -> HfApi:
    """An ``HfApi`` for the configured endpoint (``HF_ENDPOINT``), with ``token`` or the saved login."""
    return HfApi(token=token)


def require_token(token: str | None) -> None:
    """OptionError (``error:`` line, exit 2) when neither ``token`` nor a saved login or ``HF_TOKEN`` gives
    a Hugging Face token: uploading needs one, and this is known before any network access."""
    from huggingface_hub import get_token

    if not token and not get_token():
        raise OptionError("no Hugging Face token: log in with `hf auth login` (or set HF_TOKEN), or pass --token")


def _http_client_errors() -> tuple[type[BaseException], ...]:
    """Base exception classes of the HTTP library huggingface_hub uses (httpx2 in 2.x, httpx in 1.x;
    huggingface_hub's own errors and requests' errors are OSErrors)."""
    found = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


HUB_ERRORS = (OSError, ValueError, *_http_client_errors())
"""What a Hub call raises for a refused request, a missing repo/revision/file, offline mode or a
dead connection (``HfHubHTTPError``, ``LocalEntryNotFoundError`` and ``OfflineModeIsEnabled`` are
OSErrors; ``HFValidationError`` is a ValueError)."""


def hub_error(what: str, err: BaseException) -> HubError:
    """One-line HubError: ``what`` failed, with the error's type and first line."""
    first_line = (str(err).strip().splitlines() or [""])[0]
    return HubError(f"{what}: {type(err).__name__}: {first_line}")
