"""``moebake kernels add``: kernel files into a bake, with their compatibility record; and the bake's other commands'
view of them (``verify``, ``inspect``, ``upload``).

A source folder (``--from DIR``) holds ``<kind>/<path>`` files (:mod:`moebake.kernels.locations`), as
``moebake kernels harvest`` writes it, with ``harvest.json`` (:data:`moebake.kernels.harvest.HARVEST_NAME`:
engine release, GPU architecture, versions, every file's sha256); a folder without it needs the engine release,
the architecture and the versions given. moebake's reduced FlashInfer MoE module (``--reduced-module``, a
``fused_moe_90_moebake.so`` beside its sidecar ``.json``, from ``bin/reduced-flashinfer-module``) goes in as
``flashinfer/fused_moe_90_moebake/`` (the ``.so`` and the sidecar), checked against the sidecar's FlashInfer and
apache-tvm-ffi versions, architecture and sha256.

All or nothing: the files are copied (and hashed as they are written) into a folder beside ``kernels/``, then
renamed to ``kernels/<set id>`` and the manifest rewritten (a temporary file renamed over it); a failure at any
step leaves the bake as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from moebake.errors import IntegrityError, ManifestError, OptionError, OutputError
from moebake.kernels.environment import REQUIRED_FIELDS, VERSION_FIELDS, normalize_arch
from moebake.kernels.files import copy_hashed, fsync_dir, temporary_name, walk_regular
from moebake.kernels.locations import KINDS, NEEDS
from moebake.kernels.record import FOLDER, KernelFile, KernelSet, kernel_sets, kernels_field, path_problem, set_id
from moebake.schema.files import open_regular
from moebake.schema.manifest import MANIFEST_NAME, read_manifest, write_manifest

HARVEST_NAME = "harvest.json"
REDUCED_MODULE = "fused_moe_90_moebake"
REDUCED_FOLDER = f"flashinfer/{REDUCED_MODULE}"


def parse_engine_release(text: str) -> tuple[str, str | None]:
    """``sglang==0.5.17`` -> (``sglang``, ``0.5.17``); ``sglang`` -> (``sglang``, None)."""
    name, sep, release = text.partition("==")
    if not name or (sep and not release):
        raise OptionError(f"--engine {text}: expected ENGINE==RELEASE, e.g. sglang==0.5.17")
    return name, release or None


def read_harvest(folder: Path) -> dict | None:
    """``folder/harvest.json`` (None if absent); ManifestError naming the file if it is not a harvest record."""
    path = folder / HARVEST_NAME
    if not os.path.lexists(path):
        return None
    with open_regular(path, error=ManifestError) as f:
        try:
            meta = json.loads(f.read())
        except ValueError as err:
            raise ManifestError(f"{path}: not JSON ({err})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("versions"), dict) or not isinstance(meta.get("files"), dict):
        raise ManifestError(f"{path}: not a kernels harvest record (no 'versions' and 'files' objects)")
    return meta


def compatibility(
    meta: dict | None, engine: str | None, arch: str | None, versions: dict[str, str | None], where: Path | None
) -> tuple[str, str, str, dict[str, str | None]]:
    """(engine, release, arch, versions) from the harvest record and the options; an option that contradicts the
    record, or a required field given by neither, is an OptionError naming it."""
    meta = meta or {}
    recorded = f"{where / HARVEST_NAME}" if where is not None else "the harvest record"

    def merged(option: str, given, found):
        if given is not None and found is not None and given != found:
            raise OptionError(f"{option} {given}: {recorded} records {found}")
        return given if given is not None else found

    name, release = parse_engine_release(engine) if engine else (None, None)
    name = merged("--engine", name, meta.get("engine"))
    release = merged("--engine", release, meta.get("release"))
    try:
        arch_given = normalize_arch(arch) if arch else None
        arch_found = normalize_arch(meta["arch"]) if meta.get("arch") else None
    except ValueError as err:
        raise OptionError(f"--arch: {err}") from None
    arch = merged("--arch", arch_given, arch_found)
    found = meta.get("versions", {})
    out = {key: merged(f"--{key.replace('_', '-')}", versions.get(key), found.get(key)) for key in VERSION_FIELDS}
    if not name or not release:
        raise OptionError("--engine ENGINE==RELEASE is needed: the source folder has no harvest.json that names it")
    if not arch:
        raise OptionError("--arch is needed (e.g. sm90): the source folder has no harvest.json that names it")
    for key in REQUIRED_FIELDS:
        if out[key] is None:
            raise OptionError(f"--{key} is needed: the source folder has no harvest.json that records it")
    return name, release, arch, out


def _source_files(source: Path, meta: dict | None) -> dict[str, Path]:
    """``{path in the set: file}`` of a source folder (its harvest.json aside)."""
    found, other = walk_regular(source)
    if other:
        raise OutputError(f"{source / other[0]}: not a regular file (kernel folders hold regular files only)")
    files = {}
    for rel in found:
        if rel == HARVEST_NAME:
            continue
        if (problem := path_problem(rel)) is not None:
            raise OptionError(f"{source / rel}: not a kernel file ({problem})")
        files[rel] = source / rel
    if meta is not None:
        missing = sorted(set(meta["files"]) - set(files))
        if missing:
            raise IntegrityError(f"{source / missing[0]}: listed in {source / HARVEST_NAME} but missing")
        extra = sorted(set(files) - set(meta["files"]))
        if extra:
            raise IntegrityError(f"{source / extra[0]}: not listed in {source / HARVEST_NAME}")
    return files


def _reduced_module_files(so: Path, versions: dict[str, str | None], arch: str) -> tuple[dict[str, Path], dict]:
    """The reduced module's ``.so`` and sidecar as set files, after its sidecar is checked against the record."""
    sidecar = so.with_suffix(".json")
    if so.name != f"{REDUCED_MODULE}.so" or not so.is_file():
        raise OptionError(f"--reduced-module {so}: not a {REDUCED_MODULE}.so file")
    if not sidecar.is_file():
        raise OptionError(f"{sidecar}: missing (the reduced module's sidecar, written beside it when it was built)")
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ManifestError(f"{sidecar}: not JSON ({err})") from None
    for key, field in (("flashinfer", "flashinfer"), ("tvm_ffi", "tvm_ffi")):
        if versions[field] is None:
            versions[field] = meta.get(key)
        elif meta.get(key) != versions[field]:
            raise OptionError(f"{sidecar}: built for {key} {meta.get(key)}, the kernel set records {versions[field]}")
    try:
        built_for = normalize_arch(str(meta.get("arch", "")))
    except ValueError:
        raise ManifestError(f"{sidecar}: arch {meta.get('arch')!r} is not a GPU architecture") from None
    if built_for != arch:
        raise OptionError(f"{sidecar}: built for {built_for}, the kernel set is for {arch}")
    if not isinstance(meta.get("sha256"), str):
        raise ManifestError(f"{sidecar}: records no sha256 of {so.name}")
    return {f"{REDUCED_FOLDER}/{so.name}": so, f"{REDUCED_FOLDER}/{sidecar.name}": sidecar}, meta


