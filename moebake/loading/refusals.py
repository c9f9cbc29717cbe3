"""What every server of a bake checks before it reads a byte, as plain functions.

Each returns ``None`` when the check passes, or one line saying what is wrong and what to do; the
caller raises it as its own error (the SGLang plugin's ``MoebakeRefusal``, the vLLM plugin's
refusal, ``moebake.serve``'s ``PlatformError``). Where the remedy is an engine's flag, the caller
passes the flag's wording (it is the engine's fact, not this module's). Nothing here imports torch
or an engine.
"""

from collections.abc import Iterable

from moebake.schema.enums import GpuFamily
from moebake.schema.flashinfer_versions import layout_for_flashinfer
from moebake.schema.targets import target_spec


def gpu_refusal(target: str, present: GpuFamily | None, device: str) -> str | None:
    """Refuse a GPU family (``present``; None: one no target runs on) the target's kernel does not run on.
    ``device`` names what is there, e.g. ``device cuda:0 (compute capability 8.0)``."""
    spec = target_spec(target)
    if present in spec.gpus:
        return None
    return f"{device}: target {target} runs on {spec.gpu_names} GPUs only; serve it there, or bake for this GPU's target"


def flashinfer_layout_refusal(baked_layout: str | None, flashinfer_version: str, where: str) -> str | None:
    """Refuse a FlashInfer whose SM90 fp4 kernels read another byte layout than the bake's (``baked_layout``
    None: the target's bytes do not depend on it)."""
    if baked_layout is None:
        return None
    read = layout_for_flashinfer(flashinfer_version)
    if read == baked_layout:
        return None
    reads = f"reads fp4 layout {read}" if read else "has no SM90 W4A16 fp4 layout"
    fix = f"re-bake with --flashinfer-layout {read}" if read else "install FlashInfer >= 0.6.10"
    return (
        f"{where}: baked for FlashInfer SM90 fp4 layout {baked_layout}, but the installed FlashInfer {flashinfer_version} "
        f"{reads}; {fix} or install a FlashInfer that reads {baked_layout}"
    )


def parallelism_refusal(
    prefix: str, experts: int, moe_tp_size: int, moe_ep_size: int, *, use_expert_parallelism: str, choose_ep_size: str
) -> str | None:
    """Refuse MoE tensor parallelism (a bake's experts are whole: I is not split) and an EP size that does not
    divide the layer's expert count. ``use_expert_parallelism`` / ``choose_ep_size``: the engine's wording of the
    remedy (its flags)."""
    if moe_tp_size > 1:
        return (
            f"{prefix}: MoE tensor parallelism ({moe_tp_size}) is not supported: the baked experts are whole (I is not "
            f"split); serve them with expert parallelism ({use_expert_parallelism})"
        )
    if moe_ep_size < 1 or experts % moe_ep_size:
        return f"{prefix}: {experts} experts do not split evenly over {moe_ep_size} EP ranks; {choose_ep_size} that divides {experts}"
    return None


def unloaded_refusal(prefix: str, missing: Iterable[str], remedy: str) -> str | None:
    """Refuse a layer whose baked tensors (``missing``, short names) the engine's loader never gave."""
    missing = sorted(missing)
    if not missing:
        return None
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return f"baked parameter {prefix}{missing[0]} was never loaded{more}; {remedy}"
