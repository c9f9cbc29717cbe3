"""The reduced FlashInfer SM90 fused-MoE module's sources, generated on CPU (compiling them needs the GPU machine's
CUDA toolkit: ``bin/gpu-harness build``). FlashInfer's own kernel generator is the oracle for which launcher
instantiations exist: every one of the two paths' instantiations is compiled or stubbed, exactly once."""

import re

import pytest

from moebake.errors import InvalidArgumentError
from moebake.serve import flashinfer_paths as fp

fb = pytest.importorskip("moebake.serve.flashinfer_build")
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
    constructor = binding[binding.index("// moebake reduced module"):binding.index("if (!mKernelRunner)")]
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
    assert chosen == {"w4a16": (("64x16x128", "1x1x1", "Pingpong"),),
                      "w4a8": (("128x8x128", "1x1x1", "SingleWarpgroupPrefill"),)}
    with pytest.raises(InvalidArgumentError, match="unknown mainloop schedule 'Rolling'"):
        fp.parse_configs("128x16x128/1x1x1/Rolling")
