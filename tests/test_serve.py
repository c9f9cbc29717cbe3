"""moebake.serve on CPU: the API, expert-parallel slicing (and the bytes it reads), and every refusal."""

import json
import math
import shutil

import psutil
import pytest
import torch
from safetensors.torch import load_file

import moebake.serve
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.errors import MoebakeError
from moebake.schema.manifest import Activation, write_manifest
from moebake.serve import Platform
from moebake.serve.sm90_cutlass import swiglu_parameters
from moebake.synthetic import write_gpt_oss

# Four experts (EP 2 and 4 split evenly), dims that need padding: H=160 -> 256, I=96 -> 128.
SHAPE = {"num_layers": 2, "num_experts": 4, "hidden": 160, "intermediate": 96, "vocab": 64}
INSTALLED = Platform(flashinfer_version="0.7.2.post1")  # a FlashInfer reading layout v2


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    """A baked (layout v2) tiny GPT-OSS checkpoint, read-only."""
    root = tmp_path_factory.mktemp("serve")
    source = write_gpt_oss(root / "src", **SHAPE)
    convert(source, root / "out", ConvertOptions(target="sm90-cutlass"), progress=False)
    return root / "out"


@pytest.fixture()
def baked_copy(tmp_path, baked):
    """A private copy that a test may damage."""
    return shutil.copytree(baked, tmp_path / "out")


def edit_manifest(directory, change):
    """Change fields as a consistently wrong moebake would (the manifest's checksum is rewritten too)."""
    manifest = json.loads((directory / "moebake.json").read_text())
    change(manifest)
    write_manifest(directory, manifest)


def layer_tensors(directory, layer):
    """The layer's baked tensors, by short name, read with safetensors' own loader."""
    manifest = json.loads((directory / "moebake.json").read_text())
    record = next(r for r in manifest["layers"] if r["index"] == layer)
    tensors = {}
    for shard in sorted({p.name for p in directory.glob("*.safetensors")}):
        tensors.update(load_file(directory / shard))
    return {short: tensors[record["prefix"] + short] for short in record["tensors"]}


@pytest.mark.parametrize("ep_rank, ep_size", [(0, 1), (0, 2), (1, 2), (3, 4)])
def test_load_experts_gives_the_ranks_slice_of_every_tensor(baked, ep_rank, ep_size):
    experts = moebake.serve.open(baked, platform=INSTALLED).load_experts(1, device="cpu", ep_rank=ep_rank, ep_size=ep_size)
    whole = layer_tensors(baked, 1)
    per_rank = SHAPE["num_experts"] // ep_size
    params = experts.parameters()
    assert sorted(params) == sorted(whole)
    for name, tensor in whole.items():
        expected = tensor[ep_rank * per_rank : (ep_rank + 1) * per_rank]
        assert params[name].dtype == expected.dtype and torch.equal(params[name], expected), name
    assert (experts.first_expert, experts.num_local_experts, experts.num_experts) == (ep_rank * per_rank, per_rank, SHAPE["num_experts"])
    assert (experts.hidden, experts.hidden_padded) == (160, 256)
    assert experts.load_stats.bytes == sum(t.numel() * t.element_size() for t in params.values())
    assert experts.load_stats.tensors == len(whole)


