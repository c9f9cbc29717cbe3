"""What both engine plugins' ``moebake`` quantization configs say about themselves (engine-neutral).

SGLang's and vLLM's ``QuantizationConfig`` base classes ask the same four questions; a plugin's config
class lists :class:`MoebakeQuantization` before its engine's base class.
"""

import torch

from moebake.schema.config_json import QUANT_METHOD


class MoebakeQuantization:
    """The ``moebake`` method: BF16 activations, Hopper (SM90) or newer, no config file of its own (it reads
    ``moebake.json`` beside config.json, named by ``quantization_config.manifest``)."""

    @classmethod
    def get_name(cls) -> str:
        return QUANT_METHOD

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 90

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []
