"""A reduced (or prebuilt) FlashInfer SM90 fused-MoE module: MXFP4 weights, as W4A16 and as Humming W4A8.

Why this exists
---------------
``flashinfer.fused_moe.cutlass_fused_moe`` and ``interleave_moe_weights_for_sm90_mixed_gemm`` both
load the JIT module ``fused_moe_90`` on first use. FlashInfer builds that module from about 250
CUDA translation units: every activation x weight dtype pair the CUTLASS MoE backend supports,
times every tile, cluster and schedule, even with ``-DFAST_BUILD`` (its build time:
docs/benchmarks.md). moebake's SM90 targets use two of those paths (:data:`PATHS`):

* :data:`W4A16`: BF16 activations x MXFP4 weights, ``use_w4_group_scaling=True`` (``sm90-cutlass``);
* :data:`W4A8_HUMMING`: BF16 activations quantized online to FP8 x MXFP4 weights with Humming's pre-MMA
  E8M0 scales, ``use_wfp4afp8_humming=True`` (``sm90-cutlass-w4a8``),

so almost all of that build is dead weight.

What it does
------------
:func:`gen_reduced_sm90_module` returns a FlashInfer ``JitSpec`` with the *same* compiler flags,
include paths and link flags as FlashInfer's own ``gen_cutlass_fused_moe_sm90_module()`` (it is a
``dataclasses.replace`` of that spec), but a different module name and a short source list:

* the TMA-WS input helper, the weight-interleave kernels (``moe_gemm_mixed_utils.cu``), the DeepGEMM
  include-dir hook the Python wrapper calls after loading, and the small common .cpp/.cu files;
* a copy of FlashInfer's binding whose ``FusedMoeRunner`` constructor is reduced to the two paths'
  branches (the stock constructor names ~25 other ``CutlassMoeFCRunner`` instantiations);
* one file instantiating the paths' ``CutlassMoeFCRunner`` types, and one per path instantiating its
  ``MoeGemmRunner`` (the tile/cluster/schedule dispatcher);
* one translation unit per selected GEMM configuration (tile, cluster, mainloop schedule) of each path,
  each holding the exact explicit instantiation FlashInfer's kernel generator emits for it;
* one stub translation unit that defines every *other* instantiation of the two paths that the dispatchers
  reference as a function that throws ``"... not compiled in the moebake reduced module"``, so
  the library links and loads without undefined symbols.

The tactic list the runner reports is FlashInfer's unchanged list. Calls without autotuning use
the first tactic (tile 64x16x128, cluster 1x1x1, ping-pong), which is compiled by default for both paths,
as is the 128x64x256 cooperative configuration FlashInfer uses to size the GEMM workspace. Autotuning
meets the stub for tactics that are not compiled; FlashInfer's autotuner skips tactics that raise.

moebake's runtime calls the module through a getter of its own
(:func:`moebake.serve.flashinfer_ops.sm90_moe_ops`): FlashInfer's ``cutlass_fused_moe`` and its module
getter rebuilt over FlashInfer's own code with the SM90 generator bound to :func:`reduced_module_spec`,
so FlashInfer's module, getter and cache stay as they are for anything else in the process (an engine's
own FlashInfer calls). :func:`ensure_flashinfer_sm90_moe` instead replaces
``flashinfer.fused_moe.core.gen_cutlass_fused_moe_sm90_module`` and clears the getter's cache, for
tests and benchmarks that run an engine's own code. With a prebuilt library (``MOEBAKE_FLASHINFER_MOE_SO``
or ``prebuilt=``), nothing is compiled: the ``.so`` is loaded with ``tvm_ffi.load_module`` after its
sidecar JSON is checked against the installed FlashInfer and apache-tvm-ffi versions and the file's sha256.

Only FlashInfer 0.7.2.post1 was checked; the source patches assert their anchors, so another
version fails loudly instead of building something wrong. A prebuilt ``.so`` is tied to the
FlashInfer and apache-tvm-ffi versions it was built with (checked from its sidecar). Build time, size
and what the GPU tests check: docs/benchmarks.md and docs/testing.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from moebake.errors import InvalidArgumentError, PlatformError

MODULE_NAME = "fused_moe_90_moebake"
"""Name of the reduced JIT module (its cache directory and ``.so`` are named after it)."""

TESTED_FLASHINFER_VERSIONS = ("0.7.2.post1",)

PREBUILT_ENV = "MOEBAKE_FLASHINFER_MOE_SO"
"""Environment variable naming a prebuilt reduced ``.so`` to load instead of building."""

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
    scale_mode: Optional[str]
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
"""BF16 activations x MXFP4 weights (``use_w4_group_scaling=True``): the ``sm90-cutlass`` target."""

W4A8_HUMMING = MixedInputPath(
    name="w4a8",
    operands="__nv_fp8_e4m3, SafeFP4, __nv_bfloat16",
    scale_mode="kPreMmaE8M0",
    runner=("CutlassMoeFCRunner<__nv_fp8_e4m3, Fp4Type, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, false, "
            "Sm90Wfp4Afp8ScaleMode::kHummingPreMmaE8M0>"),
    gemm_runner=("MoeGemmRunner<__nv_fp8_e4m3, Fp4Type, __nv_bfloat16, __nv_bfloat16, false, "
                 "Sm90Wfp4Afp8ScaleMode::kHummingPreMmaE8M0>"),
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
"""The paths the reduced module compiles, in the binding constructor's order."""

