"""What moebake's reduced FlashInfer SM90 fused-MoE module compiles: its paths and the sources written for them.

A path (:class:`MixedInputPath`) is one mixed-input MoE GEMM family of FlashInfer's CUTLASS backend: the launcher's
template operands and scale mode, as FlashInfer's kernel generator writes them, the runner types the binding builds,
the binding constructor's branch, and the tile configurations compiled by default. A :class:`SourceRevision` says
which paths, and which launcher templates, one span of FlashInfer releases has (:data:`REVISIONS`).
:func:`write_reduced_sources` writes, for one revision's paths, the reduced binding, the runner instantiations, one
file per selected GEMM configuration and one of throwing stubs for every other instantiation the dispatchers
reference. How the module is built, loaded and checked: :mod:`moebake.serve.jit.flashinfer_build`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from moebake.errors import InvalidArgumentError, PlatformError

SCHEDULES = {
    "pingpong": "Pingpong",
    "cooperative": "Cooperative",
    "singlewarpgroupprefill": "SingleWarpgroupPrefill",
    "singlewarpgrouprolling": "SingleWarpgroupRolling",
}
"""Mainloop schedules of a configuration, as spelled in ``TILE/CLUSTER/SCHEDULE`` (case-insensitive). The
single-warpgroup ones are the Humming path's small-K kernels (``sm90_generic_mixed_moe_small_k_kernelLauncher``)."""


@dataclasses.dataclass(frozen=True)
class MixedInputPath:
    """One SM90 mixed-input MoE path of FlashInfer compiled into the reduced module.

    ``operands`` are the GEMM launcher's first three template arguments (activation, weight, GEMM output) as
    FlashInfer's kernel generator writes them; ``scale_mode`` its ``MixedInputScaleMode`` argument (``None``: left
    at the default, ``kPostMma``, and not written). ``runner`` is the ``CutlassMoeFCRunner`` the binding builds
    for the path, ``gemm_runner`` the ``MoeGemmRunner`` it calls, ``branch`` the binding constructor's branch
    (``{runner}`` stands for the runner type).
    """

    name: str
    operands: str
    scale_mode: str | None
    runner: str
    gemm_runner: str
    branch: str
    default_configs: tuple[tuple[str, str, str], ...]

    @property
    def configs_env(self) -> str:
        """Environment variable overriding the compiled GEMM configurations of this path, e.g.
        ``MOEBAKE_FLASHINFER_W4A16_CONFIGS="64x16x128/1x1x1/Pingpong,128x64x256/1x1x1/Cooperative"``."""
        return f"MOEBAKE_FLASHINFER_{self.name.upper()}_CONFIGS"


W4A16 = MixedInputPath(
    name="w4a16",
    operands="__nv_bfloat16, SafeFP4, __nv_bfloat16",
    scale_mode=None,
    runner="CutlassMoeFCRunner<__nv_bfloat16, Fp4Type>",
    gemm_runner="MoeGemmRunner<__nv_bfloat16, Fp4Type, __nv_bfloat16>",
    branch="""    if (isWFP4A16Quant()) {
      TVM_FFI_ICHECK_EQ(mActivationDtype, dl_bfloat16)
          << "SM90 MXFP4 W4A16 supports BF16 activations only; FP16 is incompatible with the "
             "interleaved weight layout.";
      mInnerDimMultiplier = 2;
      mKernelRunner = std::make_shared<kernels::{runner}>();
    }
""",
    default_configs=(
        ("64x16x128", "1x1x1", "Pingpong"),  # FlashInfer's first (= untuned default) tactic
        ("128x64x256", "1x1x1", "Cooperative"),  # used by calcMaxWorkspaceSize for FP4 weights
        ("128x16x128", "1x1x1", "Cooperative"),  # decode-sized token tiles, for autotuning
        ("128x128x128", "1x1x1", "Cooperative"),  # prefill-sized token tiles, for autotuning
    ),
)
"""BF16 activations x MXFP4 weights (``use_w4_group_scaling=True``): the ``sm90-cutlass`` target (FlashInfer
0.7.2's spelling of the FP4 weight type, ``SafeFP4`` / ``Fp4Type``)."""

