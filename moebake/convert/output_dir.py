"""Where a conversion writes OUT, and what it may replace or delete there.

OUT is built in the sibling staging directory ``.OUT.partial`` (:mod:`moebake.convert.staging`)
and renamed into place when complete. With ``--overwrite`` an existing OUT is first renamed to
``.OUT.replaced`` and deleted once the new OUT is in place. The rules, checked before anything is
written:

* OUT is not the source, inside it, or around it (paths compared with symbolic links resolved);
* OUT's parent is an existing, writable directory;
* ``--overwrite`` replaces only a previous moebake output (:func:`output_problem`): a directory
  (not a link) whose ``moebake.json`` is a manifest moebake wrote, holding nothing but the files
  that manifest lists (and a Hub ``.gitattributes``). Deleting one (:func:`remove_output`)
  deletes exactly those files, ``moebake.json`` last, then the then empty directory: never a
  user's directory, a file, or anything the manifest does not list;
* ``.OUT.replaced`` is deleted only if it is a moebake output too, and ``.OUT.partial`` is used
  only if moebake made it (its lock file).
"""

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from moebake.convert.staging import check_staging
from moebake.errors import MoebakeError, OutputError
from moebake.progress_bars import size_text
from moebake.schema.checksums import ALGORITHMS, file_digest, parse_tagged
from moebake.schema.files import file_kind, plain_name_problem
from moebake.schema.manifest import MANIFEST_NAME, read_manifest
from moebake.schema.source_location import public_location

HUB_FILES = {".gitattributes"}
"""Files a Hub repo adds beside an output's files, which --overwrite may delete too."""


@dataclass(frozen=True)
class OutputPaths:
    """OUT as given (for messages) and absolute (its parent's symbolic links resolved), and its
    staging and retired siblings."""

    given: Path
    out: Path
    staging: Path
    retired: Path

    @property
    def label(self) -> str:
        """OUT as given, with the absolute path when that differs (``.`` -> ``. (/data/model)``)."""
        return str(self.given) if str(self.given) == str(self.out) else f"{self.given} ({self.out})"


def output_paths(out: str | os.PathLike) -> OutputPaths:
    """The :class:`OutputPaths` of ``out``; OutputError for the file-system root."""
    given = Path(out)
    absolute = Path(os.path.realpath(given.parent)) / given.name if os.path.islink(given) else Path(os.path.realpath(given))
    if absolute.parent == absolute:
        raise OutputError(f"{given}: cannot write an output in place of the file-system root")
    parent = absolute.parent
    return OutputPaths(given, absolute, parent / f".{absolute.name}.partial", parent / f".{absolute.name}.replaced")


def check_output(paths: OutputPaths, *, overwrite: bool, resume: bool, source: str | os.PathLike | None = None) -> None:
    """OutputError (one line) unless a conversion may write ``paths.out`` from ``source`` (a local
    checkpoint directory, or None when not known yet) with these flags. Writes nothing."""
    if source is not None:
        check_not_overlapping(paths, Path(source))
    check_destination(paths, overwrite=overwrite)
    check_staging(paths, resume=resume)


def finished_bake(paths: OutputPaths, options: dict, source: str) -> bool | None:
    """Whether OUT, a finished moebake output with no partial conversion beside it, was baked from ``source``
    (a local path, or a Hub repo ``ORG/NAME[@REVISION]``) with these options (:meth:`ConvertOptions.as_dict`;
    the chunk size, which changes no byte, aside): then ``--resume`` has nothing to do. None when OUT is
    not such an output. Reads the manifest only; ``moebake verify`` checks the files."""
    from moebake.convert.resume_record import MEMORY_ONLY_OPTIONS

    if os.path.lexists(paths.staging) or not os.path.lexists(paths.out) or output_problem(paths.out) is not None:
        return None
    try:
        manifest = read_manifest(paths.out)
    except MoebakeError:
        return None
    recorded, location = manifest.get("options"), (manifest.get("source") or {}).get("location")
    if not isinstance(recorded, dict):
        return None
    same = {k: v for k, v in recorded.items() if k not in MEMORY_ONLY_OPTIONS} == {
        k: v for k, v in options.items() if k not in MEMORY_ONLY_OPTIONS
    }
    if not os.path.lexists(source):
        return same and location == source.split("@", 1)[0]
    local = Path(source).resolve()
    # the manifest names a local source by its folder only (older ones: its path); its small files' checksums tell
    # two folders of one name apart
    return same and location in (public_location(local), str(local)) and _same_small_files(manifest, local)


def _same_small_files(manifest: dict, source: Path) -> bool:
    """Whether the source files other than the shards (config, index, tokenizer: small) that ``manifest`` records
    checksums of are in ``source`` with those checksums."""
    recorded = (manifest.get("source") or {}).get("files")
    if not isinstance(recorded, dict):
        return False
    for name, value in recorded.items():
        if not isinstance(value, str) or name.endswith(".safetensors"):
            continue
        algorithm, digest = parse_tagged(value)
        if algorithm not in ALGORITHMS or not (source / name).is_file() or file_digest(source / name, algorithm) != digest:
            return False
    return True