Config = tuple[str, str, str]
"""(tile MxNxK, cluster, mainloop schedule) of one grouped GEMM. The mixed-input GEMM runs with swapped
operands: M tiles the expert weight rows, N the tokens."""

_INSTANTIATION_RE = re.compile(
    r"template\s+void\s+(?P<launcher>sm90_generic_mixed_moe_(?:gemm|small_k)_kernelLauncher)\s*"
    r"<(?P<args>.*?)>\s*\((?P<params>.*?)\)\s*;", re.S)
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
    '"Could not construct fused moe op (moebake reduced module ' + MODULE_NAME
    + ': only MXFP4 uint8 weights with use_w4_group_scaling=True and BF16 activations, as W4A16 or as Humming '
    'W4A8 (use_wfp4afp8_humming=True), are compiled) with the requested input combination Activation: "'
)

_RUNNERS_CU = """// Generated by moebake.serve.flashinfer_build: the MoE runners of the reduced module's paths only.
#include "fused_moe/cutlass_backend/cutlass_fused_moe_kernels.cuh"
#include "moe_kernels.h"

namespace tensorrt_llm::kernels::cutlass_kernels {{
{runners}
INSTANTIATE_FINALIZE_MOE_ROUTING(__nv_bfloat16, __nv_bfloat16, __nv_bfloat16);
}}  // namespace tensorrt_llm::kernels::cutlass_kernels
"""

_GEMM_RUNNER_CU = """// Generated by moebake.serve.flashinfer_build: the grouped-GEMM runner of the {path} path.
#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_template_dispatch.h"

namespace tensorrt_llm::kernels::cutlass_kernels {{
template class {gemm_runner};
}}  // namespace tensorrt_llm::kernels::cutlass_kernels
"""

_KERNEL_CU = """// Generated by moebake.serve.flashinfer_build: one {path} grouped-GEMM configuration,
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

_STUB_CU = """// Generated by moebake.serve.flashinfer_build: the grouped-GEMM configurations of the compiled paths
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
using SafeFP4 = tensorrt_llm::kernels::cutlass_kernels::Fp4Type;

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

template <typename T, typename WeightType, typename GemmOutputType, typename EpilogueTag,
          typename CTAShape, typename ClusterShape, typename MainloopScheduleType,
          typename EpilogueScheduleType, cutlass::WeightOnlyQuantOp QuantOp,
          cutlass::gemm::collective::MixedInputScaleMode ScaleMode>