W4A16_E2M1 = MixedInputPath(
    name="w4a16",
    operands="__nv_bfloat16, __nv_fp4_e2m1, __nv_bfloat16",
    scale_mode=None,
    runner="CutlassMoeFCRunner<__nv_bfloat16, __nv_fp4_e2m1>",
    gemm_runner="MoeGemmRunner<__nv_bfloat16, __nv_fp4_e2m1, __nv_bfloat16>",
    branch="""    if (isWFP4A16Quant()) {
      TVM_FFI_ICHECK_EQ(mActivationDtype, dl_bfloat16)
          << "moebake reduced module: SM90 MXFP4 W4A16 is compiled for BF16 activations only";
      mInnerDimMultiplier = 2;
      mKernelRunner = std::make_shared<kernels::{runner}>();
    }
""",
    default_configs=(
        ("64x16x128", "1x1x1", "Pingpong"),  # FlashInfer's first (= untuned default) tactic
        ("128x64x256", "1x1x1", "Cooperative"),  # used by calcMaxWorkspaceSize for FP4 weights
        ("128x16x128", "1x1x1", "Cooperative"),  # decode-sized token tiles, for autotuning
    ),
)
"""The same W4A16 path in FlashInfer 0.6.14 (vLLM 0.26.0's pin) and 0.6.15.post1 (SGLang 0.5.17's), where the FP4
weight type is CUDA's ``__nv_fp4_e2m1``; those releases have no 128x128x128 cooperative mixed-input tile and no Humming
path."""

W4A8_HUMMING = MixedInputPath(
    name="w4a8",
    operands="__nv_fp8_e4m3, SafeFP4, __nv_bfloat16",
    scale_mode="kPreMmaE8M0",
    runner=(
        "CutlassMoeFCRunner<__nv_fp8_e4m3, Fp4Type, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, false, "
        "Sm90Wfp4Afp8ScaleMode::kHummingPreMmaE8M0>"
    ),
    gemm_runner=("MoeGemmRunner<__nv_fp8_e4m3, Fp4Type, __nv_bfloat16, __nv_bfloat16, false, Sm90Wfp4Afp8ScaleMode::kHummingPreMmaE8M0>"),
    branch="""    if (isWMxfp4AFp8HummingQuant()) {
      TVM_FFI_ICHECK_EQ(common::getSMVersion(), 90) << "Humming-style MXFP4 x FP8 is only supported on SM90.";
      TVM_FFI_ICHECK(mActivationDtype == dl_bfloat16 && mOutputDtype == dl_bfloat16)
          << "moebake reduced module: Humming MXFP4 x FP8 is compiled for BF16 activations and BF16 output only";
      mInnerDimMultiplier = 2;
      mSm90Wfp4Afp8Mode = kernels::Sm90Wfp4Afp8ScaleMode::kHummingPreMmaE8M0;
      mKernelRunner = std::make_shared<kernels::{runner}>();
    }
""",
    default_configs=(
        ("64x16x128", "1x1x1", "Pingpong"),  # FlashInfer's first (= untuned default) tactic
        ("128x64x256", "1x1x1", "Cooperative"),  # used by calcMaxWorkspaceSize for FP4 weights
        ("128x16x128", "1x1x1", "SingleWarpgroupRolling"),  # Humming's small-K decode kernel (K > 384)
        ("128x16x128", "1x1x1", "Cooperative"),  # decode-sized token tiles, for autotuning
        ("128x128x128", "1x1x1", "Cooperative"),  # prefill-sized token tiles, for autotuning
    ),
)
"""FP8 activations (quantized online from BF16) x MXFP4 weights with Humming's pre-MMA E8M0 scales
(``use_wfp4afp8_humming=True``): the ``sm90-cutlass-w4a8`` target."""

PATHS = (W4A16, W4A8_HUMMING)
"""The paths the reduced module compiles for the newest FlashInfer, in the binding constructor's order."""

Config = tuple[str, str, str]
"""(tile MxNxK, cluster, mainloop schedule) of one grouped GEMM. The mixed-input GEMM runs with swapped
operands: M tiles the expert weight rows, N the tokens."""

