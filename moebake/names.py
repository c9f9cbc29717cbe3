"""The registries' names without importing the registries (they import torch): the CLI's choices,
``--help`` and usage errors stay fast. ``tests/test_cli.py`` checks them against
:data:`moebake.convert.targets.TARGETS` and :data:`moebake.formats.SOURCE_FORMATS`."""

TARGET_NAMES = ("sm90-cutlass", "cutedsl", "cutedsl-deepep", "deepep-bf16", "sm100-trtllm")
SOURCE_FORMAT_NAMES = ("gpt-oss", "modelopt-nvfp4", "deepseek-v4", "bf16-moe")
