"""The ``moebake`` command line: convert, verify, inspect, list, upload, demo, kernels.

Bad input ends with one line ``error: ...`` on stderr and exit status 2 (no traceback); a failed
verification exits with status 1. Importing this module does not import torch (the commands do,
when they run), so ``--help`` and usage errors are fast. Messages go through Python ``logging``
(logger ``moebake``): warnings always, progress notes by default, per-shard lines with ``-v``.
"""

import contextlib
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import click

import moebake
from moebake.convert.io_mode import IO_ENV, IO_MODES, PLAIN_IO_CORES
from moebake.convert.options import DEFAULT_CHUNK_BYTES, GATE_UP_GLOBALS, MAX_MULTIPLE, MAX_WORKERS, WRITERS_PER_DEVICE, ConvertOptions
from moebake.errors import Interrupted, MoebakeError, OptionError, OutputError, format_error
from moebake.names import SOURCE_FORMAT_NAMES, TARGET_NAMES
from moebake.schema.engine_release import EngineRelease
from moebake.schema.enums import FlashInferLayout, GateUpGlobals
from moebake.schema.flashinfer_versions import LAYOUTS, release_ranges
from moebake.schema.profiles import DEFAULT_ENGINE, ENGINES, parse_engine, release_span, serving_flags


class EngineOption(click.ParamType):
    """``sglang``, ``vllm`` or ``ENGINE==RELEASE``: an engine of the release matrix (its newest proven release), kept
    as its name, or one of its releases, parsed here into an :class:`EngineRelease`."""

    name = "ENGINE[==RELEASE]"

    def convert(self, value: str | EngineRelease, param: click.Parameter | None, ctx: click.Context | None) -> str | EngineRelease:
        if isinstance(value, EngineRelease):
            return value
        try:
            release = parse_engine(value)
        except MoebakeError as err:
            self.fail(str(err).removeprefix(f"--engine {value}: "), param, ctx)
        return release if "==" in value else release.engine


def reports_errors(command: Callable[..., Any]):
    """Turn MoebakeError into ``error: <message>`` and exit status 2; Ctrl-C, and SIGTERM while the command runs,
    into one line saying what was kept (:class:`Interrupted`) and exit status 130 (143 for SIGTERM)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any):
        try:
            with _sigterm_interrupts():
                return command(*args, **kwargs)
        except MoebakeError as err:
            click.echo(format_error(err), err=True)
            sys.exit(2)
        except KeyboardInterrupt as err:
            stopped = err if isinstance(err, Interrupted) else Interrupted()
            click.echo(stopped.line(), err=True)
            sys.exit(stopped.status)

    return wrapper


@contextlib.contextmanager
def _sigterm_interrupts():
    """In the ``with`` body, SIGTERM raises :class:`Interrupted` (``terminated``), as Ctrl-C raises KeyboardInterrupt,
    so that both stop a command the same way (the main thread only: elsewhere SIGTERM keeps its handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: FrameType | None):
        raise Interrupted(terminated=True)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _StderrHandler(logging.Handler):
    """Writes ``warning: ...`` / ``debug: ...`` (plain text for progress notes) to the current ``sys.stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        prefix = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        click.echo(prefix + record.getMessage(), err=True)


def configure_logging(verbosity: int) -> None:
    """Logger ``moebake``: INFO (progress notes) by default, DEBUG (a line per shard) with ``-v``."""
    logger = logging.getLogger("moebake")
    logger.setLevel(logging.DEBUG if verbosity else logging.INFO)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())


VERBOSE_HELP = "More detail on stderr (a line per shard, decisions)."


def verbose_option(command: Callable[..., Any]):
    """``-v`` after the subcommand too (``moebake convert ... -v``), as before it (``moebake -v convert ...``)."""

    def more_detail(context: click.Context, parameter: click.Parameter, value: int):
        if value:
            configure_logging(value)

    return click.option("-v", "--verbose", count=True, expose_value=False, callback=more_detail, help=VERBOSE_HELP)(command)


class OneLineError(click.ClickException):
    """A usage error (an unknown command or option, a missing argument, a value an option refuses) shown as bad input
    is: one line ``error: ...`` on stderr, exit status 2 (click's own is ``Usage:``, ``Try ...`` and ``Error: ...``)."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def one_line(err: click.ClickException) -> OneLineError:
    """``err`` as its :class:`OneLineError`: click's message on one line (first letter lower case, no final full stop)
    and, where the command line's form was wrong (not a value), the command's ``--help``. Keeps ``err``'s exit status."""
    message = " ".join(line.strip() for line in err.format_message().splitlines() if line.strip()).rstrip(".")
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    context = getattr(err, "ctx", None)
    if (
        isinstance(err, click.UsageError)
        and context is not None
        and (not isinstance(err, click.BadParameter) or isinstance(err, click.MissingParameter))
    ):
        message += f" (see: {context.command_path} --help)"
    line = OneLineError(message)
    setattr(line, "exit_code", err.exit_code)  # the usage error's own status (click's: 2)
    return line


class Moebake(click.Group):
    """The ``moebake`` group: every click error, parsing the command line or raised by a command, is one line
    (:class:`OneLineError`)."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except OneLineError:
            raise
        except click.ClickException as err:
            raise one_line(err) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except OneLineError:
            raise
        except click.ClickException as err:
            raise one_line(err) from None


@click.group(cls=Moebake, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(moebake.__version__, prog_name="moebake")
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP)
def main(verbose: int):
    """Pre-bake MoE checkpoints into the byte layouts GPU MoE kernels consume.

    Start with `moebake list` (sources x targets), `moebake inspect SOURCE` (what fits a checkpoint)
    and `moebake convert SOURCE OUT --target T --dry-run` (what would be written).
    """
    configure_logging(verbose)


def run() -> None:
    """The ``moebake`` program: :func:`main`, then an immediate exit with its status.

    The interpreter's own teardown with torch and numba loaded is all waiting, for nothing (its
    measured cost: docs/benchmarks.md): every file a command writes is closed and fsynced by then.
    Output streams and logging are flushed first.
    """
    status: str | int | None
    try:
        main()
        status = 0
    except SystemExit as done:
        status = done.code
    if isinstance(status, str):
        print(status, file=sys.stderr)
    _release_semaphores()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status if isinstance(status, int) else (0 if status is None else 1))


def _release_semaphores() -> None:
    """Unlink the named semaphores multiprocessing made (``--workers``: its queues' locks), as its own exit
    handler would: with :func:`os._exit` skipping that, multiprocessing's resource tracker would unlink them
    itself and warn ``resource_tracker: There appear to be N leaked semaphore objects``. Runs the finalizers
    of priority >= 0 only (semaphores, queue feeders); joining processes (priority < 0) is what is skipped."""
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util._run_finalizers(0)


def _resolve(source: str, revision: str | None, token: str | None):
    from moebake.hub.client import hub_client
    from moebake.hub.download import resolve_source

    return resolve_source(source, hub_client(token), revision=revision)


@main.command()
@verbose_option
@click.argument("source")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--target", required=True, type=click.Choice(TARGET_NAMES), help="Kernel layout to bake for (see `moebake list`).")
@click.option(
    "--flashinfer-layout",
    default=None,
    type=click.Choice(LAYOUTS),
    help="SM90 fp4 layout, by the FlashInfer releases that read it (default: the one the --engine release's "
    "pinned FlashInfer reads): " + "; ".join(f"{layout} = {release_ranges(layout)}" for layout in LAYOUTS) + ".",
)
@click.option(
    "--engine",
    default=DEFAULT_ENGINE,
    show_default=True,
    type=EngineOption(),
    help="Serving engine release whose load-time bytes the bake equals: " + " or ".join(ENGINES) + " (its newest "
    "proven release), or ENGINE==RELEASE (`moebake list` shows the proven releases).",
)
@click.option(
    "--hidden-multiple",
    type=int,
    help=f"Override the engine profile's H padding multiple (a multiple of 128, at most {MAX_MULTIPLE}); the bake "
    "is then recorded as not engine-exact unless it equals the profile's.",
)
@click.option("--intermediate-multiple", type=int, help="Override the engine profile's I padding multiple (as --hidden-multiple).")
@click.option(
    "--allow-inexact",
    is_flag=True,
    help="Bake even when --engine has no verified profile for this target and source (refused otherwise, naming "
    "the engines that do): the bake is recorded as NOT engine-exact, and that engine's plugin refuses it.",
)
@click.option(
    "--gate-up-globals",
    default="share",
    show_default=True,
    type=click.Choice(GATE_UP_GLOBALS),
    help="NVFP4 experts whose gate and up global scales differ: share one (rescaled block scales; accurate, "
    "not the engine's bytes) or keep both (the engine's bytes; its kernels apply the gate's to both halves).",
)
@click.option(
    "--chunk-mb",
    default=DEFAULT_CHUNK_BYTES >> 20,
    show_default=True,
    type=click.IntRange(1, 16384),
    help="Source MiB read per step (bounds memory).",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it is a previous moebake output (only once the new one is complete).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run with the same options (re-uses its checked shards).")
@click.option("--dry-run", is_flag=True, help="Print the plan (layers, padding, every output tensor and size); write nothing.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--revision", help="Branch, tag or commit of a Hub SOURCE (same as ORG/NAME@REVISION).")
@click.option("--token", help="Hugging Face token for a Hub SOURCE (default: HF_TOKEN or the saved login).")
@click.option(
    "--workers",
    default=1,
    show_default="1: one process, the fastest measured",
    type=click.IntRange(min=1),
    help="Bake this many shards at once, in separate processes (output bytes do not change); capped at "
    "--writers-per-device, 2, the usable cores and the shards to bake (more were measured no faster "
    "and over 1 GB of memory).",
)
@click.option(
    "--writers-per-device",
    default=WRITERS_PER_DEVICE,
    show_default=True,
    type=click.IntRange(1, MAX_WORKERS),
    help="Worker processes that may write to the output's storage device at once. Raise it only where "
    "bench/convert_bench.py measures more workers faster on your storage: on the disks measured so "
    "far, a second writer was slower.",
)
@click.option(
    "--io",
    "io_mode",
    type=click.Choice(IO_MODES),
    default=None,
    help="Disk I/O: direct (O_DIRECT: least CPU), plain (through the page cache), or auto: direct below "
    f"{PLAIN_IO_CORES} usable cores, plain from there [default: auto, or ${IO_ENV}]. Bytes do not change.",
)
@click.option("--profile", is_flag=True, help="Print busy time per stage (read, transform, hash, write) at the end.")
@reports_errors
def convert(
    source: str,
    out: Path,
    target: str,
    flashinfer_layout: str | None,
    engine: str | EngineRelease,
    hidden_multiple: int | None,
    intermediate_multiple: int | None,
    allow_inexact: bool,
    gate_up_globals: str,
    chunk_mb: int,
    overwrite: bool,
    resume: bool,
    dry_run: bool,
    quiet: bool,
    revision: str | None,
    token: str | None,
    workers: int,
    writers_per_device: int,
    io_mode: str | None,
    profile: bool,
):
    """Bake checkpoint SOURCE into OUT for --target.

    SOURCE is a checkpoint directory or a Hub model repo ORG/NAME[@REVISION] (only the files needed
    are downloaded, into the Hugging Face cache; the manifest records the repo and resolved commit).
    A target and source that --engine cannot serve exactly are refused unless --allow-inexact.
    """
    from moebake.convert.output_dir import check_output, finished_bake, output_paths
    from moebake.convert.run import convert as run_convert
    from moebake.inspection import gate_up_summary
    from moebake.progress_bars import rate_text, size_text

    _refuse_options_without_effect(target)
    options = ConvertOptions(
        target,
        flashinfer_layout=FlashInferLayout(flashinfer_layout) if flashinfer_layout else None,
        hidden_multiple=hidden_multiple,
        intermediate_multiple=intermediate_multiple,
        chunk_bytes=chunk_mb << 20,
        engine=engine,
        gate_up_globals=GateUpGlobals(gate_up_globals),
    )
    finished = finished_bake(output_paths(out), options.as_dict(), source) if resume and not overwrite and not dry_run else None
    if finished:
        click.echo(
            f"nothing to do: {out} is already a finished bake of {source} with these options "
            f"(`moebake verify {out}` checks it; --overwrite bakes it again)"
        )
        return
    if finished is False:
        raise OutputError(
            f"{out}: already a finished bake, from another source or with other options; --resume continues "
            "only an interrupted conversion (pass --overwrite to replace it)"
        )
    check_output(
        output_paths(out), overwrite=overwrite, resume=resume, source=source if Path(source).exists() else None
    )  # before a Hub download
    resolved = _resolve(source, revision, token)
    if dry_run:
        from moebake.convert.conversion import open_conversion
        from moebake.convert.dry_run import plan_lines
        from moebake.schema.profiles import check_servable

        conversion = open_conversion(resolved.path, options)
        if not allow_inexact:
            check_servable(options.profile, target, conversion.model.format_name, options.engine_text)
        click.echo("\n".join(plan_lines(conversion, out)))
        return
    if io_mode is not None:
        os.environ[IO_ENV] = io_mode  # read by every file opened from here on, in this process and its workers
    began = time.perf_counter()
    baked = run_convert(
        resolved.path,
        out,
        options,
        overwrite=overwrite,
        resume=resume,
        progress=not quiet,
        source_location=resolved.repo_id,
        source_revision=resolved.revision,
        workers=workers,
        writers_per_device=writers_per_device,
        allow_inexact=allow_inexact,
    )
    if profile:
        from moebake.convert.stages import STAGES, profile_lines

        click.echo("\n".join(profile_lines(STAGES.snapshot(), time.perf_counter() - began)), err=True)
    seconds = time.perf_counter() - began
    layout = f", FlashInfer layout {baked.flashinfer_layout}" if baked.flashinfer_layout else ""
    written = sum(record.bytes for record in baked.files.values())
    click.echo(
        f"wrote {out} ({len(baked.layers)} MoE layers, target {target}{layout}): "
        f"{len(baked.files)} files, {size_text(written)} in {seconds:.1f} s ({rate_text(written, seconds)})"
    )
    record = baked.engine
    assert record is not None  # a conversion always records its engine
    exactness = "engine-exact" if record.exact else f"NOT engine-exact: {record.not_exact_because}"
    flags = serving_flags(record)
    if flags is None:
        click.echo(
            f"engine {record.name} {record.version}: {exactness}, so no flags serve it: moebake's {record.name} plugin refuses this bake"
        )
    else:
        click.echo(f"engine {record.name} {record.version} ({flags}): {exactness}")
    if record.releases:
        click.echo(
            f"proven on {record.name} {release_span(record.name, record.releases)} (each release's own load-time code builds these bytes)"
        )
    for other in baked.serves:
        click.echo(f"also serves {other.name} {other.version} (the same bytes; {serving_flags(other)})")
    gate_up = gate_up_summary(baked)
    if gate_up:
        click.echo(gate_up)


def _refuse_options_without_effect(target: str) -> None:
    """OptionError for a convert option given on the command line that changes no byte of a ``target`` bake (it would
    only be recorded in the manifest, as if it mattered): --flashinfer-layout where the target has no FlashInfer SM90
    fp4 layout, --gate-up-globals where it bakes no NVFP4 experts."""
    from click.core import ParameterSource

    from moebake.formats.modelopt_nvfp4 import FORMAT_NAME as NVFP4
    from moebake.schema.targets import TARGET_SPECS, target_spec

    context, spec = click.get_current_context(), target_spec(target)
    for name, flag, matters, what in (
        ("flashinfer_layout", "--flashinfer-layout", lambda s: s.uses_flashinfer_layout, "FlashInfer SM90 fp4 layout"),
        ("gate_up_globals", "--gate-up-globals", lambda s: NVFP4 in s.source_formats, "NVFP4 experts"),
    ):
        if context.get_parameter_source(name) is ParameterSource.COMMANDLINE and not matters(spec):
            users = [other.name for other in TARGET_SPECS.values() if matters(other)]
            raise OptionError(
                f"{flag} {context.params[name]}: changes nothing for target {target}, which bakes no {what} "
                f"(only {', '.join(users)} {'does' if len(users) == 1 else 'do'}); drop the option"
            )


@main.command()
@verbose_option
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--source",
    help="Also prove bit-exactness against SOURCE (a directory or ORG/NAME[@REVISION]): "
    "invert every baked expert tensor, and re-bake every output byte.",
)
@click.option("--revision", help="Branch, tag or commit of a Hub --source.")
@click.option("--token", help="Hugging Face token for a Hub SOURCE.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout (ok, problems, what was checked).")
@reports_errors
def verify(out: Path, source: str | None, revision: str | None, token: str | None, quiet: bool, as_json: bool):
    """Check OUT: its manifest is as moebake wrote it, every file's size and checksum, the index, the shard
    headers and the baked tensors' dtypes and shapes (and, with --source, bit-exactness)."""
    try:
        problems, checked, compared = _verify(out, source, revision, token, progress=not quiet and not as_json)
    except MoebakeError as err:
        if not as_json:
            raise
        click.echo(json.dumps({"ok": False, "out": str(out), "source": source, "error": str(err)}, indent=2))
        sys.exit(2)
    if as_json:
        click.echo(
            json.dumps(
                {"ok": not problems, "out": str(out), "source": source, "problems": problems, "checked": None if problems else checked},
                indent=2,
            )
        )
    else:
        for problem in problems[:MISMATCH_LINES]:
            click.echo(f"mismatch: {problem}", err=True)
        if len(problems) > MISMATCH_LINES:
            click.echo(f"mismatch: ... and {len(problems) - MISMATCH_LINES} more (--json lists them all)", err=True)
        if problems:
            against = (
                ""
                if source is None
                else f" against {source}"
                if compared
                else f" (not compared with {source}: the bake fails its own checks first)"
            )
            click.echo(f"failed: {out}: {_problem_count(problems)}{against}", err=True)
        else:
            click.echo(f"ok: {out} ({checked})")
    if problems:
        sys.exit(1)


MISMATCH_LINES = 10
"""``verify`` prints at most this many ``mismatch:`` lines (each is one tensor or file), then a count."""


def _problem_count(problems: list[str]) -> str:
    """``3 mismatches in 2 files`` (each problem line starts with the file it is about)."""
    files = {problem.split(": ", 1)[0] for problem in problems}
    return f"{len(problems)} mismatch{'es' if len(problems) != 1 else ''} in {len(files)} file{'s' if len(files) != 1 else ''}"


def _verify(out: Path, source: str | None, revision: str | None, token: str | None, progress: bool) -> tuple[list[str], str, bool]:
    """Problems found in ``out`` (and against ``source``), what was checked, and whether ``out`` was compared with
    ``source`` (only once ``out`` passes its own checks)."""
    from moebake.convert.verify import verify_report

    report = verify_report(out, progress=progress)
    problems, checked = report.problems, report.summary()
    if not problems:
        checked += _proven_releases(out)
    if source is not None and not problems:
        from moebake.convert.source_check import compare_with_source, proof_summary

        problems = compare_with_source(out, _resolve(source, revision, token).path, progress=progress)
        checked += f"; {proof_summary(out, source)}"
        return problems, checked, True
    return problems, checked, False


def _proven_releases(out: Path) -> str:
    """``; proven on sglang 0.5.19, ...`` for a verified bake: the engine releases whose own code builds its bytes."""
    from moebake.schema.manifest import Manifest, read_manifest

    manifest = Manifest.from_json(read_manifest(out), out)
    records = [r for r in (manifest.engine, *manifest.serves) if r is not None and r.serving_releases]
    return "".join(f"; proven on {r.name} {release_span(r.name, r.serving_releases)}" for r in records)


@main.command()
@verbose_option
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@reports_errors
def inspect(path: Path, as_json: bool):
    """Describe checkpoint PATH: a source (format, dims, quantization, convertible targets) or a baked output (from its
    manifest; a listed file missing or of another size exits with status 1: `moebake verify` checks the bytes)."""
    from moebake.inspection import inspect_path, render_text
    from moebake.schema.source_location import parse_repo_spec

    if not os.path.lexists(path) and (spec := parse_repo_spec(str(path))) is not None:
        repo, revision = spec
        download = f"hf download {repo}" + (f" --revision {revision}" if revision else "") + f" --local-dir {repo.split('/')[1]}"
        raise OptionError(
            f"{path}: no such local directory; inspect reads a checkpoint on disk and downloads nothing: "
            f"download the Hub repo first ({download}) and inspect that folder"
        )
    report = inspect_path(path)
    click.echo(json.dumps(report, indent=2) if as_json else render_text(report), nl=as_json)
    if report.get("file_problems"):  # a bake with a listed file missing or of another size
        sys.exit(1)


@main.command("list")
@verbose_option
def list_command():
    """Supported source formats x targets, and the kernel each target bakes for."""
    from moebake.convert.targets import TARGETS, kernel_description

    width = max(map(len, SOURCE_FORMAT_NAMES)) + 2
    lines = ["source format".ljust(width) + "  ".join(TARGETS)]
    for source_format in SOURCE_FORMAT_NAMES:
        cells = ("yes" if source_format in target.spec.source_formats else "-" for target in TARGETS.values())
        lines.append(source_format.ljust(width) + "  ".join(c.ljust(len(name)) for c, name in zip(cells, TARGETS)))
    lines += ["", "(bf16-moe also covers the BF16 MTP/draft layers of a ModelOpt NVFP4 checkpoint: deepep-bf16 bakes them.)", "", "targets"]
    lines += [f"  {name:<{max(map(len, TARGETS)) + 2}}{kernel_description(name)}" for name in TARGETS]
    lines += ["", "Which of them fit one checkpoint, and why not: moebake inspect SOURCE"]
    from moebake.schema.release_table import text

    lines += ["", "engine releases x targets and sources (convert --engine ENGINE==RELEASE bakes for one):", text()]
    click.echo("\n".join(lines))


@main.command()
@verbose_option
@click.argument("repo_id", required=False)
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--repo-id", "old_repo_id", hidden=True, help="Deprecated: the old form `upload OUT --repo-id ORG/NAME`.")
@click.option("--private", is_flag=True, help="Create the repo private (a repo that exists keeps its visibility).")
@click.option("--revision", help="Branch to commit to (created if missing), or refs/pr/N to resume a pull request.")
@click.option("--create-pr", is_flag=True, help="Open a pull request instead of committing to the branch.")
@click.option("--source", help="Before uploading, also prove bit-exactness against SOURCE (directory or ORG/NAME[@REV]).")
@click.option("--token", help="Hugging Face token (default: HF_TOKEN or the saved login).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Verify, then print the model card and the files that would be uploaded; send nothing (needs no token or network).",
)
@reports_errors
def upload(
    repo_id: str | None,
    path: Path | None,
    old_repo_id: str | None,
    private: bool,
    revision: str | None,
    create_pr: bool,
    source: str | None,
    token: str | None,
    dry_run: bool,
):
    """Verify baked output PATH (default: the current directory), write its model card (README.md) and
    upload it to Hub model repo REPO_ID (ORG/NAME, created if missing), as `hf upload REPO_ID [PATH]`.
    Re-run to resume."""
    from moebake.hub.client import hub_client, require_token
    from moebake.hub.publish import publish

    if old_repo_id is not None:
        if path is not None:
            raise OptionError("give the repo once: moebake upload REPO_ID PATH")
        repo_id, path = old_repo_id, Path(repo_id) if repo_id else None
        click.echo("deprecated: `moebake upload OUT --repo-id REPO_ID` is now `moebake upload REPO_ID OUT`", err=True)
    if not repo_id:
        raise OptionError("missing REPO_ID (ORG/NAME): moebake upload REPO_ID [PATH]")
    out = _upload_arguments(repo_id, path)
    if dry_run:
        _upload_preview(out, repo_id, token, revision=revision, create_pr=create_pr, source=source)
        return
    require_token(token)  # before any network access
    commit = publish(out, repo_id, hub_client(token), private=private, revision=revision, create_pr=create_pr, source=source, progress=True)
    click.echo(f"uploaded {out} to {repo_id}: {commit.pr_url or commit.commit_url}")


def _upload_preview(out: Path, repo_id: str, token: str | None, *, revision: str | None, create_pr: bool, source: str | None) -> None:
    """``upload --dry-run``: what the upload would send (its checks made), on stdout; nothing sent or written."""
    from moebake.hub.client import hub_client
    from moebake.hub.publish import preview
    from moebake.progress_bars import size_text

    shown = preview(out, repo_id, hub_client(token), revision=revision, create_pr=create_pr, source=source, progress=True)
    where = f"a pull request to {repo_id}" if create_pr else f"{repo_id}" + (f" ({revision})" if revision else "")
    total = sum(size for _, size, _ in shown.files)
    lines = [
        f'would upload {out} to {where}: {len(shown.files)} files, {size_text(total)}, commit "{shown.message}" (--dry-run: nothing sent)'
    ]
    width = max(len(name) for name, _, _ in shown.files)
    lines += [
        f"  {name:<{width}}  {size_text(size):>9}" + ("  (written by the upload)" if written else "") for name, size, written in shown.files
    ]
    lines += ["", "model card (README.md):", "", shown.card.rstrip("\n")]
    click.echo("\n".join(lines))


def _upload_arguments(repo_id: str, path: Path | None) -> Path:
    """The output to upload (PATH, or the current directory) once REPO_ID reads ORG/NAME and it is a moebake output;
    OptionError or ManifestError otherwise (checked before the token, so the first error is the first mistake)."""
    from moebake.schema.manifest import load_manifest
    from moebake.schema.source_location import parse_repo_spec

    spec = parse_repo_spec(repo_id)
    if spec is None or spec[1] is not None:
        order = f"; the repo comes first: moebake upload ORG/NAME {repo_id}" if path is None and Path(repo_id).exists() else ""
        raise OptionError(f"{repo_id}: not a Hub repo id (expected ORG/NAME){order}")
    out = path or Path(".")
    try:
        load_manifest(out)  # a moebake output at all (verify, before the upload, checks the rest)
    except MoebakeError:
        if path is not None:
            raise
        raise OutputError(
            f"no PATH given, and the current directory ({Path.cwd()}) is not a moebake output: moebake upload {repo_id} PATH"
        ) from None
    return out


@main.command()
@verbose_option
@click.option(
    "--workdir",
    type=click.Path(path_type=Path),
    default=Path("moebake-demo"),
    show_default=True,
    help="Where the example source and baked output are written.",
)
@reports_errors
def demo(workdir: Path):
    """Bake a built-in small GPT-OSS-shaped example, verify it, print a summary."""
    from moebake.demo import run_demo

    run_demo(workdir)


def _add_kernels_group() -> None:
    from moebake.kernels.cli import build_group

    main.add_command(build_group(reports_errors, verbose_option), "kernels")


_add_kernels_group()
