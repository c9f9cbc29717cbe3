"""The ``moebake`` command line: convert, verify, demo.

Bad input ends with one line ``error: ...`` on stderr and exit status 2 (no traceback); a failed
verification exits with status 1.
"""

import functools
import sys
from pathlib import Path

import click

import moebake
from moebake.convert.options import DEFAULT_CHUNK_BYTES, ConvertOptions
from moebake.convert.targets import TARGETS
from moebake.errors import MoebakeError
from moebake.layouts.sm90_fp4 import LAYOUTS


def reports_errors(command):
    """Turn MoebakeError into ``error: <message>`` and exit status 2."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except MoebakeError as err:
            click.echo(f"error: {err}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted: finished shards are kept; re-run with --resume to continue", err=True)
            sys.exit(130)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(moebake.__version__, prog_name="moebake")
def main():
    """Pre-bake MoE checkpoints into the byte layouts GPU MoE kernels consume."""


@main.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--target", required=True, type=click.Choice(sorted(TARGETS)), help="Kernel layout to bake for.")
@click.option("--flashinfer-layout", default="v2", show_default=True, type=click.Choice(LAYOUTS),
              help="SM90 fp4 interleave: v2 = FlashInfer 0.6.18+/0.7.x, v1 = 0.6.10-0.6.17.")
@click.option("--hidden-multiple", default=128, show_default=True, help="Pad H up to a multiple of this (e.g. 256 as SGLang 0.5.23).")
@click.option("--intermediate-multiple", default=128, show_default=True, help="Pad I up to a multiple of this.")
@click.option("--chunk-mb", default=DEFAULT_CHUNK_BYTES >> 20, show_default=True, help="Source MiB read per step (bounds memory).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (only once the new one is complete).")
@click.option("--resume", is_flag=True, help="Re-use shards finished by an interrupted run (checked by SHA-256).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@reports_errors
def convert(source, out, target, flashinfer_layout, hidden_multiple, intermediate_multiple, chunk_mb, overwrite, resume, quiet):
    """Bake checkpoint SOURCE into OUT for --target."""
    from moebake.convert.run import convert as run_convert

    options = ConvertOptions(target, flashinfer_layout, hidden_multiple, intermediate_multiple, chunk_mb << 20)
    manifest = run_convert(source, out, options, overwrite=overwrite, resume=resume, progress=not quiet)
    click.echo(f"wrote {out} ({len(manifest['layers'])} MoE layers, target {target}, FlashInfer layout {flashinfer_layout})")


@main.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--source", type=click.Path(path_type=Path), help="Also invert every baked expert tensor and compare with SOURCE.")
@reports_errors
def verify(out, source):
    """Check OUT's checksums, index and headers (and, with --source, bit-exactness)."""
    from moebake.convert.verify import verify_output

    problems = verify_output(out)
    if source is not None and not problems:
        from moebake.convert.source_check import compare_with_source

        problems = compare_with_source(out, source)
    for problem in problems:
        click.echo(f"mismatch: {problem}", err=True)
    if problems:
        sys.exit(1)
    click.echo(f"ok: {out}" + (f" (experts invert bit-exactly to {source})" if source else ""))


@main.command()
@click.option("--workdir", type=click.Path(path_type=Path), default=Path("moebake-demo"), show_default=True,
              help="Where the example source and baked output are written.")
@reports_errors
def demo(workdir):
    """Bake a built-in small GPT-OSS-shaped example, verify it, print a summary."""
    from moebake.demo import run_demo

    run_demo(workdir)
