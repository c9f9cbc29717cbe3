"""The model card (``README.md``) of a baked output, built from its manifest alone (deterministic).

YAML front matter: ``base_model`` (the source repo, when the manifest's source location is a Hub
repo id or a Hugging Face cache snapshot path), ``base_model_relation: quantized`` (the Hub then
lists the repo among the source's quantizations), ``library_name: moebake``, ``tags`` (moebake,
the target, the source format, ...) and the source's ``license`` when the output carries the
source's card. Body: target kernel and GPU, FlashInfer layout id, padding, the expert tensors, and
how to check the checkpoint, load it with ``moebake.serve`` (when it has a runtime for the target)
and install it in an engine.

:func:`card_files` makes it, and the ``moebake.json`` that records it (so ``verify`` keeps passing,
here and after a download), without writing anything; :func:`write_model_card` writes both into
the output.
"""

import json
import os
from pathlib import Path

import yaml
from huggingface_hub import ModelCardData
from huggingface_hub.repocard import metadata_load

from moebake.schema import serving
from moebake.schema.checksums import ALGORITHMS, CHECKSUM
from moebake.schema.manifest import (
    MANIFEST_NAME,
    EngineRecord,
    Manifest,
    SourceRecord,
    TensorRecord,
    read_manifest,
    render_manifest,
    rescaled_gate_up,
)
from moebake.schema.profiles import serving_flags
from moebake.schema.source_location import hub_repo_of, public_location
from moebake.schema.targets import target_spec

CARD_NAME = "README.md"


def _proof_sentence(manifest: Manifest) -> str:
    """What ``moebake verify --source`` proves for this bake (bit-exactness only where no value was changed)."""
    rescaled, experts, change = rescaled_gate_up(manifest)
    if not rescaled:
        return (
            "`moebake verify --source` proves them bit-exact: every baked expert tensor inverts to the source's bytes, "
            "and re-baking the source reproduces every byte of every tensor here."
        )
    return (
        f"`moebake verify --source` proves that re-baking the source reproduces every byte of every tensor here, and that "
        f"the experts invert to the source's bytes except, by design (`--gate-up-globals share`), the gate/up block scales "
        f"of {rescaled} of {experts} experts, which were rescaled to one shared gate/up global (largest relative change "
        f"{change:.2%}) and are not bit-exact to the source."
    )


def source_label(source: SourceRecord) -> str:
    """``org/name@sha`` for a Hub source, the folder name for a local one (local paths stay private)."""
    return public_location(source.location) + (f"@{source.revision}" if source.revision else "")


def render_model_card(manifest: Manifest, repo_id: str, license_id: str | None = None) -> str:
    """Markdown model card with YAML front matter for the baked output described by ``manifest``."""
    source, layers, target = manifest.source, manifest.layers, manifest.target
    base = hub_repo_of(source.location)
    data = ModelCardData(
        base_model=base,
        license=license_id,
        library_name="moebake",
        tags=["moebake", target, source.format, "mixture-of-experts", "flashinfer"],
        base_model_relation="quantized" if base else None,
    )
    first = layers[0]
    source_ref = f"[`{base}`](https://huggingface.co/{base})" if base else f"the local checkpoint `{source_label(source)}`"
    revision = f" at revision `{source.revision}`" if source.revision else ""
    source_arg = f"{base}@{source.revision}" if base and source.revision else (base or "SOURCE_DIR")
    name = repo_id.split("/")[-1]
    lines = [
        "---",
        data.to_yaml(),
        "---",
        "",
        f"# {name}",
        "",
        f"The expert weights of {source_ref}{revision}, pre-baked offline by moebake into the exact byte "
        f"layout of {target_spec(target).description}, so they load with zero processing. {_proof_sentence(manifest)}",
        "",
        "| | |",
        "|---|---|",
        f"| target | `{target}` (moebake layout version {manifest.target_layout_version}) |",
        f"| kernel and GPU | {target_spec(target).description} |",
    ]
    if manifest.flashinfer_layout:
        lines.append(f"| FlashInfer layout | `{manifest.flashinfer_layout}`: {manifest.flashinfer_layout_description} |")
    lines += [
        f"| source | {source_ref}{revision} (format `{source.format}`) |",
        f"| MoE layers x experts | {len(layers)} x {first.experts} |",
        f"| padding | hidden {first.hidden} -> {first.hidden_padded}, intermediate {first.intermediate} -> {first.intermediate_padded} |",
        *_engine_row(manifest.engine),
        f"| activation | `{json.dumps(manifest.activation.to_json())}` |",
        f"| baked by | moebake {manifest.moebake_version}" + (f", {manifest.created}" if manifest.created else "") + " |",
        "",
        f"## Expert tensors (per MoE layer, under `{first.prefix}`)",
        "",
        "| tensor | dtype | shape | from source tensors |",
        "|---|---|---|---|",
        *(
            f"| `{short}` | {spec.dtype} | {list(spec.shape)} | {_source_cell(spec, first.prefix)} |"
            for short, spec in first.tensors.items()
        ),
        "",
        "Every other tensor and the tokenizer are the source's, byte for byte; `config.json` is the source's with "
        "`quantization_config.quant_method: moebake` (the source's kept as `original`), so an engine without "
        "moebake's plugin refuses to load it. `moebake.json` records the options and the checksum of every "
        "source file and of every file here.",
        "",
        "## Check it with moebake",
        "",
        "```bash",
        f"hf download {repo_id} --local-dir {name}",
        f"moebake verify {name}            # checksums, index, shard headers",
        f"moebake verify {name} --source {source_arg}   # bit-exact against the source",
        f"moebake inspect {name}",
        "```",
        "",
        *_serve_section(target, repo_id, first.index),
        *_engine_section(manifest, repo_id),
    ]
    return "\n".join(lines)


