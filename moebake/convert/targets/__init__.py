"""Conversion targets: each module defines one :class:`~moebake.convert.targets.base.Target` class and
registers it (see :mod:`moebake.convert.targets.base` for the contract, :mod:`moebake.schema.targets`
for what each target is). Importing this package registers them all in :data:`TARGETS`, in this order.
A target reads the source formats its spec lists (tried in registry order, see :mod:`moebake.formats`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moebake.convert.options import ConvertOptions

# Each module registers its target on import; this order is the registry's (the CLI's and inspect's).
# isort: off
from moebake.convert.targets import sm90_cutlass  # noqa: F401
from moebake.convert.targets import sm90_cutlass_w4a8  # noqa: F401
from moebake.convert.targets import cutedsl  # noqa: F401
from moebake.convert.targets import cutedsl_deepep  # noqa: F401
from moebake.convert.targets import deepep_bf16  # noqa: F401
from moebake.convert.targets import sm100_trtllm  # noqa: F401
from moebake.convert.targets import sm90_marlin  # noqa: F401

# isort: on
from moebake.convert.targets.base import TARGETS, Target
from moebake.errors import MoebakeError, UnsupportedError
from moebake.formats import SOURCE_FORMATS, detect_format, detected_format

if TYPE_CHECKING:
    from moebake.formats.checkpoint import SourceCheckpoint


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise UnsupportedError(f"unknown target {name!r}; expected one of {', '.join(TARGETS)}")
    return TARGETS[name]


def model_for_target(checkpoint: SourceCheckpoint, name: str, *, name_fits: bool = True):
    """The source model target ``name`` bakes from opened ``checkpoint``: detected among the target's
    ``spec.source_formats`` (so a ModelOpt checkpoint's BF16 MTP layers are ``bf16-moe`` for ``deepep-bf16``).

    The one check ``convert`` and ``inspect`` both use. When the checkpoint is a supported model that
    this target does not read, the error names the targets that fit it (``name_fits``)."""
    target = get_target(name)
    detected = detected_format(checkpoint, target.spec.source_formats)
    if detected is not None:
        return SOURCE_FORMATS[detected].open_model(checkpoint)
    other = detect_format(checkpoint)  # MoebakeError if no format reads it: then the model is the problem
    fits = f"; targets that fit it: {', '.join(fitting_targets(checkpoint)) or 'none'}" if name_fits else ""
    raise UnsupportedError(
        f"{checkpoint.root}: target {name} bakes {' or '.join(target.spec.source_formats)} checkpoints, this one is {other}{fits}"
    )


def plan_target(checkpoint: SourceCheckpoint, name: str, options: ConvertOptions | None = None):
    """``(model, output tensors, layer records)`` of target ``name`` on ``checkpoint`` (default options if
    None); MoebakeError with the target's own reason when it does not fit. Reads headers and scalars only."""
    model = model_for_target(checkpoint, name, name_fits=False)
    converted, layers = get_target(name).plan(model, options or ConvertOptions(name))
    return model, converted, layers


def fitting_targets(checkpoint: SourceCheckpoint) -> list[str]:
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
    """The kernel and GPU target ``name`` bakes for (Markdown code spans), from its spec."""
    return get_target(name).spec.description
