"""deepep-bf16 runtime on CPU: forward_masked (torch fallback, and the DeepGEMM padding path through an
alignment-checking stand-in) against a per-token loop, the single-GPU dispatch/combine, and loading
a baked checkpoint through moebake.serve.open."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import moebake.serve
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import MoebakeError
from moebake.reference.synthetic_sources import write_bf16_moe
from moebake.schema.manifest import write_manifest
from moebake.serve.deepep_bf16 import DeepEPBf16Experts
from moebake.serve.dispatch import combine, dispatch, expected_m
from moebake.serve.masked_gemm import TORCH, MaskedGemm, default_backend, get_backend

BF16 = torch.bfloat16


def weights(E, H, I, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(E, 2 * I, H, generator=g) * 0.1).to(BF16), (torch.randn(E, H, I, generator=g) * 0.1).to(BF16)


def expert_reference(x, w13, w2):
    """One token through one expert, float64 dot products, rounded to BF16 where the kernels store BF16:
    gate/up (GEMM 1 output), the activation, and the result."""
    I = w13.shape[0] // 2
    gate = (w13[:I].double() @ x.double()).to(BF16).double()
    up = (w13[I:].double() @ x.double()).to(BF16).double()
    h = (gate / (1 + torch.exp(-gate)) * up).to(BF16).double()
    return (w2.double() @ h).to(BF16)


def masked_reference(x, masked_m, w13, w2):
    """[E, T, H]: the per-token loop over rows below masked_m; zeros elsewhere."""
    out = torch.zeros_like(x)
    for e in range(x.shape[0]):
        for t in range(int(masked_m[e])):
            out[e, t] = expert_reference(x[e, t], w13[e], w2[e])
    return out


def assert_bf16_close(got, expected):
    """Equal up to accumulation order: a few BF16 ulps of the values' scale."""
    torch.testing.assert_close(got.float(), expected.float(), rtol=2**-6, atol=2e-3)


def ll_input(E, T, H, masked_m, seed=1):
    """DeepEP-like input: rows below masked_m are tokens, the rest garbage (NaN, inf, huge)."""
    x = torch.randn(E, T, H, generator=torch.Generator().manual_seed(seed)).to(BF16)
    garbage = torch.tensor([float("nan"), float("inf"), -3e38], dtype=BF16)
    for e in range(E):
        x[e, int(masked_m[e]) :] = garbage[e % 3]
    return x


def checked_bmm(a, b, masked_m, expected_m):
    """A stand-in for DeepGEMM on CPU: refuses unaligned M/K exactly as the kernel would need, then bmm."""
    assert a.shape[1] % 128 == 0 and a.shape[2] % 64 == 0 and b.shape[2] == a.shape[2], (a.shape, b.shape)
    assert a.is_contiguous() and b.is_contiguous() and masked_m.dtype == torch.int32 and expected_m > 0
    return torch.bmm(a, b.transpose(1, 2))


ALIGNED = MaskedGemm("aligned", m_align=128, k_align=64, run=checked_bmm)


@pytest.mark.parametrize("backend", [TORCH, ALIGNED], ids=["torch", "deepgemm-alignment"])
@pytest.mark.parametrize("E, T, H, I", [(4, 16, 64, 32), (3, 10, 40, 24)])
def test_forward_masked_matches_the_per_token_loop(backend, E, T, H, I):
    w13, w2 = weights(E, H, I)
    masked_m = torch.tensor([0, T, 5, 1][:E], dtype=torch.int32)  # empty, full, partial
    x = ll_input(E, T, H, masked_m)
    experts = DeepEPBf16Experts(w13, w2, backend=backend)
    got = experts.forward_masked(x, masked_m, expected_m=6)
    assert got.dtype == BF16 and tuple(got.shape) == (E, T, H) and got.is_contiguous()
    assert_bf16_close(got, masked_reference(x, masked_m, w13, w2))
    for e in range(E):  # rows past masked_m: exactly zero whatever they held
        assert torch.equal(got[e, int(masked_m[e]) :], torch.zeros_like(got[e, int(masked_m[e]) :]))


def test_padded_weights_keep_gate_and_up_halves_apart():
    E, H, I = 2, 40, 24  # DeepGEMM alignment: H -> 64, I -> 64
    w13, w2 = weights(E, H, I)
    experts = DeepEPBf16Experts(w13, w2, backend=ALIGNED)
    p = experts.parameters()
    assert tuple(p["w13_weight"].shape) == (E, 128, 64) and tuple(p["w2_weight"].shape) == (E, 64, 64)
    assert torch.equal(p["w13_weight"][:, :I, :H], w13[:, :I]) and torch.equal(p["w13_weight"][:, 64 : 64 + I, :H], w13[:, I:])
    assert torch.equal(p["w2_weight"][:, :H, :I], w2)
    pad = torch.ones(E, 128, 64, dtype=torch.bool)
    pad[:, :I, :H] = pad[:, 64 : 64 + I, :H] = False
    assert not p["w13_weight"][pad].any()
    assert p["w2_weight"][:, H:].abs().sum() == 0 and p["w2_weight"][:, :, I:].abs().sum() == 0


