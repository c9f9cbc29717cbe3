"""``moebake kernels``: harvest, add, install, uninstall and remove a bake's compiled kernels (:mod:`moebake.kernels`).

Bad input is one ``error: ...`` line and exit status 2 (the CLI's :func:`moebake.cli.reports_errors`), with nothing
written or placed.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from moebake.errors import OptionError

ROOT_HELP = (
    "KIND=DIR: read or place KIND's files in DIR instead of the library's own folder (repeatable; KIND one of "
    "flashinfer, flashinfer-cubins, tvm-ffi, deep-gemm, triton, tilelang). For flashinfer, harvest reads FlashInfer's "
    "JIT cache folder (<base>/.cache/flashinfer) and install places into FlashInfer's AOT folder."
)


def _roots(values) -> dict[str, Path]:
    from moebake.kernels.locations import parse_roots

    try:
        return parse_roots(values)
    except ValueError as err:
        raise OptionError(str(err)) from None


def build_group(reports_errors, verbose_option) -> click.Group:
    """The ``kernels`` command group, with the CLI's error reporting and ``-v`` option."""

    @click.group()
    def kernels():
        """Compiled kernels shipped with a bake: harvested from one server start, added to the bake with a
        compatibility record, and placed for the engine only by `moebake kernels install`, which checks them."""

    @kernels.command()
    @verbose_option
    @click.option("--out", required=True, type=click.Path(path_type=Path), help="New folder to write (refused if it exists).")
    @click.option("--engine", default="sglang", show_default=True, help="The engine whose release and cache folders to read.")
    @click.option("--arch", help="GPU architecture (e.g. sm90); default: CUDA device 0's.")
    @click.option("--root", "roots", multiple=True, help=ROOT_HELP)
    @reports_errors
    def harvest(out, engine, arch, roots):
        """Copy the kernels a server start compiled (FlashInfer, SGLang/tvm-ffi, DeepGEMM, Triton, TileLang caches, as the
        environment variables or the libraries' defaults place them) into OUT, with harvest.json (engine release,
        architecture, installed versions, sha256 of each file)."""
        from moebake.kernels.harvest import harvest as run
        from moebake.progress_bars import size_text

        meta = run(out, engine, arch, roots=_roots(roots))
        total = sum(r["bytes"] for r in meta["files"].values())
        click.echo(f"harvested {len(meta['files'])} files ({size_text(total)}) of {engine} {meta['release']} on {meta['arch']} into {out}")
        kinds: dict[str, int] = {}
        for rel in meta["files"]:
            kinds[rel.split("/", 1)[0]] = kinds.get(rel.split("/", 1)[0], 0) + 1
        for kind, count in kinds.items():
            click.echo(f"  {kind}: {count} files from {meta['roots'][kind]}")

    @kernels.command()
    @verbose_option
    @click.argument("bake", type=click.Path(path_type=Path))
    @click.option("--from", "source", type=click.Path(path_type=Path), help="A folder of <kind>/<path> files (harvest's OUT).")
    @click.option(
        "--reduced-module",
        type=click.Path(path_type=Path),
        help="moebake's reduced FlashInfer MoE module (fused_moe_90_moebake.so, its sidecar .json beside it).",
    )
    @click.option("--engine", help="ENGINE==RELEASE the kernels are for (default: the harvest record's).")
    @click.option("--arch", help="GPU architecture, e.g. sm90 (default: the harvest record's).")
    @click.option("--flashinfer", help="FlashInfer version (default: the harvest record's).")
    @click.option("--deep-gemm", help="DeepGEMM version.")
    @click.option("--tvm-ffi", help="apache-tvm-ffi version.")
    @click.option("--triton", help="Triton version.")
    @click.option("--tilelang", help="TileLang version.")
    @click.option("--torch", help="torch version (e.g. 2.11.0+cu130).")
    @click.option("--cuda", help="CUDA version torch was built with (e.g. 13.0).")
    @click.option("--replace", is_flag=True, help="Replace the bake's kernel set of the same engine release and architecture.")
    @reports_errors
    def add(bake, source, reduced_module, engine, arch, flashinfer, deep_gemm, tvm_ffi, triton, tilelang, torch, cuda, replace):
        """Add kernel files to BAKE as one kernel set (kernels/<engine>-<release>-<arch>/), recorded in its manifest with
        their compatibility record and sha256; all or nothing."""
        from moebake.kernels.pack import add_kernels
        from moebake.progress_bars import size_text

        versions = {
            "flashinfer": flashinfer,
            "deep_gemm": deep_gemm,
            "tvm_ffi": tvm_ffi,
            "triton": triton,
            "tilelang": tilelang,
            "torch": torch,
            "cuda": cuda,
        }
        added = add_kernels(bake, source, engine=engine, arch=arch, versions=versions, reduced_module=reduced_module, replace=replace)
        kinds = ", ".join(f"{k} {n}" for k, (n, _) in added.kinds().items())
        click.echo(f"added kernel set {added.id} to {bake}: {len(added.files)} files, {size_text(added.bytes)} ({kinds})")

    @kernels.command()
    @verbose_option
    @click.argument("bake", type=click.Path(path_type=Path))
    @click.option("--set", "identifier", help="The kernel set to install (default: the one for this environment).")
    @click.option("--arch", help="GPU architecture to check against (default: CUDA device 0's).")
    @click.option("--root", "roots", multiple=True, help=ROOT_HELP)
    @click.option("--dry-run", is_flag=True, help="Check everything and say what would be placed; place nothing.")
    @click.option("--json", "as_json", is_flag=True, help="Also print every file placed, as JSON on stdout.")
    @reports_errors
    def install(bake, identifier, arch, roots, dry_run, as_json):
        """Check BAKE's kernels (every sha256; engine release, library, torch and CUDA versions and GPU architecture
        against this environment) and place them where the engine looks for them. Any mismatch: one error line,
        exit 2, nothing placed, and a server compiles its kernels as usual."""
        from moebake.kernels.install import install_kernels

        report = install_kernels(bake, identifier=identifier, arch=arch, roots=_roots(roots), dry_run=dry_run)
        head = "checked" if dry_run else "installed"
        click.echo(
            f"{head} kernel set {report.set.id} of {bake} ({report.set.engine} {report.set.release}, {report.arch}): "
            "every sha256 and compatibility field matches"
        )
        for line in report.lines():
            click.echo(f"  {line}")
        if as_json:
            click.echo(
                json.dumps(
                    {
                        kind: {"root": str(r.root), "placed": r.placed, "replaced": r.replaced, "present": r.present, "bytes": r.bytes}
                        for kind, r in report.kinds.items()
                    },
                    indent=1,
                )
            )

    @kernels.command()
    @verbose_option
    @click.argument("bake", type=click.Path(path_type=Path))
    @click.option("--set", "identifier", help="Only this kernel set.")
    @click.option("--root", "roots", multiple=True, help=ROOT_HELP)
    @reports_errors
    def uninstall(bake, identifier, roots):
        """Remove the kernel files `moebake kernels install` placed from BAKE (those unchanged since; the ledger in each
        folder says which)."""
        from moebake.kernels.install import uninstall_kernels

        removed, left = uninstall_kernels(bake, identifier=identifier, roots=_roots(roots))
        click.echo(f"removed {len(removed)} kernel files of {bake}")
        for path in left:
            click.echo(f"left {path}: changed since it was installed", err=True)

    @kernels.command()
    @verbose_option
    @click.argument("bake", type=click.Path(path_type=Path))
    @click.argument("identifier")
    @reports_errors
    def remove(bake, identifier):
        """Remove kernel set IDENTIFIER from BAKE (its files and its manifest record)."""
        from moebake.kernels.pack import remove_kernels

        removed = remove_kernels(bake, identifier)
        click.echo(f"removed kernel set {removed.id} ({len(removed.files)} files) from {bake}")

    return kernels
