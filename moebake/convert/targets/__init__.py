"""Conversion targets: each module turns a source model's expert tensors into one kernel's layout.

A target module exposes ``NAME``, ``LAYOUT_VERSION``, ``USES_FLASHINFER_SM90_LAYOUT`` (whether
``--flashinfer-layout`` changes its bytes; the manifest records the layout only then),
``plan(model, options) -> (list[OutputTensor], list[layer dict])`` and
``restore(record, baked, layout) -> {source tensor name: tensor}``, the exact inverse used by verification. The first line of its docstring reads ``Target ``NAME``: <kernel> on <GPU>.``
(shown by ``inspect`` and in model cards, see :func:`kernel_description`).
A target may also set ``SOURCE_FORMATS``, the source formats it reads (tried in registry order,
see :mod:`moebake.formats`); without it, the checkpoint is read as whatever format it is detected as.
"""

from moebake.convert.options import ConvertOptions
from moebake.convert.targets import cutedsl, cutedsl_deepep, deepep_bf16, sm90_cutlass, sm100_trtllm
from moebake.errors import MoebakeError, UnsupportedError
from moebake.formats import SOURCE_FORMATS, detect_format, detected_format

TARGETS = {
    sm90_cutlass.NAME: sm90_cutlass,
    cutedsl.NAME: cutedsl,
    cutedsl_deepep.NAME: cutedsl_deepep,
    deepep_bf16.NAME: deepep_bf16,
    sm100_trtllm.NAME: sm100_trtllm,
}


def get_target(name: str):
    if name not in TARGETS:
        raise UnsupportedError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}")
    return TARGETS[name]


def model_for_target(checkpoint, name: str, *, name_fits: bool = True):
    """The source model target ``name`` bakes from opened ``checkpoint``: detected among the target's
    ``SOURCE_FORMATS`` (so a ModelOpt checkpoint's BF16 MTP layers are ``bf16-moe`` for ``deepep-bf16``).

    The one check ``convert`` and ``inspect`` both use. When the checkpoint is a supported model that
    this target does not read, the error names the targets that fit it (``name_fits``)."""
    target = get_target(name)
    detected = detected_format(checkpoint, target.SOURCE_FORMATS)
    if detected is not None:
        return SOURCE_FORMATS[detected].open_model(checkpoint)
    other = detect_format(checkpoint)  # MoebakeError if no format reads it: then the model is the problem
    fits = f"; targets that fit it: {', '.join(fitting_targets(checkpoint)) or 'none'}" if name_fits else ""
    raise UnsupportedError(f"{checkpoint.root}: target {name} bakes {' or '.join(target.SOURCE_FORMATS)} checkpoints, "
                       f"this one is {other}{fits}")


def plan_target(checkpoint, name: str, options: ConvertOptions | None = None):
    """``(model, output tensors, layer records)`` of target ``name`` on ``checkpoint`` (default options if
    None); MoebakeError with the target's own reason when it does not fit. Reads headers and scalars only."""
    model = model_for_target(checkpoint, name, name_fits=False)
    converted, layers = get_target(name).plan(model, options or ConvertOptions(name))
    return model, converted, layers


def fitting_targets(checkpoint) -> list[str]:
    """Names of the targets that can bake ``checkpoint`` with default options."""
    fits = []
    for name in TARGETS:
        try:
            plan_target(checkpoint, name)
        except MoebakeError:
            continue
        fits.append(name)
    return fits


def kernel_description(name: str) -> str:
    """The kernel and GPU target ``name`` bakes for, from its docstring's first line (Markdown code spans)."""
    first_line = (get_target(name).__doc__ or name).strip().splitlines()[0]
    return first_line.split(": ", 1)[-1].rstrip(".").replace("``", "`")
