"""moebake's own getter of FlashInfer's SM90 fused-MoE module: FlashInfer's code, moebake's module, nothing of
FlashInfer's replaced (the GPU tests run the kernel through it: tests/gpu/test_sm90_serve.py)."""

import inspect

import pytest

core = pytest.importorskip("flashinfer.fused_moe.core")


class FakeModule:
    """What the getter loads: records the one call FlashInfer's getter makes on it."""

    interleave_moe_weights_for_sm90_mixed_gemm = object()

    def __init__(self, calls):
        self.calls = calls

    def set_deepgemm_jit_include_dirs(self, dirs):
        self.calls.append(("include dirs", tuple(dirs)))


class FakeSpec:
    def __init__(self):
        self.calls = []

    def build_and_load(self):
        self.calls.append("build_and_load")
        return FakeModule(self.calls)


def test_own_getter_loads_our_module_once_and_leaves_flashinfer_as_it_was():
    from moebake.serve.flashinfer_ops import own_getter

    before = (core.gen_cutlass_fused_moe_sm90_module, core.get_cutlass_fused_moe_module, core.cutlass_fused_moe)
    cached_before = core.get_cutlass_fused_moe_module.cache_info().currsize
    spec = FakeSpec()
    getter, cutlass_fused_moe = own_getter(lambda: spec)
    ops = getter("90")
    assert getter("90") is ops
    assert spec.calls[0] == "build_and_load" and spec.calls.count("build_and_load") == 1
    assert spec.calls[1][0] == "include dirs"  # FlashInfer's getter body ran on our module
    assert ops.interleave_moe_weights_for_sm90_mixed_gemm is FakeModule.interleave_moe_weights_for_sm90_mixed_gemm
    assert callable(ops.cutlass_fused_moe) and ops.MoERunner.__name__ == "MoERunner"
    # FlashInfer's own module functions and cache are untouched
    assert (core.gen_cutlass_fused_moe_sm90_module, core.get_cutlass_fused_moe_module, core.cutlass_fused_moe) == before
    assert core.get_cutlass_fused_moe_module.cache_info().currsize == cached_before
    # the public entry point is FlashInfer's code, calling our getter
    assert cutlass_fused_moe.__code__ is inspect.unwrap(core.cutlass_fused_moe).__code__
    assert cutlass_fused_moe.__globals__["get_cutlass_fused_moe_module"] is getter
    assert inspect.signature(cutlass_fused_moe) == inspect.signature(inspect.unwrap(core.cutlass_fused_moe))


def test_interleave_refuses_a_tensor_it_cannot_take():
    import torch

    from moebake.errors import InvalidArgumentError
    from moebake.serve import flashinfer_ops

    flashinfer_ops.sm90_moe_ops.cache_clear()
    try:
        with pytest.raises(InvalidArgumentError, match="3-D uint8 CUDA tensor"):
            flashinfer_ops.sm90_moe_ops().interleave_weights(torch.zeros(2, 64, 32, dtype=torch.uint8))
    finally:
        flashinfer_ops.sm90_moe_ops.cache_clear()