def add_kernels(
    bake: Path,
    source: Path | None,
    *,
    engine: str | None = None,
    arch: str | None = None,
    versions: dict[str, str | None] | None = None,
    reduced_module: Path | None = None,
    replace: bool = False,
) -> KernelSet:
    """Pack ``source``'s kernel files (and ``reduced_module``) into ``bake`` as one kernel set; returns its record."""
    bake = Path(bake)
    manifest = read_manifest(bake)
    sets = kernel_sets(manifest, bake / MANIFEST_NAME)
    if source is None and reduced_module is None:
        raise OptionError("nothing to add: give --from DIR, --reduced-module FILE, or both")
    if source is not None and not source.is_dir():
        raise OptionError(f"--from {source}: not a directory")
    meta = read_harvest(source) if source is not None else None
    name, release, arch, record_versions = compatibility(meta, engine, arch, dict(versions or {}), source)
    files = _source_files(source, meta) if source is not None else {}
    expected = {rel: meta["files"][rel].get("sha256") for rel in files} if meta is not None else {}
    if reduced_module is not None:
        module_files, module_meta = _reduced_module_files(Path(reduced_module), record_versions, arch)
        clash = sorted(set(module_files) & set(files))
        if clash:
            raise OptionError(f"--reduced-module: {clash[0]} is also in {source}")
        files |= module_files
        expected[f"{REDUCED_FOLDER}/{REDUCED_MODULE}.so"] = module_meta["sha256"]
    if not files:
        raise OptionError(f"{source}: holds no kernel files")
    for rel in files:
        needs = NEEDS[rel.split("/", 1)[0]]
        if record_versions[needs] is None:
            raise OptionError(
                f"{files[rel]}: a {rel.split('/', 1)[0]} file, but no {needs} version is recorded or given (--{needs.replace('_', '-')})"
            )
    identifier = set_id(name, release, arch)
    existing = next((s for s in sets if s.id == identifier), None)
    if existing is not None and not replace:
        raise OutputError(f"{bake}: already holds kernel set {identifier} (--replace replaces it)")
    kernels_dir = bake / FOLDER
    target = kernels_dir / identifier
    if existing is None and os.path.lexists(target):
        raise OutputError(
            f"{target}: exists but {MANIFEST_NAME} records no such kernel set; moebake did not write it "
            "there, so it is left alone: move it away first"
        )
    staging = temporary_name(target, "staging")
    created_dir = not kernels_dir.exists()
    records: dict[str, KernelFile] = {}
    kernels_dir.mkdir(exist_ok=True)
    try:
        staging.mkdir()
        for rel in sorted(files):
            out = staging / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            digest, size = copy_hashed(files[rel], out)
            if rel in expected and expected[rel] != digest:
                raise IntegrityError(f"{files[rel]}: sha256 {digest}, its record says {expected[rel]}")
            records[rel] = KernelFile(digest, size)
        new = KernelSet(identifier, name, release, arch, record_versions, records)
        _place(bake, manifest, [s for s in sets if s.id != identifier] + [new], staging, target, existing is not None)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created_dir and kernels_dir.is_dir() and not any(kernels_dir.iterdir()):
            kernels_dir.rmdir()
        raise
    return new


