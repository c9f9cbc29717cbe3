"""The serving records (:mod:`moebake.schema.serving`) are well formed, and every server implements exactly the routes
they name: the SGLang plugin's method factories, the vLLM plugin's served kinds, ``moebake.serve``'s runtime classes."""

import pytest

from moebake.schema import serving
from moebake.schema.targets import TARGET_SPECS


def test_each_record_names_a_known_server_target_and_source():
    for record in serving.RECORDS:
        assert record.server in serving.SERVERS, record
        assert record.target in TARGET_SPECS, record
        assert record.source_format in (None, *TARGET_SPECS[record.target].source_formats), record


def test_one_record_per_server_target_and_source():
    keys = [(r.server, r.target, r.source_format) for r in serving.RECORDS]
    assert len(keys) == len(set(keys))


def test_a_record_is_served_or_says_why_not_never_both():
    for record in serving.RECORDS:
        assert record.served != bool(record.why_not), record
        assert record.kernel_backend is None or (record.served and record.server == serving.VLLM), record


def test_a_source_record_takes_precedence_over_its_targets():
    assert serving.record(serving.SGLANG, "sm90-marlin", "deepseek-v4").route == "sm90-marlin-deepseek-v4"
    assert serving.record(serving.SGLANG, "sm90-marlin", "gpt-oss").route == "sm90-marlin"
    assert serving.record(serving.VLLM, "cutedsl-deepep", "modelopt-nvfp4") is None


def _routes(server: str) -> set[str]:
    return {r.route for r in serving.routes(server)}


def test_the_sglang_plugin_implements_its_routes():
    from moebake.engines.sglang.moe_methods import FACTORIES

    assert set(FACTORIES) == _routes(serving.SGLANG)


def test_the_vllm_plugin_implements_its_routes():
    from moebake.engines.vllm.bake import HOLDINGS

    assert set(HOLDINGS) == _routes(serving.VLLM)


def test_the_vllm_kernel_backends_are_vllms():
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend

    members = set(Mxfp4MoeBackend.__members__) | set(NvFp4MoeBackend.__members__)
    assert {r.kernel_backend for r in serving.routes(serving.VLLM)} <= members


def test_moebake_serve_implements_its_routes():
    import moebake.serve

    assert set(moebake.serve.RUNTIMES) == {r.target for r in serving.routes(serving.SERVE)}
    assert {runtime.__name__ for runtime in moebake.serve.RUNTIMES.values()} == _routes(serving.SERVE)


def test_a_target_wide_reason_is_said_alone():
    line = serving.unserved(serving.VLLM, "sm90-cutlass-w4a8", "gpt-oss")
    assert line.startswith("target 'sm90-cutlass-w4a8': the vLLM plugin cannot serve it: vLLM 0.33.0's HUMMING")
    line = serving.unserved(serving.VLLM, "deepep-bf16", "bf16-moe")
    assert line.startswith(
        "target 'deepep-bf16' of source format 'bf16-moe'; the vLLM plugin serves sm90-cutlass bakes of gpt-oss; "
    ) and line.endswith("path does not exist there)")
