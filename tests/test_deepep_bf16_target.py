"""Target deepep-bf16 end to end: each BF16 source style baked, checked against an expert MLP written
from the source tensors, pass-through, manifest, deep verify (inverse of per-expert patterns), and refusals."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from conftest import load_all
from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.source_check import inverse_problems
from moebake.convert.targets import get_target
from moebake.formats import open_source
from moebake.reference.synthetic_sources import write_bf16_moe
from moebake.schema.manifest import LayerRecord, read_manifest, read_manifest_record
from moebake.synthetic import write_gpt_oss

# 8 experts of 32 KiB (gate + up, BF16): a 64 KiB chunk holds 2, so every tensor takes 4 chunks.
SHAPE = {"num_layers": 2, "num_experts": 8, "hidden": 128, "intermediate": 64}
CHUNK = 64 << 10
CASES = {  # Qwen3.5 fused with a BF16 MTP layer, Qwen3 and Mixtral per expert
    "qwen3.5": dict(style="qwen3.5", mtp_layers=1),
    "qwen3": dict(style="qwen3"),
    "mixtral": dict(style="mixtral"),
}


def source_expert(tensors, prefix, e):
    """(gate [I, H], up [I, H], down [H, I]) of expert ``e`` read the way each HF model defines them."""
    if prefix + "gate_up_proj" in tensors:  # Qwen3.5: gate_up_proj.chunk(2, dim=-2) -> gate, up
        gate, up = tensors[prefix + "gate_up_proj"][e].chunk(2, dim=-2)
        return gate, up, tensors[prefix + "down_proj"][e]
    names = ("gate_proj", "up_proj", "down_proj") if f"{prefix}{e}.gate_proj.weight" in tensors else ("w1", "w3", "w2")
    return tuple(tensors[f"{prefix}{e}.{n}.weight"] for n in names)


def hf_expert(x, gate, up, down):
    """The HF expert MLP ``down(act(gate(x)) * up(x))`` in float64, silu written out."""
    g, u = x @ gate.double().T, x @ up.double().T
    return (g * torch.sigmoid(g) * u) @ down.double().T


def sglang_expert(x, w13, w2):
    """SGLang's unquantized DeepEP expert on baked weights: gate_up = x @ w13.T; gate, up = chunk(2)."""
    gate, up = (x @ w13.double().T).chunk(2, dim=-1)
    return (gate * torch.sigmoid(gate) * up) @ w2.double().T


@pytest.fixture(scope="module", params=list(CASES))
def baked(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param.replace(".", ""))
    source = write_bf16_moe(root / "src", **SHAPE, **CASES[request.param])
    out = root / "out"
    convert(source, out, ConvertOptions(target="deepep-bf16", chunk_bytes=CHUNK), progress=False)
    return source, out


