"""Engine rules and release profiles: what an engine release's load-time code builds for each target x source.

A *rule* (:class:`Rule`) is a named set of load-time facts of one engine, one :class:`TargetProfile` per (target,
source format) it covers; the release matrix (:mod:`moebake.schema.release_matrix`) maps each release's cells to a
rule, and a release's *profile* (:class:`ReleaseProfile`, :func:`release_profile`) is those entries. A cell a release
has no rule for is refused (:func:`refused_because` says why, in words a user can act on).

A bake is "engine-exact" when its expert tensors equal, byte for byte, the parameters the engine
holds after ``process_weights_after_loading`` for the same source. What differs between engines
(and versions of one engine) is recorded here, per (target, source format):

  * ``hidden_multiple`` / ``intermediate_multiple``: H and I are padded up to multiples of these;
  * ``hidden_scale_fill`` / ``intermediate_scale_fill``: the byte left in the block scales' *hidden* /
    *intermediate* padding next to real rows/columns (SGLang 0.5.23 creates its GPT-OSS MXFP4 scale
    buffers filled with 127 = E8M0 2^0 and its loader never writes past the checkpoint's H and I; its
    SM90 post-load step zero-pads I again, its SM100 one keeps the 127s);
  * ``runner_backend`` / ``a2a_backend``: the engine's ``--moe-runner-backend`` /
    ``--moe-a2a-backend`` whose preparation the bytes equal (the serving flags);
  * ``engine_method``: the engine's class that prepares them (the tests run it as the oracle);
  * ``verified``: whether the tests prove the bytes against that class's own code (a profile that
    is not verified is recorded as not engine-exact);
  * ``engine_flags``: further engine flags that select the path the bytes are for (SGLang's Humming W4A8:
    ``--flashinfer-mxfp4-moe-precision fp8``), part of the serving flags;
  * ``parameter_names``: where the engine's parameter names differ from the bake's tensor short names
    (the files keep moebake's names, which ``verify`` and ``moebake.serve`` read), ``(baked, engine)``
    pairs; the engine's plugin maps them.

A bake whose bytes also equal another engine's preparation (e.g. no hidden padding, so SGLang's 127
fill and vLLM's zeros never show) lists that engine in the manifest's ``serves``
(:func:`engines_with_same_bytes`): one bake serves both.

``tests/test_engine_profiles.py`` loops over :data:`RULES` and checks every verified entry
against the engine's own code, run on CPU.
"""

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

from packaging.version import InvalidVersion

from moebake.errors import OptionError, UnsupportedError
from moebake.schema import release_matrix
from moebake.schema.engine_release import EngineRelease
from moebake.schema.manifest import EngineRecord, LayerRecord
from moebake.schema.release_matrix import Cell
from moebake.schema.serving import not_servable_because
from moebake.schema.sizes import round_up


@dataclass(frozen=True)
class TargetProfile:
    """What one engine builds for one (target, source format)."""

    runner_backend: str
    a2a_backend: str
    engine_method: str
    hidden_multiple: int = 128
    intermediate_multiple: int = 128
    hidden_scale_fill: int = 0
    intermediate_scale_fill: int = 0
    verified: bool = True
    parameter_names: tuple[tuple[str, str], ...] = ()
    engine_flags: str = ""


@dataclass(frozen=True)
class Rule:
    """A named set of load-time facts of one engine: for each (target, source format) it covers, the
    :class:`TargetProfile` that engine's code builds. ``first`` is the release it was written for, which names it
    (``sglang-0.5.17``); the release matrix maps each release's cells to rules by that name. A rule holds only the
    entries that differ from every other rule of its engine, so each (cell, entry) has one name."""

    first: EngineRelease
    targets: dict[Cell, TargetProfile]

    @property
    def name(self) -> str:
        return f"{self.first.engine}-{self.first.version}"


@dataclass(frozen=True)
class ReleaseProfile:
    """What one engine release builds: for each (target, source format) proven on it (the release matrix), its rule's
    entry."""

    release: EngineRelease
    targets: dict[Cell, TargetProfile]

    @property
    def engine(self) -> str:
        return self.release.engine

    def target(self, target: str, source_format: str) -> TargetProfile:
        """The profile of (``target``, ``source_format``); without one (a cell this release was never proven on),
        moebake's plain defaults, marked not verified."""
        return self.targets.get((target, source_format), UNPROFILED)


