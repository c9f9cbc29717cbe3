"""DeepSeek-V4 experts baked for ``sm90-cutlass``, run through FlashInfer's ``cutlass_fused_moe`` (W4A16) on SM90.

A tiny synthetic DeepSeek-V4 checkpoint is baked, its baked layer tensors are passed to
``cutlass_fused_moe`` the way SGLang's DeepSeek-V4 SM90 method calls it (no biases, the SwiGLU
limit per expert, alpha/beta left to the kernel's defaults 1 and 0), and the output is compared
with a float32 reference computed from the *source* tensors dequantized: per routed expert
``silu(min(x w1^T, L)) * clamp(x w3^T, -L, L) @ w2^T`` (DeepSeek's ``Expert.forward``), weighted by
the routing weights. Criterion (FlashInfer's own): >= 99.9 % of elements within rtol = atol = 0.1,
plus a relative RMS bound. A reference with gate and up swapped must fail it (the check can fail).

FlashInfer is called directly; :func:`moebake.serve.jit.flashinfer_build.ensure_flashinfer_sm90_moe`
(FlashInfer's SM90 MoE JIT reduced to the W4A16 path) is installed first when present.
Skipped without CUDA, an SM90 GPU or FlashInfer.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import write_deepseek_v4
from mxfp4_oracle import dequantize

pytestmark = pytest.mark.gpu

SHAPE = {"num_experts": 8, "hidden": 512, "intermediate": 256}
LIMIT = 4.0  # small enough that the clamps act on a good share of the activations
INPUT_SCALE = 4.0  # hidden states ~N(0, 4^2): outputs are O(1), well above the 0.1 tolerance
TOP_K = 2


def _cutlass_fused_moe():
    """FlashInfer's ``cutlass_fused_moe``, with moebake's reduced SM90 JIT module installed first if available."""
    try:
        from moebake.serve.flashinfer_ops import sm90_moe_ops  # installs it once per process
    except ImportError:
        try:
            from moebake.serve.jit.flashinfer_build import ensure_flashinfer_sm90_moe
        except ImportError:
            pass
        else:
            ensure_flashinfer_sm90_moe()
    else:
        return sm90_moe_ops().cutlass_fused_moe
    from flashinfer.fused_moe import cutlass_fused_moe

    return cutlass_fused_moe


@pytest.fixture(scope="module")
def gpu(sm90_gpu):
    return sm90_gpu


@pytest.fixture(scope="module")
def baked(tmp_path_factory, gpu):
    root = tmp_path_factory.mktemp("dsv4-sm90")
    source = write_deepseek_v4(root / "src", num_layers=1, mtp_layers=0, swiglu_limit=LIMIT, seed=5, **SHAPE)
    convert(source, root / "out", ConvertOptions("sm90-cutlass"), progress=False)
    return source, root / "out"


def _load(directory, names):
    index = json.loads((directory / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = {}
    for shard in sorted({index[n] for n in names}):
        tensors.update({n: t for n, t in load_file(directory / shard).items() if n in names})
    return tensors


def _inputs(tokens, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(tokens, SHAPE["hidden"], generator=g, device=device) * INPUT_SCALE).to(torch.bfloat16)
    weights, ids = torch.topk(torch.softmax(torch.randn(tokens, SHAPE["num_experts"], generator=g, device=device), -1), TOP_K)
    return x, ids.to(torch.int32), weights / weights.sum(-1, keepdim=True)


def dequantized_reference(source, shape, x, ids, weights, swap_gate_up=False):
    """float32 DeepSeek-V4 routed-expert output of layer 0 from the dequantized source experts, with the source's
    SwiGLU limit (config.json's ``swiglu_limit``); ``shape`` gives ``num_experts`` and ``hidden``."""
    prefix, E = "layers.0.ffn.experts.", shape["num_experts"]
    limit = json.loads((source / "config.json").read_text())["swiglu_limit"]
    src = _load(source, [f"{prefix}{e}.w{i}.{p}" for e in range(E) for i in (1, 2, 3) for p in ("weight", "scale")])

    def weight(e, i):
        return dequantize(src[f"{prefix}{e}.w{i}.weight"].view(torch.uint8), src[f"{prefix}{e}.w{i}.scale"].view(torch.uint8)).to(x.device)

    out = torch.zeros(x.shape[0], shape["hidden"], device=x.device)
    for e in ids.unique().tolist():
        token, slot = (ids == e).nonzero(as_tuple=True)
        gate, up = x[token].float() @ weight(e, 1).T, x[token].float() @ weight(e, 3).T
        if swap_gate_up:
            gate, up = up, gate
        h = torch.nn.functional.silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)
        out.index_add_(0, token, (h @ weight(e, 2).T) * weights[token, slot, None])
    return out