def test_aligned_weights_are_used_in_place():
    w13, w2 = weights(2, 64, 64)
    experts = DeepEPBf16Experts(w13, w2, backend=ALIGNED)
    assert experts.w13.data_ptr() == w13.data_ptr() and experts.w2.data_ptr() == w2.data_ptr()


def test_bad_arguments_are_refused():
    w13, w2 = weights(2, 64, 32)
    with pytest.raises(ValueError, match="expected w13 BF16"):
        DeepEPBf16Experts(w13.float(), w2)
    with pytest.raises(ValueError, match="expected w13 BF16"):
        DeepEPBf16Experts(w13, w2[:, :, :16])
    experts = DeepEPBf16Experts(w13, w2)
    x, m = torch.zeros(2, 8, 64, dtype=BF16), torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="hidden_states must be BF16"):
        experts.forward_masked(x[:, :, :32], m, 1)
    with pytest.raises(ValueError, match="masked_m must be int32"):
        experts.forward_masked(x, m.long(), 1)
    with pytest.raises(ValueError, match="expected_m must be a positive int"):
        experts.forward_masked(x, m, 0)


def test_backend_choice_on_cpu():
    assert default_backend("cpu") is TORCH and get_backend(None, "cpu") is TORCH
    assert get_backend("torch", "cpu") is TORCH and get_backend(ALIGNED, "cpu") is ALIGNED
    with pytest.raises(ValueError, match="unknown masked GEMM backend 'cutlass'"):
        get_backend("cutlass", "cpu")


def routing(T, k, num_experts, seed=2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:k] for _ in range(T)])
    ids[0, 1] = -1  # a dropped choice
    return ids, torch.rand(T, k, generator=g)


def test_dispatch_packs_each_experts_tokens_in_token_order():
    T, k, E_local, offset, H = 12, 3, 4, 4, 8  # this rank holds experts 4..7 of 10
    hidden = torch.randn(T, H).to(BF16)
    ids, _ = routing(T, k, 10)
    recv_x, masked_m, _ = dispatch(hidden, ids, E_local, max_tokens=16, expert_offset=offset)
    assert tuple(recv_x.shape) == (E_local, 16, H) and masked_m.dtype == torch.int32
    for e in range(E_local):
        tokens = [t for t in range(T) if (offset + e) in ids[t].tolist()]
        assert int(masked_m[e]) == len(tokens)
        assert torch.equal(recv_x[e, : len(tokens)], hidden[tokens])
        assert not recv_x[e, len(tokens) :].any()
    with pytest.raises(ValueError, match="more than T_max=2"):
        dispatch(hidden, ids, E_local, max_tokens=2, expert_offset=offset)


@pytest.mark.parametrize("ep_rank", [0, 1])
def test_forward_is_the_routed_sum_of_this_ranks_experts(ep_rank):
    T, k, E, H, I = 9, 3, 8, 64, 32
    w13, w2 = weights(E, H, I)
    E_local = E // 2
    local = slice(ep_rank * E_local, (ep_rank + 1) * E_local)
    experts = DeepEPBf16Experts(w13[local], w2[local], first_expert=ep_rank * E_local)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(3)).to(BF16)
    ids, topk_weights = routing(T, k, E)
    got = experts.forward(hidden, ids, topk_weights)
    expected = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(k):
            e = int(ids[t, j])
            if local.start <= e < local.stop:
                expected[t] += float(topk_weights[t, j]) * expert_reference(hidden[t], w13[e], w2[e]).double()
    assert_bf16_close(got, expected.to(BF16))


def test_combine_weights_rows_and_sums_in_fp32():
    hidden = torch.arange(6, dtype=torch.float32).reshape(3, 2).to(BF16)
    ids = torch.tensor([[0, 1], [1, -1], [0, 1]])
    recv_x, masked_m, handle = dispatch(hidden, ids, 2)
    assert masked_m.tolist() == [2, 3]
    w = torch.tensor([[0.25, 0.75], [2.0, 9.0], [1.0, 1.0]])
    assert torch.equal(combine(recv_x, w, handle), torch.tensor([[0, 1], [4, 6], [8, 10]], dtype=BF16))