class Padding(NamedTuple):
    """How a bake pads H and I: to multiples of ``hidden_multiple`` / ``intermediate_multiple``; the byte
    left in the block scales' hidden padding and in their intermediate padding (E8M0: 0, or 127 = 2^0
    where the engine fills its scale buffers with it and its post-load step keeps it)."""

    hidden_multiple: int
    intermediate_multiple: int
    hidden_scale_fill: int
    intermediate_scale_fill: int


UNPROFILED = TargetProfile("unknown", "unknown", "unknown", verified=False)
"""What a (target, source) without a profile gets: 128 multiples, zero fill, not engine-exact."""

_SGLANG_MXFP4 = "sglang.srt.layers.quantization.mxfp4.Mxfp4MoEMethod"
_SGLANG_DSV4_SM90 = "sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe.Mxfp4FlashinferCutlassMoEMethod"
_SGLANG_DSV4_SM100 = "sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe.Mxfp4FlashinferTrtllmMoEMethod"
_SGLANG_DSV4_MARLIN = "sglang.srt.layers.quantization.mxfp4_marlin_moe.Mxfp4MarlinMoEMethod"
_SGLANG_NVFP4 = "sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"
_SGLANG_UNQUANT = "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod"

HUMMING_FLAGS = "--flashinfer-mxfp4-moe-precision fp8"
"""SGLang's flag for FlashInfer's SM90 Humming W4A8 path (``sm90-cutlass-w4a8``)."""

SGLANG_0_5_17 = Rule(
    EngineRelease("sglang", "0.5.17"),
    {
        # FusedMoE rounds GPT-OSS's hidden size up to 256 for flashinfer_mxfp4 (2880 -> 3072) before
        # Mxfp4MoEMethod.create_weights; its cutlass_sm90 step pads I to 128 with zeros.
        ("sm90-cutlass", "gpt-oss"): TargetProfile("flashinfer_mxfp4", "none", _SGLANG_MXFP4, hidden_multiple=256, hidden_scale_fill=127),
        # DeepSeek-V4's SM90 method asserts H and I multiples of 128 (no padding).
        ("sm90-cutlass", "deepseek-v4"): TargetProfile("flashinfer_mxfp4", "none", _SGLANG_DSV4_SM90),
        # trtllm_sm100: H rounded up to 256 by FusedMoE (as above), I to 128 by Mxfp4MoEMethod.create_weights, whose
        # scale buffers start at 127 in all their padding; the trtllm-gen row shuffles and scale swizzle keep it.
        ("sm100-trtllm", "gpt-oss"): TargetProfile(
            "flashinfer_mxfp4", "none", _SGLANG_MXFP4, hidden_multiple=256, hidden_scale_fill=127, intermediate_scale_fill=127
        ),
        # Mxfp4FlashinferTrtllmMoEMethod: no padding (H and I multiples of 128 required), the same shuffles.
        ("sm100-trtllm", "deepseek-v4"): TargetProfile("flashinfer_mxfp4", "none", _SGLANG_DSV4_SM100),
        # --moe-runner-backend marlin: Mxfp4MoEMethod.create_weights rounds H up to 256 and I to 128 (scale buffers
        # at 127 in all their padding, weights and biases zero); prepare_moe_mxfp4_layer_for_marlin then takes
        # [gate; up] halves (deinterleave_moe_mxfp4_w13_for_marlin), gptq_marlin_repack and the Marlin scale and bias orders.
        ("sm90-marlin", "gpt-oss"): TargetProfile(
            "marlin", "none", _SGLANG_MXFP4, hidden_multiple=256, hidden_scale_fill=127, intermediate_scale_fill=127
        ),
        # Mxfp4MarlinMoEMethod on SM90: H rounded up to 256 into uninitialised buffers and I padded to 128 by the Marlin
        # preparation (zero scales; 64 from 0.5.22): moebake bakes only H % 256 == 0 and I % 128 == 0 (nothing padded),
        # [w1; w3] kept.
        ("sm90-marlin", "deepseek-v4"): TargetProfile(
            "marlin", "none", _SGLANG_DSV4_MARLIN, hidden_multiple=256, intermediate_multiple=128
        ),
        # --flashinfer-mxfp4-moe-precision fp8 (_use_sm90_humming): the sm90-cutlass padding and [up; gate] stacking, its
        # scale padding filled with each expert's first scale (not 127), then FlashInfer's Humming preprocess.
        ("sm90-cutlass-w4a8", "gpt-oss"): TargetProfile(
            "flashinfer_mxfp4", "none", _SGLANG_MXFP4, hidden_multiple=256, engine_flags=HUMMING_FLAGS
        ),
        ("sm90-cutlass-w4a8", "deepseek-v4"): TargetProfile("flashinfer_mxfp4", "none", _SGLANG_DSV4_SM90, engine_flags=HUMMING_FLAGS),
        # ModelOptNvFp4FusedMoEMethod, flashinfer_cutedsl: its standard ("v2": [up; gate] in 64-row groups, swizzled
        # scales) and DeepEP low-latency ("v1": [gate; up]) post-load steps; NVFP4 is not padded. Exact where each
        # expert's gate and up globals agree, or are kept apart (--gate-up-globals keep: SGLang keeps both, and its
        # CuteDSL kernels apply the gate's to both halves); where moebake shares them (the default),
        # :func:`manifest_engine` records the bake as not exact.
        ("cutedsl", "modelopt-nvfp4"): TargetProfile("flashinfer_cutedsl", "none", _SGLANG_NVFP4, intermediate_multiple=64),
        ("cutedsl-deepep", "modelopt-nvfp4"): TargetProfile("flashinfer_cutedsl", "deepep", _SGLANG_NVFP4, intermediate_multiple=64),
        # SGLang's unquantized DeepEP-LL + DeepGEMM post-load step transforms no weight.
        ("deepep-bf16", "bf16-moe"): TargetProfile("deep_gemm", "deepep", _SGLANG_UNQUANT),
    },
)

