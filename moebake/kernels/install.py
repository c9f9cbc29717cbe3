"""``moebake kernels install`` / ``uninstall``: a bake's kernels placed where the engine looks for them, or removed.

Install is the operator's explicit step; nothing else in moebake places compiled code. In order:

1. the kernel set: ``--set ID``, else the bake's only set, else the one for the installed engine release and the
   GPU architecture;
2. its compatibility record against this environment: the engine release, each recorded library version
   (:func:`moebake.kernels.environment.installed_versions`, the Python path's distributions), torch's and CUDA's,
   and the GPU architecture (CUDA device 0, or ``--arch``). Any difference is one ``PlatformError`` line naming
   every field that differs, expected and found; nothing is placed, and a server started anyway compiles its kernels
   as it does without them;
3. every destination (:func:`moebake.kernels.locations.install_roots`): a file already there with the same sha256
   is left as it is; a different file is replaced only if this root's ledger (:data:`LEDGER`) says moebake placed
   it and it is unchanged since; anything else is refused, naming it, and nothing is placed;
4. every file is copied from the bake to a temporary name beside its destination, hashed as it is written, and
   compared with the record (a changed byte refuses the whole set, nothing placed);
5. the files take their names (a new name is linked, so a file that appeared meanwhile is never overwritten),
   then each root's ledger is rewritten (temporary file renamed). A failure in 4 or 5 undoes what was done.

Uninstall removes the files a root's ledger lists for the bake's set whose bytes are still those placed, and the
folders that leaves empty; a file changed since is left, and said so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from moebake.errors import IntegrityError, ManifestError, OptionError, OutputError, PlatformError
from moebake.kernels.environment import engine_release, gpu_arch, installed_versions, normalize_arch
from moebake.kernels.files import copy_hashed, fsync_dir, sha256_file, temporary_name
from moebake.kernels.locations import KINDS, LEDGER, install_roots
from moebake.kernels.record import FOLDER, KernelSet, kernel_sets
from moebake.schema.files import open_regular
from moebake.schema.manifest import MANIFEST_NAME, read_manifest

LEDGER_SCHEMA = "moebake.kernels-installed/1"
FALLBACK = "nothing installed; a server started now compiles its kernels as usual"


@dataclass
class KindReport:
    root: Path
    placed: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    bytes: int = 0


@dataclass
class InstallReport:
    set: KernelSet
    arch: str
    kinds: dict[str, KindReport]
    dry_run: bool = False

    def lines(self) -> list[str]:
        from moebake.progress_bars import size_text

        verb = "would place" if self.dry_run else "placed"
        out = []
        for kind, report in self.kinds.items():
            new = len(report.placed) + len(report.replaced)
            out.append(
                f"{kind}: {verb} {new} file{'s' if new != 1 else ''} ({size_text(report.bytes)}) in {report.root}"
                + (f" ({len(report.replaced)} replacing moebake's own)" if report.replaced else "")
                + (f"; {len(report.present)} already there" if report.present else "")
            )
        return out


def _load_ledger(root: Path) -> dict:
    path = root / LEDGER
    if not os.path.lexists(path):
        return {"schema": LEDGER_SCHEMA, "files": {}}
    with open_regular(path, error=ManifestError) as f:
        try:
            data = json.loads(f.read())
        except ValueError as err:
            raise ManifestError(f"{path}: not JSON ({err}); moebake will not place kernels beside it") from None
    if not isinstance(data, dict) or data.get("schema") != LEDGER_SCHEMA or not isinstance(data.get("files"), dict):
        raise ManifestError(f"{path}: not a moebake kernels ledger ({LEDGER_SCHEMA})")
    return data


def _write_ledger(root: Path, ledger: dict) -> None:
    path = root / LEDGER
    if not ledger["files"]:
        if os.path.lexists(path):
            os.unlink(path)
        return
    temporary = temporary_name(path, "tmp")
    temporary.write_text(json.dumps(ledger, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def choose_set(bake: Path, sets: list[KernelSet], identifier: str | None, arch: str | None) -> KernelSet:
    if not sets:
        raise OptionError(f"{bake}: holds no kernels ({MANIFEST_NAME} has no kernel sets; `moebake kernels add` adds them)")
    if identifier is not None:
        found = next((s for s in sets if s.id == identifier), None)
        if found is None:
            raise OptionError(f"--set {identifier}: {bake} holds {', '.join(s.id for s in sets)}")
        return found
    if len(sets) == 1:
        return sets[0]
    matching = [s for s in sets if engine_release(s.engine) == s.release and (arch is None or s.arch == arch)]
    if len(matching) == 1:
        return matching[0]
    raise OptionError(
        f"{bake}: holds kernel sets {', '.join(s.id for s in sets)}, "
        f"{'none' if not matching else 'several'} for this environment: pick one with --set"
    )


def mismatches(kernel_set: KernelSet, arch: str) -> list[str]:
    """``field expected X, found Y`` for each compatibility field that differs from this environment."""
    found = installed_versions()
    out = []
    release = engine_release(kernel_set.engine)
    if release != kernel_set.release:
        out.append(f"{kernel_set.engine} expected {kernel_set.release}, found {release or 'not installed'}")
    for key, expected in kernel_set.versions.items():
        if expected is not None and found.get(key) != expected:
            out.append(f"{key} expected {expected}, found {found.get(key) or 'not installed'}")
    if arch != kernel_set.arch:
        out.append(f"GPU architecture expected {kernel_set.arch}, found {arch}")
    return out


def _arch(arch: str | None) -> str:
    try:
        found = normalize_arch(arch) if arch else gpu_arch()
    except ValueError as err:
        raise OptionError(f"--arch: {err}") from None
    if found is None:
        raise OptionError(f"no CUDA device found to check the kernels' GPU architecture against: pass --arch; {FALLBACK}")
    return found


def _destinations(kernel_set: KernelSet, env: Mapping[str, str], roots: Mapping[str, Path] | None) -> dict[str, tuple[str, Path, Path]]:
    """``{path in the set: (kind, root, destination)}``."""
    where = install_roots(env, kernel_set.engine, roots)
    out = {}
    for rel in kernel_set.files:
        kind, rest = rel.split("/", 1)
        root = where.get(kind)
        if root is None:
            raise PlatformError(
                f"kernel set {kernel_set.id}: no folder for {kind} files here ({kind}'s library is not on the Python path); {FALLBACK}"
            )
        out[rel] = (kind, Path(root), Path(root) / rest)
    return out


def install_kernels(
    bake: Path,
    *,
    identifier: str | None = None,
    arch: str | None = None,
    roots: Mapping[str, Path] | None = None,
    env: Mapping[str, str] | None = None,
    dry_run: bool = False,
) -> InstallReport:
    """Check and place ``bake``'s kernel set (module docstring); returns what was (or would be) placed."""
    bake = Path(bake)
    env = os.environ if env is None else env
    manifest = read_manifest(bake)
    sets = kernel_sets(manifest, bake / MANIFEST_NAME)
    arch = _arch(arch)
    kernel_set = choose_set(bake, sets, identifier, arch)
    differ = mismatches(kernel_set, arch)
    if differ:
        raise PlatformError(
            f"{bake / MANIFEST_NAME}: kernel set {kernel_set.id} does not match this environment: {'; '.join(differ)}; {FALLBACK}"
        )
    destinations = _destinations(kernel_set, env, roots)
    ledgers = {root: _load_ledger(root) for _, root, _ in destinations.values()}
    kinds = {
        kind: KindReport(root)
        for kind, root in sorted({(k, r) for k, r, _ in destinations.values()}, key=lambda kind_root: KINDS.index(kind_root[0]))
    }
    source_dir = bake / FOLDER / kernel_set.id
    plan: list[tuple[str, Path, bool]] = []  # (path in the set, destination, replacing moebake's own)
    for rel, (kind, root, dest) in sorted(destinations.items()):
        record = kernel_set.files[rel]
        for parent in reversed(dest.relative_to(root).parents[:-1]):
            if os.path.lexists(root / parent) and (os.path.islink(root / parent) or not (root / parent).is_dir()):
                raise OutputError(f"{root / parent}: not a directory, so {dest} cannot be placed; {FALLBACK}")
        if not os.path.lexists(dest):
            plan.append((rel, dest, False))
            continue
        if os.path.islink(dest) or not dest.is_file():
            raise OutputError(f"{dest}: exists and is not a regular file; moebake leaves it alone; {FALLBACK}")
        digest, _ = sha256_file(dest)
        if digest == record.sha256:
            digest_in_bake, size = sha256_file(source_dir / rel)
            if (digest_in_bake, size) != (record.sha256, record.bytes):
                raise IntegrityError(f"{source_dir / rel}: does not match its sha256 in {MANIFEST_NAME}; {FALLBACK}")
            kinds[kind].present.append(str(dest))
            continue
        owned = ledgers[root]["files"].get(dest.relative_to(root).as_posix())
        if not (isinstance(owned, dict) and owned.get("sha256") == digest):
            raise OutputError(f"{dest}: exists with other bytes and moebake did not place it there; moebake leaves it alone; {FALLBACK}")
        plan.append((rel, dest, True))
    report = InstallReport(kernel_set, arch, kinds, dry_run)
    for rel, dest, replacing in plan:
        kind = rel.split("/", 1)[0]
        (kinds[kind].replaced if replacing else kinds[kind].placed).append(str(dest))
        kinds[kind].bytes += kernel_set.files[rel].bytes
    if dry_run:
        return report
    _commit(bake, kernel_set, source_dir, plan, destinations, ledgers)
    return report