def _engine_section(manifest: Manifest, repo_id: str) -> list[str]:
    """How each engine whose bytes the bake equals serves it (through moebake's plugin for that engine)."""
    engines = [e for e in ([manifest.engine] if manifest.engine else []) + list(manifest.serves) if e.exact]
    lines = [
        "## Load it in an engine",
        "",
        "The expert tensors are already in the kernel's layout, byte for byte what the engine itself builds at "
        "start-up. The engine serves them with moebake's plugin for it (commands below): it loads them "
        "as they are and skips its own load-time re-layout of the experts; expert parallelism splits the experts "
        "over GPUs (SGLang `--ep-size` = `--tp-size`, vLLM `--enable-expert-parallel`). An engine without the "
        "plugin refuses this repo at start-up (unknown quantization method `moebake`) instead of serving it as "
        "the source format.",
        "",
    ]
    if engines:
        commands = {"sglang": "python -m sglang.launch_server --model-path", "vllm": "vllm serve"}
        lines += [
            "```bash",
            *(
                f'pip install "moebake[{e.name}]"   # {e.name} {e.version}\n{commands[e.name]} {repo_id} {serving_flags(e)}'
                for e in engines
            ),
            "```",
            "",
        ]
    return lines


def _engine_row(engine: EngineRecord | None) -> list[str]:
    """The table row naming the engine profile the bake follows (none for bakes from before profiles)."""
    if engine is None:
        return []
    flags = f"`{serving_flags(engine)}`" if serving_flags(engine) else "no flags serve it"
    exact = (
        "byte for byte its post-load parameters (proven against its code)"
        if engine.exact
        else f"not engine-exact: {engine.not_exact_because}"
    )
    return [f"| engine | {engine.name} {engine.version}, {flags}: {exact} |"]


def _source_cell(spec: TensorRecord, prefix: str) -> str:
    """The source tensors (names under the layer prefix) a baked tensor comes from, or ``derived``."""
    return ", ".join(f"`{name.removeprefix(prefix)}`" for name in spec.sources) or "derived"


def _serve_section(target: str, repo_id: str, layer: int) -> list[str]:
    """How to load it with moebake's GPU runtime, when ``moebake.serve`` has one for ``target``."""
    if target not in serving.served_targets(serving.SERVE):
        return []
    return [
        "## Load it with moebake",
        "",
        "```python",
        "import moebake.serve",
        "from huggingface_hub import snapshot_download",
        "",
        f'ckpt = moebake.serve.open(snapshot_download("{repo_id}"))',
        f'experts = ckpt.load_experts({layer}, device="cuda")',
        "out = experts.forward(hidden_states, topk_ids, topk_weights)",
        "```",
        "",
    ]


def _card_license(path: Path) -> str | None:
    """The ``license`` of the card at ``path`` (None if absent, or its front matter is not valid YAML)."""
    if not path.is_file():
        return None
    try:
        metadata = metadata_load(path) or {}
    except yaml.YAMLError:
        return None
    return metadata.get("license") if isinstance(metadata, dict) else None


def card_files(out: str | os.PathLike, repo_id: str) -> dict[str, bytes]:
    """The card ``README.md`` for ``out`` (keeping the licence of a source card it replaces) and
    ``out``'s ``moebake.json`` recording it, as ``{file name: bytes}``; writes nothing."""
    out = Path(out)
    manifest = read_manifest(out)
    if isinstance(manifest.get("source"), dict) and isinstance(manifest["source"].get("location"), str):
        # a bake made before manifests recorded only this: its local path is not published (nor hashed into config.json)
        manifest["source"]["location"] = public_location(manifest["source"]["location"])
    card = render_model_card(Manifest.from_json(manifest, out / MANIFEST_NAME), repo_id, _card_license(out / CARD_NAME)).encode("utf-8")
    record = {CHECKSUM: ALGORITHMS[CHECKSUM](card).hexdigest(), "bytes": len(card)}
    manifest["files"] = dict(sorted({**manifest["files"], CARD_NAME: record}.items()))
    return {CARD_NAME: card, MANIFEST_NAME: render_manifest(manifest).encode("utf-8")}


def write_model_card(out: str | os.PathLike, repo_id: str) -> str:
    """Write the card into ``out/README.md`` and record it in ``out/moebake.json`` (each file replaced
    atomically, the manifest last, and only if it changes); returns the card. Idempotent."""
    out = Path(out)
    files = card_files(out, repo_id)
    for name in (CARD_NAME, MANIFEST_NAME):
        path = out / name
        if not path.is_file() or path.read_bytes() != files[name]:
            temporary = out / f".{name}.tmp"
            temporary.write_bytes(files[name])
            os.replace(temporary, path)
    return files[CARD_NAME].decode("utf-8")