SGLANG_0_5_22 = Rule(
    EngineRelease("sglang", "0.5.22"),
    {
        # From 0.5.22, Mxfp4MarlinMoEMethod pads DeepSeek-V4's I to a multiple of 64.
        ("sm90-marlin", "deepseek-v4"): TargetProfile("marlin", "none", _SGLANG_DSV4_MARLIN, hidden_multiple=256, intermediate_multiple=64),
    },
)

_VLLM_GPT_OSS_MXFP4 = "vllm.model_executor.layers.quantization.mxfp4.GptOssMxfp4MoEMethod"
_VLLM_NVFP4 = "vllm.model_executor.layers.quantization.modelopt.ModelOptNvFp4FusedMoE"
_VLLM_MXFP4 = "vllm.model_executor.layers.quantization.mxfp4.Mxfp4MoEMethod"

VLLM_0_30_0 = Rule(
    EngineRelease("vllm", "0.30.0"),
    {
        # --moe-backend flashinfer_cutlass (FLASHINFER_CUTLASS_MXFP4_BF16): H and I rounded up to 128
        # (mxfp4_round_up_hidden_size_and_intermediate_size) for create_weights' zero-filled buffers, then
        # convert_gpt_oss_weight_to_mxfp4_moe_kernel_format: [w3; w1] halves, FlashInfer's SM90 interleave
        # and scale fold. Its RoutedExperts name the biases w13_bias / w2_bias.
        ("sm90-cutlass", "gpt-oss"): TargetProfile(
            "flashinfer_cutlass",
            "none",
            _VLLM_GPT_OSS_MXFP4,
            parameter_names=(("w13_weight_bias", "w13_bias"), ("w2_weight_bias", "w2_bias")),
        ),
        # DeepSeek-V4 (DeepseekV4FP8Config -> the generic Mxfp4MoEMethod), --moe-backend flashinfer_cutlass on SM90
        # (select_deepseek_v4_mxfp4_moe_backend: FLASHINFER_CUTLASS_MXFP4_BF16): H and I rounded up to 128 (zeros; moebake
        # bakes DeepSeek-V4 only at multiples of 128, so nothing is padded), then convert_weight_to_mxfp4_moe_kernel_format:
        # [w3; w1] halves and FlashInfer's SM90 weight interleave and scale fold, the names the bake's. The same bytes as
        # SGLang 0.5.23's Mxfp4FlashinferCutlassMoEMethod: one bake serves both.
        ("sm90-cutlass", "deepseek-v4"): TargetProfile("flashinfer_cutlass", "none", _VLLM_MXFP4),
        # GPT-OSS, --moe-backend flashinfer_trtllm on SM100 (FLASHINFER_TRTLLM_MXFP4_BF16): H rounded up to 256, I to 128
        # (mxfp4_round_up_hidden_size_and_intermediate_size) for create_weights' zero-filled buffers, then
        # convert_gpt_oss_weight_to_mxfp4_moe_kernel_format's TRTLLM branch: [up, gate] row pairs, biases to F32,
        # trtllm-gen row permutations and the 128x4 scale interleave. SGLang 0.5.23's bytes but for the scales' padding
        # (vLLM's zeros, SGLang's 127): one bake serves both where nothing is padded. The bake's gemm1_alpha/beta/
        # clamp_limit are not vLLM parameters (its kernel takes GPT-OSS's hard-coded SwiGLU constants).
        ("sm100-trtllm", "gpt-oss"): TargetProfile(
            "flashinfer_trtllm",
            "none",
            _VLLM_GPT_OSS_MXFP4,
            hidden_multiple=256,
            parameter_names=(("w13_weight_bias", "w13_bias"), ("w2_weight_bias", "w2_bias")),
        ),
        # DeepSeek-V4, --moe-backend flashinfer_trtllm on SM100 (select_deepseek_v4_mxfp4_moe_backend:
        # FLASHINFER_TRTLLM_MXFP4_BF16): mxfp4_round_up_hidden_size_and_intermediate_size rounds H up to 256 and I to 128
        # (moebake does not pad DeepSeek-V4: H must be a multiple of 256, where vLLM pads nothing either), then
        # convert_weight_to_mxfp4_moe_kernel_format's TRTLLM branch: [w3, w1] row pairs, trtllm-gen row permutations and the
        # 128x4 scale interleave, the same bytes as SGLang 0.5.23's Mxfp4FlashinferTrtllmMoEMethod (vLLM views the weights
        # as uint8 where the bake keeps the checkpoint's int8; it holds no gemm1_clamp_limit: its kernel reads the limit).
        ("sm100-trtllm", "deepseek-v4"): TargetProfile("flashinfer_trtllm", "none", _VLLM_MXFP4, hidden_multiple=256),
        # --moe-backend flashinfer_cutedsl (FLASHINFER_CUTEDSL) on Blackwell: prepare_nvfp4_moe_layer_for_flashinfer_cutedsl
        # reorders W13 to [up; gate], pads I to 64 (2I to 128) and H to 256 (zero weights and block scales, for its
        # 256-wide K tiles), interleaves 64-row groups and 128x4-swizzles the block scales: the cutedsl bake's four
        # weight and block-scale tensors, byte for byte. Its four [E] F32 scalars (the gate's weight global; the
        # layer's largest input scale, for every expert) are reduced at load by the vLLM plugin from the bake's
        # (the source's, which SGLang reads), with vLLM's own reduction (EPLB's all-reduce included): with H a
        # multiple of 256 one bake serves both engines.
        # DeepSeek-V4, --moe-backend marlin (Mxfp4MoeBackend.MARLIN): H rounded up to 256 and I to 128
        # (mxfp4_round_up_hidden_size_and_intermediate_size; moebake bakes DeepSeek-V4 only at those multiples, so nothing is
        # padded), then prepare_moe_mxfp4_layer_for_marlin on [w1; w3]: SGLang 0.5.23's bytes wherever I % 128 == 0, so one
        # bake serves both. (GPT-OSS is not profiled: its serving record says why; test_vllm_profile.py proves it on vLLM's own
        # preparation.)
        ("sm90-marlin", "deepseek-v4"): TargetProfile("marlin", "none", _VLLM_MXFP4, hidden_multiple=256),
        # Before 0.32.0, prepare_nvfp4_moe_layer_for_flashinfer_cutedsl padded H to 128 only (VLLM_0_33_0: 256).
        ("cutedsl", "modelopt-nvfp4"): TargetProfile("flashinfer_cutedsl", "none", _VLLM_NVFP4, intermediate_multiple=64),
    },
)

