"""Files that a checkpoint or an output names: plain file names only, and regular files only.

A name read from a checkpoint (a shard in ``model.safetensors.index.json``) or a manifest is
untrusted: :func:`plain_name_problem` accepts only a plain file name, the convention of
safetensors and huggingface_hub (no ``/`` or ``\\``, not ``.`` or ``..``, no control characters
such as NUL), and :func:`child` is the one way a path is built from such a name, so no path made
from one leaves its directory. :func:`open_regular` opens a file without blocking and refuses
anything but a regular file (a FIFO in place of a shard would otherwise hang the reader).
"""

import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

from moebake.errors import CheckpointError, InvalidArgumentError, MoebakeError

CONFIG_NAME = "config.json"
"""A Hugging Face checkpoint's model configuration (a source's, and a bake's rewritten one)."""

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


def plain_name_problem(name: object) -> str | None:
    """Why ``name`` is not a plain file name (None when it is one)."""
    if not isinstance(name, str):
        return f"a {type(name).__name__}, not a string"
    if name in ("", ".", ".."):
        return "not a file name"
    for character, why in (("/", "contains '/'"), ("\\", "contains '\\'")):
        if character in name:
            return why
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character"
    return None


def child(directory: str | os.PathLike, name: str) -> Path:
    """``directory / name`` for a plain file ``name``; ValueError otherwise (callers check names
    when they read them, with a message that names their source: this is the last line of defence)."""
    problem = plain_name_problem(name)
    if problem is not None:
        raise InvalidArgumentError(f"{name!r} is not a plain file name ({problem})")
    return Path(directory) / name


def file_kind(mode: int) -> str:
    """``a FIFO``, ``a directory``, ... for a ``st_mode`` that is not a regular file's."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def open_regular(path: str | os.PathLike, buffering: int = -1, error: type[MoebakeError] = CheckpointError) -> BinaryIO:
    """``path`` opened for reading in binary mode, if it is a regular file (symbolic links followed).

    ``error`` (a MoebakeError) naming ``path`` if it cannot be opened or is anything else (a FIFO,
    device, directory, socket): the open does not block, and the type is checked on the opened file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is {file_kind(mode)}, not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~getattr(os, "O_NONBLOCK", 0))
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise
