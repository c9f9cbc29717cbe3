"""``sm100-trtllm``: GPT-OSS and DeepSeek-V4 against SGLang-style constructions built from FlashInfer's helpers.

The oracles follow SGLang's load-time code for the SM100 ``flashinfer_mxfp4`` path, written out
here: GPT-OSS (``Mxfp4MoEMethod``): padded buffers (weights and biases zero, scales 127 = E8M0 2^0), naive copy of the pair-
interleaved rows, ``swap_every_two_rows``, FlashInfer's ``get_w2_permute_indices_with_cache`` rows;
DeepSeek-V4 (``Mxfp4FlashinferTrtllmMoEMethod``): ``[w1; w3]`` loaded, ``[w3; w1]`` folded into
FlashInfer's ``_maybe_get_cached_w3_w1_permute_indices`` rows. Scales then go through the 128x4
swizzle; on CPU FlashInfer's own torch port of it (``_swizzle_cutile_fp4_scales``) stands in for
the CUDA ``block_scale_interleave`` (compared on the GPU in tests/gpu).
"""

import json
import re

import pytest
import torch
from click.testing import CliRunner

from conftest import load_all
from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.targets import get_target
from moebake.formats import open_source
from moebake.reference.synthetic_sources import write_deepseek_v4
from moebake.schema.manifest import LayerRecord

EXPERT_TENSOR = re.compile(r"\.experts\.(\d+\.|gate_up_proj_|down_proj_)")  # routed-expert source tensors


def flashinfer_swizzle(sf: torch.Tensor) -> torch.Tensor:
    """FlashInfer's CPU 128x4 swizzle of ``[E, R, C]`` (R % 128 == 0, C % 4 == 0), kept ``[E, R, C]``."""
    prepare = pytest.importorskip("flashinfer.fused_moe.prepare")
    if not hasattr(prepare, "_swizzle_cutile_fp4_scales"):
        pytest.skip("this FlashInfer has no CPU 128x4 swizzle (_swizzle_cutile_fp4_scales, 0.7.x)")
    return prepare._swizzle_cutile_fp4_scales(sf, scale_block_size=32).reshape(sf.shape)


def gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return torch.stack([x[e][rows] for e in range(x.shape[0])])