VLLM_0_33_0 = Rule(
    EngineRelease("vllm", "0.33.0"),
    {
        # From 0.32.0, prepare_nvfp4_moe_layer_for_flashinfer_cutedsl pads H to 256 (before: 128).
        ("cutedsl", "modelopt-nvfp4"): TargetProfile(
            "flashinfer_cutedsl", "none", _VLLM_NVFP4, hidden_multiple=256, intermediate_multiple=64
        ),
    },
)

VLLM_0_26_0 = Rule(
    EngineRelease("vllm", "0.26.0"),
    {
        # Before 0.27.0, mxfp4_round_up_hidden_size_and_intermediate_size rounded I up to 256 for the
        # trtllm-gen backends (TRTLLM_BACKENDS; 0.27.0 on: 128), H to 256 as later: GPT-OSS's I 2880 -> 3072 (0.27.0 on:
        # 2944), zeros as later; DeepSeek-V4 (which moebake does not pad) needs I a multiple of 256.
        ("sm100-trtllm", "gpt-oss"): TargetProfile(
            "flashinfer_trtllm",
            "none",
            _VLLM_GPT_OSS_MXFP4,
            hidden_multiple=256,
            intermediate_multiple=256,
            parameter_names=(("w13_weight_bias", "w13_bias"), ("w2_weight_bias", "w2_bias")),
        ),
        ("sm100-trtllm", "deepseek-v4"): TargetProfile(
            "flashinfer_trtllm", "none", _VLLM_MXFP4, hidden_multiple=256, intermediate_multiple=256
        ),
    },
)

