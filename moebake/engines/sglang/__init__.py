"""moebake's SGLang plugin: serve a baked checkpoint from SGLang itself (``--quantization moebake``).

Registered through the ``sglang.srt.plugins`` entry point (``pyproject.toml``), which SGLang loads
early in every process (launcher, scheduler, workers). :func:`register` adds the ``moebake``
quantization method to SGLang's ``QUANTIZATION_METHODS`` and to its ``--quantization`` choices;
no SGLang file is patched. The method (:mod:`moebake.engines.sglang.config`) delegates non-MoE
layers to the source's quantization config (the ``original`` kept in config.json) and gives every
fused-MoE layer a moebake method (:mod:`moebake.engines.sglang.moe_methods`) that creates the
layer's parameters at the manifest's shapes, loads the rank's slice of each baked tensor with shape
and dtype checks, runs no transform, and executes through SGLang's own runner. The bake's other tensors
that SGLang would copy whole are read by moebake too (:mod:`moebake.engines.sglang.whole_model`).
"""


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: make ``moebake`` a quantization method SGLang knows."""
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    from moebake.engines.sglang import internals, loader_hook, shard_iterator, whole_model
    from moebake.engines.sglang.config import MoebakeConfig
    from moebake.schema.config_json import QUANT_METHOD

    QUANTIZATION_METHODS[QUANT_METHOD] = MoebakeConfig
    choices, add_choices = internals.quantization_choices()
    if QUANT_METHOD not in choices:
        add_choices([QUANT_METHOD])
    loader_hook.install(whole_model.intercept, shard_iterator.lazy)  # a bake's tensors through moebake (whole_model's,
    # shard_iterator's docstrings)