def sglang_gpt_oss_layer(src, prefix, H, I, Hp, Ip):
    core = pytest.importorskip("flashinfer.fused_moe.core")
    E = src[prefix + "gate_up_proj_blocks"].shape[0]

    def padded(name, shape, width, dtype=torch.uint8, fill=0):
        buffer = torch.full((E, *shape), fill, dtype=dtype)
        buffer[(slice(None),) + tuple(slice(0, n) for n in width)] = src[prefix + name].reshape(E, *width)
        return buffer

    def swap_every_two_rows(x, axis):
        shape = list(x.shape)
        pairs = shape[:axis] + [shape[axis] // 2, 2] + shape[axis + 1 :]
        return x.reshape(pairs).flip(axis + 1).reshape(shape)

    w13 = swap_every_two_rows(padded("gate_up_proj_blocks", (2 * Ip, Hp // 2), (2 * I, H // 2)), 1)
    s13 = swap_every_two_rows(padded("gate_up_proj_scales", (2 * Ip, Hp // 32), (2 * I, H // 32), fill=127), 1)
    b13 = swap_every_two_rows(padded("gate_up_proj_bias", (2 * Ip,), (2 * I,), torch.bfloat16).float(), 1)
    w2 = padded("down_proj_blocks", (Hp, Ip // 2), (H, I // 2))
    s2 = padded("down_proj_scales", (Hp, Ip // 32), (H, I // 32), fill=127)
    b2 = padded("down_proj_bias", (Hp,), (H,), torch.bfloat16).float()

    def rows(x, sf=None):
        return core.get_w2_permute_indices_with_cache({}, x[0].reshape(x.shape[1], -1), 128, num_elts_per_sf=sf)

    return {
        "w13_weight": gather_rows(w13, rows(w13)),
        "w13_weight_scale": flashinfer_swizzle(gather_rows(s13, rows(s13, 16))).view(torch.float8_e4m3fn),
        "w13_weight_bias": gather_rows(b13, rows(b13)),
        "w2_weight": gather_rows(w2, rows(w2)),
        "w2_weight_scale": flashinfer_swizzle(gather_rows(s2, rows(s2, 16))).view(torch.float8_e4m3fn),
        "w2_weight_bias": gather_rows(b2, rows(b2)),
        "gemm1_alpha": torch.tensor([1.702] * E, dtype=torch.float32),
        "gemm1_beta": torch.tensor([1.0] * E, dtype=torch.float32),
        "gemm1_clamp_limit": torch.tensor([7.0] * E, dtype=torch.float32),
    }


def sglang_dsv4_layer(src, prefix, E, I, limit):
    core = pytest.importorskip("flashinfer.fused_moe.core")

    def stacked(projections, part):
        return torch.stack([torch.cat([src[f"{prefix}{e}.{p}.{part}"] for p in projections]) for e in range(E)])

    w13, s13 = stacked(("w1", "w3"), "weight"), stacked(("w1", "w3"), "scale").view(torch.uint8)
    w2, s2 = stacked(("w2",), "weight"), stacked(("w2",), "scale").view(torch.uint8)
    w3_w1 = torch.cat([torch.arange(I, 2 * I), torch.arange(0, I)])
    w13_rows = w3_w1[core._maybe_get_cached_w3_w1_permute_indices({}, w13[0].view(torch.uint8), 128)]
    s13_rows = w3_w1[core._maybe_get_cached_w3_w1_permute_indices({}, s13[0], 128, num_elts_per_sf=16)]
    w2_rows = core.get_w2_permute_indices_with_cache({}, w2[0].view(torch.uint8), 128)
    s2_rows = core.get_w2_permute_indices_with_cache({}, s2[0], 128, num_elts_per_sf=16)
    return {
        "w13_weight": gather_rows(w13, w13_rows),
        "w13_weight_scale": flashinfer_swizzle(gather_rows(s13, s13_rows)).view(torch.float8_e4m3fn),
        "w2_weight": gather_rows(w2, w2_rows),
        "w2_weight_scale": flashinfer_swizzle(gather_rows(s2, s2_rows)).view(torch.float8_e4m3fn),
        "gemm1_clamp_limit": torch.full((E,), limit, dtype=torch.float32),
    }


def check(source, out, expected_by_prefix):
    src, baked = load_all(source), load_all(out)
    manifest = json.loads((out / "moebake.json").read_text())
    for record in manifest["layers"]:
        expected = expected_by_prefix(record["prefix"])
        assert set(record["tensors"]) == set(expected) and record["epilogue_tile_m"] == 128
        for short, tensor in expected.items():
            got = baked[record["prefix"] + short]
            assert got.dtype == tensor.dtype and got.shape == tensor.shape, (short, got.dtype, got.shape)
            assert torch.equal(got.view(torch.uint8), tensor.view(torch.uint8)), short
    consumed = {n for n in src if EXPERT_TENSOR.search(n)}
    for name in set(src) - consumed:  # everything else passes through
        assert torch.equal(baked[name].view(torch.uint8), src[name].view(torch.uint8)), name
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(source), "--quiet"])
    assert result.exit_code == 0, result.output
    return manifest


@pytest.mark.oracle
def test_gpt_oss_equals_sglang_style_construction(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm100-trtllm", chunk_bytes=1 << 16), progress=False)
    src = load_all(gpt_oss_tiny)
    manifest = check(gpt_oss_tiny, out, lambda prefix: sglang_gpt_oss_layer(src, prefix, 160, 96, 256, 128))
    assert manifest["layers"][0]["tensors"]["w13_weight"]["gate_up_order"] == "up_gate_pairs"


@pytest.mark.oracle
def test_gpt_oss_hidden_multiple_256_like_sglang_0_5_23(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm100-trtllm", hidden_multiple=256, intermediate_multiple=256), progress=False)
    src = load_all(gpt_oss_tiny)
    check(gpt_oss_tiny, out, lambda prefix: sglang_gpt_oss_layer(src, prefix, 160, 96, 256, 256))


@pytest.mark.oracle
def test_deepseek_v4_equals_sglang_style_construction(tmp_path):
    source = write_deepseek_v4(tmp_path / "src", num_layers=2, num_experts=3, hidden=256, intermediate=128, mtp_layers=1)
    out = tmp_path / "out"
    convert(source, out, ConvertOptions("sm100-trtllm", chunk_bytes=1 << 16), progress=False)
    src = load_all(source)
    manifest = check(source, out, lambda prefix: sglang_dsv4_layer(src, prefix, 3, 128, 10.0))
    assert len(manifest["layers"]) == 3 and manifest["activation"]["limit"] == 10.0


def test_deepseek_v4_without_limit_has_no_clamp_tensor(tmp_path):
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=2, mtp_layers=0, swiglu_limit=None)
    _, layers = get_target("sm100-trtllm").plan(open_source(source), ConvertOptions("sm100-trtllm"))
    assert set(layers[0].tensors) == {"w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"}


def test_restore_inverts_any_run_of_experts(tmp_path):
    source = write_deepseek_v4(tmp_path / "src", num_layers=1, num_experts=3, mtp_layers=0)
    out = tmp_path / "out"
    manifest = convert(source, out, ConvertOptions("sm100-trtllm"), progress=False).to_json()
    src, baked = load_all(source), load_all(out)
    record = manifest["layers"][0]
    tensors = {s: baked[record["prefix"] + s][1:3] for s in record["tensors"]}
    restored = get_target("sm100-trtllm").restore(LayerRecord.from_json(record, "m"), tensors, "v2")
    assert set(restored) == {f"layers.0.ffn.experts.*.w{i}.{p}" for i in (1, 2, 3) for p in ("weight", "scale")}
    for pattern, tensor in restored.items():
        expected = torch.stack([src[pattern.replace("*", str(e))].view(torch.uint8) for e in (1, 2)])
        assert torch.equal(tensor.view(torch.uint8), expected), pattern
