"""Checkpoint readers: the safetensors format rules, checkpoint directories, one module per source format.

:func:`open_source` detects the format of a checkpoint directory and returns a validated model
object (e.g. :class:`moebake.formats.gpt_oss.GptOssModel`).

Detection tries :data:`SOURCE_FORMATS` in order, so the formats that recognise a quantization come
before ``bf16-moe``, which claims any checkpoint with BF16 expert weights: an NVFP4 checkpoint
whose MTP layers are BF16 is ``modelopt-nvfp4`` unless the caller asks for ``bf16-moe`` (as target
``deepep-bf16`` does, through ``formats``).
"""

from moebake.errors import MoebakeError
from moebake.formats import bf16_moe, deepseek_v4, gpt_oss, modelopt_nvfp4
from moebake.formats.checkpoint import SourceCheckpoint, open_checkpoint

SOURCE_FORMATS = {  # detection order: see the module docstring
    gpt_oss.FORMAT_NAME: gpt_oss,
    modelopt_nvfp4.FORMAT_NAME: modelopt_nvfp4,
    deepseek_v4.FORMAT_NAME: deepseek_v4,
    bf16_moe.FORMAT_NAME: bf16_moe,
}


def detect_format(checkpoint: SourceCheckpoint, formats: tuple[str, ...] | None = None) -> str:
    """Name of the first of :data:`SOURCE_FORMATS` (only those in ``formats``, if given) that detects
    ``checkpoint``; MoebakeError if none does."""
    candidates = [name for name in SOURCE_FORMATS if formats is None or name in formats]
    for name in candidates:
        if SOURCE_FORMATS[name].detect(checkpoint):
            return name
    config = checkpoint.config
    model_type = config.get("model_type", "?")
    quant = (config.get("quantization_config") or {}).get("quant_method", "none")
    raise MoebakeError(
        f"{checkpoint.root / 'config.json'}: unsupported model (model_type={model_type!r}, quant_method={quant!r}); "
        f"supported: {', '.join(candidates)}"
    )


def open_source(path, formats: tuple[str, ...] | None = None):
    """Open, detect (among ``formats``, if given) and validate a source checkpoint directory."""
    checkpoint = open_checkpoint(path)
    return SOURCE_FORMATS[detect_format(checkpoint, formats)].open_model(checkpoint)