RULES = {rule.name: rule for rule in (SGLANG_0_5_17, SGLANG_0_5_22, VLLM_0_26_0, VLLM_0_30_0, VLLM_0_33_0)}
"""Every rule by name (``<engine>-<first release it was written for>``): :mod:`moebake.schema.release_matrix` names,
for each release and (target, source format), the rule whose entry that release's own code was proven to build."""

ENGINES = tuple(release_matrix.MATRIX)
"""The engines the release matrix knows (``--engine`` takes one of them)."""

DEFAULT_ENGINE = "sglang"


def release_profile(release: EngineRelease) -> ReleaseProfile:
    """``release``'s profile: for each (target, source) the matrix proves on it, its rule's entry; none where unproven
    (nor for a release the matrix does not hold)."""
    row = release_matrix.row(release)
    cells = row.cells if row is not None else {}
    return ReleaseProfile(release, {cell: RULES[rule].targets[cell] for cell, rule in cells.items()})


def releases(engine: str) -> list[EngineRelease]:
    """The releases of ``engine`` the matrix holds, oldest first (none for an engine it does not know)."""
    return release_matrix.releases(engine)


def newest(engine: str) -> EngineRelease:
    """``engine``'s newest release in the matrix: what ``--engine ENGINE`` bakes for."""
    return releases(engine)[-1]


def serving_releases(engine: str) -> list[EngineRelease]:
    """The releases of ``engine`` whose own code was proven to build some bake (the install extras' span)."""
    return [release for release in releases(engine) if release_matrix.MATRIX[engine][release.version].cells]


def release_span(engine: str, chosen: Iterable[EngineRelease]) -> str:
    """``chosen`` releases of ``engine`` as runs of the matrix's consecutive releases: ``0.5.17-0.5.18, 0.5.20``."""
    known, chosen = releases(engine), set(chosen)
    runs: list[list[EngineRelease]] = []
    run: list[EngineRelease] = []
    for release in known:
        if release in chosen:
            run.append(release)
        elif run:
            runs.append(run)
            run = []
    runs += [run] if run else []
    runs += [[release] for release in sorted(chosen - set(known), key=lambda r: r.version)]  # one the matrix lacks
    return ", ".join(r[0].version if len(r) == 1 else f"{r[0].version}-{r[-1].version}" for r in runs)


def pinned_flashinfer(release: EngineRelease) -> str | None:
    """The FlashInfer release ``release`` pins (its SM90 fp4 layout is what that release's servers read)."""
    row = release_matrix.row(release)
    return row.flashinfer if row is not None else None


def pinned_layout(release: EngineRelease) -> str | None:
    """The SM90 fp4 layout (``v1``/``v2``) that ``release``'s pinned FlashInfer reads, or None."""
    row = release_matrix.row(release)
    return row.flashinfer_layout if row is not None else None


