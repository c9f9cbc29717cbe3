"""Checkpoint readers: the safetensors format rules, checkpoint directories, one module per source format.

:func:`open_source` detects the format of a checkpoint directory and returns a validated model
object (e.g. :class:`moebake.formats.gpt_oss.GptOssModel`).

Detection tries :data:`SOURCE_FORMATS` in order, so the formats that recognise a quantization come
before ``bf16-moe``, which claims any checkpoint with BF16 expert weights: an NVFP4 checkpoint
whose MTP layers are BF16 is ``modelopt-nvfp4`` unless the caller asks for ``bf16-moe`` (as target
``deepep-bf16`` does, through ``formats``).
"""

import os
from pathlib import Path

from moebake.errors import MoebakeError, UnsupportedError
from moebake.formats import bf16_moe, deepseek_v4, gpt_oss, modelopt_nvfp4
from moebake.formats.checkpoint import SourceCheckpoint, open_checkpoint
from moebake.schema.config_json import QUANT_METHOD
from moebake.schema.config_values import short_repr
from moebake.schema.manifest import read_manifest_record

SOURCE_FORMATS = {  # detection order: see the module docstring
    gpt_oss.FORMAT_NAME: gpt_oss,
    modelopt_nvfp4.FORMAT_NAME: modelopt_nvfp4,
    deepseek_v4.FORMAT_NAME: deepseek_v4,
    bf16_moe.FORMAT_NAME: bf16_moe,
}


def detected_format(checkpoint: SourceCheckpoint, formats: tuple[str, ...] | None = None) -> str | None:
    """Name of the first of :data:`SOURCE_FORMATS` (only those in ``formats``, if given) that detects ``checkpoint``, or None."""
    return next((name for name in SOURCE_FORMATS if (formats is None or name in formats) and SOURCE_FORMATS[name].detect(checkpoint)), None)


def detect_format(checkpoint: SourceCheckpoint, formats: tuple[str, ...] | None = None) -> str:
    """:func:`detected_format`; MoebakeError naming the model if no format detects it."""
    name = detected_format(checkpoint, formats)
    if name is not None:
        return name
    config = checkpoint.values
    quant = config.section("quantization_config")
    if quant and quant.raw("quant_method") == QUANT_METHOD:
        raise UnsupportedError(_already_baked(checkpoint.root))
    model = f"model_type={short_repr(config.raw('model_type'))}, quant_method={short_repr(quant.raw('quant_method') if quant else None)}"
    candidates = [name for name in SOURCE_FORMATS if formats is None or name in formats]
    other = detected_format(checkpoint) if formats is not None else None
    if other is not None:  # a format moebake reads, but not one asked for here
        raise UnsupportedError(f"{config.file}: a {other} checkpoint ({model}); this needs {' or '.join(candidates)}")
    supported = ", ".join(SOURCE_FORMATS)
    raise UnsupportedError(
        f"{config.file}: unsupported model ({model}); "
        + (
            f"supported here: {', '.join(candidates)} (moebake reads {supported})"
            if len(candidates) < len(SOURCE_FORMATS)
            else f"supported: {supported}"
        )
    )


def _already_baked(root: Path) -> str:
    """The refusal of a moebake bake given as a source: what it is, and what to convert instead."""
    try:
        manifest = read_manifest_record(root)
        what = f" for target {manifest.target}, from source {manifest.source.location}"
    except MoebakeError:
        what = ""
    return (
        f"{root}: is already a moebake bake{what} (config.json's quant_method is moebake); convert its source "
        f"checkpoint instead (`moebake inspect {root}` describes this bake)"
    )


def open_model(checkpoint: SourceCheckpoint, formats: tuple[str, ...] | None = None):
    """Detect (among ``formats``, if given) and validate the model of an opened checkpoint."""
    return SOURCE_FORMATS[detect_format(checkpoint, formats)].open_model(checkpoint)


def open_source(path: str | os.PathLike, formats: tuple[str, ...] | None = None):
    """Open, detect (among ``formats``, if given) and validate a source checkpoint directory."""
    return open_model(open_checkpoint(path), formats)
