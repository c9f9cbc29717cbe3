"""End to end: ModelOpt NVFP4 -> cutedsl / cutedsl-deepep, checked against an independent SGLang-style construction.

The reference loads the checkpoint the way SGLang's ModelOptNvFp4FusedMoEMethod does (W13 halves
[up; gate] for the standard CuteDSL path, [gate; up] for DeepEP), applies FlashInfer's own CPU
helpers (``_interleave_linear_and_gate``, ``_swizzle_cutile_fp4_scales``), makes the gate/up globals
one with a brute-force E4M3 rounding, and recomputes SGLang's derived scalars in numpy float32.
"""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.source_check import compare_with_source
from moebake.convert.targets import get_target
from moebake.errors import MoebakeError
from moebake.formats import open_source
from moebake.formats.checkpoint import per_expert_names
from moebake.reference.synthetic_sources import write_modelopt_nvfp4
from moebake.schema.manifest import LayerRecord
from test_convert_gpt_oss import load_all
from test_nvfp4_gate_up import brute_force_e4m3

H, I, E = 256, 128, 4  # two experts per 64 KiB chunk: W13 streams in two expert ranges
QUANTIZED = ("model.layers.1.mlp.experts.", "model.layers.2.mlp.experts.")
TARGETS = {name: get_target(name) for name in ("cutedsl", "cutedsl-deepep")}
F32_BITS = np.uint32


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return write_modelopt_nvfp4(tmp_path_factory.mktemp("nvfp4") / "src", hidden=H, intermediate=I, num_experts=E)


@pytest.fixture(scope="module")
def baked(source, tmp_path_factory):
    root = tmp_path_factory.mktemp("baked")
    for name in TARGETS:
        convert(source, root / name, ConvertOptions(name, chunk_bytes=1 << 16), progress=False)
    return {name: root / name for name in TARGETS}


def shared_globals(src, prefix):
    """Per expert: the larger of the gate/up F32 globals, and each half's block scales brought to it."""
    out = {}
    for e in range(E):
        name = f"{prefix}{e}.{{}}_proj.{{}}"
        g, u = (float(src[name.format(p, "weight_scale_2")]) for p in ("gate", "up"))
        S = max(g, u)
        for proj, s in (("gate", g), ("up", u)):
            scales = src[name.format(proj, "weight_scale")].view(torch.uint8)
            if s < S:
                exact = scales.view(torch.float8_e4m3fn).double() * s / S
                scales = brute_force_e4m3(exact.flatten()).reshape(scales.shape)
            out[e, proj] = scales
        out[e] = S
    return out