_INSTANTIATION_RE = re.compile(
    r"template\s+void\s+(?P<launcher>sm90_generic_mixed_moe_(?:gemm|small_k)_kernelLauncher)\s*"
    r"<(?P<args>.*?)>\s*\((?P<params>.*?)\)\s*;",
    re.S,
)
_CONFIG_RE = re.compile(
    r"cute::Shape<cute::Int<(\d+)>,\s*cute::Int<(\d+)>,\s*cute::Int<(\d+)>>,\s*"
    r"cute::Shape<cute::Int<(\d+)>,\s*cute::Int<(\d+)>,\s*cute::Int<(\d+)>>,\s*"
    r"cutlass::gemm::KernelTmaWarpSpecialized(\w+),"
)
_SMALL_K_RE = re.compile(r"MainloopScheduleType::SINGLE_WARPGROUP_(PREFILL|ROLLING)$")

_BINDING = "fused_moe/cutlass_backend/flashinfer_cutlass_fused_moe_binding.cu"
_CTOR_BEGIN = "    // keep consistent with cpp/tensorrt_llm/plugins/mixtureOfExperts/mixtureOfExpertsPlugin.cpp\n"
_CTOR_END = "    if (!mKernelRunner) {\n"
_RELATIVE_INCLUDE = '#include "../../tvm_ffi_utils.h"'
_ERROR_TEXT = '"Could not construct fused moe op with the requested input combination Activation: "'
_ERROR_REDUCED = (
    '"Could not construct fused moe op (moebake reduced module {module}: only MXFP4 uint8 weights with '
    "use_w4_group_scaling=True and BF16 activations, as W4A16 or as Humming "
    'W4A8 (use_wfp4afp8_humming=True), are compiled) with the requested input combination Activation: "'
)

_RUNNERS_CU = """// Generated by moebake.serve.jit.flashinfer_paths: the MoE runners of the reduced module's paths only.
#include "fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh"
#include "moe_kernels.h"

namespace tensorrt_llm::kernels::cutlass_kernels {{
{runners}
INSTANTIATE_FINALIZE_MOE_ROUTING(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16);
}}  // namespace tensorrt_llm::kernels::cutlass_kernels
"""

_GEMM_RUNNER_CU = """// Generated by moebake.serve.jit.flashinfer_paths: the grouped-GEMM runner of the {path} path.
#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_template_dispatch.h"

namespace tensorrt_llm::kernels::cutlass_kernels {{
template class {gemm_runner};
}}  // namespace tensorrt_llm::kernels::cutlass_kernels
"""

_KERNEL_CU = """// Generated by moebake.serve.jit.flashinfer_paths: one {path} grouped-GEMM configuration,
// {config}, copied from FlashInfer's generated {origin}.
#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_mixed_input_launcher.inl"
namespace tensorrt_llm {{
namespace kernels {{
namespace cutlass_kernels_oss {{
{statement}
}}  // namespace cutlass_kernels_oss
}}  // namespace kernels
}}  // namespace tensorrt_llm
"""

_STUB_CU = """// Generated by moebake.serve.jit.flashinfer_paths: the grouped-GEMM configurations of the compiled paths
// that the dispatchers reference but the reduced module does not compile. Each throws when selected.
#include <string>

#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass_extensions/epilogue_helpers.h"
#include "tensorrt_llm/common/assert.h"
#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_mixed_input_launcher.h"

namespace tensorrt_llm {{
namespace kernels {{
namespace cutlass_kernels_oss {{
{prelude}
template <typename CTAShape, typename ClusterShape>
[[noreturn]] void moebake_not_compiled(char const* schedule) {{
  std::string const config = std::to_string(cute::size<0>(CTAShape{{}})) + "x" +
                             std::to_string(cute::size<1>(CTAShape{{}})) + "x" +
                             std::to_string(cute::size<2>(CTAShape{{}})) + " cluster " +
                             std::to_string(cute::size<0>(ClusterShape{{}})) + "x" +
                             std::to_string(cute::size<1>(ClusterShape{{}})) + "x" +
                             std::to_string(cute::size<2>(ClusterShape{{}}));
  TLLM_THROW("SM90 mixed-input MoE GEMM tile %s (%s) is not compiled in the moebake reduced module "
             "{module}; rebuild it with this configuration ({envs}) or pick another tactic.",
             config.c_str(), schedule);
}}
{launchers}
{statements}
}}  // namespace cutlass_kernels_oss
}}  // namespace kernels
}}  // namespace tensorrt_llm
"""