def test_baked_experts_compute_the_source_models_experts(baked):
    source, out = baked
    src, dst = load_all(source), load_all(out)
    x = torch.randn(5, SHAPE["hidden"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    layers = read_manifest(out)["layers"]
    assert len(layers) == len({k.rsplit("experts.", 1)[0] for k in src if ".experts." in k})
    for record in layers:
        prefix = record["prefix"]
        w13, w2 = dst[prefix + "w13_weight"], dst[prefix + "w2_weight"]
        assert w13.dtype == w2.dtype == torch.bfloat16
        assert tuple(w13.shape) == (8, 128, 128) and tuple(w2.shape) == (8, 128, 64)
        for e in range(SHAPE["num_experts"]):
            gate, up, down = source_expert(src, prefix, e)
            # Bytes exactly: SGLang's chunk(2) of the baked W13 gives the HF gate and up, W2 is down.
            baked_gate, baked_up = w13[e].chunk(2, dim=0)
            for baked_part, source_part in ((baked_gate, gate), (baked_up, up), (w2[e], down)):
                assert torch.equal(baked_part.view(torch.int16), source_part.view(torch.int16)), (prefix, e)
            # The computation: float64 GEMMs of different shapes may round differently (MKL vs OpenBLAS
            # blocking), so the outputs agree to float64 rounding, not bit for bit.
            torch.testing.assert_close(
                sglang_expert(x, w13[e], w2[e]),
                hf_expert(x, gate, up, down),
                rtol=1e-12,
                atol=1e-12,
                msg=lambda m: f"{prefix} expert {e}: {m}",
            )


def test_manifest_records_bf16_dispatch_and_sources(baked):
    source, out = baked
    manifest = read_manifest(out)
    assert manifest["target"] == "deepep-bf16" and manifest["target_layout_version"] == get_target("deepep-bf16").spec.layout_version
    assert manifest["source"]["format"] == "bf16-moe"
    assert manifest["activation"] == {"kind": "swiglu", "alpha": 1.0, "beta": 0.0, "limit": None}  # silu(gate) * up
    model = open_source(source)
    for record, layer in zip(manifest["layers"], model.layers):
        assert record["dispatcher_output_dtype"] == "bf16"
        assert (record["prefix"], record["index"], record["experts"], record["hidden"], record["intermediate"]) == (
            layer.prefix,
            layer.index,
            8,
            128,
            64,
        )
        w13 = record["tensors"]["w13_weight"]
        assert w13["gate_up_order"] == "gate_up" and w13["shape"] == [8, 128, 128] and w13["dtype"] == "BF16"
        assert w13["source"] == (layer.gate_up[0] if layer.fused else list(layer.gate_up))
        assert w13["source_gate_up_order"] == ("gate_up" if layer.fused else "separate")
        assert record["tensors"]["w2_weight"]["source"] == layer.down


def test_every_other_tensor_passes_through_and_expert_sources_are_gone(baked):
    source, out = baked
    src, dst = load_all(source), load_all(out)
    baked_names = {r["prefix"] + t for r in read_manifest(out)["layers"] for t in r["tensors"]}
    passthrough = {k for k in src if ".experts." not in k}
    assert set(dst) == passthrough | baked_names
    for name in passthrough:
        assert src[name].dtype == dst[name].dtype and torch.equal(src[name].view(torch.uint8), dst[name].view(torch.uint8))
    index = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    out_index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    for record in read_manifest(out)["layers"]:  # baked tensors land in their first source's shard
        spec = record["tensors"]["w13_weight"]["source"]
        first = (spec if isinstance(spec, str) else spec[0]).replace("*", "0")
        assert out_index[record["prefix"] + "w13_weight"] == index[first]


def test_restore_inverts_any_run_of_experts(baked):
    source, out = baked
    checkpoint = open_source(source).checkpoint
    dst = load_all(out)
    for record in read_manifest(out)["layers"]:
        slab = {short: dst[record["prefix"] + short][2:5] for short in record["tensors"]}
        restored = get_target("deepep-bf16").restore(LayerRecord.from_json(record, "m"), slab, "v2")
        assert len(restored) == (2 if "gate_up_proj" in next(iter(restored)) else 3)
        for name, tensor in restored.items():
            assert torch.equal(tensor, checkpoint.read_experts(name, 2, 5)), name


def test_cli_verify_with_source_passes(baked):
    source, out = baked
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(source)])
    assert result.exit_code == 0, result.output


def test_inverse_check_finds_a_flipped_bit_in_a_per_expert_gate(tmp_path):
    source = write_bf16_moe(tmp_path / "src", style="qwen3", **SHAPE)
    out = tmp_path / "out"
    convert(source, out, ConvertOptions(target="deepep-bf16", chunk_bytes=CHUNK), progress=False)
    prefix = "model.layers.1.mlp.experts."
    shard = out / json.loads((out / "model.safetensors.index.json").read_text())["weight_map"][prefix + "w13_weight"]
    tensors = load_file(shard)
    tensors[prefix + "w13_weight"][5, 3, 7] = -tensors[prefix + "w13_weight"][5, 3, 7] + 1  # expert 5, gate row 3
    save_file(tensors, shard, metadata={"format": "pt"})
    problems = inverse_problems(out, read_manifest_record(out), open_source(source, ("bf16-moe",)))
    assert len(problems) == 1
    assert f"inverted to {prefix}*.gate_proj.weight: first difference at index [5, 3, 7]" in problems[0]


def test_gpt_oss_source_is_refused_in_one_line(tmp_path):
    source = write_gpt_oss(tmp_path / "g", num_layers=1, num_experts=2, hidden=64, intermediate=64)
    result = CliRunner().invoke(main, ["convert", str(source), str(tmp_path / "out"), "--target", "deepep-bf16", "--quiet"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "target deepep-bf16 bakes bf16-moe checkpoints, this one is gpt-oss" in result.output
    assert "targets that fit it: sm90-cutlass, sm90-cutlass-w4a8, sm100-trtllm" in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()