def _place(bake: Path, manifest: dict, sets: list[KernelSet], staging: Path, target: Path, replacing: bool) -> None:
    """Rename ``staging`` to ``target`` (the old set aside first when replacing), then write the manifest; on
    failure, everything back as it was."""
    backup = temporary_name(target, "old") if replacing else None
    if backup is not None:
        os.rename(target, backup)
    try:
        os.rename(staging, target)
        try:
            fsync_dir(target.parent)
            write_manifest(bake, manifest | {"kernels": kernels_field(sets)})
        except BaseException:
            os.rename(target, staging)
            raise
    except BaseException:
        if backup is not None:
            os.rename(backup, target)
        raise
    if backup is not None:
        shutil.rmtree(backup)


def remove_kernels(bake: Path, identifier: str) -> KernelSet:
    """Remove kernel set ``identifier`` from ``bake`` (manifest first, then its folder)."""
    manifest = read_manifest(bake)
    sets = kernel_sets(manifest, bake / MANIFEST_NAME)
    found = next((s for s in sets if s.id == identifier), None)
    if found is None:
        raise OptionError(f"{bake}: holds no kernel set {identifier} (it holds: {', '.join(s.id for s in sets) or 'none'})")
    target = Path(bake) / FOLDER / identifier
    aside = temporary_name(target, "removed")
    if os.path.lexists(target):
        os.rename(target, aside)
    rest = [s for s in sets if s.id != identifier]
    try:
        write_manifest(bake, {k: v for k, v in manifest.items() if k != "kernels"} | ({"kernels": kernels_field(rest)} if rest else {}))
    except BaseException:
        if os.path.lexists(aside):
            os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    if not rest and (Path(bake) / FOLDER).is_dir() and not any((Path(bake) / FOLDER).iterdir()):
        (Path(bake) / FOLDER).rmdir()
    return found


