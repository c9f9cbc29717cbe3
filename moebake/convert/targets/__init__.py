"""Conversion targets: each module turns a source model's expert tensors into one kernel's layout.

A target module exposes ``NAME``, ``LAYOUT_VERSION``, ``USES_FLASHINFER_SM90_LAYOUT`` (whether
``--flashinfer-layout`` changes its bytes; the manifest records the layout only then),
``plan(model, options) -> (list[OutputTensor], list[layer dict])`` and
``restore(record, baked, layout) -> {source tensor name: tensor}``, the exact inverse used by verification. The first line of its docstring reads ``Target ``NAME``: <kernel> on <GPU>.``
(shown by ``inspect`` and in model cards, see :func:`kernel_description`).
A target may also set ``SOURCE_FORMATS``, the source formats it reads (tried in registry order,
see :mod:`moebake.formats`); without it, the checkpoint is read as whatever format it is detected as.
"""

from moebake.convert.targets import cutedsl, cutedsl_deepep, deepep_bf16, sm90_cutlass, sm100_trtllm
from moebake.errors import MoebakeError

TARGETS = {
    sm90_cutlass.NAME: sm90_cutlass,
    cutedsl.NAME: cutedsl,
    cutedsl_deepep.NAME: cutedsl_deepep,
    deepep_bf16.NAME: deepep_bf16,
    sm100_trtllm.NAME: sm100_trtllm,
}


def get_target(name: str):
    if name not in TARGETS:
        raise MoebakeError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}")
    return TARGETS[name]


def kernel_description(name: str) -> str:
    """The kernel and GPU target ``name`` bakes for, from its docstring's first line (Markdown code spans)."""
    first_line = (get_target(name).__doc__ or name).strip().splitlines()[0]
    return first_line.split(": ", 1)[-1].rstrip(".").replace("``", "`")
