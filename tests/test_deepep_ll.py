"""DeepEP low-latency path on CPU: the refusals (one line each), the LL buffer-size arithmetic, the
multi-rank stand-in dispatcher, the DeepEP dispatcher's calls (against a DeepEP-shaped fake that
orders rows by arrival and leaves garbage in the padding, as DeepEP does), and the EP launcher end
to end with 2 gloo processes: every rank loads its half of the experts from a bake and its output
matches an fp32 MoE over all experts computed from the SOURCE checkpoint."""

import types

import pytest
import torch

import moebake.serve
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import MoebakeError
from moebake.reference.moe_fp32 import decode_inputs, moe_fp32, read_source_experts, relative_l2
from moebake.reference.synthetic_sources import write_bf16_moe
from moebake.serve import deepep_ll
from moebake.serve.deepep_bf16 import DeepEPBf16Experts, make_dispatcher
from moebake.serve.deepep_ll import LL_HIDDEN_SIZES, LowLatencyBuffer, LowLatencyRefusal, LowLatencySpec, rdma_bytes
from moebake.serve.dispatch import StandInDispatcher, dispatch
from moebake.serve.ep_launch import LaunchConfig, LayerJob, launch, main, plan

BF16 = torch.bfloat16


def one_line_refusal(call, match):
    with pytest.raises(LowLatencyRefusal, match=match) as info:
        call()
    assert "\n" not in str(info.value)


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, match",
    [
        (LowLatencySpec(1000, 8, 128), r"hidden size 1000 is not one DeepEP low-latency kernels are built for \(2048, 2560, 3072"),
        (LowLatencySpec(2048, 64, 128, 1, 12), r"top-k 12 is above DeepEP low-latency's maximum of 11"),
        (LowLatencySpec(2048, 64, 512), r"max tokens per rank 512 is above DeepEP low-latency's 511"),
        (LowLatencySpec(2048, 10, 128, 4), r"10 experts cannot be split evenly over 4 EP ranks"),
        (LowLatencySpec(2048, 8, 3, 1), r"ranks x max tokens per rank = 3 must be a multiple of 4"),
        (LowLatencySpec(2048, 8, 128, 1, 9), r"top-k 9 is more than the layer's 8 experts"),
        (LowLatencySpec(2048, 8, 0), r"max_tokens_per_rank must be a positive integer, got 0"),
    ],
)
def test_deep_ep_refusals(spec, match):
    one_line_refusal(lambda: spec.check(deep_ep=True), match)


def test_the_stand_in_runs_what_deep_ep_refuses_but_not_uneven_experts():
    for spec in (LowLatencySpec(1000, 8, 128), LowLatencySpec(2048, 64, 128, 1, 12), LowLatencySpec(2048, 64, 600)):
        spec.check(deep_ep=False)
        StandInDispatcher(spec)
    one_line_refusal(lambda: LowLatencySpec(64, 10, 128, 4).check(deep_ep=False), "cannot be split evenly")


def test_every_supported_hidden_and_top_k_up_to_11_pass():
    for hidden in LL_HIDDEN_SIZES:
        LowLatencySpec(hidden, 512, 128, 8, 11).check()


def test_a_batch_larger_than_the_buffer_is_refused():
    spec = LowLatencySpec.for_tokens(2048, 8, 100, top_k=2)
    assert spec.max_tokens_per_rank == 128
    spec.check_batch(128, 2)
    one_line_refusal(lambda: spec.check_batch(129, 2), r"129 tokens on this rank are more than num_max_dispatch_tokens_per_rank=128")
    one_line_refusal(lambda: spec.check_batch(1, 3), r"routes each token to 3 experts, the dispatcher was made for top-k <= 2")
    hidden, ids, weights = decode_inputs(129, 64, 8, 2, seed=0)
    one_line_refusal(lambda: StandInDispatcher(LowLatencySpec(64, 8, 128, 1, 2)).dispatch(hidden, ids), "129 tokens")


