"""The deepep-bf16 path through real DeepEP low-latency dispatch/combine (tokenspeed-deepep 1.2.1, V1 Buffer).

Every case bakes a synthetic BF16 MoE source (Qwen3.5 fused or Qwen3 per-expert tensors) to
``deepep-bf16`` and checks the served layer against an fp32 MoE over ALL experts computed from the
SOURCE checkpoint (relative L2 < 1e-2), with tokens that select fewer than top-k experts (``-1``
ids) and one that selects none:

1. DeepEP's own ``get_low_latency_rdma_size_hint`` equals moebake's arithmetic (CPU boxes size
   buffers with it).
2. The launcher, one process per GPU: 1 rank (cases on one GPU), then 2 ranks (EP=2, each loads
   half of the experts; skipped with fewer than 2 GPUs), DeepEP vs the fp32 source MoE, and DeepEP
   equal to the stand-in dispatcher over the same NCCL group (per-row GEMM results are the same
   kernels' bits; only combine's fp32 summation order differs, so within one BF16 rounding).
3. In this process, one rank: DeepEP == stand-in, both with DeepGEMM and with the torch GEMM, all
   against the fp32 source MoE; and a forward through ``moebake.serve.open(...).load_experts``.

Skipped without CUDA, an SM90 GPU or an importable ``deep_ep``. Run by ``bin/gpu-harness deepep``.
"""

import os
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

import moebake.serve
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.moe_fp32 import decode_inputs, moe_fp32, read_source_experts, relative_l2
from moebake.reference.synthetic_sources import write_bf16_moe
from moebake.serve.deepep_bf16 import make_dispatcher
from moebake.serve.deepep_ll import LowLatencyBuffer, LowLatencySpec, deep_ep_status, rdma_bytes
from moebake.serve.ep_launch import LaunchConfig, LayerJob, free_port, launch

pytestmark = pytest.mark.gpu


@dataclass(frozen=True)
class Dims:
    style: str  # write_bf16_moe style: qwen3.5 (fused gate_up_proj) or qwen3 (per-expert tensors)
    experts: int  # per rank: EP=1 bakes have this many experts, EP=2 bakes twice as many (same DeepGEMM kernels)
    hidden: int
    intermediate: int


DIMS = {
    "h2048": Dims("qwen3.5", 64, 2048, 512),  # the Qwen3.5-35B-A3B draft's H, I (fewer experts)
    "h3072": Dims("qwen3", 16, 3072, 256),
    "h4096": Dims("qwen3.5", 24, 4096, 384),
}


@dataclass(frozen=True)
class Case:
    name: str
    dims: str
    top_k: int
    tokens: int  # per rank
    drop: bool = True


CASES = (
    Case("h2048-top8-128-tokens", "h2048", 8, 128),
    Case("h2048-top8-5-tokens", "h2048", 8, 5),
    Case("h3072-top10-per-expert-61-tokens", "h3072", 10, 61),
    Case("h4096-top11-1-token", "h4096", 11, 1, drop=False),
)


@pytest.fixture(scope="module")
def deep_ep():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the tokenspeed-deepep wheel is built for SM90")
    module, why = deep_ep_status()
    if module is None:
        pytest.skip(why)
    return module


@pytest.fixture(scope="module")
def bakes(deep_ep, tmp_path_factory):
    """``{(dims name, EP size): (source dir, bake dir, layer prefix)}``."""
    root = tmp_path_factory.mktemp("deepep")
    made = {}
    for i, (name, d) in enumerate(DIMS.items()):
        for ep in (1, 2):
            if ep == 2 and torch.cuda.device_count() < 2:
                continue
            tag = f"{name}-e{d.experts * ep}"
            source = write_bf16_moe(
                root / f"{tag}-src",
                style=d.style,
                num_layers=1,
                num_experts=d.experts * ep,
                hidden=d.hidden,
                intermediate=d.intermediate,
                seed=i,
            )
            convert(source, root / f"{tag}-out", ConvertOptions(target="deepep-bf16"), progress=False)
            prefix = moebake.serve.open(root / f"{tag}-out").layer(0).prefix
            made[name, ep] = (str(source), str(root / f"{tag}-out"), prefix)
    return made


def jobs(bakes, ep, seed=0):
    return tuple(
        LayerJob(bakes[c.dims, ep][1], 0, c.tokens, top_k=c.top_k, seed=seed + i, drop=c.drop, source=bakes[c.dims, ep][0])
        for i, c in enumerate(CASES)
    )


def report(label, results):
    for rank_results in results:
        for case, r in zip(CASES, rank_results):
            print(
                f"{label} rank {r['rank']}/{r['ranks']} {case.name}: experts {r['experts']} of {r['num_experts']}, "
                f"{r['tokens']} tokens x top-{r['top_k']} ({r['dropped_choices']} ids -1), T_max/rank "
                f"{r['max_tokens_per_rank']}, {r['dispatcher']} + {r['backend']}: rel L2 vs fp32 source {r['rel_l2']:.2e}"
            )


def test_rdma_size_arithmetic_equals_deep_eps_hint(deep_ep):
    for tokens in (1, 64, 128, 256, 511):
        for hidden in (2048, 3072, 4096, 7168):
            for ranks, experts in ((1, 8), (2, 256), (8, 288), (2, 512)):
                assert rdma_bytes(tokens, hidden, ranks, experts) == deep_ep.Buffer.get_low_latency_rdma_size_hint(
                    tokens, hidden, ranks, experts
                ), (tokens, hidden, ranks, experts)


