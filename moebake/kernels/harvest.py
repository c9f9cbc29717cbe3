"""``moebake kernels harvest``: the kernels one server start compiled, copied out of the caches it wrote.

Run on the GPU node after a server of the engine release has started once (and answered a request) with the same
cache settings: for each kind (:mod:`moebake.kernels.locations`) the files under its root are copied to
``OUT/<kind>/<path>``:

* ``flashinfer``: ``<base>/.cache/flashinfer/<installed FlashInfer version>/<arch folder>/cached_ops/<m>/<m>.so``
  -> ``flashinfer/<m>/<m>.so`` (the arch folder's name is FlashInfer's arch list, e.g. ``90a``; with several,
  those of the set's architecture);
* ``tvm-ffi``: ``<root>/<dir>/<file>.so`` -> ``tvm-ffi/<dir>/<file>.so``;
* ``deep-gemm``: ``<root>/cache/...`` -> ``deep-gemm/cache/...``;
* ``triton``, ``tilelang``, ``flashinfer-cubins``: every file under the root, less temporary and lock files.

Symbolic links are skipped, never followed. ``OUT/harvest.json`` records the engine release, the architecture, the
installed versions (:func:`moebake.kernels.environment.installed_versions`), the roots read and each file's sha256
and size. OUT is written under a temporary name beside it and renamed into place when complete; an existing OUT is
refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from moebake.errors import OptionError, OutputError
from moebake.kernels.environment import engine_release, installed_versions, normalize_arch
from moebake.kernels.files import copy_hashed, temporary_name, walk_regular
from moebake.kernels.locations import KINDS, NEEDS, harvest_roots
from moebake.kernels.pack import HARVEST_NAME

SCHEMA = "moebake.kernels-harvest/1"
_TEMPORARY = re.compile(r"(^tmp\.|\.tmp|\.lock$|^\.)")


def _arch_folder_matches(name: str, arch: str) -> bool:
    """Whether FlashInfer's arch-list folder ``name`` (``90a``, ``80_89_90a``) covers ``arch`` (``sm90``) alone."""
    return re.fullmatch(rf"{arch[2:]}[a-z]?", name) is not None


def harvest_files(roots: Mapping[str, Path | None], arch: str, flashinfer_version: str | None) -> tuple[dict[str, Path], list[str]]:
    """``{path in the set: file}`` found under ``roots``, and what was skipped (links, other entries)."""
    files: dict[str, Path] = {}
    skipped: list[str] = []
    for kind in KINDS:
        root = roots.get(kind)
        if root is None or not Path(root).is_dir():
            continue
        root = Path(root)
        if kind == "flashinfer":
            if flashinfer_version is None:
                continue
            version_dir = root / flashinfer_version
            if not version_dir.is_dir():
                continue
            for arch_dir in sorted(p for p in version_dir.iterdir() if p.is_dir() and _arch_folder_matches(p.name, arch)):
                ops = arch_dir / "cached_ops"
                if not ops.is_dir():
                    continue
                for module in sorted(ops.iterdir()):
                    so = module / f"{module.name}.so"
                    if module.is_dir() and not module.is_symlink() and so.is_file() and not so.is_symlink():
                        files.setdefault(f"flashinfer/{module.name}/{so.name}", so)
            continue
        found, other = walk_regular(root)
        skipped += [f"{root / rel}" for rel in other]
        for rel in found:
            parts = rel.split("/")
            if any(_TEMPORARY.search(part) for part in parts):
                continue
            if kind == "tvm-ffi" and not (len(parts) == 2 and parts[1].endswith(".so")):
                continue
            if kind == "deep-gemm" and parts[0] != "cache":
                continue
            files[f"{kind}/{rel}"] = root / rel
    return files, skipped


def harvest(
    out: Path, engine: str, arch: str | None, env: Mapping[str, str] | None = None, roots: Mapping[str, Path] | None = None
) -> dict:
    """Copy the installed engine's compiled kernels into ``out`` (module docstring); returns the harvest record."""
    from moebake.kernels.environment import gpu_arch

    out = Path(out)
    env = os.environ if env is None else env
    if os.path.lexists(out):
        raise OutputError(f"{out}: exists; harvest writes a new folder")
    release = engine_release(engine)
    if release is None:
        raise OptionError(f"--engine {engine}: not installed here (no {engine} distribution on the Python path)")
    try:
        arch = normalize_arch(arch) if arch else gpu_arch()
    except ValueError as err:
        raise OptionError(f"--arch: {err}") from None
    if arch is None:
        raise OptionError("no CUDA device found to read the GPU architecture from: pass --arch (e.g. sm90)")
    versions = installed_versions()
    read_from = harvest_roots(env, engine, roots)
    files, skipped = harvest_files(read_from, arch, versions["flashinfer"])
    for rel in list(files):
        if versions[NEEDS[rel.split("/", 1)[0]]] is None:
            skipped.append(f"{files.pop(rel)} ({NEEDS[rel.split('/', 1)[0]]} is not installed here)")
    if not files:
        raise OutputError(
            "no compiled kernels found in "
            + ", ".join(f"{k} {v}" for k, v in read_from.items() if v)
            + "; start a server with these cache settings first"
        )
    partial = temporary_name(out, "partial")
    partial.mkdir(parents=True)
    try:
        records = {}
        for rel in sorted(files):
            target = partial / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            digest, size = copy_hashed(files[rel], target)
            records[rel] = {"sha256": digest, "bytes": size}
        meta = {
            "schema": SCHEMA,
            "engine": engine,
            "release": release,
            "arch": arch,
            "versions": versions,
            "roots": {k: str(v) for k, v in read_from.items() if v is not None},
            "skipped": skipped,
            "files": records,
        }
        (partial / HARVEST_NAME).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        os.rename(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return meta