def reference_layer(src, prefix, target):
    prepare = pytest.importorskip("flashinfer.fused_moe.prepare")
    shared = shared_globals(src, prefix)
    first, second = ("up", "gate") if target == "cutedsl" else ("gate", "up")
    w13 = torch.zeros(E, 2 * I, H // 2, dtype=torch.uint8)
    s13 = torch.zeros(E, 2 * I, H // 16, dtype=torch.uint8)
    for e in range(E):  # SGLang's per-expert loader: shard w1 (gate) / w3 (up) into its half
        for half, proj in enumerate((first, second)):
            w13[e, half * I : (half + 1) * I] = src[f"{prefix}{e}.{proj}_proj.weight"]
            s13[e, half * I : (half + 1) * I] = shared[e, proj]
    if target == "cutedsl":
        w13 = prepare._interleave_linear_and_gate(w13, group_size=64, dim=1)
        s13 = prepare._interleave_linear_and_gate(s13, group_size=64, dim=1)
    w2 = torch.stack([src[f"{prefix}{e}.down_proj.weight"] for e in range(E)])
    s2 = torch.stack([src[f"{prefix}{e}.down_proj.weight_scale"].view(torch.uint8) for e in range(E)])
    swizzle = prepare._swizzle_cutile_fp4_scales
    return {
        "w13_weight": w13,
        "w13_weight_scale_linear": s13,
        "w13_weight_scale": swizzle(s13, scale_block_size=16).reshape(E, 2 * I, H // 16),
        "w2_weight": w2,
        "w2_weight_scale": swizzle(s2, scale_block_size=16).reshape(E, H, I // 16),
    } | reference_scalars(src, prefix, shared, target)


def reference_scalars(src, prefix, shared, target):
    """SGLang's process_weights_after_loading (CuteDSL branch) and resolve_cutedsl_standard_scales, in numpy float32."""

    def column(proj, part):
        return np.array([np.float32(src[f"{prefix}{e}.{proj}_proj.{part}"]) for e in range(E)], dtype=np.float32)

    ws13 = np.array([[shared[e], shared[e]] for e in range(E)], dtype=np.float32)
    in13 = np.stack([column("gate", "input_scale"), column("up", "input_scale")], 1)
    ws2, in2 = column("down", "weight_scale_2"), column("down", "input_scale")
    raw = {"w13_weight_scale_2": ws13, "w2_weight_scale_2": ws2, "w13_input_scale": in13, "w2_input_scale": in2}
    one = np.float32(1)
    w13_input = np.full(E, in13.max(), dtype=np.float32)
    w13_quant, w2_quant = one / w13_input, one / in2
    if target == "cutedsl-deepep":
        return raw | {
            "g1_alphas": w13_input * ws13[:, 0],
            "g1_alphas_up": w13_input * ws13[:, 1],
            "g2_alphas": in2 * ws2,
            "w13_input_scale_quant": w13_quant,
            "w2_input_scale_quant": w2_quant,
        }
    fc2 = w2_quant.min()
    return raw | {
        "w1_alpha": ws13[:, 0] / w13_quant.min(),
        "w2_alpha": ws2 / fc2,
        "fc2_input_scale": np.array([fc2], dtype=np.float32),
        "w13_input_scale_quant": w13_quant,
        "g1_alphas_up": w13_input * ws13[:, 1],
    }


@pytest.mark.oracle
@pytest.mark.parametrize("target", TARGETS)
def test_equals_sglang_style_construction(source, baked, target):
    src, out = load_all(source), load_all(baked[target])
    manifest = json.loads((baked[target] / "moebake.json").read_text())
    assert [r["prefix"] for r in manifest["layers"]] == list(QUANTIZED)
    for record in manifest["layers"]:
        expected = reference_layer(src, record["prefix"], target)
        assert set(record["tensors"]) == set(expected) - {"w13_weight_scale_linear"}
        for short, spec in record["tensors"].items():
            got, want = out[record["prefix"] + short], expected[short]
            assert [spec["dtype"], spec["shape"]] == [
                {torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32"}[got.dtype],
                list(got.shape),
            ], short
            if isinstance(want, np.ndarray):
                assert np.array_equal(got.numpy().view(F32_BITS), want.astype(np.float32).view(F32_BITS)), short
            else:
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), short


def mma_view(swizzled: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """FlashInfer's ``convert_sf_to_mma_layout`` index math (cute_dsl/utils.py): a strided view, no copy."""
    return swizzled.reshape(-1).view(E, m // 128, k // 16 // 4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)


@pytest.mark.oracle
def test_baked_scales_are_the_cutedsl_mma_layout(source, baked):
    """CuTe's scale-factor atom: row r, scale column c of expert g sits at (r%32, r//32%4, r//128, c%4, c//4, g)."""
    src, out = load_all(source), load_all(baked["cutedsl"])
    for prefix in QUANTIZED:
        linear = reference_layer(src, prefix, "cutedsl")["w13_weight_scale_linear"]
        for name, m, k, rows in (
            ("w13_weight_scale", 2 * I, H, linear),
            ("w2_weight_scale", H, I, torch.stack([src[f"{prefix}{e}.down_proj.weight_scale"].view(torch.uint8) for e in range(E)])),
        ):
            view = mma_view(out[prefix + name].view(torch.uint8), m, k)
            g, r, c = torch.meshgrid(torch.arange(E), torch.arange(m), torch.arange(k // 16), indexing="ij")
            assert torch.equal(view[r % 32, r // 32 % 4, r // 128, c % 4, c // 4, g], rows), name


@pytest.mark.oracle
def test_mma_view_against_flashinfer_convert_sf_to_mma_layout(baked):
    utils = pytest.importorskip("flashinfer.cute_dsl.utils", reason="needs nvidia-cutlass-dsl")
    out = load_all(baked["cutedsl"])
    sf = out[QUANTIZED[0] + "w13_weight_scale"].view(torch.uint8).reshape(-1)
    expected = utils.convert_sf_to_mma_layout(sf, m=2 * I, k=H, num_groups=E, sf_vec_size=16)
    assert torch.equal(mma_view(sf, 2 * I, H), expected)


@pytest.mark.parametrize("target", TARGETS)
def test_everything_else_passes_through(source, baked, target):
    src, out = load_all(source), load_all(baked[target])
    quantized = {n for n in src if n.startswith(QUANTIZED)}
    assert len(quantized) == 2 * E * 3 * 4
    shorts = json.loads((baked[target] / "moebake.json").read_text())["layers"][0]["tensors"]
    produced = {prefix + short for prefix in QUANTIZED for short in shorts}
    assert set(out) == (set(src) - quantized) | produced
    for name in set(src) - quantized:  # dense and shared-expert NVFP4, BF16 router/attention, the excluded BF16 MTP experts
        assert out[name].dtype == src[name].dtype and torch.equal(as_bytes(out[name]), as_bytes(src[name])), name
    assert any(n.startswith("model.layers.3.mlp.experts.") and out[n].dtype == torch.bfloat16 for n in out)


@pytest.mark.parametrize("target", TARGETS)
def test_manifest_reports_the_gate_up_sharing(source, baked, target):
    manifest = json.loads((baked[target] / "moebake.json").read_text())
    src = load_all(source)
    assert manifest["source"]["format"] == "modelopt-nvfp4" and manifest["target"] == target
    assert manifest["activation"] == {"kind": "swiglu", "alpha": 1.0, "beta": 0.0, "limit": None}
    for record in manifest["layers"]:
        report = record["gate_up_global_scale"]
        assert (report["experts_rescaled"], report["rescaled_up"], report["rescaled_gate"]) == (2, [1], [3])
        assert report["max_relative_change"] == pytest.approx(0.75)  # expert 3: gate global = up global / 4
        shared = shared_globals(src, record["prefix"])
        assert report["zero_at_or_below"] > 0 and report["max_relative_error"] > 0  # ratio 0.3 is no power of two
        for e, proj in ((1, "up"), (3, "gate")):  # the bound holds for the block scales actually rescaled
            name = f"{record['prefix']}{e}.{proj}_proj.weight_scale"
            before = src[name].double() * float(src[name + "_2"])
            after = shared[e, proj].view(torch.float8_e4m3fn).double() * shared[e]
            normal = before / shared[e] >= 2.0**-6
            assert float(((after - before).abs() / before)[normal].max()) <= report["max_relative_error"] * (1 + 1e-12)
            assert bool((src[name].double()[~normal] < report["subnormal_below"]).all())
            assert bool((src[name].double()[after == 0] <= report["zero_at_or_below"]).all())
        w13 = record["tensors"]["w13_weight"]
        assert w13["gate_up_order"] == ("up_gate_interleaved_64" if target == "cutedsl" else "gate_up")
        assert w13["source"] == [record["prefix"] + "*.gate_proj.weight", record["prefix"] + "*.up_proj.weight"]


@pytest.mark.parametrize("target", TARGETS)
def test_restore_inverts_every_expert_range(source, baked, target):
    model = open_source(source)
    manifest = json.loads((baked[target] / "moebake.json").read_text())
    out = load_all(baked[target])
    for record in manifest["layers"]:
        for start, stop in ((0, E), (1, 3), (3, 4)):
            short = {name: out[record["prefix"] + name][start:stop] for name in record["tensors"]}
            restored = TARGETS[target].restore(LayerRecord.from_json(record, "m"), short, "v2")
            assert len(restored) == 12
            for pattern, tensor in restored.items():
                assert torch.equal(as_bytes(tensor), as_bytes(model.read_experts(pattern, start, stop))), pattern


@pytest.mark.parametrize("target", TARGETS)
def test_cli_convert_reports_and_verify_source_passes(source, tmp_path, target):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(source), str(out), "--target", target, "--quiet"])
    assert result.exit_code == 0, result.output
    assert "gate/up global scales made one in 4 of 8 experts" in result.output and "largest relative change 75.00%" in result.output
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(source), "--quiet"])
    assert result.exit_code == 0 and result.output.startswith("ok:"), result.output


@pytest.mark.parametrize("target", TARGETS)
def test_keep_gate_up_globals_bakes_the_files_scales_and_verifies(source, tmp_path, target):
    """``--gate-up-globals keep``: every gate/up block scale and global is the file's (recorded in the manifest's
    options, engine-exact, reported), and deep verify (inversion and re-bake from the recorded options) passes."""
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(source), str(out), "--target", target, "--gate-up-globals", "keep", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "gate/up global scales kept as the source has them" in result.output and "differ in 4 of 8 experts" in result.output
    assert ": engine-exact" in result.output
    manifest = json.loads((out / "moebake.json").read_text())
    assert manifest["options"]["gate_up_globals"] == "keep"
    stored, files = load_all(out), load_all(source)
    for record in manifest["layers"]:
        tensors = {n: stored[record["prefix"] + n] for n in record["tensors"]}
        restored = TARGETS[target].restore(LayerRecord.from_json(record, "m"), tensors, "v2")
        for pattern, tensor in restored.items():
            expected = torch.stack([files[name] for name in per_expert_names(pattern, record["experts"])])
            assert torch.equal(as_bytes(tensor), as_bytes(expected.reshape(tensor.shape))), pattern
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(source), "--quiet"])
    assert result.exit_code == 0 and result.output.startswith("ok:"), result.output


def test_deep_verify_finds_a_changed_scale_byte(source, tmp_path):
    out = tmp_path / "out"
    convert(source, out, ConvertOptions("cutedsl"), progress=False)
    shard = out / json.loads((out / "model.safetensors.index.json").read_text())["weight_map"][QUANTIZED[1] + "w13_weight_scale"]
    data = bytearray(shard.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    begin = json.loads(data[8:header])[QUANTIZED[1] + "w13_weight_scale"]["data_offsets"][0]
    data[header + begin + 5] ^= 0x01
    shard.write_bytes(bytes(data))
    problems = compare_with_source(out, source)
    assert problems and all(QUANTIZED[1] in p for p in problems)
    assert any("w13_weight_scale" in p and "inverted to" in p for p in problems)


def test_cutedsl_needs_hidden_128_and_intermediate_64(tmp_path):
    for hidden, intermediate in ((160, 64), (128, 96)):
        model = open_source(write_modelopt_nvfp4(tmp_path / f"src{hidden}{intermediate}", hidden=hidden, intermediate=intermediate))
        for target in TARGETS.values():
            with pytest.raises(MoebakeError, match=r"hidden_size % 128 == 0 and moe_intermediate_size % 64 == 0"):
                target.plan(model, ConvertOptions(target.spec.name))


def test_refuses_other_source_formats(gpt_oss_tiny):
    model = open_source(gpt_oss_tiny)
    for target in TARGETS.values():
        with pytest.raises(MoebakeError, match="does not support source format gpt-oss"):
            target.plan(model, ConvertOptions(target.spec.name))
