"""What a conversion keeps when it stops before its end, and the one line that says so.

A fault stops a conversion that had nothing wrong with its input: Ctrl-C or SIGTERM
(:class:`~moebake.errors.Interrupted`), an OSError while writing (a full disk, an I/O error), or a worker
process that died (:class:`~moebake.errors.WorkerError`). The shards already finished (written, fsynced and
listed in the resume record, :mod:`moebake.convert.resume_record`) stay in the staging directory for
``--resume``; the shard files not finished are deleted (a resume bakes them again; on a full disk that
frees their space). When no shard is finished there is nothing to keep: the staging directory is removed,
so the same command simply starts again. Either way the message says which, and what to run next.

Bad input (any other :class:`~moebake.errors.MoebakeError`) is no fault: the staging directory this run
made is removed, and a partial conversion it resumed is left as it was.
"""

import os
from collections.abc import Iterable

from moebake.convert.resume_record import load_resume_record
from moebake.convert.staging import Staging
from moebake.errors import Interrupted, MoebakeError, OutputError, WorkerError
from moebake.schema.files import child


def after_stop(err: BaseException, staging: Staging, planned: Iterable[str]) -> BaseException | None:
    """Clean ``staging`` up after ``err`` stopped the conversion of the output shards ``planned`` (file names),
    and return the exception to raise in its place, its message saying what was kept; None to raise ``err``
    itself (an exception that is neither bad input nor a fault: a bug, left as it happened)."""
    if isinstance(err, (KeyboardInterrupt, OSError, WorkerError)):
        kept = _keep_finished(staging, list(planned))
        if isinstance(err, KeyboardInterrupt):
            return Interrupted(kept, terminated=getattr(err, "terminated", False))
        if isinstance(err, OSError):
            return OutputError(f"{err.filename or staging.path}: {err.strerror or err}; {kept}")
        return WorkerError(f"{err}; {kept}")
    if isinstance(err, MoebakeError) and staging.fresh:
        staging.remove()
    return None


def _keep_finished(staging: Staging, planned: list[str]) -> str:
    """Keep the finished shards in ``staging`` and delete the unfinished ones (the whole directory when no
    shard is finished); what was kept and what to run next, as a phrase."""
    try:
        record = load_resume_record(staging.path)
    except MoebakeError:
        record = None  # a damaged record vouches for nothing: --resume would refuse it, so nothing is worth keeping
    finished = sorted(set(record["shards"]) & set(planned)) if record else []
    if not finished:
        staging.remove()
        return "no shard was finished, so nothing was kept; run the same command again to start over"
    for name in planned:
        if name not in finished and os.path.lexists(path := child(staging.path, name)):
            os.unlink(path)
    return (
        f"{len(finished)} of {len(planned)} shard(s) are finished and kept in {staging.path}; "
        "re-run the same command with --resume to bake the rest"
    )
