"""moebake's SGLang plugin: serve a baked checkpoint from SGLang itself (``--quantization moebake``).

Registered through the ``sglang.srt.plugins`` entry point (``pyproject.toml``), which SGLang loads
early in every process (launcher, scheduler, workers). :func:`register` adds the ``moebake``
quantization method to SGLang's ``QUANTIZATION_METHODS`` and to its ``--quantization`` choices;
no SGLang file is patched. The method (:mod:`moebake.engines.sglang.config`) delegates non-MoE
layers to the source's quantization config (the ``original`` kept in config.json) and gives every
fused-MoE layer a moebake method (:mod:`moebake.engines.sglang.moe_methods`) that creates the
layer's parameters at the manifest's shapes, loads the rank's slice of each baked tensor with shape
and dtype checks, runs no transform, and executes through SGLang's own runner.
"""

QUANT_NAME = "moebake"


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: make ``moebake`` a quantization method SGLang knows."""
    # server_args binds both CLI names in every release of the matrix (0.5.20 moved their definitions to
    # sglang.srt.arg_groups.choices, which 0.5.17-0.5.19 lack: there the plugin failed to register and
    # `launch_server --quantization moebake` was refused by argparse).
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS
    from sglang.srt.server_args import QUANTIZATION_CHOICES, add_quantization_method_choices

    from moebake.engines.sglang.config import MoebakeConfig

    QUANTIZATION_METHODS[QUANT_NAME] = MoebakeConfig
    if QUANT_NAME not in QUANTIZATION_CHOICES:
        add_quantization_method_choices([QUANT_NAME])
