"""``moebake demo``: bake a small synthetic GPT-OSS checkpoint for sm90-cutlass and prove it exact.

The work directory is the demo's own: it is made with a marker file :data:`MARKER` in it, and a
directory that exists without one is used only if it holds nothing but the demo's two folders
(left by an earlier demo); anything else is refused, never written into.
"""

import os
import time
from pathlib import Path

import click

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.source_check import compare_with_source
from moebake.convert.verify import verify_output
from moebake.errors import OutputError
from moebake.progress_bars import size_text
from moebake.synthetic import write_gpt_oss

DEMO_SHAPE = {"num_layers": 2, "num_experts": 4, "hidden": 2880, "intermediate": 2880}
SOURCE_NAME, OUT_NAME, MARKER = "gpt-oss-mini", "gpt-oss-mini-sm90-cutlass", ".moebake-demo"


def claim_workdir(workdir: Path) -> None:
    """Make ``workdir`` (with :data:`MARKER`), or check that an existing one is the demo's;
    OutputError otherwise."""
    if os.path.lexists(workdir):
        if workdir.is_symlink() or not workdir.is_dir():
            raise OutputError(f"{workdir}: exists and is not a directory; pass another --workdir")
        foreign = sorted(p.name for p in workdir.iterdir()) if not (workdir / MARKER).is_file() else []
        foreign = [name for name in foreign if name not in (SOURCE_NAME, OUT_NAME, MARKER)]
        if foreign:
            raise OutputError(f"{workdir}: exists and is not a moebake demo directory (it holds {foreign[0]}); pass another --workdir")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / MARKER).write_text("made by moebake demo: it may rewrite the folders here\n")
    except OSError as err:
        raise OutputError(f"{workdir}: cannot create the demo directory ({err.strerror})") from None


def run_demo(workdir: Path) -> None:
    claim_workdir(workdir)
    source, out = workdir / SOURCE_NAME, workdir / OUT_NAME
    if not (source / "config.json").is_file():
        shape = DEMO_SHAPE
        click.echo(
            f"writing example GPT-OSS checkpoint to {source} ({shape['num_layers']} layers, {shape['num_experts']} experts, "
            f"hidden {shape['hidden']}, intermediate {shape['intermediate']})"
        )
        write_gpt_oss(source, **DEMO_SHAPE)
    started = time.perf_counter()
    baked = convert(source, out, ConvertOptions(target="sm90-cutlass"), overwrite=True, resume=True)
    seconds = time.perf_counter() - started
    problems = verify_output(out) or compare_with_source(out, source)
    if problems:
        raise SystemExit("demo failed:\n" + "\n".join(problems))
    layer = baked.layers[0]
    out_bytes = sum(f.bytes for f in baked.files.values())
    click.echo("")
    click.echo(f"source        {source}  ({baked.source.format}, {len(baked.layers)} MoE layers, {layer.experts} experts)")
    click.echo(f"baked         {out}  (target {baked.target}, FlashInfer layout {baked.flashinfer_layout})")
    click.echo(f"padding       H {layer.hidden} -> {layer.hidden_padded}, I {layer.intermediate} -> {layer.intermediate_padded}")
    click.echo(f"activation    {_activation_text(baked.activation.to_json())}")
    click.echo(f"output        {len(baked.files)} files, {size_text(out_bytes)} in {seconds:.2f} s")
    for short, spec in layer.tensors.items():
        click.echo(f"  {layer.prefix}{short:<18} {spec.dtype:<5} {list(spec.shape)}")
    click.echo("verify        checksums, index and headers ok; every expert tensor inverts bit-exactly to the source,")
    click.echo("              and re-baking the source reproduces every byte of the output (padding included)")


def _activation_text(activation: dict) -> str:
    """``swiglu_oai (alpha 1.702, beta 1.0, limit 7.0)``: a manifest's activation record in words."""
    parameters = ", ".join(f"{key} {value}" for key, value in activation.items() if key != "kind")
    return f"{activation['kind']} ({parameters})" if parameters else activation["kind"]
