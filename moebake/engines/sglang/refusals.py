"""The plugin's refusals: each is one line saying what is wrong and what to do, raised before any weight is read.

``MoebakeRefusal`` is an :class:`~moebake.errors.EngineRefusal` (also a ``RuntimeError``, so SGLang's start-up
reports it like its own errors).
Every check here is a pure function of the manifest and SGLang's state, tested on CPU.
"""

from typing import Any

from moebake.errors import EngineRefusal
from moebake.loading.refusals import flashinfer_layout_refusal, gpu_refusal, parallelism_refusal, unloaded_refusal
from moebake.schema.enums import GpuFamily
from moebake.schema.manifest import EngineRecord, LayerRecord, Manifest
from moebake.schema.profiles import HUMMING_FLAGS


class MoebakeRefusal(EngineRefusal):
    """A baked checkpoint that this SGLang process must not serve (one line: what, and what to do)."""

    def __str__(self) -> str:
        return "moebake: " + super().__str__()


# The remedies in SGLang's own flags.
USE_EXPERT_PARALLELISM = "--ep-size equal to --tp-size"
CHOOSE_EP_SIZE = "choose an --ep-size"


def _raise(refusal: str | None) -> None:
    if refusal is not None:
        raise MoebakeRefusal(refusal)


def check_gpu(target: str, platform: Any) -> None:
    """SGLang's platform says which GPU family it runs on (``is_sm90`` / ``is_sm100``)."""
    present = GpuFamily.SM90 if getattr(platform, "is_sm90", False) else GpuFamily.SM100 if getattr(platform, "is_sm100", False) else None
    _raise(gpu_refusal(target, present, f"this GPU ({present.label if present else 'neither SM90 nor SM100'})"))


def check_flashinfer_layout(manifest: Manifest, flashinfer_version: str) -> None:
    _raise(flashinfer_layout_refusal(manifest.flashinfer_layout, flashinfer_version, "this bake"))


def check_backends(engine: EngineRecord, runner_backend: str, a2a_backend: str) -> None:
    for flag, wanted, got in (
        ("--moe-runner-backend", engine.runner_backend, runner_backend),
        ("--moe-a2a-backend", engine.a2a_backend, a2a_backend),
    ):
        if wanted != got:
            raise MoebakeRefusal(f"this bake is for {flag} {wanted}, the server runs {flag} {got}; start it with {flag} {wanted}")


BACKEND_PACKAGES = {
    ("--moe-a2a-backend", "deepep"): ("deep_ep", "DeepEP"),
    ("--moe-runner-backend", "deep_gemm"): ("deep_gemm", "DeepGEMM"),
}
"""(SGLang flag, backend) -> (the module that backend runs on, its project's name)."""


def needs_backend_packages(engine: EngineRecord) -> bool:
    """Whether a bake's engine record names a backend of :data:`BACKEND_PACKAGES` (``deepep-bf16``, ``cutedsl-deepep``)."""
    return any(
        key in BACKEND_PACKAGES for key in (("--moe-a2a-backend", engine.a2a_backend), ("--moe-runner-backend", engine.runner_backend))
    )


def check_backend_packages(target: str, engine: EngineRecord, import_problem) -> None:
    """A bake for ``--moe-a2a-backend deepep`` runs through DeepEP, one for ``--moe-runner-backend deep_gemm`` through
    DeepGEMM: refuse where that module does not import (``import_problem(module)``: why not, or None)."""
    for flag, backend in (("--moe-a2a-backend", engine.a2a_backend), ("--moe-runner-backend", engine.runner_backend)):
        if (flag, backend) not in BACKEND_PACKAGES:
            continue
        module, project = BACKEND_PACKAGES[flag, backend]
        if problem := import_problem(module):
            raise MoebakeRefusal(
                f"this {target} bake runs through {project} ({flag} {backend}), but {module} does not "
                f"import here ({problem}); install {project} (the {module} package)"
            )


def check_humming_precision(target: str, baked_for_humming: bool, server_runs_humming: bool) -> None:
    """``sm90-cutlass-w4a8`` bytes are for SGLang's SM90 Humming W4A8 path
    (:data:`~moebake.schema.profiles.HUMMING_FLAGS`), ``sm90-cutlass`` bytes for its W4A16 path: refuse a server
    started on the other one (it would run the bytes as the wrong format)."""
    if baked_for_humming and not server_runs_humming:
        raise MoebakeRefusal(
            f"this {target} bake holds FlashInfer's Humming W4A8 weights, the server runs SM90 MXFP4 "
            f"MoE in W4A16; start it with {HUMMING_FLAGS}"
        )
    if server_runs_humming and not baked_for_humming:
        raise MoebakeRefusal(
            f"the server runs {HUMMING_FLAGS} (Humming W4A8), this {target} bake holds W4A16 weights; "
            f"drop that flag, or bake target sm90-cutlass-w4a8"
        )


def check_parallelism(record: LayerRecord, moe_tp_size: int, moe_ep_size: int) -> None:
    _raise(
        parallelism_refusal(
            f"layer {record.prefix.rstrip('.')}",
            record.experts,
            moe_tp_size,
            moe_ep_size,
            use_expert_parallelism=USE_EXPERT_PARALLELISM,
            choose_ep_size=CHOOSE_EP_SIZE,
        )
    )


def check_dims(record: LayerRecord, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
    baked = (record.experts, record.hidden, record.intermediate)
    model = (num_experts, hidden_size, intermediate_size)
    if baked != model:
        raise MoebakeRefusal(
            f"config.json and manifest disagree on layer {record.prefix}: the model has (experts, hidden, "
            f"intermediate) {model}, the bake {baked}; serve the config.json the bake was made with"
        )


def check_all_loaded(record: LayerRecord, loaded: set[str]) -> None:
    _raise(
        unloaded_refusal(
            record.prefix,
            set(record.tensors) - loaded,
            "the checkpoint is incomplete or this model's loader skipped it: run `moebake verify`",
        )
    )