RELEASE_GAPS: dict[tuple[str, ...], tuple[EngineRelease, str]] = {
    ("sglang", "sm90-cutlass-w4a8"): (
        EngineRelease("sglang", "0.5.19"),
        (
            "SGLang before 0.5.19 has no FlashInfer Humming W4A8 path: its pinned FlashInfer (0.6.15.post1, 0.6.17) has no "
            "preprocess_moe_weights_for_sm90_mixed_gemm_humming and its Mxfp4MoEMethod no _use_sm90_humming"
        ),
    ),
    ("vllm", "sm90-cutlass", "deepseek-v4"): (
        EngineRelease("vllm", "0.28.0"),
        (
            "vLLM before 0.28.0 has no FlashInfer CUTLASS path for DeepSeek-V4's generic Mxfp4MoEMethod: "
            "select_deepseek_v4_mxfp4_moe_backend picks FLASHINFER_CUTLASS_MXFP4_BF16 on SM90, but "
            'convert_weight_to_mxfp4_moe_kernel_format has no branch for it and raises ValueError ("Unsupported mxfp4_backend '
            'for Mxfp4MoEMethod")'
        ),
    ),
}
"""(engine, target) or (engine, target, source format) -> (first release with the path, why releases before it cannot
serve such a bake): what a release lacks, from its code; the release matrix run confirms each (those releases' oracle
runs fail on exactly this)."""

UNPROVEN = "not proven: moebake could not run this release's own load-time code for these bytes"
"""Why a release is refused a cell that other releases of its engine were proven on (the oracle run's own words stay
in ``tests/engine_releases/unproven.json``)."""


def refused_because(release: EngineRelease, target: str, source_format: str, *, name_others: bool = True) -> str:
    """Why ``release`` cannot serve (``target``, ``source_format``) bakes, in words a user can act on: the engine's
    missing path, the release's, or that its own code was not proven to build them (with ``name_others``, naming the
    releases that were)."""
    if why := not_servable_because(release.engine, target, source_format):
        return why
    gap = RELEASE_GAPS.get((release.engine, target, source_format)) or RELEASE_GAPS.get((release.engine, target))
    if gap is not None and release < gap[0]:
        return gap[1]
    proven = [r for r in releases(release.engine) if release_profile(r).target(target, source_format).verified]
    if not proven:
        return "no verified profile"
    return f"{UNPROVEN}; {release.engine} {release_span(release.engine, proven)} can" if name_others else UNPROVEN


def serving_flags(engine: EngineRecord) -> str | None:
    """The command-line flags that start ``engine``'s record's engine on the path its bytes are for (with moebake's plugin);
    None when the engine has no profiled path for the bake's target and source (no flags serve it)."""
    if engine.runner_backend == UNPROFILED.runner_backend:
        return None
    if engine.name == "vllm":
        return f"--quantization moebake --load-format moebake --moe-backend {engine.runner_backend}"
    flags = f"--quantization moebake --moe-runner-backend {engine.runner_backend}"
    flags += f" --moe-a2a-backend {engine.a2a_backend}" if engine.a2a_backend != "none" else ""
    return flags + (f" {engine.engine_flags}" if engine.engine_flags else "")


def parse_engine(spec: str) -> EngineRelease:
    """``sglang`` or ``sglang==0.5.20`` -> the release (``sglang``: the newest proven one); OptionError for an engine
    or release the matrix does not hold. The one place an ``--engine`` text becomes a release."""
    engine, _, version = spec.partition("==")
    if engine not in ENGINES:
        raise OptionError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)} (optionally ==RELEASE)")
    known = releases(engine)
    if not version:
        return known[-1]
    release = EngineRelease(engine, version)
    if release not in known:
        try:
            newer = all(release > r for r in known)
        except InvalidVersion:
            newer = False
        why = "newer than any release moebake has proven" if newer else "not a release moebake has proven"
        raise OptionError(
            f"--engine {spec}: {engine} {version} is {why}; proven: {', '.join(r.version for r in known)} "
            f"(docs/contributing.md says how to prove a new release)"
        )
    return release


ALLOW_INEXACT = "--allow-inexact"
"""The ``convert`` flag that bakes a (target, source) the chosen engine cannot serve exactly anyway."""


