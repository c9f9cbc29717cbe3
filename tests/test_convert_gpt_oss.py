"""End to end: GPT-OSS -> sm90-cutlass, checked against an independent SGLang-style construction."""

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from conftest import TINY, load_all
from kernel_emulation import kernel_interleave_v1, kernel_interleave_v2
from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.convert.targets import get_target
from moebake.schema.manifest import LayerRecord
from moebake.synthetic import write_gpt_oss
from mxfp4_oracle import dequantize

KERNELS = {"v2": kernel_interleave_v2, "v1": kernel_interleave_v1}


def sglang_style_layer(src, prefix, H, I, Hp, Ip, layout, fill=127):
    """What SGLang's _process_weights_for_sm90_cutlass builds, written out the way SGLang does it. The scale fold is the
    installed FlashInfer's for layout v2; for v1, that of FlashInfer's v1 releases (0.6.15.post1's
    ``interleave_moe_scales_for_sm90_mixed_gemm``, written out: the release-matrix run executes the real one)."""
    fold = (
        pytest.importorskip("flashinfer.fused_moe").interleave_moe_scales_for_sm90_mixed_gemm
        if layout == "v2"
        else _flashinfer_v1_scale_fold
    )
    blocks = src[prefix + "gate_up_proj_blocks"]
    E = blocks.shape[0]
    blocks = blocks.reshape(E, 2 * I, H // 2)
    scales, bias = src[prefix + "gate_up_proj_scales"], src[prefix + "gate_up_proj_bias"]
    w13 = torch.zeros(E, 2 * Ip, Hp // 2, dtype=torch.uint8)
    w13[:, :I, : H // 2], w13[:, Ip : Ip + I, : H // 2] = blocks[:, 1::2], blocks[:, 0::2]
    # SGLang's scale buffers start at 127 (E8M0 1.0) over [I, H_pad/32] of each half (its loader
    # writes the checkpoint's H only); its post-load padding of I is zeros. W2 likewise over [H_pad, I/32].
    s13 = torch.zeros(E, 2 * Ip, Hp // 32, dtype=torch.uint8)
    s13[:, :I], s13[:, Ip : Ip + I] = fill, fill
    s13[:, :I, : H // 32], s13[:, Ip : Ip + I, : H // 32] = scales[:, 1::2], scales[:, 0::2]
    b13 = torch.zeros(E, 2 * Ip, dtype=torch.bfloat16)
    b13[:, :I], b13[:, Ip : Ip + I] = bias[:, 1::2], bias[:, 0::2]
    w2 = torch.zeros(E, Hp, Ip // 2, dtype=torch.uint8)
    w2[:, :H, : I // 2] = src[prefix + "down_proj_blocks"].reshape(E, H, I // 2)
    s2 = torch.zeros(E, Hp, Ip // 32, dtype=torch.uint8)
    s2[:, :, : I // 32] = fill
    s2[:, :H, : I // 32] = src[prefix + "down_proj_scales"]
    b2 = torch.zeros(E, Hp, dtype=torch.bfloat16)
    b2[:, :H] = src[prefix + "down_proj_bias"]
    return {
        "w13_weight": KERNELS[layout](w13),
        "w13_weight_scale": fold(s13, group_size=32),
        "w13_weight_bias": b13,
        "w2_weight": KERNELS[layout](w2),
        "w2_weight_scale": fold(s2, group_size=32),
        "w2_weight_bias": b2,
    }


def _flashinfer_v1_scale_fold(scales, group_size=32):
    """FlashInfer 0.6.15.post1 / 0.6.17: ``[E, rows, K/32]`` -> ``[E, K/128, rows * 4]`` (reshape, swap, reshape)."""
    e, rows, groups = scales.shape
    factor = 128 // group_size
    return scales.reshape(e, rows, groups // factor, factor).permute(0, 2, 1, 3).contiguous().reshape(e, groups // factor, rows * factor)


def _check_against_reference(source, out, H, I, Hp, Ip, layout):
    src, baked = load_all(source), load_all(out)
    manifest = json.loads((out / "moebake.json").read_text())
    assert len(manifest["layers"]) >= 1
    for record in manifest["layers"]:
        prefix = record["prefix"]
        assert (record["hidden"], record["hidden_padded"], record["intermediate"], record["intermediate_padded"]) == (H, Hp, I, Ip)
        expected = sglang_style_layer(src, prefix, H, I, Hp, Ip, layout)
        for short, tensor in expected.items():
            got = baked[prefix + short]
            assert got.dtype == tensor.dtype and got.shape == tensor.shape, short
            assert torch.equal(got.view(torch.uint8), tensor.view(torch.uint8)), short
    consumed = {spec["source"] for r in manifest["layers"] for spec in r["tensors"].values()}
    for name, tensor in src.items():
        if name not in consumed:
            assert baked[name].dtype == tensor.dtype and torch.equal(baked[name].view(torch.uint8), tensor.view(torch.uint8)), name
    produced = {r["prefix"] + short for r in manifest["layers"] for short in r["tensors"]}
    assert set(baked) == (set(src) - consumed) | produced
    return manifest


@pytest.mark.oracle
@pytest.mark.parametrize("layout", ["v2", "v1"])
def test_tiny_equals_sglang_style_construction(gpt_oss_tiny, tmp_path, layout):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass", flashinfer_layout=layout, chunk_bytes=1 << 16), progress=False)
    manifest = _check_against_reference(gpt_oss_tiny, out, 160, 96, 256, 128, layout)
    assert manifest["flashinfer_layout"]["id"] == layout


@pytest.mark.oracle
def test_gpt_oss_dims_2880_pad_like_sglang_0_5_23(tmp_path):
    """The default engine profile (SGLang 0.5.23): H 2880 -> 3072 (multiple of 256), I 2880 -> 2944."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=2880, intermediate=2880, vocab=32)
    convert(source, tmp_path / "out", ConvertOptions("sm90-cutlass"), progress=False)
    _check_against_reference(source, tmp_path / "out", 2880, 2880, 3072, 2944, "v2")


@pytest.mark.oracle
def test_overridden_multiples_are_recorded_as_not_engine_exact(gpt_oss_tiny, tmp_path):
    manifest = convert(
        gpt_oss_tiny, tmp_path / "out", ConvertOptions("sm90-cutlass", hidden_multiple=128, intermediate_multiple=256), progress=False
    ).to_json()
    _check_against_reference(gpt_oss_tiny, tmp_path / "out", 160, 96, 256, 256, "v2")
    assert manifest["engine"]["exact"] is False and manifest["engine"]["not_exact_because"] == "padding multiples overridden"


@pytest.mark.parametrize("hidden, exact", [(2880, True), (160, False)])
def test_an_overridden_multiple_that_pads_to_the_same_sizes_is_engine_exact(tmp_path, hidden, exact):
    """--hidden-multiple 512 on GPT-OSS's H 2880 pads to 3072, as SGLang's 256 does: the same shards as the default bake,
    so the same record (engine-exact, the same releases). On H 160 it pads to 512 where SGLang pads to 256: not exact."""
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=hidden, intermediate=128, vocab=32)
    default = convert(source, tmp_path / "default", ConvertOptions("sm90-cutlass"), progress=False)
    wider = convert(source, tmp_path / "wider", ConvertOptions("sm90-cutlass", hidden_multiple=512), progress=False)
    same_shards = all(
        (tmp_path / "default" / name).read_bytes() == (tmp_path / "wider" / name).read_bytes()
        for name in default.files
        if name.endswith(".safetensors")
    )
    assert same_shards is exact and default.engine.exact
    assert wider.engine.exact is exact
    if exact:
        assert (wider.engine.releases, wider.serves) == (default.engine.releases, default.serves) and wider.engine.releases
    else:
        assert wider.engine.not_exact_because == "padding multiples overridden" and wider.engine.releases == ()


def test_dequantized_experts_survive_the_round_trip(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    manifest = convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False).to_json()
    src, baked = load_all(gpt_oss_tiny), load_all(out)
    for record in manifest["layers"]:
        short = {name: baked[record["prefix"] + name] for name in record["tensors"]}
        restored = get_target("sm90-cutlass").restore(LayerRecord.from_json(record, "m"), short, "v2")
        for projection in ("gate_up_proj", "down_proj"):
            blocks, scales = (record["prefix"] + f"{projection}_{part}" for part in ("blocks", "scales"))
            E = src[blocks].shape[0]
            original = dequantize(src[blocks].reshape(E, src[blocks].shape[1], -1), src[scales])
            roundtrip = dequantize(restored[blocks].reshape(E, restored[blocks].shape[1], -1), restored[scales])
            assert torch.equal(roundtrip, original)


def test_output_files_index_manifest(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    manifest = convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False).to_json()
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
            "moebake.json",
            "config.json",
            "generation_config.json",
            "tokenizer_config.json",
        ]
    )
    assert not list(tmp_path.glob(".*"))  # no staging directory left
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        with safe_open(out / shard, framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in load_all(out).values())
    config, source_config = (json.loads((d / "config.json").read_text()) for d in (out, gpt_oss_tiny))
    assert config.pop("quantization_config")["original"] == source_config.pop("quantization_config")
    assert config == source_config  # the rest of config.json is the source's (see test_stock_engine_refusal.py)
    assert manifest["schema"] == "moebake.manifest/1" and manifest["target"] == "sm90-cutlass"
    assert manifest["activation"] == {"kind": "swiglu_oai", "alpha": 1.702, "beta": 1.0, "limit": 7.0}
    assert set(manifest["source"]["files"]) >= {"model-00001-of-00002.safetensors", "config.json"}
    tensors = manifest["layers"][0]["tensors"]
    assert tensors["w13_weight"]["gate_up_order"] == "up_gate" and tensors["w13_weight"]["source_gate_up_order"] == "pairs"
    assert manifest["options"]["hidden_multiple"] is None and manifest["options"]["engine"] == "sglang"
    assert manifest["engine"] == {
        "name": "sglang",
        "version": "0.5.23",
        "runner_backend": "flashinfer_mxfp4",
        "a2a_backend": "none",
        "engine_method": "sglang.srt.layers.quantization.mxfp4.Mxfp4MoEMethod",
        "hidden_multiple": 256,
        "intermediate_multiple": 128,
        "hidden_scale_fill": 127,
        "verified": True,
        "parameter_names": {},
        "exact": True,
        "not_exact_because": None,
        "moe_parallelism": "expert-only",
        "releases": ["0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"],
    }  # FlashInfer v2 pins
    assert manifest["serves"] == []  # H 160 is padded: vLLM 0.33.0's bytes differ (128 multiple, zero fill)
    import xxhash

    for name, record in manifest["files"].items():
        assert record == {"xxh3-128": xxhash.xxh3_128((out / name).read_bytes()).hexdigest(), "bytes": (out / name).stat().st_size}, name


def test_reads_are_bounded_by_the_chunk(gpt_oss_tiny, tmp_path, monkeypatch):
    from moebake.formats.safetensors_file import SafetensorsFile

    sizes, original = [], SafetensorsFile.read_bytes

    def recording(self, entry, start=0, stop=None):
        chunk = original(self, entry, start, stop)
        sizes.append(chunk.numel())
        return chunk

    monkeypatch.setattr(SafetensorsFile, "read_bytes", recording)
    chunk = 1 << 16
    convert(gpt_oss_tiny, tmp_path / "out", ConvertOptions("sm90-cutlass", chunk_bytes=chunk), progress=False)
    per_expert = 2 * 96 * 160 // 2  # one expert of gate_up_proj_blocks, the largest row of the source
    assert max(sizes) <= max(chunk, per_expert)
    assert len(sizes) > 10


def test_cli_convert_and_verify(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(gpt_oss_tiny), str(out), "--target", "sm90-cutlass", "--quiet"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(gpt_oss_tiny)])
    assert result.exit_code == 0 and "ok" in result.output


def test_verify_detects_a_flipped_byte(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    shard = out / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01
    shard.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1 and "xxh3-128 mismatch" in result.output and shard.name in result.output


def test_verify_detects_a_missing_file(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), progress=False)
    (out / "model-00001-of-00002.safetensors").unlink()
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [  # issue 37: one problem, one line (not a header and 6 tensor lines more)
        f"mismatch: {out / 'model-00001-of-00002.safetensors'}: listed in moebake.json but missing",
        f"failed: {out}: 1 mismatch in 1 file",
    ]


def interrupt_after_first_shard(source, out, monkeypatch) -> str:
    """Run a conversion that is interrupted (KeyboardInterrupt) after its first shard; that shard's name."""
    from moebake.convert import run

    written, original = [], run.write_shard

    def interrupted_after_first(shard, path, on_bytes):
        if written:
            raise KeyboardInterrupt
        written.append(shard.file_name)
        return original(shard, path, on_bytes)

    with monkeypatch.context() as patch:
        patch.setattr(run, "write_shard", interrupted_after_first)
        with pytest.raises(KeyboardInterrupt):
            convert(source, out, ConvertOptions("sm90-cutlass"), progress=False)
    return written[0]


def test_resume_reuses_finished_shards(gpt_oss_tiny, tmp_path, monkeypatch):
    from moebake.convert import run

    out, original = tmp_path / "out", run.write_shard
    finished = interrupt_after_first_shard(gpt_oss_tiny, out, monkeypatch)
    assert not out.exists() and (tmp_path / ".out.partial" / finished).is_file()

    rewritten = []

    def recording(shard, path, on_bytes):
        rewritten.append(shard.file_name)
        return original(shard, path, on_bytes)

    monkeypatch.setattr(run, "write_shard", recording)
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), resume=True, progress=False)
    assert finished not in rewritten and len(rewritten) == 1
    fresh = tmp_path / "fresh"
    convert(gpt_oss_tiny, fresh, ConvertOptions("sm90-cutlass"), progress=False)
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert (out / shard).read_bytes() == (fresh / shard).read_bytes()


def test_resume_rewrites_a_damaged_shard(gpt_oss_tiny, tmp_path, monkeypatch):
    out = tmp_path / "out"
    damaged = tmp_path / ".out.partial" / interrupt_after_first_shard(gpt_oss_tiny, out, monkeypatch)
    damaged.write_bytes(damaged.read_bytes()[:-10])
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), resume=True, progress=False)
    assert CliRunner().invoke(main, ["verify", str(out)]).exit_code == 0


def test_overwrite_replaces_a_previous_output(gpt_oss_tiny, tmp_path):
    out = tmp_path / "out"
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass", flashinfer_layout="v1"), progress=False)
    convert(gpt_oss_tiny, out, ConvertOptions("sm90-cutlass"), overwrite=True, progress=False)
    assert json.loads((out / "moebake.json").read_text())["flashinfer_layout"]["id"] == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_tiny_fixture_dims_are_the_padding_case():
    assert TINY["hidden"] % 128 and TINY["intermediate"] % 128


def test_synthetic_shards_are_numbered_from_one_as_hugging_face_does(tmp_path):
    """Issue 37: they were model-00000-of-00001 and model-00001-of-00001 (Hugging Face: 00001-of-00002, 00002-of-00002)."""
    from moebake.synthetic import write_gpt_oss

    source = write_gpt_oss(tmp_path / "src", **{**TINY, "num_layers": 3})
    assert sorted(p.name for p in source.glob("*.safetensors")) == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ]


@pytest.mark.parametrize(
    "intermediate, vllm_releases",
    [
        (256, ["0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]),
        (128, ["0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]),
    ],
)
def test_serves_lists_every_vllm_release_whose_own_rule_gives_the_same_bytes(tmp_path, intermediate, vllm_releases):
    """An SGLang sm100-trtllm bake, H unpadded: vLLM 0.26.0's rule pads I to 256 and later ones to 128 (the release
    matrix's rules, each proven on its release's code), so at I 256 every release builds these bytes and at I 128
    0.26.0 does not. The record is of the newest such release."""
    from moebake.schema.engine_release import EngineRelease
    from moebake.schema.profiles import release_profile

    for release in ("0.26.0", "0.33.0"):  # what the expected lists rest on
        entry = release_profile(EngineRelease("vllm", release)).targets[("sm100-trtllm", "gpt-oss")]
        assert (entry.hidden_multiple, entry.intermediate_multiple) == ((256, 256) if release == "0.26.0" else (256, 128))
    source = write_gpt_oss(tmp_path / "src", num_layers=1, num_experts=2, hidden=256, intermediate=intermediate, vocab=32)
    manifest = convert(source, tmp_path / "out", ConvertOptions("sm100-trtllm"), progress=False)
    (vllm,) = manifest.serves
    assert (vllm.name, [r.version for r in vllm.releases], vllm.version) == ("vllm", vllm_releases, vllm_releases[-1])