# --- buffer sizing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, ranks, expected",
    [(1, 1, 128), (128, 1, 128), (129, 1, 256), (1, 2, 64), (65, 2, 128), (1, 3, 128), (100, 8, 112), (1, 16, 8), (5, 256, 5)],
)
def test_max_tokens_per_rank_is_rounded_for_128_row_gemm_tiles(tokens, ranks, expected):
    spec = LowLatencySpec.for_tokens(4096, 512, tokens, ranks)
    assert spec.max_tokens_per_rank == expected and spec.t_max % 128 == 0
    assert spec.num_local_experts == 512 // ranks


def test_rdma_bytes_follows_deep_eps_low_latency_layout():
    # DeepEP's own test defaults: 128 tokens per rank, H = 7168, 8 ranks, 288 experts.
    # dispatch message: 16-byte header + max(2 * 7168, 7168 + 4 * 56) = 14352 bytes;
    # combine message: 4 * 56 + 2 * 7168 = 14560 bytes; send = max(128 * 14352, 288 * 128 * 14560);
    # receive = 288 * 128 * 14560; signaling = 288 * 4 -> 1152 (a multiple of 128); two of each.
    send = recv = 288 * 128 * 14560
    total = 2 * (1152 + send + recv)
    assert rdma_bytes(128, 7168, 8, 288) == total + 128 - total % 128 == 2146961792
    # Qwen3.5-35B-A3B on one rank: 256 experts, H = 2048: combine messages dominate both areas.
    send = recv = 256 * 128 * (4 * 16 + 2 * 2048)
    assert rdma_bytes(128, 2048, 1, 256) == (2 * (1024 + send + recv) // 128 + 1) * 128
    # one expert, 4 tokens: the signaling area (4 bytes) is padded to 128
    assert rdma_bytes(4, 2048, 1, 1) == (2 * (128 + 4 * 4160 + 4 * 4160) // 128 + 1) * 128 == 66944
    assert LowLatencySpec(7168, 288, 128, 8).rdma_bytes() == rdma_bytes(128, 7168, 8, 288)


# --- dispatchers on one rank --------------------------------------------------------------------


def weights(E, H, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, 2 * I, H, generator=g) * 0.05).to(BF16), (torch.randn(E, H, I, generator=g) * 0.05).to(BF16)


def test_stand_in_dispatcher_on_one_rank_matches_the_plain_forward():
    E, H, I, T, k = 6, 64, 32, 11, 3
    w13, w2 = weights(E, H, I)
    experts = DeepEPBf16Experts(w13, w2)
    hidden, ids, topk_weights = decode_inputs(T, H, E, k, seed=1)
    spec = LowLatencySpec.for_tokens(H, E, T, 1, k)
    got = experts.forward(hidden, ids, topk_weights, StandInDispatcher(spec))
    torch.testing.assert_close(got.float(), experts.forward(hidden, ids, topk_weights).float(), rtol=2**-7, atol=1e-4)
    reference = moe_fp32(types.SimpleNamespace(gate_up=w13, down=w2), hidden, ids, topk_weights)
    assert relative_l2(got, reference) < 1e-2
    assert not got[2].any()  # token 2 selects no expert


class FakeGroup:
    def __init__(self, rank=0, size=1):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


class FakeDeepEPBuffer:
    """DeepEP LL's BF16 contract on one rank: rows of an expert in a shuffled (arrival) order, NaN padding."""

    made = []

    @staticmethod
    def get_low_latency_rdma_size_hint(max_tokens, hidden, ranks, experts):
        return rdma_bytes(max_tokens, hidden, ranks, experts)

    def __init__(
        self,
        group,
        num_nvl_bytes=0,
        num_rdma_bytes=0,
        low_latency_mode=False,
        num_qps_per_rank=24,
        allow_nvlink_for_low_latency_mode=True,
        allow_mnnvl=False,
        use_fabric=False,
        explicitly_destroy=False,
        enable_shrink=False,
        comm=None,
    ):
        assert group.size() == 1 and low_latency_mode and num_nvl_bytes == 0
        self.kwargs = dict(num_rdma_bytes=num_rdma_bytes, num_qps_per_rank=num_qps_per_rank, explicitly_destroy=explicitly_destroy)
        self.cleaned, self.destroyed = [], False
        FakeDeepEPBuffer.made.append(self)

    def clean_low_latency_buffer(self, max_tokens, hidden, experts):
        self.cleaned.append((max_tokens, hidden, experts))

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8=True, **kwargs):
        assert not use_fp8 and topk_idx.dtype == torch.int64 and x.dtype == BF16 and x.is_contiguous()
        assert x.shape[0] <= num_max_dispatch_tokens_per_rank and self.kwargs["num_rdma_bytes"] >= rdma_bytes(
            num_max_dispatch_tokens_per_rank, x.shape[1], 1, num_experts
        )
        recv_x, count, handle = dispatch(x, topk_idx, num_experts, max_tokens=num_max_dispatch_tokens_per_rank)
        order = torch.arange(recv_x.shape[1]).repeat(num_experts, 1)
        for e in range(num_experts):
            m = int(count[e])
            order[e, :m] = torch.randperm(m, generator=torch.Generator().manual_seed(e))
        recv_x = torch.where(
            torch.arange(recv_x.shape[1])[None, :, None] < count[:, None, None],
            torch.gather(recv_x, 1, order[..., None].expand_as(recv_x)),
            float("nan"),
        ).to(BF16)
        return recv_x, count, (handle, order, num_max_dispatch_tokens_per_rank), None, None

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, **kwargs):
        assert topk_weights.dtype == torch.float32 and x.is_contiguous()
        handle, order, _ = handle
        unshuffled = torch.empty_like(x).scatter_(1, order[..., None].expand_as(x), x)
        from moebake.serve.dispatch import combine

        return combine(unshuffled, topk_weights, handle), None, None

    def destroy(self):
        self.destroyed = True


