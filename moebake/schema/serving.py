"""Serving records: for each server and (target, source format), the code that serves such a bake, or why none does.

Servers: ``sglang`` (the SGLang plugin, ``moebake/engines/sglang/``), ``vllm`` (the vLLM plugin,
``moebake/engines/vllm/``) and ``moebake.serve`` (the engine-free runtime). A record whose ``source_format`` is None
holds for every source format of its target; a record for one source format takes precedence over it. A (server,
target, source format) without a record is not served, for no reason moebake knows.

:data:`RECORDS` is the one table of these facts; every other is a view of it: the SGLang plugin's ``METHODS`` (and the
method it picks per source format), the vLLM plugin's ``SERVED`` and the kernel backend it checks for,
``moebake.serve``'s ``RUNTIMES``, the refusal of a bake a server does not serve (:func:`unserved`),
:data:`NOT_SERVABLE` (the reason ``convert --engine`` gives too) and docs/serving.md's serving-routes table
(:func:`routes_markdown`; ``tests/test_docs.py`` keeps the page equal to it). A route is named here and implemented
by the server's code under that name (``tests/test_serving.py`` checks that each named route exists and that no other
does). What an engine builds per release (its flags, padding, parameter names) is the engine profile's
(:mod:`moebake.schema.profiles`); the GPUs a target runs on, its
:class:`~moebake.schema.targets.TargetSpec`'s.
"""

from dataclasses import dataclass

from moebake.schema.release_matrix import releases
from moebake.schema.targets import TARGET_SPECS, target_spec

SGLANG, VLLM, SERVE = "sglang", "vllm", "moebake.serve"
SERVERS = {SGLANG: "SGLang plugin", VLLM: "vLLM plugin", SERVE: "moebake.serve"}
"""Each server, as refusals name it and the serving-routes table heads its column."""


@dataclass(frozen=True, kw_only=True)
class ServingRecord:
    """How ``server`` serves bakes of ``target`` made from ``source_format`` (None: from any of the target's
    source formats), or why it cannot."""

    server: str
    target: str
    source_format: str | None = None
    route: str | None = None
    """The name the server's code registers the route under (SGLang: a MoE method factory; vLLM: a served kind;
    ``moebake.serve``: a runtime class); None: not served."""
    kernel_backend: str | None = None
    """vLLM: the member of its MoE backend enum (``Mxfp4MoeBackend``, ``NvFp4MoeBackend``) whose post-load bytes
    the bake is; the plugin refuses a server that selected another."""
    why_not: str | None = None
    """Why the server cannot serve such a bake at all: one clause, from its code (None where it serves it)."""

    @property
    def served(self) -> bool:
        return self.route is not None


_VLLM_NEWEST = releases(VLLM)[-1].version
"""The newest vLLM release of the release matrix: the one whose code the vLLM reasons below were read from (the
release matrix's proofs show the older releases lack those paths too)."""

_VLLM_HUMMING = (
    f"vLLM {_VLLM_NEWEST}'s HUMMING MXFP4 MoE backend runs the humming package's own GEMM on weights laid out by its "
    "own transform (humming.transform), not FlashInfer's SM90 cutlass_fused_moe Humming layout this bake holds; "
    "serve it with SGLang --flashinfer-mxfp4-moe-precision fp8"
)

