"""The Hub client moebake talks to, and how its failures are reported.

moebake calls only these ``huggingface_hub.HfApi`` methods, so tests inject a fake with the same
signatures (or a real ``HfApi(endpoint=...)`` pointed at a loopback server):

* ``create_repo(repo_id, *, private, exist_ok=True)``
* ``create_branch(repo_id, *, branch, exist_ok=True)``
* ``upload_folder(*, repo_id, folder_path, commit_message, revision, create_pr)`` -> ``CommitInfo``
* ``snapshot_download(repo_id, *, revision, allow_patterns, ignore_patterns)`` -> snapshot folder path
"""

import importlib
import re
import socket

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


HUB_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, *_http_client_errors())
"""What a Hub call raises for a refused request, a missing repo/revision/file, offline mode or a
dead connection (``HfHubHTTPError``, ``LocalEntryNotFoundError`` and ``OfflineModeIsEnabled`` are
OSErrors; ``HFValidationError`` is a ValueError)."""


def hub_error(what: str, err: BaseException) -> HubError:
    """One-line HubError: ``what`` failed, with the error's type and first line."""
    first_line = (str(err).strip().splitlines() or [""])[0]
    return HubError(f"{what}: {type(err).__name__}: {first_line}")


OFFLINE = "offline mode is on (HF_HUB_OFFLINE=1)"
"""How :func:`hub_reason` names offline mode."""
UNREACHABLE = "the Hub cannot be reached"
"""How :func:`hub_reason`'s line for a connection failure begins."""


def hub_reason(err: BaseException) -> str | None:
    """Why a Hub request failed, in words a user can act on, where it is one of: offline mode (:data:`OFFLINE`), no
    connection (:data:`UNREACHABLE`), no such repo or revision, a gated repo; None for any other failure. ``err`` and
    the exceptions it was raised from are read (huggingface_hub raises LocalEntryNotFoundError from the cause)."""
    from huggingface_hub import constants, errors

    def kind(name: str) -> type | tuple[()]:
        return getattr(errors, name, ())  # () matches nothing: a huggingface_hub release without that class

    chain = list(_raised_from(err))
    if any(isinstance(e, kind("OfflineModeIsEnabled")) for e in chain):
        return OFFLINE
    cause = next((e for e in chain if isinstance(e, _transport_errors())), None)
    if cause is not None:
        detail = re.sub(r"^\[Errno -?\d+\]\s*", "", (str(cause).strip().splitlines() or [""])[0])
        return f"{UNREACHABLE} ({detail or type(cause).__name__})"
    if isinstance(err, kind("LocalEntryNotFoundError")) and constants.HF_HUB_OFFLINE:
        return OFFLINE
    if isinstance(err, kind("GatedRepoError")):
        return "the repo is gated: accept its conditions on the Hub, and pass --token"
    if isinstance(err, kind("RepositoryNotFoundError")):
        return "the Hub has no such repo, or it is private: check the name, or pass --token"
    if isinstance(err, kind("RevisionNotFoundError")):
        return "the Hub repo has no such revision"
    return None


def _raised_from(err: BaseException | None):
    """``err``, then the exception it was raised from, and so on."""
    seen = set()
    while err is not None and id(err) not in seen:
        yield err
        seen.add(id(err))
        err = err.__cause__ or err.__context__


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a network failure (no route, no name, refused, timed out) raises, in Python and in the HTTP library
    huggingface_hub uses (httpx2 in 2.x, httpx in 1.x, requests in 0.x)."""
    found = [ConnectionError, TimeoutError, socket.gaierror]
    for module, names in (
        ("httpx2", ("TransportError",)),
        ("httpx", ("TransportError",)),
        ("requests.exceptions", ("ConnectionError", "Timeout")),
    ):
        try:
            found += [getattr(importlib.import_module(module), name) for name in names]
        except (ImportError, AttributeError):
            continue
    return tuple(found)