def check_servable(profile: ReleaseProfile, target: str, source_format: str, asked: str) -> None:
    """UnsupportedError (one line, naming the engines that can) unless ``profile`` has a verified entry for
    (``target``, ``source_format``): a bake for it would not be that release's bytes, and its plugin would refuse it.
    ``asked`` is the ``--engine`` value as given, which the message quotes. ``convert`` calls this unless asked for an
    inexact bake (:data:`ALLOW_INEXACT`); other reasons a bake is not engine-exact (padding overridden to other sizes,
    shared gate/up globals) are the user's explicit choice, not refused."""
    if profile.target(target, source_format).verified:
        return
    proven = {name: [r for r in releases(name) if release_profile(r).target(target, source_format).verified] for name in ENGINES}
    can = "; ".join(f"{name} {release_span(name, rs)} can (--engine {name}==RELEASE)" for name, rs in proven.items() if rs)
    can = f"; {can}" if can else "; no engine release moebake knows can"
    why = refused_because(profile.release, target, source_format, name_others=False)
    raise UnsupportedError(
        f"--engine {asked}: {profile.release} cannot serve {target} bakes of {source_format} "
        f"checkpoints exactly ({why}){can}; pass {ALLOW_INEXACT} to bake it anyway, "
        "recorded as NOT engine-exact"
    )


SHARED_GLOBALS = "gate and up global scales shared"
"""How a ``not_exact_because`` starts when moebake shared differing NVFP4 gate/up globals (``--gate-up-globals keep`` avoids it)."""


def padded_as_profiled(entry: TargetProfile, padding: Padding, layers: list[LayerRecord]) -> bool:
    """Whether ``padding``'s multiples give every one of ``layers`` the padded sizes ``entry``'s multiples give (the
    same bytes): an overridden multiple that pads to the same sizes (GPT-OSS's H 2880 pads to 3072 at 256 and at 512)
    changes nothing."""

    def padded(hidden: int, intermediate: int, multiples: tuple[int, int]) -> tuple[int, int]:
        return round_up(hidden, multiples[0]), round_up(intermediate, multiples[1])

    ours = (padding.hidden_multiple, padding.intermediate_multiple)
    theirs = (entry.hidden_multiple, entry.intermediate_multiple)
    return all(padded(layer.hidden, layer.intermediate, ours) == padded(layer.hidden, layer.intermediate, theirs) for layer in layers)


def manifest_engine(
    profile: ReleaseProfile, target: str, source_format: str, padding: Padding, flashinfer_layout: str | None, layers: list[LayerRecord]
) -> EngineRecord:
    """The manifest's ``engine`` record of a conversion for ``profile``'s release with ``padding`` and its planned
    ``layers``: name, release, the profile, whether the bake is engine-exact (a verified profile's bytes), and every
    release whose own code was proven to build the same bytes (:func:`proven_releases`).
    Not exact: padding multiples overridden to other padded sizes, or NVFP4 experts whose gate and up
    global scales moebake shared (the engine keeps them apart)."""
    entry = profile.target(target, source_format)
    overridden = not padded_as_profiled(entry, padding, layers)
    shared = sum((layer.gate_up_global_scale or {}).get("experts_rescaled", 0) for layer in layers)
    reason = (
        ("padding multiples overridden" if overridden else None)
        or (
            None
            if entry.verified
            else "no profile of this engine for this target and source"
            if entry is UNPROFILED
            else "profile not verified against the engine's code"
        )
        or (
            f"{SHARED_GLOBALS} in {shared} experts ({profile.release} keeps both and applies the gate's to both halves)" if shared else None
        )
    )
    same = () if reason else proven_releases(profile.engine, target, source_format, entry, flashinfer_layout)
    return replace(_engine_record(profile.release, entry, reason), releases=tuple(same))


def proven_releases(
    engine: str, target: str, source_format: str, entry: TargetProfile, flashinfer_layout: str | None
) -> list[EngineRelease]:
    """The releases of ``engine`` whose own code was proven to build ``entry``'s bytes for (``target``,
    ``source_format``): the same entry in the release matrix and, for targets in FlashInfer's SM90 fp4 layout
    (``flashinfer_layout`` not None), a pinned FlashInfer that reads it."""
    out = []
    for release in releases(engine):
        if release_profile(release).targets.get((target, source_format)) != entry:
            continue
        if flashinfer_layout is not None and pinned_layout(release) != flashinfer_layout:
            continue
        out.append(release)
    return out