void sm90_generic_mixed_moe_gemm_kernelLauncher(
    GroupedGemmInput<T, WeightType, GemmOutputType, GemmOutputType> inputs,
    TmaWarpSpecializedGroupedGemmInput hopper_inputs, int sm_count_, size_t* workspace_size) {{
  moebake_not_compiled<CTAShape, ClusterShape>(
      std::is_same_v<MainloopScheduleType, cutlass::gemm::KernelTmaWarpSpecializedCooperative>
          ? "Cooperative" : "Pingpong");
}}

template <typename T, typename WeightType, typename GemmOutputType, typename EpilogueTag,
          typename CTAShape, typename ClusterShape, typename MainloopScheduleType,
          typename EpilogueScheduleType, cutlass::WeightOnlyQuantOp QuantOp,
          cutlass::gemm::collective::MixedInputScaleMode ScaleMode,
          tensorrt_llm::cutlass_extensions::MainloopScheduleType KernelType>
void sm90_generic_mixed_moe_small_k_kernelLauncher(
    GroupedGemmInput<T, WeightType, GemmOutputType, GemmOutputType> inputs,
    TmaWarpSpecializedGroupedGemmInput hopper_inputs, int sm_count_, size_t* workspace_size) {{
  moebake_not_compiled<CTAShape, ClusterShape>(
      KernelType == tensorrt_llm::cutlass_extensions::MainloopScheduleType::SINGLE_WARPGROUP_PREFILL
          ? "SingleWarpgroupPrefill" : "SingleWarpgroupRolling");
}}

{statements}
}}  // namespace cutlass_kernels_oss
}}  // namespace kernels
}}  // namespace tensorrt_llm
"""

_STOCK_SOURCES_KEPT = (
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_tma_warp_specialized_input.cu",
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_gemm_mixed_utils.cu",
    "fused_moe/cutlass_backend/deepgemm_jit_setup.cu",
    "nv_internal/cpp/common/envUtils.cpp",
    "nv_internal/cpp/common/logger.cpp",
    "nv_internal/cpp/common/stringUtils.cpp",
    "nv_internal/cpp/common/tllmException.cpp",
    "nv_internal/cpp/common/memoryUtils.cu",
    "nv_internal/tensorrt_llm/kernels/preQuantScaleKernel.cu",
    "nv_internal/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp",
    "nv_internal/tensorrt_llm/kernels/lora/lora.cpp",
)
"""FlashInfer sources of the stock ``fused_moe_90`` module that the compiled paths still need."""


def parse_configs(text: str) -> tuple[Config, ...]:
    """``"64x16x128/1x1x1/Pingpong,128x16x128/1x1x1/SingleWarpgroupRolling"`` -> config tuples."""
    configs = []
    for item in text.split(","):
        tile, cluster, schedule = (part.strip() for part in item.strip().split("/"))
        if schedule.lower() not in SCHEDULES:
            raise InvalidArgumentError(f"unknown mainloop schedule {schedule!r} in {item!r}; expected one of "
                                       f"{sorted(SCHEDULES.values())}")
        configs.append((tile, cluster, SCHEDULES[schedule.lower()]))
    return tuple(configs)


ConfigChoice = Optional[dict[str, Iterable[Sequence[str]]]]
"""Compiled configurations per path name (``{"w4a16": [...], "w4a8": [...]}``); a path left out, or ``None``,
takes its ``configs_env`` variable or else its defaults."""


def selected_configs(configs: ConfigChoice = None) -> dict[str, tuple[Config, ...]]:
    """The configurations compiled for each path (see :data:`ConfigChoice`)."""
    chosen = {}
    for path in PATHS:
        given = (configs or {}).get(path.name)
        if given is not None:
            chosen[path.name] = parse_configs(",".join("/".join(map(str, c)) for c in given))
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


def reduced_binding_source(csrc_dir: Path) -> str:
    """FlashInfer's fused-MoE binding with the runner constructor reduced to the compiled paths' branches."""
    text = (Path(csrc_dir) / _BINDING).read_text()
    for anchor in (_CTOR_BEGIN, _CTOR_END, _RELATIVE_INCLUDE, _ERROR_TEXT):
        if text.count(anchor) != 1:
            raise PlatformError(f"FlashInfer binding changed: anchor {anchor.strip()!r} not found exactly once")
    branches = "".join(path.branch.replace("{runner}", _in_kernels(path.runner)) for path in PATHS)
    reduced = ("    // moebake reduced module: only the runners of " + ", ".join(p.name for p in PATHS)
               + " are compiled in.\n#if defined(ENABLE_FP4) && defined(ENABLE_BF16) && defined(ENABLE_FP8)\n"
               + branches + "#endif\n")
    begin = text.index(_CTOR_BEGIN)
    end = text.index(_CTOR_END, begin)
    text = text[:begin] + reduced + text[end:]
    text = text.replace(_RELATIVE_INCLUDE, '#include "tvm_ffi_utils.h"')
    return text.replace(_ERROR_TEXT, _ERROR_REDUCED)


def _check_flashinfer_version() -> str:
    import flashinfer

    version = flashinfer.__version__
    if version not in TESTED_FLASHINFER_VERSIONS and not os.environ.get("MOEBAKE_FLASHINFER_ANY_VERSION"):
        raise PlatformError(
            f"moebake's reduced FlashInfer MoE module was written for FlashInfer {TESTED_FLASHINFER_VERSIONS}, "
            f"found {version}; set MOEBAKE_FLASHINFER_ANY_VERSION=1 to try anyway"
        )
    return version


def _stock_sm90_generator():
    """FlashInfer's own SM90 spec generator, even after :func:`ensure_flashinfer_sm90_moe` patched core."""
    import flashinfer.jit.fused_moe as jit_fused_moe

    return jit_fused_moe.gen_cutlass_fused_moe_sm90_module