def check_destination(paths: OutputPaths, *, overwrite: bool) -> None:
    """OutputError unless OUT's parent is a writable directory, OUT is free (or, with ``overwrite``,
    a previous moebake output) and ``.OUT.replaced``, if there, is a moebake output too."""
    parent = paths.out.parent
    if not os.path.lexists(parent):
        raise OutputError(f"{paths.label}: its parent directory {parent} does not exist")
    if not parent.is_dir():
        raise OutputError(f"{paths.label}: its parent {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(
            f"{paths.label}: cannot write in its parent directory {parent} "
            f"({'read-only file system' if _read_only(parent) else 'permission denied'})"
        )
    if os.path.lexists(paths.out):
        if not overwrite:
            if (problem := output_problem(paths.out)) is not None:  # --overwrite would refuse it too: say so now
                raise OutputError(
                    f"{paths.label}: already exists and is not a previous moebake output (it {problem}); "
                    "choose another OUT (--overwrite replaces only a previous moebake output)"
                )
            raise OutputError(f"{paths.label}: already exists (a previous moebake output; pass --overwrite to replace it)")
        check_replaceable(paths.out, f"{paths.label}: --overwrite replaces only a previous moebake output, but it")
    if os.path.lexists(paths.retired):
        check_replaceable(paths.retired, f"{paths.retired}: left by an interrupted --overwrite of {paths.label}, but it", "; move it away")


def check_free_space(paths: OutputPaths, staging: Path, nbytes: int) -> None:
    """OutputError unless the file system holding ``staging`` (where OUT is built) has ``nbytes`` free for an
    unprivileged writer (``statvfs``' ``f_bavail``), checked before the first shard is written."""
    st = os.statvfs(staging)
    free = st.f_bavail * st.f_frsize
    if free < nbytes:
        raise OutputError(
            f"{paths.label}: not enough free space: the bake writes {size_text(nbytes)}, and the file system "
            f"holding {staging} has {size_text(free)} free; free {size_text(nbytes - free)} there, "
            "or choose an OUT on another file system"
        )


def check_not_overlapping(paths: OutputPaths, source: Path) -> None:
    """OutputError if OUT is the source, contains it or lies inside it (symbolic links resolved)."""
    src = Path(os.path.realpath(source))
    for out in {paths.out, Path(os.path.realpath(paths.given))}:
        if out == src:
            raise OutputError(f"{paths.label}: is the source checkpoint {source} itself; choose another OUT")
        if out in src.parents:
            raise OutputError(f"{paths.label}: contains the source checkpoint {source}; choose another OUT")
        if src in out.parents:
            raise OutputError(f"{paths.label}: lies inside the source checkpoint {source}; choose another OUT")


def output_problem(path: Path) -> str | None:
    """Why ``path`` is not a previous moebake output that may be deleted (None when it is one)."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        return "is a regular file" if stat.S_ISREG(mode) else f"is {file_kind(mode)}"
    if not os.path.lexists(path / MANIFEST_NAME):
        return f"has no {MANIFEST_NAME}"
    try:
        manifest = read_manifest(path)
    except MoebakeError as err:
        return f"has an unusable {MANIFEST_NAME} ({str(err).removeprefix(f'{path / MANIFEST_NAME}: ')})"
    files = manifest.get("files")
    if not isinstance(manifest.get("moebake_version"), str) or not isinstance(files, dict):
        return f"has a {MANIFEST_NAME} that moebake did not write"
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.name != MANIFEST_NAME and entry.name not in files and entry.name not in HUB_FILES:
            return f"holds {entry.name}, which its {MANIFEST_NAME} does not list"
        if entry.is_dir(follow_symlinks=False):
            return f"holds a directory {entry.name}"
        if entry.name == MANIFEST_NAME and not entry.is_file(follow_symlinks=False):
            return f"has a {MANIFEST_NAME} that is not a regular file"
    return None


def check_replaceable(path: Path, what: str, advice: str = "") -> None:
    """OutputError ``<what> <problem>`` unless ``path`` is a previous moebake output."""
    problem = output_problem(path)
    if problem is not None:
        raise OutputError(f"{what} {problem}{advice}")


def remove_output(path: Path) -> None:
    """Delete the previous moebake output ``path``: its listed files, ``moebake.json`` last (so an
    interrupted removal leaves a directory still recognised as a moebake output), then the directory."""
    check_replaceable(path, f"{path}: not deleting it: it")
    for entry in os.scandir(path):
        if entry.name != MANIFEST_NAME and plain_name_problem(entry.name) is None:
            os.unlink(entry.path)
    os.unlink(path / MANIFEST_NAME)
    os.rmdir(path)


def _read_only(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False