def release_for_layout(release: EngineRelease, named: bool, target: str, layout: str) -> EngineRelease:
    """The release to bake ``target`` for in FlashInfer SM90 layout ``layout``, from ``release`` (``named``: the user
    named it, else it is the newest): unchanged where the target does not use the layout or the release's pinned
    FlashInfer reads it; for an unnamed release, the newest release whose pinned FlashInfer reads it; a named release
    whose FlashInfer reads another layout is an OptionError naming the releases that read ``layout``."""
    from moebake.schema.targets import target_spec

    try:
        uses_layout = target_spec(target).uses_flashinfer_layout
    except UnsupportedError:
        return release  # an unknown target: refused where targets are checked
    if not uses_layout or pinned_layout(release) in (None, layout):
        return release
    name = release.engine
    reading = [r for r in releases(name) if pinned_layout(r) == layout]
    if named or not reading:
        where = (
            f"{name} {release_span(name, reading)} pin a FlashInfer that reads it"
            if reading
            else f"no {name} release moebake has proven pins a FlashInfer that reads it"
        )
        raise OptionError(
            f"--flashinfer-layout {layout}: {release} pins FlashInfer {pinned_flashinfer(release)}, "
            f"which reads {pinned_layout(release)}; {where} (--engine {name}==RELEASE)"
        )
    return reading[-1]


def _engine_record(release: EngineRelease, entry: TargetProfile, not_exact_because: str | None) -> EngineRecord:
    return EngineRecord(
        name=release.engine,
        version=release.version,
        runner_backend=entry.runner_backend,
        a2a_backend=entry.a2a_backend,
        engine_method=entry.engine_method,
        hidden_multiple=entry.hidden_multiple,
        intermediate_multiple=entry.intermediate_multiple,
        hidden_scale_fill=entry.hidden_scale_fill,
        verified=entry.verified,
        parameter_names=dict(entry.parameter_names),
        exact=not_exact_because is None,
        not_exact_because=not_exact_because,
        intermediate_scale_fill=entry.intermediate_scale_fill,
        engine_flags=entry.engine_flags,
    )


def engines_with_same_bytes(
    profile: ReleaseProfile,
    target: str,
    source_format: str,
    padding: Padding,
    flashinfer_layout: str | None,
    hidden: int,
    intermediate: int,
) -> list[EngineRecord]:
    """The manifest's ``serves``: the other engines whose verified preparation of this model (hidden
    size ``hidden``, expert intermediate size ``intermediate``) gives this engine-exact bake's bytes (padded with
    ``padding``): the same padded sizes, and the same scale fill wherever H is padded. One ``engine`` record per
    engine, of its newest such release, listing every release whose own rule gives these bytes (an older rule may pad
    to other multiples that come to the same sizes for this model)."""
    if not profile.target(target, source_format).verified:
        return []
    padded = (round_up(hidden, padding.hidden_multiple), round_up(intermediate, padding.intermediate_multiple))

    def same_bytes(entry: TargetProfile | None) -> bool:
        if entry is None or not entry.verified:
            return False
        theirs = (round_up(hidden, entry.hidden_multiple), round_up(intermediate, entry.intermediate_multiple))
        return (
            theirs == padded
            and (entry.hidden_scale_fill == padding.hidden_scale_fill or padded[0] == hidden)
            and (entry.intermediate_scale_fill == padding.intermediate_scale_fill or padded[1] == intermediate)
        )

    served = []
    for name in ENGINES:
        if name == profile.engine:
            continue
        entries = {release_profile(release).targets.get((target, source_format)) for release in releases(name)}
        proven = {
            release
            for entry in entries
            if entry is not None and same_bytes(entry)
            for release in proven_releases(name, target, source_format, entry, flashinfer_layout)
        }
        same = [release for release in releases(name) if release in proven]
        if same:
            entry = release_profile(same[-1]).targets[(target, source_format)]
            served.append(replace(_engine_record(same[-1], entry, None), releases=tuple(same)))
    return served
