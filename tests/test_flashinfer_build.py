"""The reduced FlashInfer SM90 fused-MoE module's sources, generated on CPU (compiling them needs the GPU machine's
CUDA toolkit: ``bin/gpu-harness build``). FlashInfer's own kernel generator is the oracle for which launcher
instantiations exist: every one of the two paths' instantiations is compiled or stubbed, exactly once."""

import re

import pytest

from moebake.errors import InvalidArgumentError, PlatformError
from moebake.serve.jit import flashinfer_paths as fp

fb = pytest.importorskip("moebake.serve.jit.flashinfer_build")
pytest.importorskip("flashinfer")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The reduced module's spec, generated into a private FlashInfer workspace."""
    mp = pytest.MonkeyPatch()
    mp.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path_factory.mktemp("fi")))
    mp.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    import importlib

    import flashinfer.jit.env as jit_env

    importlib.reload(jit_env)  # its directories are read from the environment at import
    try:
        from flashinfer.jit import env

        spec = fb.gen_reduced_sm90_module()
        yield spec, env
    finally:
        mp.undo()
        importlib.reload(jit_env)


def _text(spec, pattern):
    (path,) = [p for p in spec.sources if re.search(pattern, str(p))]
    return path.read_text()


def test_every_instantiation_of_both_paths_is_compiled_or_stubbed_once(generated):
    spec, env = generated
    chosen = fp.selected_configs()
    stubs = _text(spec, r"moebake_gemm_stubs\.cu$")
    instantiations_dir = env.FLASHINFER_GEN_SRC_DIR / "cutlass_instantiations" / "90"
    for path in fp.PATHS:
        available = fp.launcher_instantiations(instantiations_dir, path)
        assert set(chosen[path.name]) <= set(available), path.name
        for key, (statement, _) in available.items():
            kernel = [p for p in spec.sources if p.name == f"moebake_{path.name}_gemm_{key[0]}_c{key[1]}_{key[2].lower()}.cu"]
            if key in chosen[path.name]:
                assert len(kernel) == 1 and statement in kernel[0].read_text(), key
                assert statement not in stubs, key
            else:
                assert not kernel and stubs.count(statement) == 1, key
    humming = fp.launcher_instantiations(instantiations_dir, fp.W4A8_HUMMING)
    assert any(key[2] == "SingleWarpgroupRolling" for key in humming)  # the small-K kernels are its own
    assert not any("SingleWarpgroup" in key[2] for key in fp.launcher_instantiations(instantiations_dir, fp.W4A16))


def test_the_binding_builds_only_the_two_runners(generated):
    spec, _ = generated
    binding = _text(spec, r"moebake_binding\.cu$")
    constructor = binding[binding.index("// moebake reduced module") : binding.index("if (!mKernelRunner)")]
    runners = re.findall(r"make_(?:shared|unique)<\s*kernels::CutlassMoeFCRunner<([^;]*)>>\(\)", constructor)
    assert [" ".join(r.split()) for r in runners] == [
        "__nv_bfloat16, kernels::Fp4Type",
        "__nv_fp8_e4m3, kernels::Fp4Type, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, false, "
        "kernels::Sm90Wfp4Afp8ScaleMode::kHummingPreMmaE8M0",
    ]
    assert "if (isWFP4A16Quant())" in constructor and "if (isWMxfp4AFp8HummingQuant())" in constructor
    instantiated = _text(spec, r"moebake_runners\.cu$")
    assert all(f"template class {p.runner};" in instantiated for p in fp.PATHS)
    assert "kHummingPreMmaE8M0>;" in _text(spec, r"moebake_w4a8_gemm_runner\.cu$")


def test_configurations_parse_and_refuse_an_unknown_schedule(monkeypatch):
    monkeypatch.setenv(fp.W4A8_HUMMING.configs_env, "128x8x128/1x1x1/singlewarpgroupprefill")
    chosen = fp.selected_configs({"w4a16": [("64x16x128", "1x1x1", "pingpong")]})
    assert chosen == {"w4a16": (("64x16x128", "1x1x1", "Pingpong"),), "w4a8": (("128x8x128", "1x1x1", "SingleWarpgroupPrefill"),)}
    with pytest.raises(InvalidArgumentError, match="unknown mainloop schedule 'Rolling'"):
        fp.parse_configs("128x16x128/1x1x1/Rolling")


def test_each_flashinfer_release_has_one_source_revision_and_an_unknown_one_is_refused():
    releases = [release for revision in fp.REVISIONS for release in revision.releases]
    assert len(releases) == len(set(releases))
    assert fp.revision_for("0.6.15.post1").paths == (fp.W4A16_E2M1,)
    assert fp.revision_for("0.6.14") is fp.revision_for("0.6.15.post1")
    assert fp.revision_for("0.7.2.post1").paths == fp.PATHS
    assert fb.TESTED_FLASHINFER_VERSIONS == fp.REVISIONS[0].releases  # the runtime: the newest revision's release
    with pytest.raises(PlatformError, match=r"written for FlashInfer 0\.7\.2\.post1, 0\.6\.15\.post1, 0\.6\.14, found 0\.6\.9"):
        fp.revision_for("0.6.9")
    assert fp.revision_for("0.6.9", any_version=True) is fp.REVISIONS[0]