def _commit(bake: Path, kernel_set: KernelSet, source_dir: Path, plan, destinations, ledgers) -> None:
    """Steps 4 and 5 of the module docstring, undone on any failure."""
    created: list[Path] = []
    staged: list[tuple[Path, Path, bool]] = []  # (temporary, destination, replacing)
    done: list[tuple[Path, Path | None]] = []  # (destination, backup of the replaced file)
    try:
        for rel, dest, replacing in plan:
            record = kernel_set.files[rel]
            missing = [p for p in [dest.parent, *dest.parent.parents] if not p.exists()]
            for folder in reversed(missing):
                folder.mkdir()
                created.append(folder)
            temporary = temporary_name(dest, "moebake")
            staged.append((temporary, dest, replacing))
            digest, size = copy_hashed(source_dir / rel, temporary)
            if (digest, size) != (record.sha256, record.bytes):
                raise IntegrityError(
                    f"{source_dir / rel}: sha256 {digest} ({size} bytes), {MANIFEST_NAME} records "
                    f"{record.sha256} ({record.bytes} bytes); {FALLBACK}"
                )
        for temporary, dest, replacing in staged:
            if replacing:
                backup = temporary_name(dest, "replaced")
                os.rename(dest, backup)
                done.append((dest, backup))
                os.rename(temporary, dest)
            else:
                try:
                    os.link(temporary, dest)  # fails if dest appeared meanwhile: never overwritten
                except FileExistsError:
                    raise OutputError(f"{dest}: appeared while installing; moebake leaves it alone; {FALLBACK}") from None
                done.append((dest, None))
                os.unlink(temporary)
            fsync_dir(dest.parent)
        for rel, (kind, root, dest) in destinations.items():
            if any(d == dest for d, _ in done):
                ledgers[root]["files"][dest.relative_to(root).as_posix()] = {
                    "sha256": kernel_set.files[rel].sha256,
                    "bytes": kernel_set.files[rel].bytes,
                    "bake": str(bake.resolve()),
                    "set": kernel_set.id,
                }
        for root, ledger in ledgers.items():
            if any(str(d).startswith(str(root) + os.sep) for d, _ in done):
                _write_ledger(root, ledger)
    except BaseException:
        for dest, replaced in reversed(done):
            if os.path.lexists(dest):
                os.unlink(dest)
            if replaced is not None:
                os.rename(replaced, dest)
        for temporary, _, _ in staged:
            if os.path.lexists(temporary):
                os.unlink(temporary)
        for folder in reversed(created):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    for _, replaced in done:
        if replaced is not None:
            os.unlink(replaced)