_GEMM_LAUNCHER_BODY = """    GroupedGemmInput<T, WeightType, GemmOutputType, GemmOutputType> inputs,
    TmaWarpSpecializedGroupedGemmInput hopper_inputs, int sm_count_, size_t* workspace_size) {
  moebake_not_compiled<CTAShape, ClusterShape>(
      std::is_same_v<MainloopScheduleType, cutlass::gemm::KernelTmaWarpSpecializedCooperative>
          ? "Cooperative" : "Pingpong");
}
"""

_LAUNCHER_STUBS_SCALE_MODE = (
    """
template <typename T, typename WeightType, typename GemmOutputType, typename EpilogueTag,
          typename CTAShape, typename ClusterShape, typename MainloopScheduleType,
          typename EpilogueScheduleType, cutlass::WeightOnlyQuantOp QuantOp,
          cutlass::gemm::collective::MixedInputScaleMode ScaleMode>
void sm90_generic_mixed_moe_gemm_kernelLauncher(
"""
    + _GEMM_LAUNCHER_BODY
    + """
template <typename T, typename WeightType, typename GemmOutputType, typename EpilogueTag,
          typename CTAShape, typename ClusterShape, typename MainloopScheduleType,
          typename EpilogueScheduleType, cutlass::WeightOnlyQuantOp QuantOp,
          cutlass::gemm::collective::MixedInputScaleMode ScaleMode,
          tensorrt_llm::cutlass_extensions::MainloopScheduleType KernelType>
void sm90_generic_mixed_moe_small_k_kernelLauncher(
    GroupedGemmInput<T, WeightType, GemmOutputType, GemmOutputType> inputs,
    TmaWarpSpecializedGroupedGemmInput hopper_inputs, int sm_count_, size_t* workspace_size) {
  moebake_not_compiled<CTAShape, ClusterShape>(
      KernelType == tensorrt_llm::cutlass_extensions::MainloopScheduleType::SINGLE_WARPGROUP_PREFILL
          ? "SingleWarpgroupPrefill" : "SingleWarpgroupRolling");
}
"""
)
"""The launcher templates of FlashInfer 0.7.2 (a ``MixedInputScaleMode`` parameter; the small-K launcher)."""

_LAUNCHER_STUBS_PLAIN = (
    """
template <typename T, typename WeightType, typename GemmOutputType, typename EpilogueTag,
          typename CTAShape, typename ClusterShape, typename MainloopScheduleType,
          typename EpilogueScheduleType, cutlass::WeightOnlyQuantOp QuantOp>
void sm90_generic_mixed_moe_gemm_kernelLauncher(
"""
    + _GEMM_LAUNCHER_BODY
)
"""The launcher template of FlashInfer 0.6.14 and 0.6.15 (no scale-mode parameter, no small-K launcher)."""


@dataclasses.dataclass(frozen=True)
class SourceRevision:
    """What the reduced module's sources depend on in some FlashInfer releases.

    ``paths`` are compiled in the binding constructor's order; ``stub_prelude`` is C++ the generated launcher
    statements need in ``cutlass_kernels_oss`` (a type alias), ``stub_launchers`` the throwing definitions of the
    release's launcher templates, with the release's template parameters. ``stock_sources`` are more of FlashInfer's own
    sources (relative to its ``csrc``) that the release's runners link against.
    """

    releases: tuple[str, ...]
    paths: tuple[MixedInputPath, ...]
    stub_prelude: str
    stub_launchers: str
    stock_sources: tuple[str, ...] = ()


REVISIONS = (
    SourceRevision(
        ("0.7.2.post1",), PATHS, "using SafeFP4 = tensorrt_llm::kernels::cutlass_kernels::Fp4Type;\n", _LAUNCHER_STUBS_SCALE_MODE
    ),
    # 0.6.14's and 0.6.15's MoE runner constructs a DeepSeek FP8 block-scale GEMM runner whatever its types: its code
    # links into every runner. The two releases' generator, launcher header and binding anchors are the same.
    SourceRevision(
        ("0.6.15.post1", "0.6.14"),
        (W4A16_E2M1,),
        "",
        _LAUNCHER_STUBS_PLAIN,
        ("nv_internal/tensorrt_llm/kernels/cutlass_kernels/fp8_blockscale_gemm/fp8_blockscale_gemm.cu",),
    ),
)
"""Every FlashInfer release the reduced module's sources are written for, newest first."""


