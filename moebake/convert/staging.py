"""The staging directory ``.OUT.partial`` a conversion builds OUT in, and its lock.

moebake makes it with a lock file inside, :data:`LOCK_NAME`, whose first line is :data:`MARKER`:
that file is how a staging directory is recognised as moebake's (a user's directory that happens
to be named ``.OUT.partial`` has none, and is never written to or deleted). The conversion using
it holds an exclusive ``flock`` on that file for as long as it runs (the kernel drops the lock
when the process dies, however it dies), so a second conversion into the same OUT, a ``--resume``
included, is refused while the first runs. Removing it deletes only plain files, the lock file
last, then the then empty directory. A partial conversion left with no finished shard (its process
killed before the first) holds nothing to resume: a plain run empties it and starts over.
"""

import errno
import fcntl
import logging
import os
import stat
from pathlib import Path

from moebake.convert.resume_record import finished_shard_count
from moebake.errors import MoebakeError, OutputError
from moebake.schema.files import file_kind, open_regular

LOG = logging.getLogger(__name__)
LOCK_NAME = ".moebake-staging.lock"
MARKER = "moebake staging directory (locked by the conversion that writes it)"


def staging_problem(staging: Path) -> str | None:
    """Why ``staging`` is not a staging directory moebake made (None when it is one)."""
    mode = os.lstat(staging).st_mode
    if not stat.S_ISDIR(mode):
        return f"is {file_kind(mode)}"
    lock = staging / LOCK_NAME
    try:
        with open_regular(lock) as f:
            if f.read(len(MARKER)) == MARKER.encode():
                return None
    except MoebakeError:
        pass
    return f"has no moebake lock file {LOCK_NAME}, so moebake leaves it alone: move it away or remove it yourself"


def check_staging(paths, *, resume: bool) -> None:
    """OutputError if ``paths.staging`` exists and may not be used: not moebake's, in use by a running
    conversion, or a partial conversion that only ``resume`` continues. Writes nothing."""
    staging = paths.staging
    if not os.path.lexists(staging):
        return
    problem = staging_problem(staging)
    if problem is not None:
        raise OutputError(f"{staging}: {problem}")
    try:
        fd = os.open(staging / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise OutputError(f"{staging / LOCK_NAME}: cannot open ({err.strerror})") from None
    try:
        _lock(fd, staging, paths.label)
    finally:
        os.close(fd)
    if not resume and finished_shard_count(staging) > 0:  # none finished: a plain run starts it over (Staging.claim)
        raise OutputError(_partial_message(staging, paths.label))


class Staging:
    """A claimed staging directory: its path, whether it holds nothing of an earlier run (``fresh``: this run made it,
    or emptied one whose conversion had finished no shard), and the held lock."""

    def __init__(self, path: Path, fresh: bool, fd: int):
        self.path, self.fresh, self._fd = path, fresh, fd

    @classmethod
    def claim(cls, paths, *, resume: bool) -> "Staging":
        """Make ``paths.staging`` (with its lock file) or, with ``resume``, take over the partial
        conversion there; either way hold its lock. OutputError as :func:`check_staging`."""
        staging = paths.staging
        try:
            os.mkdir(staging)
            fresh = True
        except FileExistsError:
            fresh = False
        except OSError as err:
            raise OutputError(f"{staging}: cannot create ({err.strerror})") from None
        lock = staging / LOCK_NAME
        if not fresh and (problem := staging_problem(staging)) is not None:
            raise OutputError(f"{staging}: {problem}")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if fresh else 0), 0o644)
        except OSError as err:
            if fresh:
                os.rmdir(staging)
            raise OutputError(f"{lock}: cannot open ({err.strerror})") from None
        try:
            _lock(fd, staging, paths.label)
            if not fresh and not resume:
                if finished_shard_count(staging) > 0:
                    raise OutputError(_partial_message(staging, paths.label))
                # killed before its first shard was finished (SIGKILL, a power cut): nothing in it to keep
                LOG.info("%s: a partial conversion with no finished shard; starting over", staging)
                _remove_files(staging, keep_lock=True)
                fresh = True
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{MARKER}\npid {os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            if fresh:
                _remove_files(staging)
            raise
        return cls(staging, fresh, fd)

    def remove(self) -> None:
        """Delete the staging directory (its plain files, the lock file last) and release the lock."""
        try:
            _remove_files(self.path)
        finally:
            self.release()

    def drop_lock_file(self) -> None:
        """Delete the lock file, keeping the lock itself until :meth:`release` (before the directory
        becomes OUT, which must not hold it)."""
        os.unlink(self.path / LOCK_NAME)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _lock(fd: int, staging: Path, out_label: str) -> None:
    """Take the exclusive lock on open lock file ``fd``, or OutputError naming its holder."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise OutputError(f"{staging / LOCK_NAME}: cannot lock ({err.strerror})") from None
        holder = os.pread(fd, 200, 0).decode("utf-8", "replace").splitlines()[1:2]
        raise OutputError(
            f"{out_label}: another moebake convert is writing it ({holder[0] if holder else 'lock held'} "
            f"on {staging / LOCK_NAME}); wait for it to finish"
        ) from None


def _partial_message(staging: Path, out_label: str) -> str:
    finished = finished_shard_count(staging)
    return (
        f"{out_label}: a partial conversion is in {staging} ({finished} shard(s) finished); pass --resume to "
        f"continue it with the same options, or remove {staging} to start over"
    )


def _remove_files(staging: Path, keep_lock: bool = False) -> None:
    """Delete our staging directory's plain files (the lock file last) and the directory, or with ``keep_lock`` all
    but the lock file; a directory inside (which moebake never makes) is left, and so is the staging directory then."""
    for entry in os.scandir(staging):
        if entry.name != LOCK_NAME and not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.path)
    if keep_lock:
        return
    if os.path.lexists(staging / LOCK_NAME):
        os.unlink(staging / LOCK_NAME)
    try:
        os.rmdir(staging)
    except OSError:
        pass