@pytest.fixture()
def fake_deep_ep(monkeypatch):
    module = types.SimpleNamespace(Buffer=FakeDeepEPBuffer, topk_idx_t=torch.int64)
    monkeypatch.setattr(deepep_ll, "deep_ep_status", lambda: (module, ""))
    FakeDeepEPBuffer.made.clear()
    return module


def test_deep_ep_dispatcher_calls_the_ll_buffer_as_deep_ep_expects(fake_deep_ep):
    E, H, I, k = 8, 2048, 64, 4
    w13, w2 = weights(E, H, I, seed=2)
    experts = DeepEPBf16Experts(w13, w2)
    small, large = LowLatencySpec.for_tokens(H, E, 7, 1, k), LowLatencySpec(H, E, 256, 1, k)
    buffer = LowLatencyBuffer(FakeGroup(), [small, large])
    assert buffer.buffer.kwargs == {"num_rdma_bytes": rdma_bytes(256, H, 1, E), "num_qps_per_rank": E, "explicitly_destroy": True}
    for spec, T, seed in ((small, 7, 3), (large, 200, 4), (large, 5, 5)):
        hidden, ids, topk_weights = decode_inputs(T, H, E, k, seed=seed)
        got = experts.forward(hidden, ids, topk_weights, make_dispatcher(spec, FakeGroup(), "deepep", "cpu", buffer))
        expected = experts.forward(hidden, ids, topk_weights, StandInDispatcher(spec))
        assert not got.isnan().any()
        torch.testing.assert_close(got.float(), expected.float(), rtol=2**-7, atol=1e-4)
    assert buffer.buffer.cleaned == [(256, H, E)]  # one layout switch, small -> large
    buffer.close()
    assert FakeDeepEPBuffer.made[0].destroyed and buffer.buffer is None