def _run(out_dir, x, ids, weights, **swiglu):
    prefix = "layers.0.ffn.experts."
    names = ["w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"]
    t = {n: v.to(x.device) for n, v in _load(out_dir, [prefix + n for n in names]).items()}
    out = torch.empty_like(x)  # FlashInfer 0.7.2 returns a list; the result lands in `output`
    _cutlass_fused_moe()(
        x,
        ids,
        weights,
        t[prefix + "w13_weight"],
        t[prefix + "w2_weight"],
        torch.bfloat16,
        quant_scales=[t[prefix + "w13_weight_scale"].view(torch.int32), t[prefix + "w2_weight_scale"].view(torch.int32)],
        use_w4_group_scaling=True,
        output=out,
        **swiglu,
    )
    return out


def _within(out, reference):
    return ((out - reference).abs() <= 0.1 + 0.1 * reference.abs()).float().mean().item()


@pytest.mark.parametrize("tokens", [1, 256])
def test_baked_deepseek_v4_matches_dequantized_reference(gpu, baked, tokens):
    source, out_dir = baked
    manifest = json.loads((out_dir / "moebake.json").read_text())
    assert manifest["activation"] == {"kind": "swiglu", "alpha": 1.0, "beta": 0.0, "limit": LIMIT}
    E = SHAPE["num_experts"]
    x, ids, weights = _inputs(tokens, gpu)
    limit = torch.full((E,), LIMIT, dtype=torch.float32, device=gpu)
    out = _run(out_dir, x, ids, weights, swiglu_limit=limit).float()  # as SGLang 0.5.23 calls it
    reference = dequantized_reference(source, SHAPE, x, ids, weights)
    within, relative_rms = _within(out, reference), ((out - reference).norm() / reference.norm()).item()
    print(
        f"\n{tokens} tokens: {within:.5%} within rtol=atol=0.1, relative RMS error {relative_rms:.2e}, "
        f"reference std {reference.std().item():.3f}"
    )
    assert reference.std() > 0.5
    assert within >= 0.999 and relative_rms < 0.02
    assert _within(out, dequantized_reference(source, SHAPE, x, ids, weights, swap_gate_up=True)) < 0.9  # gate/up order matters
    explicit = _run(
        out_dir, x, ids, weights, swiglu_alpha=torch.ones(E, device=gpu), swiglu_beta=torch.zeros(E, device=gpu), swiglu_limit=limit
    ).float()
    assert torch.equal(explicit, out)  # the manifest's alpha = 1, beta = 0 are the kernel's defaults


def test_moebake_runtime_serves_deepseek_v4_like_the_direct_call(gpu, baked):
    """``moebake.serve`` drives the kernel from the manifest (no bias, plain SwiGLU with limit)."""
    import moebake.serve

    _, out_dir = baked
    E = SHAPE["num_experts"]
    x, ids, weights = _inputs(64, gpu, seed=3)
    experts = moebake.serve.open(out_dir).load_experts(0, device=gpu)
    direct = _run(out_dir, x, ids, weights, swiglu_limit=torch.full((E,), LIMIT, dtype=torch.float32, device=gpu))
    assert torch.equal(experts.forward(x, ids, weights), direct)