def gen_reduced_sm90_module(configs: ConfigChoice = None):
    """FlashInfer ``JitSpec`` of the reduced SM90 fused-MoE module (see the module docstring).

    Writes the generated sources under FlashInfer's generated-source directory
    (``FLASHINFER_GEN_SRC_DIR/moebake_90``). Building it is ``spec.build_and_load()``.
    """
    from flashinfer.jit import env as jit_env

    _check_flashinfer_version()
    selected = selected_configs(configs)
    stock = _stock_sm90_generator()(False)  # also (re)generates FlashInfer's kernel instantiation files
    generated = Path(jit_env.FLASHINFER_GEN_SRC_DIR) / "cutlass_instantiations" / "90"
    out_dir = Path(jit_env.FLASHINFER_GEN_SRC_DIR) / "moebake_90"
    csrc = Path(jit_env.FLASHINFER_CSRC_DIR)
    sources = [csrc / rel for rel in _STOCK_SOURCES_KEPT]

    binding = out_dir / "moebake_binding.cu"
    _write_if_different(binding, reduced_binding_source(csrc))
    runners = out_dir / "moebake_runners.cu"
    _write_if_different(runners, _RUNNERS_CU.format(runners="\n".join(f"template class {p.runner};" for p in PATHS)))
    sources += [binding, runners]

    stubs = []
    for path in PATHS:
        available = launcher_instantiations(generated, path)
        missing = [c for c in selected[path.name] if c not in available]
        if missing:
            raise PlatformError(f"the installed FlashInfer has no {path.name} instantiation for {missing}; "
                                f"available: {sorted(available)}")
        gemm_runner = out_dir / f"moebake_{path.name}_gemm_runner.cu"
        _write_if_different(gemm_runner, _GEMM_RUNNER_CU.format(path=path.name, gemm_runner=path.gemm_runner))
        sources.append(gemm_runner)
        for tile, cluster, schedule in selected[path.name]:
            statement, origin = available[(tile, cluster, schedule)]
            kernel = out_dir / f"moebake_{path.name}_gemm_{tile}_c{cluster}_{schedule.lower()}.cu"
            _write_if_different(kernel, _KERNEL_CU.format(path=path.name, config=f"{tile} {cluster} {schedule}",
                                                          origin=origin, statement=statement))
            sources.append(kernel)
        stubs += [available[key][0] for key in sorted(available) if key not in selected[path.name]]

    stub = out_dir / "moebake_gemm_stubs.cu"
    envs = ", ".join(p.configs_env for p in PATHS)
    _write_if_different(stub, _STUB_CU.format(module=MODULE_NAME, envs=envs, statements="\n\n".join(stubs)))
    sources.append(stub)
    for source in sources:
        if not source.exists():
            raise FileNotFoundError(f"FlashInfer source missing (trimmed wheel?): {source}")
    return dataclasses.replace(stock, name=MODULE_NAME, sources=sources)