def test_deep_ep_buffer_refuses_a_spec_it_was_not_sized_for(fake_deep_ep):
    buffer = LowLatencyBuffer(FakeGroup(), [LowLatencySpec(2048, 8, 128, 1, 2)])
    one_line_refusal(lambda: buffer.dispatcher(LowLatencySpec(2048, 16, 128, 1, 2)), "bytes of DeepEP LL buffer, this buffer has")
    one_line_refusal(lambda: buffer.dispatcher(LowLatencySpec(1000, 8, 128, 1, 2)), "hidden size 1000")
    one_line_refusal(
        lambda: LowLatencyBuffer(FakeGroup(), [LowLatencySpec(2048, 8, 128, 2, 2)]), "for 2 EP ranks cannot run on a group of 1"
    )


def test_auto_dispatcher_falls_back_to_the_stand_in():
    spec = LowLatencySpec(2048, 8, 128, 1, 2)
    assert make_dispatcher(spec, None, "auto", "cpu").name == "standin"
    with pytest.raises(ValueError, match="unknown dispatcher 'nccl'"):
        make_dispatcher(spec, None, "nccl")


def test_auto_dispatcher_picks_deep_ep_when_usable(fake_deep_ep, monkeypatch):
    spec = LowLatencySpec(2048, 8, 128, 1, 2)
    assert make_dispatcher(spec, FakeGroup(), "auto", "cuda").name == "deepep"
    assert make_dispatcher(LowLatencySpec(1000, 8, 128, 1, 2), FakeGroup(), "auto", "cuda").name == "standin"


# --- the launcher -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bakes(tmp_path_factory):
    """A Qwen3.5-style (fused) and a Qwen3-style (per-expert) BF16 MoE source, each with its deepep-bf16 bake."""
    root = tmp_path_factory.mktemp("ep")
    made = {}
    for style, E in (("qwen3.5", 8), ("qwen3", 4)):
        source = write_bf16_moe(root / f"{style}-src", style=style, num_layers=1, num_experts=E, hidden=64, intermediate=32)
        convert(source, root / f"{style}-out", ConvertOptions(target="deepep-bf16"), progress=False)
        made[style] = (str(source), str(root / f"{style}-out"))
    return made


def test_launcher_refuses_before_starting_any_rank(bakes):
    source, bake = bakes["qwen3.5"]
    job = LayerJob(bake, 0, 4, top_k=2)
    cases = [
        (LaunchConfig(3, (job,), device="cpu"), "8 experts cannot be split evenly over 3 EP ranks"),
        (LaunchConfig(2, (job,), device="cpu", dispatcher="deepep"), "hidden size 64 is not one DeepEP low-latency kernels"),
        (
            LaunchConfig(1, (LayerJob(bake, 0, 300, top_k=2, max_tokens_per_rank=200),), device="cpu"),
            "300 tokens on this rank are more than num_max_dispatch_tokens_per_rank=256",
        ),
        (LaunchConfig(1, (LayerJob(bake, 0, 4, top_k=9),), device="cpu"), "top-k 9 is more than the layer's 8 experts"),
        (LaunchConfig(1, (LayerJob(bake, 0, 0),), device="cpu"), "tokens per rank must be a positive integer, got 0"),
        (LaunchConfig(0, (job,), device="cpu"), "ranks must be a positive integer, got 0"),
        (LaunchConfig(1, (job,), device="cpu", dispatcher="mpi"), "dispatcher must be one of auto, deepep, standin"),
        (LaunchConfig(1, (job,), device="cpu", cuda_graph=True), "--cuda-graph needs --device cuda"),
        (LaunchConfig(1, (job,), device="tpu"), "device must be one of cuda, cpu"),
        (LaunchConfig(1, (LayerJob(bake, 5, 4),), device="cpu"), "no MoE layer 5"),
        (LaunchConfig(1, (LayerJob(source, 0, 4),), device="cpu"), "moebake.json"),
    ]
    if not torch.cuda.is_available():
        cases.append((LaunchConfig(2, (job,), device="cuda", dispatcher="standin"), "2 EP ranks need 2 GPUs .* this machine has 0"))
    for config, match in cases:
        with pytest.raises(MoebakeError, match=match) as info:
            plan(config)
        assert "\n" not in str(info.value)