def revision_for(flashinfer_version: str, *, any_version: bool = False) -> SourceRevision:
    """The :class:`SourceRevision` of a FlashInfer release; with ``any_version``, the newest for an unknown one."""
    for revision in REVISIONS:
        if flashinfer_version in revision.releases:
            return revision
    if any_version:
        return REVISIONS[0]
    known = [release for revision in REVISIONS for release in revision.releases]
    raise PlatformError(
        f"moebake's reduced FlashInfer MoE module is written for FlashInfer {', '.join(known)}, "
        f"found {flashinfer_version}; install one of those, or set MOEBAKE_FLASHINFER_ANY_VERSION=1 "
        "to try the newest one's sources anyway"
    )


def _config(parts: Sequence, where: str) -> Config:
    """``(tile, cluster, schedule)`` with the schedule spelled as in :data:`SCHEDULES`; ``where`` names it in the error."""
    tile, cluster, schedule = (str(part).strip() for part in parts)
    if schedule.lower() not in SCHEDULES:
        raise InvalidArgumentError(f"unknown mainloop schedule {schedule!r} in {where!r}; expected one of {sorted(SCHEDULES.values())}")
    return tile, cluster, SCHEDULES[schedule.lower()]


def parse_configs(text: str) -> tuple[Config, ...]:
    """``"64x16x128/1x1x1/Pingpong,128x16x128/1x1x1/SingleWarpgroupRolling"`` -> config tuples."""
    return tuple(_config(item.strip().split("/"), item) for item in text.split(","))


ConfigChoice = dict[str, Iterable[Sequence[str]]] | None
"""Compiled configurations per path name (``{"w4a16": [...], "w4a8": [...]}``); a path left out, or ``None``,
takes its ``configs_env`` variable or else its defaults."""


def selected_configs(configs: ConfigChoice = None, paths: Sequence[MixedInputPath] = PATHS) -> dict[str, tuple[Config, ...]]:
    """The configurations compiled for each of ``paths`` (see :data:`ConfigChoice`)."""
    chosen = {}
    for path in paths:
        given = (configs or {}).get(path.name)
        if given is not None:
            chosen[path.name] = tuple(_config(c, "/".join(map(str, c))) for c in given)
        elif os.environ.get(path.configs_env):
            chosen[path.name] = parse_configs(os.environ[path.configs_env])
        else:
            chosen[path.name] = path.default_configs
    return chosen


def _write_if_different(path: Path, text: str) -> None:
    """Keep mtimes stable so that ninja does not rebuild unchanged sources."""
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _belongs_to(path: MixedInputPath, args: str) -> bool:
    if not args.startswith(path.operands + ","):
        return False
    if path.scale_mode is None:
        return "MixedInputScaleMode" not in args
    return f"MixedInputScaleMode::{path.scale_mode}," in args + ","


def launcher_instantiations(generated_dir: Path, path: MixedInputPath) -> dict[Config, tuple[str, str]]:
    """All of ``path``'s grouped-GEMM launcher instantiations in FlashInfer's generated kernel files.

    Returns ``{(tile, cluster, schedule): (statement, file name)}``; the statement is the explicit
    instantiation text exactly as FlashInfer's generator wrote it.
    """
    found: dict[Config, tuple[str, str]] = {}
    for source in sorted(Path(generated_dir).rglob("*.generated.cu")):
        text = source.read_text()
        if "sm90_generic_mixed_moe_" not in text:
            continue
        for match in _INSTANTIATION_RE.finditer(text):
            args = " ".join(match.group("args").split())
            if not _belongs_to(path, args):
                continue
            m = _CONFIG_RE.search(args)
            if m is None:
                raise PlatformError(f"unrecognised instantiation in {source.name}: {args[:200]}")
            schedule = m.group(7)
            if match.group("launcher") == "sm90_generic_mixed_moe_small_k_kernelLauncher":
                small_k = _SMALL_K_RE.search(args)
                if small_k is None:
                    raise PlatformError(f"unrecognised small-K instantiation in {source.name}: {args[:200]}")
                schedule = SCHEDULES["singlewarpgroup" + small_k.group(1).lower()]
            key = ("x".join(m.group(1, 2, 3)), "x".join(m.group(4, 5, 6)), schedule)
            found[key] = (match.group(0), source.name)
    return found