def test_expected_m_is_sglangs_hint():
    assert expected_m(128, 8, 64) == (128 * 8 + 64) // 64 == 17
    assert expected_m(1, 1, 256) == 1


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve_bf16")
    source = write_bf16_moe(root / "src", style="qwen3.5", mtp_layers=1, num_layers=1, num_experts=4, hidden=64, intermediate=32)
    convert(source, root / "out", ConvertOptions(target="deepep-bf16"), progress=False)
    return source, root / "out"


@pytest.mark.parametrize("ep_rank, ep_size", [(0, 1), (1, 2), (3, 4)])
def test_serve_open_loads_the_ranks_experts(baked, ep_rank, ep_size):
    source, out = baked
    tensors = load_file(next(source.glob("*.safetensors")))
    experts = moebake.serve.open(out).load_experts("mtp.layers.0.mlp.experts.", device="cpu", ep_rank=ep_rank, ep_size=ep_size)
    per_rank = 4 // ep_size
    rank = slice(ep_rank * per_rank, (ep_rank + 1) * per_rank)
    assert experts.backend is TORCH and experts.first_expert == rank.start and experts.num_local_experts == per_rank
    assert torch.equal(experts.w13, tensors["mtp.layers.0.mlp.experts.gate_up_proj"][rank])
    assert torch.equal(experts.w2, tensors["mtp.layers.0.mlp.experts.down_proj"][rank])
    assert experts.load_stats.bytes == experts.w13.nbytes + experts.w2.nbytes


def test_serve_open_refuses_an_ambiguous_index_and_uneven_ep(baked):
    _, out = baked
    checkpoint = moebake.serve.open(out)
    with pytest.raises(MoebakeError, match=r"MoE layer index 0 is ambiguous \(model\.language_model\.layers\.0\.mlp\.experts\., mtp"):
        checkpoint.load_experts(0, device="cpu")
    with pytest.raises(MoebakeError, match="cannot split evenly"):
        checkpoint.load_experts("mtp.layers.0.mlp.experts.", device="cpu", ep_size=3)
    with pytest.raises(MoebakeError, match="no MoE layer with prefix 'mtp.layers.1.mlp.experts.'"):
        checkpoint.load_experts("mtp.layers.1.mlp.experts.", device="cpu")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("activation", {"kind": "swiglu_oai", "alpha": 1.702, "beta": 1.0, "limit": 7.0}, "is not the silu\\(gate\\) \\* up"),
        ("target_layout_version", 2, "deepep-bf16 layout version 2; this runtime reads 1"),
    ],
)
def test_serve_open_refuses_what_the_runtime_would_compute_wrongly(baked, tmp_path, field, value, message):
    out = shutil.copytree(baked[1], tmp_path / "out")
    manifest = json.loads((out / "moebake.json").read_text())
    manifest[field] = value
    write_manifest(out, manifest)  # as a consistently wrong moebake would
    with pytest.raises(MoebakeError, match=message):
        moebake.serve.open(out)


def test_torch_fallback_keeps_garbage_rows_out_of_valid_rows():
    """torch's CPU BF16 GEMM spreads a NaN in one row of A to other rows at this size; the fallback zeroes them first."""
    a = torch.randn(2, 96, 1000).to(BF16)
    b = torch.randn(2, 400, 1000).to(BF16)
    masked_m = torch.tensor([50, 96], dtype=torch.int32)
    a[0, 50:] = float("nan")
    d = TORCH.run(a, b, masked_m, 48)
    assert not d.isnan().any()
    assert_bf16_close(d[0, :50], torch.bmm(a[:1, :50], b[:1].transpose(1, 2))[0])


def test_masked_activation_torch_path():
    """Off CUDA: silu(gate) * up on every row in fp32, and zeroing in place through a cropped view."""
    from moebake.serve.masked_activation import silu_and_mul_masked, zero_rows_past

    gate_up = torch.randn(2, 5, 8).to(BF16)
    gate, up = gate_up.double().chunk(2, dim=-1)
    expected = (gate / (1 + torch.exp(-gate)) * up).to(BF16)
    assert_bf16_close(silu_and_mul_masked(gate_up, torch.tensor([5, 2], dtype=torch.int32)), expected)
    y = torch.randn(2, 5, 6).to(BF16)
    before = y.clone()
    zero_rows_past(y[:, :, :4], torch.tensor([1, 5], dtype=torch.int32))
    assert not y[0, 1:, :4].any() and torch.equal(y[0, :1], before[0, :1]) and torch.equal(y[1], before[1])
    assert torch.equal(y[0, 1:, 4:], before[0, 1:, 4:])