def uninstall_kernels(
    bake: Path, *, identifier: str | None = None, roots: Mapping[str, Path] | None = None, env: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """Remove what ``install`` placed of ``bake``'s kernel set(s); returns (removed, left as changed since)."""
    bake = Path(bake)
    env = os.environ if env is None else env
    sets = kernel_sets(read_manifest(bake), bake / MANIFEST_NAME)
    if identifier is not None:
        sets = [s for s in sets if s.id == identifier]
        if not sets:
            raise OptionError(f"--set {identifier}: {bake} holds no such kernel set")
    removed, left = [], []
    for kernel_set in sets:
        where = install_roots(env, kernel_set.engine, roots)
        touched: dict[Path, dict] = {}
        for rel, record in kernel_set.files.items():
            kind, rest = rel.split("/", 1)
            root = where.get(kind)
            if root is None:
                continue
            root = Path(root)
            ledger = touched.setdefault(root, _load_ledger(root))
            entry = ledger["files"].get(rest)
            if not (isinstance(entry, dict) and entry.get("set") == kernel_set.id and entry.get("sha256") == record.sha256):
                continue
            dest = root / rest
            if os.path.lexists(dest):
                if os.path.islink(dest) or not dest.is_file() or sha256_file(dest)[0] != record.sha256:
                    left.append(str(dest))
                    continue
                os.unlink(dest)
                removed.append(str(dest))
            del ledger["files"][rest]
            for parent in dest.parents:
                if parent == root or root not in parent.parents:
                    break
                if parent.is_dir() and not any(parent.iterdir()):
                    parent.rmdir()
                else:
                    break
        for root, ledger in touched.items():
            _write_ledger(root, ledger)
    return removed, left
