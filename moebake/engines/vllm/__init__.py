"""The vLLM plugin: serves bakes made for vLLM (``--engine vllm``) of the kinds the serving records give vLLM
(:mod:`moebake.schema.serving`; docs/serving.md's serving-routes table lists them).

vLLM loads it in every process through the ``vllm.general_plugins`` entry point (``pyproject.toml``);
:func:`register` adds the ``moebake`` quantization (:mod:`moebake.engines.vllm.quantization`) and the
``moebake`` load format (:mod:`moebake.engines.vllm.loader`). Serve with::

  vllm serve BAKED_DIR --quantization moebake --load-format moebake --moe-backend BACKEND

where ``BACKEND`` is the bake's (the manifest's ``engine.runner_backend``; ``moebake convert`` prints the whole
flags, :func:`moebake.schema.profiles.serving_flags`), and ``--enable-expert-parallel`` for more than one GPU.
Importing this package does not import vLLM.
"""


def register() -> None:
    """Register the ``moebake`` quantization config and model loader with vLLM (idempotent)."""
    from vllm.model_executor.layers.quantization import register_quantization_config
    from vllm.model_executor.model_loader import register_model_loader

    from moebake.engines.vllm import internals
    from moebake.engines.vllm.loader import MoebakeModelLoader
    from moebake.engines.vllm.quantization import LOAD_FORMAT, MoebakeConfig
    from moebake.schema.config_json import QUANT_METHOD

    if internals.registered_quantization(QUANT_METHOD) is not MoebakeConfig:
        register_quantization_config(QUANT_METHOD)(MoebakeConfig)
    if internals.registered_model_loader(LOAD_FORMAT) is not MoebakeModelLoader:
        register_model_loader(LOAD_FORMAT)(MoebakeModelLoader)