@pytest.mark.parametrize("ep_rank, ep_size", [(0, 1), (1, 2)])
def test_w4a8_experts_call_the_humming_path_with_their_ranks_residuals(tmp_path, baked, ep_rank, ep_size):
    """sm90-cutlass-w4a8: SGLang's Humming call (five quant scales in its order, an fp32 scalar FC2 activation scale
    of 1, ``use_wfp4afp8_humming``), each tensor the rank's slice of the bake's; sm90-cutlass keeps its two scales."""
    source = write_gpt_oss(tmp_path / "src", **SHAPE)
    convert(source, tmp_path / "out", ConvertOptions(target="sm90-cutlass-w4a8"), progress=False)
    ckpt = moebake.serve.open(tmp_path / "out", platform=INSTALLED)
    assert type(ckpt).__name__ == "Sm90CutlassW4A8Checkpoint"
    experts = ckpt.load_experts(0, device="cpu", ep_rank=ep_rank, ep_size=ep_size)
    whole, per_rank = layer_tensors(tmp_path / "out", 0), SHAPE["num_experts"] // ep_size
    mine = {name: tensor[ep_rank * per_rank : (ep_rank + 1) * per_rank] for name, tensor in whole.items()}
    args = experts._kernel_args
    assert experts.humming and args["use_wfp4afp8_humming"] is True and args["use_w4_group_scaling"] is True
    w13_scale, w13_residual, fc2_act, w2_scale, w2_residual = args["quant_scales"]
    assert torch.equal(w13_scale, mine["w13_weight_scale"].view(torch.int32))
    assert torch.equal(w2_scale, mine["w2_weight_scale"].view(torch.int32))
    assert w13_residual.dtype == w2_residual.dtype == torch.float32
    assert torch.equal(w13_residual, mine["w13_humming_residual_scale"])
    assert torch.equal(w2_residual, mine["w2_humming_residual_scale"])
    assert fc2_act.shape == () and fc2_act.dtype == torch.float32 and fc2_act.item() == 1.0
    plain = moebake.serve.open(baked, platform=INSTALLED).load_experts(0, device="cpu")
    assert not plain.humming and len(plain._kernel_args["quant_scales"]) == 2
    assert "use_wfp4afp8_humming" not in plain._kernel_args


def test_activation_parameters_come_from_the_manifest(baked_copy):
    edit_manifest(baked_copy, lambda m: m["activation"].update(alpha=1.5, beta=0.25, limit=3.0))
    experts = moebake.serve.open(baked_copy, platform=INSTALLED).load_experts(0, device="cpu", ep_rank=1, ep_size=2)
    for tensor, value in ((experts.swiglu_alpha, 1.5), (experts.swiglu_beta, 0.25), (experts.swiglu_limit, 3.0)):
        assert tensor.dtype == torch.float32 and torch.equal(tensor, torch.full((2,), value))


def test_swiglu_kinds():
    def parameters(**activation):
        return swiglu_parameters(Activation.from_json(activation, "m"), "m")

    assert parameters(kind="swiglu_oai", alpha=1.702, beta=1.0, limit=7.0) == (1.702, 1.0, 7.0)
    assert parameters(kind="swiglu", alpha=1.0, beta=0.0, limit=10.0) == (1.0, 0.0, 10.0)
    assert parameters(kind="swiglu", limit=None) == (1.0, 0.0, math.inf)
    assert parameters(kind="swiglu") == (1.0, 0.0, math.inf)
    with pytest.raises(MoebakeError, match="m: activation swiglu_oai needs numeric alpha, beta and limit"):
        parameters(kind="swiglu_oai", alpha=1.0, beta=1.0)
    with pytest.raises(MoebakeError, match="m: field activation.limit is str"):  # the manifest's one validation path
        parameters(kind="swiglu", limit="high")
    with pytest.raises(MoebakeError, match="m: activation kind 'gelu' is not supported"):
        parameters(kind="gelu")


def test_expert_parallel_reads_only_the_ranks_bytes(baked):
    io = psutil.Process().io_counters
    if not hasattr(io(), "read_chars"):
        pytest.skip("this platform does not count bytes read")
    checkpoint = moebake.serve.open(baked, platform=INSTALLED)
    checkpoint.load_experts(0, device="cpu", ep_rank=0, ep_size=2)  # parses the shard headers
    before = io().read_chars
    experts = checkpoint.load_experts(0, device="cpu", ep_rank=1, ep_size=2)
    read = io().read_chars - before
    rank_bytes = sum(t.numel() * t.element_size() for t in experts.parameters().values())
    layer_bytes = sum(t.numel() * t.element_size() for t in layer_tensors(baked, 0).values())
    assert rank_bytes == layer_bytes // 2
    assert rank_bytes <= read <= rank_bytes + 4096


def test_verify_accepts_an_intact_checkpoint(baked):
    moebake.serve.open(baked, platform=INSTALLED).load_experts(0, device="cpu", verify=True)