def _in_kernels(runner: str) -> str:
    """``runner`` as written in the binding, outside ``tensorrt_llm::kernels::cutlass_kernels``."""
    return runner.replace("Fp4Type", "kernels::Fp4Type").replace("Sm90Wfp4Afp8ScaleMode::", "kernels::Sm90Wfp4Afp8ScaleMode::")


def reduced_binding_source(csrc_dir: Path, module_name: str, paths: Sequence[MixedInputPath] = PATHS) -> str:
    """FlashInfer's fused-MoE binding with the runner constructor reduced to the branches of ``paths``."""
    text = (Path(csrc_dir) / _BINDING).read_text()
    for anchor in (_CTOR_BEGIN, _CTOR_END, _RELATIVE_INCLUDE, _ERROR_TEXT):
        if text.count(anchor) != 1:
            raise PlatformError(f"FlashInfer binding changed: anchor {anchor.strip()!r} not found exactly once")
    branches = "".join(path.branch.replace("{runner}", _in_kernels(path.runner)) for path in paths)
    reduced = (
        "    // moebake reduced module: only the runners of "
        + ", ".join(p.name for p in paths)
        + " are compiled in.\n#if defined(ENABLE_FP4) && defined(ENABLE_BF16) && defined(ENABLE_FP8)\n"
        + branches
        + "#endif\n"
    )
    begin = text.index(_CTOR_BEGIN)
    end = text.index(_CTOR_END, begin)
    text = text[:begin] + reduced + text[end:]
    text = text.replace(_RELATIVE_INCLUDE, '#include "tvm_ffi_utils.h"')
    return text.replace(_ERROR_TEXT, _ERROR_REDUCED.format(module=module_name))


def write_reduced_sources(
    out_dir: Path, csrc: Path, generated: Path, module_name: str, configs: ConfigChoice = None, revision: SourceRevision = REVISIONS[0]
) -> list[Path]:
    """Write the reduced module's own sources into ``out_dir`` and return their paths: the reduced binding (from
    FlashInfer's ``csrc``), the runners, and per path of ``revision`` its ``MoeGemmRunner``, one file per selected
    GEMM configuration (the instantiation FlashInfer's generator wrote into ``generated``) and the stubs of all the
    others."""
    paths = revision.paths
    selected = selected_configs(configs, paths)
    binding = out_dir / "moebake_binding.cu"
    _write_if_different(binding, reduced_binding_source(csrc, module_name, paths))
    runners = out_dir / "moebake_runners.cu"
    _write_if_different(runners, _RUNNERS_CU.format(runners="\n".join(f"template class {p.runner};" for p in paths)))
    sources = [binding, runners]

    stubs = []
    for path in paths:
        available = launcher_instantiations(generated, path)
        missing = [c for c in selected[path.name] if c not in available]
        if missing:
            raise PlatformError(f"the installed FlashInfer has no {path.name} instantiation for {missing}; available: {sorted(available)}")
        gemm_runner = out_dir / f"moebake_{path.name}_gemm_runner.cu"
        _write_if_different(gemm_runner, _GEMM_RUNNER_CU.format(path=path.name, gemm_runner=path.gemm_runner))
        sources.append(gemm_runner)
        for tile, cluster, schedule in selected[path.name]:
            statement, origin = available[(tile, cluster, schedule)]
            kernel = out_dir / f"moebake_{path.name}_gemm_{tile}_c{cluster}_{schedule.lower()}.cu"
            _write_if_different(
                kernel, _KERNEL_CU.format(path=path.name, config=f"{tile} {cluster} {schedule}", origin=origin, statement=statement)
            )
            sources.append(kernel)
        stubs += [available[key][0] for key in sorted(available) if key not in selected[path.name]]

    stub = out_dir / "moebake_gemm_stubs.cu"
    envs = ", ".join(p.configs_env for p in paths)
    _write_if_different(
        stub,
        _STUB_CU.format(
            module=module_name, envs=envs, prelude=revision.stub_prelude, launchers=revision.stub_launchers, statements="\n\n".join(stubs)
        ),
    )
    sources.append(stub)
    return sources
