"""The registries' names without importing the registries (they import torch): the CLI's choices,
``--help`` and usage errors stay fast. Target names come from the torch-free schema
(:data:`moebake.schema.targets.TARGET_SPECS`); ``tests/test_cli.py`` checks both against
:data:`moebake.convert.targets.TARGETS` and :data:`moebake.formats.SOURCE_FORMATS`."""

from moebake.schema.targets import TARGET_SPECS

TARGET_NAMES = tuple(TARGET_SPECS)
SOURCE_FORMAT_NAMES = ("gpt-oss", "modelopt-nvfp4", "deepseek-v4", "bf16-moe")