def test_verify_refuses_a_changed_shard(baked_copy):
    shard = sorted(baked_copy.glob("*.safetensors"))[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    checkpoint = moebake.serve.open(baked_copy, platform=INSTALLED)
    layer = next(r.index for r in checkpoint.manifest.layers if checkpoint.weight_map[r.prefix + "w13_weight"] == shard.name)
    with pytest.raises(MoebakeError, match=f"{shard.name}: xxh3-128 mismatch"):
        checkpoint.load_experts(layer, device="cpu", verify=True)
    checkpoint.load_experts(layer, device="cpu", verify=False)  # unchecked loads still read it


def test_verify_refuses_a_shard_of_the_wrong_size(baked_copy):
    shard = sorted(baked_copy.glob("*.safetensors"))[0]
    with open(shard, "ab") as f:
        f.write(b"\0")
    checkpoint = moebake.serve.open(baked_copy, platform=INSTALLED)
    with pytest.raises(MoebakeError, match=rf"{shard.name}: \d+ bytes, .*moebake.json says \d+"):
        checkpoint.verify_files([name for name, file in checkpoint.weight_map.items() if file == shard.name])


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_refuses_a_gpu_that_is_not_sm90(baked, capability):
    platform = Platform(flashinfer_version="0.7.2.post1", capability=capability)
    with pytest.raises(MoebakeError, match=rf"compute capability {capability[0]}\.{capability[1]}.*runs on Hopper \(SM90\) GPUs only"):
        moebake.serve.open(baked, platform=platform).load_experts(0, device="cuda")


@pytest.mark.parametrize(
    "version, message",
    [
        ("0.6.17", "installed FlashInfer 0.6.17 reads fp4 layout v1; re-bake with --flashinfer-layout v1"),
        ("0.6.12", "installed FlashInfer 0.6.12 reads fp4 layout v1"),
        ("0.6.16.post3", "installed FlashInfer 0.6.16.post3 reads fp4 layout v1"),
        ("0.6.5", "installed FlashInfer 0.6.5 has no SM90 W4A16 fp4 layout"),
    ],
)
def test_refuses_a_flashinfer_that_reads_another_layout(baked, version, message):
    expected = r"moebake.json: baked for FlashInfer SM90 fp4 layout v2, but the " + message.replace(".", r"\.")
    with pytest.raises(MoebakeError, match=expected):
        moebake.serve.open(baked, platform=Platform(flashinfer_version=version)).load_experts(0, device="cpu")


@pytest.mark.parametrize("version", ["0.6.16", "0.6.18", "0.7.2.post1"])
def test_accepts_a_flashinfer_that_reads_the_baked_layout(baked, version):
    moebake.serve.open(baked, platform=Platform(flashinfer_version=version)).load_experts(0, device="cpu")


def test_refuses_a_v1_checkpoint_on_a_v2_flashinfer(tmp_path):
    source = write_gpt_oss(tmp_path / "src", **{**SHAPE, "num_layers": 1})
    convert(source, tmp_path / "out", ConvertOptions(target="sm90-cutlass", flashinfer_layout="v1"), progress=False)
    with pytest.raises(
        MoebakeError, match="baked for FlashInfer SM90 fp4 layout v1, but the installed FlashInfer 0.7.2.post1 reads fp4 layout v2"
    ):
        moebake.serve.open(tmp_path / "out", platform=INSTALLED).load_experts(0, device="cpu")


def test_refuses_an_unknown_schema(baked_copy):
    edit_manifest(baked_copy, lambda m: m.update(schema="moebake.manifest/99"))
    with pytest.raises(MoebakeError, match="unknown manifest schema 'moebake.manifest/99'"):
        moebake.serve.open(baked_copy)


def test_refuses_an_unknown_target(baked_copy):
    edit_manifest(baked_copy, lambda m: m.update(target="tpu-magic"))
    with pytest.raises(MoebakeError, match="target 'tpu-magic' has no runtime here"):
        moebake.serve.open(baked_copy)


def test_refuses_a_newer_target_layout_version(baked_copy):
    edit_manifest(baked_copy, lambda m: m.update(target_layout_version=99))
    with pytest.raises(MoebakeError, match="sm90-cutlass layout version 99; this runtime reads"):
        moebake.serve.open(baked_copy)


def test_refuses_a_directory_without_manifest(tmp_path):
    with pytest.raises(MoebakeError, match="not a moebake output"):
        moebake.serve.open(tmp_path)


@pytest.mark.parametrize("ep_rank, ep_size", [(0, 3), (2, 2), (-1, 2), (0, 0)])
def test_refuses_an_uneven_or_impossible_expert_split(baked, ep_rank, ep_size):
    with pytest.raises(MoebakeError, match="has 4 experts, which EP rank .* cannot split evenly"):
        moebake.serve.open(baked, platform=INSTALLED).load_experts(0, device="cpu", ep_rank=ep_rank, ep_size=ep_size)


def test_refuses_an_unknown_layer(baked):
    with pytest.raises(MoebakeError, match=r"no MoE layer 7 \(layers: \[0, 1\]\)"):
        moebake.serve.open(baked, platform=INSTALLED).load_experts(7, device="cpu")


def test_refuses_an_unknown_activation(baked_copy):
    edit_manifest(baked_copy, lambda m: m.update(activation={"kind": "relu2"}))
    with pytest.raises(MoebakeError, match="activation kind 'relu2' is not supported"):
        moebake.serve.open(baked_copy, platform=INSTALLED).load_experts(0, device="cpu")


@pytest.mark.parametrize(
    "change",
    [
        lambda tensors: tensors.pop("w2_weight_bias"),  # one bias without the other
        lambda tensors: tensors.pop("w2_weight_scale"),  # a required tensor missing
        lambda tensors: tensors.update(w13_residual=tensors["w2_weight"]),  # a tensor the runtime would ignore
    ],
)
def test_refuses_a_tensor_set_it_cannot_run(baked_copy, change):
    edit_manifest(baked_copy, lambda m: change(m["layers"][0]["tensors"]))
    with pytest.raises(MoebakeError, match="layer 0 tensors .* do not fit the sm90-cutlass runtime"):
        moebake.serve.open(baked_copy, platform=INSTALLED).load_experts(0, device="cpu")


def test_refuses_a_shard_whose_tensor_disagrees_with_the_manifest(baked_copy):
    edit_manifest(baked_copy, lambda m: m["layers"][0]["tensors"]["w2_weight"].update(shape=[4, 256, 32]))
    with pytest.raises(MoebakeError, match=r"tensor model.layers.0.mlp.experts.w2_weight is U8 \[4, 256, 64\], .*says U8 \[4, 256, 32\]"):
        moebake.serve.open(baked_copy, platform=INSTALLED).load_experts(0, device="cpu")


def test_forward_needs_cuda(baked):
    experts = moebake.serve.open(baked, platform=INSTALLED).load_experts(0, device="cpu")
    x = torch.zeros(2, 160, dtype=torch.bfloat16)
    with pytest.raises(MoebakeError, match="experts were loaded to cpu; forward needs a CUDA device"):
        experts.forward(x, torch.zeros(2, 4, dtype=torch.int32), torch.ones(2, 4))


@pytest.mark.parametrize(
    "x, ids, weights, message",
    [
        (
            torch.zeros(2, 256, dtype=torch.bfloat16),
            torch.zeros(2, 4, dtype=torch.int32),
            torch.ones(2, 4),
            r"hidden_states is torch.bfloat16 \[2, 256\], expected bfloat16 \[T, 160\]",
        ),
        (
            torch.zeros(2, 160, dtype=torch.float16),
            torch.zeros(2, 4, dtype=torch.int32),
            torch.ones(2, 4),
            r"hidden_states is torch.float16 \[2, 160\]",
        ),
        (
            torch.zeros(2, 160, dtype=torch.bfloat16),
            torch.zeros(3, 4, dtype=torch.int32),
            torch.ones(3, 4),
            r"topk_ids is torch.int32 \[3, 4\], expected integer \[T, k\]",
        ),
        (
            torch.zeros(2, 160, dtype=torch.bfloat16),
            torch.zeros(2, 4, dtype=torch.int32),
            torch.ones(2, 4, dtype=torch.bfloat16),
            r"topk_weights is torch.bfloat16 \[2, 4\], expected float32 \[2, 4\]",
        ),
    ],
)
def test_forward_refuses_bad_inputs(baked, x, ids, weights, message):
    experts = moebake.serve.open(baked, platform=INSTALLED).load_experts(0, device="cpu")
    with pytest.raises(MoebakeError, match="forward: .*" + message):
        experts.forward(x, ids, weights)