def test_launcher_one_rank_deep_ep_matches_the_source(bakes):
    results = launch(LaunchConfig(1, jobs(bakes, 1), device="cuda", dispatcher="deepep"))
    report("launcher", results)
    for r in results[0]:
        assert r["dispatcher"] == "deepep" and r["backend"] == "deep_gemm" and r["rel_l2"] < 1e-2, r


def test_launcher_two_ranks_deep_ep_matches_the_source_and_the_stand_in(bakes):
    if torch.cuda.device_count() < 2:
        pytest.skip("EP=2 needs 2 GPUs")
    print(f"peer access 0<->1: {torch.cuda.can_device_access_peer(0, 1)}, {torch.cuda.can_device_access_peer(1, 0)}")
    deep = launch(LaunchConfig(2, jobs(bakes, 2, seed=10), device="cuda", dispatcher="deepep", keep_outputs=True))
    stand_in = launch(LaunchConfig(2, jobs(bakes, 2, seed=10), device="cuda", dispatcher="standin", keep_outputs=True))
    report("EP=2", deep)
    report("EP=2", stand_in)
    for rank in (0, 1):
        for case, d, s in zip(CASES, deep[rank], stand_in[rank]):
            half = DIMS[case.dims].experts
            assert d["experts"] == (rank * half, rank * half + half) and d["dispatcher"] == "deepep" and s["dispatcher"] == "standin"
            assert d["rel_l2"] < 1e-2 and s["rel_l2"] < 1e-2, (d, s)
            assert_same_within_one_rounding(d["output"], s["output"], f"EP=2 rank {rank} {case.name}")


@pytest.mark.parametrize("ranks", [1, 2])
def test_deep_ep_decode_step_replays_from_a_cuda_graph(bakes, ranks):
    """Each rank's whole decode step (DeepEP LL dispatch, DeepGEMM masked GEMMs, combine) captured in a CUDA graph
    and replayed on new inputs equals an eager forward on those inputs, bit for bit."""
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"EP={ranks} needs {ranks} GPUs")
    results = launch(LaunchConfig(ranks, jobs(bakes, ranks, seed=20), device="cuda", dispatcher="deepep", cuda_graph=True))
    report(f"graph EP={ranks}", results)
    for rank_results in results:
        for case, r in zip(CASES, rank_results):
            assert r["graph_equal"], (ranks, r["rank"], case.name)


def assert_same_within_one_rounding(got, expected, label):
    equal = float((got == expected).float().mean())
    print(
        f"{label}: DeepEP vs stand-in: {100 * equal:.2f}% of elements bit-equal, max |diff| "
        f"{float((got.float() - expected.float()).abs().max()):.3g}"
    )
    torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=1e-5)


@pytest.fixture(scope="module")
def one_rank_group(deep_ep):
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def one_rank_buffer(one_rank_group):
    specs = [LowLatencySpec.for_tokens(DIMS[c.dims].hidden, DIMS[c.dims].experts, c.tokens, 1, c.top_k) for c in CASES]
    buffer = LowLatencyBuffer(one_rank_group, specs)
    yield buffer
    buffer.close()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_one_rank_deep_ep_equals_the_stand_in_and_the_source(case, bakes, one_rank_group, one_rank_buffer):
    source, bake, prefix = bakes[case.dims, 1]
    d = DIMS[case.dims]
    device = torch.device("cuda", 0)
    checkpoint = moebake.serve.open(bake)
    spec = checkpoint.low_latency_spec(0, case.tokens, ep_size=1, top_k=case.top_k)
    hidden, ids, weights = decode_inputs(case.tokens, d.hidden, d.experts, case.top_k, seed=7, device=device, drop=case.drop)
    reference = moe_fp32(read_source_experts(source, prefix), hidden, ids, weights)
    outputs = {}
    for backend in ("deep_gemm", "torch"):
        experts = checkpoint.load_experts(0, device, backend=backend)
        for kind in ("deepep", "standin"):
            dispatcher = make_dispatcher(spec, one_rank_group, kind, device, one_rank_buffer)
            out = experts.forward(hidden, ids, weights, dispatcher)
            torch.cuda.synchronize()
            outputs[backend, kind] = out
            error = relative_l2(out, reference)
            print(f"one rank {case.name}: {kind} + {backend}: rel L2 vs fp32 source {error:.2e}")
            assert error < 1e-2
            assert not out.isnan().any() and (not case.drop or case.tokens < 3 or not out[2].any())
    for backend in ("deep_gemm", "torch"):
        assert_same_within_one_rounding(outputs[backend, "deepep"], outputs[backend, "standin"], f"one rank {case.name} {backend}")
    # The single-rank stand-in functions (no dispatcher) agree too.
    plain = checkpoint.load_experts(0, device).forward(hidden, ids, weights)
    torch.testing.assert_close(plain.float(), outputs["deep_gemm", "deepep"].float(), rtol=2**-7, atol=1e-5)


def test_deep_ep_low_latency_mode_keeps_nvlink_multicast_off(one_rank_buffer):
    assert one_rank_buffer.num_bytes >= rdma_bytes(128, 4096, 1, 24)
    assert os.environ.get("NVSHMEM_DISABLE_NVLS") == "1"