RECORDS = (
    ServingRecord(server=SGLANG, target="sm90-cutlass", route="sm90-cutlass"),
    ServingRecord(server=SGLANG, target="sm90-cutlass-w4a8", route="sm90-cutlass-w4a8"),
    ServingRecord(server=SGLANG, target="deepep-bf16", route="deepep-bf16"),
    ServingRecord(server=SGLANG, target="sm100-trtllm", route="sm100-trtllm"),
    ServingRecord(server=SGLANG, target="sm100-trtllm", source_format="deepseek-v4", route="sm100-trtllm-deepseek-v4"),
    ServingRecord(server=SGLANG, target="cutedsl", route="cutedsl"),
    ServingRecord(server=SGLANG, target="cutedsl-deepep", route="cutedsl"),
    ServingRecord(server=SGLANG, target="sm90-marlin", route="sm90-marlin"),
    ServingRecord(server=SGLANG, target="sm90-marlin", source_format="deepseek-v4", route="sm90-marlin-deepseek-v4"),
    ServingRecord(
        server=VLLM, target="sm90-cutlass", source_format="gpt-oss", route="gpt-oss", kernel_backend="FLASHINFER_CUTLASS_MXFP4_BF16"
    ),
    ServingRecord(
        server=VLLM, target="cutedsl", source_format="modelopt-nvfp4", route="modelopt-nvfp4", kernel_backend="FLASHINFER_CUTEDSL"
    ),
    ServingRecord(
        server=VLLM, target="sm90-cutlass", source_format="deepseek-v4", route="deepseek-v4", kernel_backend="FLASHINFER_CUTLASS_MXFP4_BF16"
    ),
    ServingRecord(
        server=VLLM, target="sm100-trtllm", source_format="gpt-oss", route="gpt-oss-sm100", kernel_backend="FLASHINFER_TRTLLM_MXFP4_BF16"
    ),
    ServingRecord(
        server=VLLM,
        target="sm100-trtllm",
        source_format="deepseek-v4",
        route="deepseek-v4-sm100",
        kernel_backend="FLASHINFER_TRTLLM_MXFP4_BF16",
    ),
    ServingRecord(server=VLLM, target="sm90-marlin", source_format="deepseek-v4", route="deepseek-v4-marlin", kernel_backend="MARLIN"),
    ServingRecord(server=VLLM, target="sm90-cutlass-w4a8", why_not=_VLLM_HUMMING),
    ServingRecord(
        server=VLLM,
        target="deepep-bf16",
        source_format="bf16-moe",
        why_not=(
            f"vLLM {_VLLM_NEWEST}'s unquantized MoE has no DeepGEMM kernel (map_unquantized_backend offers triton, batched_triton, "
            "flashinfer_trtllm, flashinfer_cutlass, aiter; behind deepep_low_latency select_unquantized_moe_backend takes "
            "BATCHED_TRITON), so this target's DeepGEMM m_grouped_bf16_gemm_nt_masked path does not exist there"
        ),
    ),
    ServingRecord(
        server=VLLM,
        target="sm90-marlin",
        source_format="gpt-oss",
        why_not=(
            f"vLLM {_VLLM_NEWEST}'s GptOssMxfp4MoEMethod hands prepare_moe_mxfp4_layer_for_marlin W13 as its GPT-OSS loader leaves it, "
            "the checkpoint's interleaved (gate, up) row pairs with the padding rows after them and zero scale padding, for "
            "its SWIGLUOAI activation, which reads gate and up interleaved; this target holds SGLang's [gate; up] halves, "
            "each padded, with scale padding 127"
        ),
    ),
    ServingRecord(server=SERVE, target="sm90-cutlass", route="Sm90CutlassCheckpoint"),
    ServingRecord(server=SERVE, target="sm90-cutlass-w4a8", route="Sm90CutlassW4A8Checkpoint"),
    ServingRecord(server=SERVE, target="deepep-bf16", route="DeepEPBf16Checkpoint"),
)
"""Every serving record (``tests/test_vllm_profile.py`` checks the vLLM ``why_not`` of ``deepep-bf16`` and of GPT-OSS
``sm90-marlin`` against vLLM's own functions)."""


def record(server: str, target: str, source_format: str | None = None) -> ServingRecord | None:
    """The record of ``server`` for (``target``, ``source_format``): the one for that source format, else the target's
    (any source format); None if there is neither."""
    found = {(r.target, r.source_format): r for r in RECORDS if r.server == server}
    return found.get((target, source_format)) or found.get((target, None))


def routes(server: str) -> tuple[ServingRecord, ...]:
    """``server``'s served records, in table order."""
    return tuple(r for r in RECORDS if r.server == server and r.served)


def served_targets(server: str) -> list[str]:
    """The targets ``server`` serves from at least one source format, sorted."""
    return sorted({r.target for r in routes(server)})


def source_formats(target: str, source_format: str | None) -> tuple[str, ...]:
    """The source formats a record for (``target``, ``source_format``) covers."""
    return (source_format,) if source_format is not None else target_spec(target).source_formats


NOT_SERVABLE = {
    (r.server, r.target, source): r.why_not for r in RECORDS if r.why_not for source in source_formats(r.target, r.source_format)
}
"""(server, target, source format) -> why that server cannot serve such a bake at all."""


def not_servable_because(server: str, target: str, source_format: str) -> str | None:
    found = record(server, target, source_format)
    return found.why_not if found is not None else None


def unserved(server: str, target: str, source_format: str) -> str:
    """One line: ``server`` serves no ``target`` bake of ``source_format``; why, where a record says, else what it
    serves and why not this (where known)."""
    name, found = SERVERS[server], record(server, target, source_format)
    if found is not None and found.source_format is None and found.why_not:
        return f"target {target!r}: the {name} cannot serve it: {found.why_not}"
    kinds = "; ".join(f"{r.target} bakes of {r.source_format or 'any source format'}" for r in routes(server))
    why = found.why_not if found is not None else None
    return f"target {target!r} of source format {source_format!r}; the {name} serves {kinds}{f' ({why})' if why else ''}"


def route_cell(server: str, target: str) -> str:
    """How the serving-routes table says what ``server`` serves of ``target``: ``yes`` (every source format, by a
    record for the target), the source formats it serves (```gpt-oss```), or ``no``."""
    found = record(server, target)
    if found is not None and found.served:
        return "yes"
    served = sorted(r.source_format for r in routes(server) if r.target == target and r.source_format is not None)
    return ", ".join(f"`{source}`" for source in served) or "no"


def routes_markdown() -> str:
    """docs/serving.md's serving-routes table: one row per target with a record, one column per server."""
    lines = ["| target | " + " | ".join(SERVERS.values()) + " |", "|---|" + "---|" * len(SERVERS)]
    targets = [target for target in TARGET_SPECS if any(r.target == target for r in RECORDS)]
    lines += [f"| `{target}` | " + " | ".join(route_cell(server, target) for server in SERVERS) + " |" for target in targets]
    return "\n".join(lines)