# ------------------------------------------------------------------------------------------ verify, inspect, upload
def verify_kernels(out: Path, manifest: dict) -> tuple[list[str], int, int]:
    """(problems, files checked, bytes) of ``out``'s kernel files: each recorded file is a regular file of its size
    and sha256, and ``kernels/`` holds nothing else."""
    from moebake.kernels.files import sha256_file

    try:
        sets = kernel_sets(manifest, out / MANIFEST_NAME)
    except ManifestError as err:
        return [str(err)], 0, 0
    problems, count, total = [], 0, 0
    folder = out / FOLDER
    if not sets:
        return ([f"{folder}: not listed in {MANIFEST_NAME}"] if os.path.lexists(folder) else []), 0, 0
    if folder.is_symlink() or not folder.is_dir():
        return [f"{folder}: {MANIFEST_NAME} records kernel sets, but this is not a directory"], 0, 0
    listed = {f"{s.id}/{rel}" for s in sets for rel in s.files}
    found, other = walk_regular(folder)
    problems += [f"{folder / rel}: not a regular file" for rel in other]
    problems += [f"{folder / rel}: not listed in {MANIFEST_NAME}" for rel in found if rel not in listed]
    present = set(found)
    for kernel_set in sets:
        for rel, record in kernel_set.files.items():
            path = folder / kernel_set.id / rel
            if f"{kernel_set.id}/{rel}" not in present:
                problems.append(f"{path}: listed in {MANIFEST_NAME} but missing or not a regular file")
                continue
            digest, size = sha256_file(path)
            if size != record.bytes:
                problems.append(f"{path}: {size} bytes, {MANIFEST_NAME} says {record.bytes}")
            elif digest != record.sha256:
                problems.append(f"{path}: sha256 {digest}, {MANIFEST_NAME} says {record.sha256}")
            else:
                count += 1
                total += size
    return problems, count, total


def kernels_report(manifest: dict, where) -> list[dict]:
    """What ``inspect`` shows of each kernel set."""
    return [
        {
            "id": s.id,
            "engine": s.engine,
            "release": s.release,
            "arch": s.arch,
            "versions": s.versions,
            "files": len(s.files),
            "bytes": s.bytes,
            "kinds": {k: {"files": n, "bytes": b} for k, (n, b) in s.kinds().items()},
        }
        for s in kernel_sets(manifest, where)
    ]


def kernel_lines(report: list[dict]) -> list[str]:
    """``inspect``'s text lines for :func:`kernels_report`."""
    from moebake.progress_bars import size_text

    lines = []
    for s in report:
        versions = ", ".join(f"{k} {v}" for k, v in s["versions"].items() if v is not None)
        kinds = ", ".join(f"{k} {v['files']} ({size_text(v['bytes'])})" for k, v in s["kinds"].items())
        lines += [
            f"  kernels        {s['id']}: {s['files']} files, {size_text(s['bytes'])} for {s['engine']} {s['release']} "
            f"on {s['arch']}; {kinds}",
            f"                 built with {versions}",
        ]
    if report:
        lines.append("                 (placed only by `moebake kernels install`, which checks them first)")
    return lines


def upload_paths(out: Path, manifest: dict) -> list[str]:
    """The kernel files an upload carries, as paths relative to ``out`` (``kernels/<set>/<path>``)."""
    return [f"{FOLDER}/{s.id}/{rel}" for s in kernel_sets(manifest, out / MANIFEST_NAME) for rel in sorted(s.files)]


def link_upload_files(out: Path, folder: Path, manifest: dict) -> None:
    """Symbolic links in the upload ``folder`` to ``out``'s kernel files, in their folders."""
    for rel in upload_paths(out, manifest):
        link = folder / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.realpath(out / rel), link)


def kinds_in(kernel_set: KernelSet) -> list[str]:
    return [kind for kind in KINDS if any(rel.startswith(kind + "/") for rel in kernel_set.files)]