def test_launcher_command_line_refusal_is_one_error_line(bakes, capsys):
    _, bake = bakes["qwen3.5"]
    assert main([bake, "--ranks", "3", "--device", "cpu", "--top-k", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "cannot be split evenly over 3 EP ranks" in err[0]


def test_launcher_two_gloo_ranks_each_load_half_and_match_the_source_fp32_moe(bakes):
    """2 CPU processes (gloo), the stand-in dispatcher: fused and per-expert sources, tokens with -1 ids."""
    (fused_src, fused_bake), (split_src, split_bake) = bakes["qwen3.5"], bakes["qwen3"]
    jobs = (
        LayerJob(fused_bake, 0, 7, top_k=3, source=fused_src),
        LayerJob(split_bake, 0, 9, top_k=2, seed=1, source=split_src),
        LayerJob(fused_bake, "model.language_model.layers.0.mlp.experts.", 1, top_k=8, seed=2, source=fused_src, drop=False),
    )
    results = launch(LaunchConfig(2, jobs, device="cpu", keep_outputs=True))
    assert [r["rank"] for r, *_ in results] == [0, 1]
    for rank, rank_results in enumerate(results):
        assert [r["experts"] for r in rank_results] == [(4 * rank, 4 * rank + 4), (2 * rank, 2 * rank + 2), (4 * rank, 4 * rank + 4)]
        for job, result in zip(jobs, rank_results):
            assert result["dispatcher"] == "standin" and result["backend"] == "torch" and result["tokens"] == job.tokens_per_rank
            assert result["rel_l2"] < 1e-2, result
        assert rank_results[0]["dropped_choices"] > 0 and rank_results[2]["dropped_choices"] == 0
        # Independently of the launcher: this rank's inputs through all experts of the source, in fp32.
        job = jobs[1]
        hidden, ids, topk_weights = decode_inputs(9, 64, 4, 2, seed=job.seed * 1009 + rank, drop=True)
        reference = moe_fp32(read_source_experts(split_src, "model.layers.0.mlp.experts."), hidden, ids, topk_weights)
        assert relative_l2(rank_results[1]["output"], reference) == pytest.approx(rank_results[1]["rel_l2"])
        assert not rank_results[0]["output"][2].any()  # token 2 selected no expert


def test_launcher_one_rank_matches_rank_0_of_two(bakes):
    source, bake = bakes["qwen3.5"]
    job = LayerJob(bake, 0, 7, top_k=3, source=source)
    ((one,),) = launch(LaunchConfig(1, (job,), device="cpu", keep_outputs=True))
    two = launch(LaunchConfig(2, (job,), device="cpu", keep_outputs=True))
    assert one["experts"] == (0, 8) and two[0][0]["experts"] == (0, 4)
    torch.testing.assert_close(one["output"].float(), two[0][0]["output"].float(), rtol=2**-7, atol=1e-5)


def test_serve_checkpoint_gives_the_low_latency_spec(bakes):
    _, bake = bakes["qwen3.5"]
    checkpoint = moebake.serve.open(bake)
    assert checkpoint.top_k() == 2  # num_experts_per_tok of the synthetic config
    assert checkpoint.low_latency_spec(0, 100, ep_size=2) == LowLatencySpec(64, 8, 128, 2, 2)
    with pytest.raises(LowLatencyRefusal, match="cannot be split evenly over 3"):
        checkpoint.low_latency_spec(0, 1, ep_size=3)
