"""Checkpoint readers: the safetensors format rules, checkpoint directories, one module per source format.

:func:`open_source` detects the format of a checkpoint directory and returns a validated model
object (e.g. :class:`moebake.formats.gpt_oss.GptOssModel`).
"""

from moebake.errors import MoebakeError
from moebake.formats import deepseek_v4, gpt_oss, modelopt_nvfp4
from moebake.formats.checkpoint import SourceCheckpoint, open_checkpoint

SOURCE_FORMATS = {gpt_oss.FORMAT_NAME: gpt_oss, modelopt_nvfp4.FORMAT_NAME: modelopt_nvfp4, deepseek_v4.FORMAT_NAME: deepseek_v4}


def detect_format(checkpoint: SourceCheckpoint) -> str:
    """Name of the source format of ``checkpoint``; MoebakeError if none matches."""
    for name, module in SOURCE_FORMATS.items():
        if module.detect(checkpoint):
            return name
    config = checkpoint.config
    model_type = config.get("model_type", "?")
    quant = (config.get("quantization_config") or {}).get("quant_method", "none")
    raise MoebakeError(
        f"{checkpoint.root / 'config.json'}: unsupported model (model_type={model_type!r}, quant_method={quant!r}); "
        f"supported: {', '.join(SOURCE_FORMATS)}"
    )


def open_source(path):
    """Open, detect and validate a source checkpoint directory."""
    checkpoint = open_checkpoint(path)
    return SOURCE_FORMATS[detect_format(checkpoint)].open_model(checkpoint)