FLASHINFER_0_6 = ("0.6.15.post1", "0.6.14")  # SGLang 0.5.17's pin, vLLM 0.26.0's pin: one SourceRevision


def _release_tree(release):
    from tests.engine_releases.trees import release_tree

    try:
        return release_tree("flashinfer-python", release)
    except OSError as err:
        pytest.skip(f"cannot fetch FlashInfer {release}'s tree: {err}")


@pytest.fixture(scope="module", params=FLASHINFER_0_6)
def generated_0_6(request, tmp_path_factory):
    """The reduced module's sources generated in a subprocess from a FlashInfer 0.6 release's own released tree (its
    Python, its kernel generator and its csrc, fetched from PyPI like the release matrix's trees): ``{name: text}``."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    tree = _release_tree(request.param)
    workspace = tmp_path_factory.mktemp("fi06")
    env = dict(
        os.environ,
        FLASHINFER_WORKSPACE_BASE=str(workspace),
        FLASHINFER_CUDA_ARCH_LIST="9.0a",
        PYTHONPATH=os.pathsep.join([str(tree), str(Path(__file__).parents[1])]),
    )
    env.pop(fp.W4A16.configs_env, None)
    script = (
        "import json, flashinfer; from moebake.serve.jit import flashinfer_build as fb; "
        "spec = fb.gen_reduced_sm90_module(); "
        "print(json.dumps({'version': flashinfer.__version__, "
        "'sources': {p.name: p.read_text() for p in spec.sources if p.parent.name == 'moebake_90'}}))"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["version"] == request.param
    return result["sources"]


def test_flashinfer_0_6s_generator_has_the_w4a16_configurations_compiled_with_its_fp4_type(generated_0_6):
    """FlashInfer 0.6.14 and 0.6.15 spell the FP4 weight ``__nv_fp4_e2m1`` and has no Humming path: each default configuration
    is one of its own generator's instantiations, copied as it wrote it; every other one of the path is stubbed."""
    sources = generated_0_6
    for tile, cluster, schedule in fp.W4A16_E2M1.default_configs:
        kernel = sources[f"moebake_w4a16_gemm_{tile}_c{cluster}_{schedule.lower()}.cu"]
        m, n, k = tile.split("x")
        assert "sm90_generic_mixed_moe_gemm_kernelLauncher<__nv_bfloat16, __nv_fp4_e2m1, __nv_bfloat16," in kernel, tile
        assert f"cute::Shape<cute::Int<{m}>, cute::Int<{n}>, cute::Int<{k}>>" in kernel
        assert f"KernelTmaWarpSpecialized{schedule}," in kernel
    assert not any("w4a8" in name for name in sources)
    stubs = sources["moebake_gemm_stubs.cu"]
    assert "MixedInputScaleMode" not in stubs and "SafeFP4" not in stubs and "small_k" not in stubs
    assert stubs.count("template void sm90_generic_mixed_moe_gemm_kernelLauncher<__nv_bfloat16, __nv_fp4_e2m1,") > 50
    assert "template void sm90_generic_mixed_moe_gemm_kernelLauncher<half," not in stubs  # FP16 is not a path here
    binding = sources["moebake_binding.cu"]
    constructor = binding[binding.index("// moebake reduced module") : binding.index("if (!mKernelRunner)")]
    runners = re.findall(r"make_(?:shared|unique)<\s*kernels::CutlassMoeFCRunner<([^;]*)>>\(\)", constructor)
    assert runners == ["__nv_bfloat16, __nv_fp4_e2m1"]
    assert "template class CutlassMoeFCRunner<__nv_bfloat16, __nv_fp4_e2m1>;" in sources["moebake_runners.cu"]
    assert "template class MoeGemmRunner<__nv_bfloat16, __nv_fp4_e2m1, __nv_bfloat16>;" in sources["moebake_w4a16_gemm_runner.cu"]


@pytest.mark.parametrize("release", FLASHINFER_0_6 + fp.REVISIONS[0].releases)
def test_a_revision_compiles_the_block_scale_gemm_where_the_release_constructs_it_for_every_runner(release):
    """FlashInfer 0.6's ``CutlassMoeFCRunner`` constructor makes a DeepSeek FP8 block-scale GEMM runner for any runner
    types, so the W4A16 runner links ``fp8_blockscale_gemm.cu``; 0.7.2 makes it only for BF16 x FP8 weights."""
    kernels = (
        _release_tree(release) / "flashinfer" / "data" / "csrc" / "fused_moe" / "cutlass_backend" / "cutlass_fused_moe_kernels.cuh"
    ).read_text()
    unconditional = (
        re.search(
            r"::CutlassMoeFCRunner\(\)\s*:\s*blockscale_gemm_runner_\{\s*std::make_unique<"
            r"kernels::fp8_blockscale_gemm::CutlassFp8BlockScaleGemmRunner<",
            kernels,
        )
        is not None
    )
    listed = any(source.endswith("/fp8_blockscale_gemm.cu") for source in fp.revision_for(release).stock_sources)
    assert unconditional == listed, release