def _sidecar(so_path: Path) -> Path:
    return Path(so_path).with_suffix(".json")


def describe_build(configs: ConfigChoice = None) -> dict[str, Any]:
    """What a built library is valid for; written next to a saved ``.so`` and checked at load."""
    import flashinfer
    import tvm_ffi

    return {
        "module": MODULE_NAME,
        "flashinfer": flashinfer.__version__,
        "tvm_ffi": tvm_ffi.__version__,
        "configs": {name: ["/".join(c) for c in chosen] for name, chosen in selected_configs(configs).items()},
        "arch": "sm_90a",
    }


class PrebuiltModuleSpec:
    """Stand-in for a FlashInfer ``JitSpec`` whose ``build_and_load()`` loads a prebuilt ``.so``."""

    def __init__(self, so_path: Path):
        self.name = MODULE_NAME
        self.so_path = Path(so_path)

    def get_library_path(self) -> Path:
        return self.so_path

    def build_and_load(self):
        import tvm_ffi

        return tvm_ffi.load_module(str(self.so_path))


def check_prebuilt(so_path: Path) -> dict[str, Any]:
    """Check a prebuilt ``.so`` against the installed FlashInfer; returns its sidecar metadata."""
    so_path = Path(so_path)
    if not so_path.is_file():
        raise FileNotFoundError(f"prebuilt FlashInfer MoE module not found: {so_path}")
    meta_path = _sidecar(so_path)
    if not meta_path.is_file():
        raise FileNotFoundError(f"prebuilt module has no metadata file {meta_path}")
    meta = json.loads(meta_path.read_text())
    import flashinfer
    import tvm_ffi

    if meta.get("module") != MODULE_NAME or meta.get("flashinfer") != flashinfer.__version__:
        raise PlatformError(
            f"prebuilt module {so_path} is for {meta.get('module')} / FlashInfer {meta.get('flashinfer')}, "
            f"not {MODULE_NAME} / FlashInfer {flashinfer.__version__}"
        )
    # The module subclasses tvm-ffi C++ classes inline from the headers it was compiled with: the
    # runtime library must be the same apache-tvm-ffi release (0.1.11 and 0.1.15 differ in layout).
    if meta.get("tvm_ffi", tvm_ffi.__version__) != tvm_ffi.__version__:
        raise PlatformError(f"prebuilt module {so_path} was built with apache-tvm-ffi {meta['tvm_ffi']}, "
                           f"but {tvm_ffi.__version__} is installed; rebuild it")
    if "sha256" in meta and hashlib.sha256(so_path.read_bytes()).hexdigest() != meta["sha256"]:
        raise PlatformError(f"prebuilt module {so_path} does not match the sha256 in {meta_path}")
    return meta


