"""The plugin's refusals: each is one line saying what is wrong and what to do, raised before any weight is read.

``MoebakeRefusal`` is an :class:`~moebake.errors.EngineRefusal` (also a ``RuntimeError``, so SGLang's start-up
reports it like its own errors).
Every check here is a pure function of the manifest and SGLang's state, tested on CPU.
"""

from moebake.errors import EngineRefusal
from moebake.layouts.flashinfer_versions import layout_for_flashinfer
from moebake.schema.manifest import EngineRecord, LayerRecord, Manifest


class MoebakeRefusal(EngineRefusal):
    """A baked checkpoint that this SGLang process must not serve (one line: what, and what to do)."""

    def __str__(self) -> str:
        return "moebake: " + super().__str__()


# target -> (platform attribute, the GPU it names)
TARGET_GPUS = {"sm90-cutlass": ("is_sm90", "Hopper (SM90)"), "cutedsl": ("is_sm100", "Blackwell (SM100)"),
               "cutedsl-deepep": ("is_sm100", "Blackwell (SM100)"), "sm100-trtllm": ("is_sm100", "Blackwell (SM100)"),
               "deepep-bf16": (("is_sm90", "is_sm100"), "Hopper (SM90) or Blackwell (SM100)")}


def check_gpu(target: str, platform) -> None:
    attributes, gpu = TARGET_GPUS[target]
    attributes = attributes if isinstance(attributes, tuple) else (attributes,)
    if not any(getattr(platform, attribute, False) for attribute in attributes):
        raise MoebakeRefusal(f"target {target} runs on {gpu} GPUs only, and this is not one; bake for this GPU's target")


def check_flashinfer_layout(manifest: Manifest, flashinfer_version: str) -> None:
    layout = manifest.flashinfer_layout
    if layout is None:
        return
    read = layout_for_flashinfer(flashinfer_version)
    if read != layout:
        raise MoebakeRefusal(f"baked for FlashInfer SM90 fp4 layout {layout}, but the installed FlashInfer {flashinfer_version} "
                             f"reads {read or 'no SM90 fp4 layout'}; re-bake with --flashinfer-layout {read} or install a "
                             f"FlashInfer that reads {layout}")


def check_backends(engine: EngineRecord, runner_backend: str, a2a_backend: str) -> None:
    for flag, wanted, got in (("--moe-runner-backend", engine.runner_backend, runner_backend),
                              ("--moe-a2a-backend", engine.a2a_backend, a2a_backend)):
        if wanted != got:
            raise MoebakeRefusal(f"this bake is for {flag} {wanted}, the server runs {flag} {got}; start it with {flag} {wanted}")


def check_parallelism(record: LayerRecord, moe_tp_size: int, moe_ep_size: int) -> None:
    if moe_tp_size > 1:
        raise MoebakeRefusal(f"MoE tensor parallelism ({moe_tp_size}) is not supported: baked experts are whole; use expert "
                             f"parallelism instead (--ep-size equal to --tp-size)")
    if record.experts % moe_ep_size:
        raise MoebakeRefusal(f"layer {record.prefix} has {record.experts} experts, not divisible by the expert-parallel "
                             f"size {moe_ep_size}; choose an --ep-size that divides {record.experts}")


def check_dims(record: LayerRecord, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
    baked = (record.experts, record.hidden, record.intermediate)
    model = (num_experts, hidden_size, intermediate_size)
    if baked != model:
        raise MoebakeRefusal(f"config.json and manifest disagree on layer {record.prefix}: the model has (experts, hidden, "
                             f"intermediate) {model}, the bake {baked}; serve the config.json the bake was made with")


def check_all_loaded(record: LayerRecord, loaded: set[str]) -> None:
    missing = sorted(set(record.tensors) - loaded)
    if missing:
        raise MoebakeRefusal(f"baked parameter {record.prefix}{missing[0]} was never loaded"
                             f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; the checkpoint is incomplete "
                             f"or this model's loader skipped it: run `moebake verify`")