def reduced_module_spec(prebuilt: Optional[os.PathLike | str] = None, configs: ConfigChoice = None):
    """The reduced module's spec: a checked prebuilt ``.so`` (``prebuilt`` or ``$MOEBAKE_FLASHINFER_MOE_SO``), or the
    JIT spec that builds it on first ``build_and_load()``. Changes nothing in FlashInfer."""
    prebuilt = prebuilt or os.environ.get(PREBUILT_ENV) or None
    if prebuilt:
        check_prebuilt(Path(prebuilt))
        return PrebuiltModuleSpec(Path(prebuilt))
    return gen_reduced_sm90_module(configs)


_installed: Optional[Any] = None
_installed_key: Optional[tuple] = None


def ensure_flashinfer_sm90_moe(prebuilt: Optional[os.PathLike | str] = None, configs: ConfigChoice = None):
    """Make FlashInfer's SM90 ``cutlass_fused_moe`` and weight interleave use the reduced module, process-wide.

    For tests and benchmarks that run an engine's own code, which calls FlashInfer's getter, on a machine
    where FlashInfer's full module cannot be built; moebake's own runtime does not call it
    (:func:`moebake.serve.flashinfer_ops.sm90_moe_ops` has a getter of its own).

    ``prebuilt`` (or ``$MOEBAKE_FLASHINFER_MOE_SO``) names a saved ``.so`` (with its ``.json``
    sidecar) to load without compiling; otherwise the reduced module is JIT-built on first use
    (a small fraction of the stock module's build, see docs/benchmarks.md). Idempotent: a repeated
    call with the same arguments keeps the module already loaded. Returns the spec installed.
    Note: FlashInfer 0.7.2's ``cutlass_fused_moe`` returns a list ``[output, ...]``, not a tensor.
    """
    global _installed, _installed_key
    import flashinfer.fused_moe.core as core

    prebuilt = prebuilt or os.environ.get(PREBUILT_ENV) or None
    key = (str(Path(prebuilt).resolve()) if prebuilt else None, tuple(selected_configs(configs).items()))
    if _installed is not None and _installed_key == key and getattr(core.gen_cutlass_fused_moe_sm90_module, "_moebake", False):
        return _installed
    spec = reduced_module_spec(prebuilt, configs)

    def gen_cutlass_fused_moe_sm90_module(use_fast_build: bool = False):
        return spec

    gen_cutlass_fused_moe_sm90_module.__doc__ = f"moebake: returns the reduced module spec {MODULE_NAME}."
    gen_cutlass_fused_moe_sm90_module._moebake = True
    core.gen_cutlass_fused_moe_sm90_module = gen_cutlass_fused_moe_sm90_module
    core.get_cutlass_fused_moe_module.cache_clear()
    _installed, _installed_key = spec, key
    return spec


def build_reduced_sm90_module(dest_dir: Optional[os.PathLike | str] = None, configs: ConfigChoice = None,
                              verbose: bool = False) -> tuple[Path, float]:
    """Build the reduced module now (ninja, ``MAX_JOBS`` cores); copy ``.so`` + ``.json`` to ``dest_dir``.

    Returns ``(path of the .so, build seconds)``. The ``.so`` only needs the CUDA driver, libnvrtc
    and the same FlashInfer + apache-tvm-ffi versions to be loaded on another SM90 machine.
    """
    spec = gen_reduced_sm90_module(configs)
    start = time.monotonic()
    spec.build(verbose=verbose)
    seconds = time.monotonic() - start
    so_path = Path(spec.get_library_path())
    if dest_dir is not None:
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / so_path.name
        shutil.copyfile(so_path, target)
        meta = describe_build(configs)
        meta["sha256"] = hashlib.sha256(target.read_bytes()).hexdigest()
        meta["build_seconds"] = round(seconds, 1)
        _sidecar(target).write_text(json.dumps(meta, indent=2) + "\n")
        so_path = target
    return so_path, seconds
