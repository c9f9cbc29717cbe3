"""GPU checks of the cutedsl / cutedsl-deepep bakes against what SGLang computes on the device at load time.

1. ``w*_weight_scale`` bytes equal FlashInfer's CUDA ``block_scale_interleave`` (the op behind SGLang's
   ``swizzle_blockscale`` consumers and ``shuffle_matrix_sf_a``) of the linear scales in the target's
   W13 row order.
2. The derived F32 scalars equal SGLang's formulas evaluated on CUDA tensors, bit for bit (the bake
   computes them on the CPU).
3. If nvidia-cutlass-dsl is installed: FlashInfer's ``convert_sf_to_mma_layout`` view of the baked bytes
   equals the view moebake documents (the CuteDSL kernels themselves need SM100 and are not run).
"""

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from moebake.convert.options import ConvertOptions  # noqa: E402
from moebake.convert.run import convert  # noqa: E402
from moebake.reference.synthetic_sources import write_modelopt_nvfp4  # noqa: E402

pytestmark = pytest.mark.gpu

H, I, E = 512, 256, 8
PREFIX = "model.layers.1.mlp.experts."


@pytest.fixture(scope="module")
def bakes(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    root = tmp_path_factory.mktemp("cutedsl-gpu")
    source = write_modelopt_nvfp4(root / "src", hidden=H, intermediate=I, num_experts=E, mismatches=((2, 0.3), (5, 3.0)))
    for target in ("cutedsl", "cutedsl-deepep"):
        convert(source, root / target, ConvertOptions(target), progress=False)
    return root


def load(directory):
    tensors = {}
    for shard in sorted(directory.glob("*.safetensors")):
        tensors |= load_file(shard)
    return tensors


@pytest.mark.parametrize("target", ["cutedsl", "cutedsl-deepep"])
def test_scales_equal_block_scale_interleave(bakes, target):
    flashinfer = pytest.importorskip("flashinfer")
    from moebake.convert.targets import get_target
    from moebake.formats import open_source

    model = open_source(bakes / "src")
    layer = model.layers[0]
    order = get_target(target).order
    gate = torch.stack([model.block_scales(layer, e, "gate") for e in range(E)])
    up = torch.stack([model.block_scales(layer, e, "up") for e in range(E)])
    down = torch.stack([model.block_scales(layer, e, "down") for e in range(E)])
    baked = load(bakes / target)
    for short, linear in (("w13_weight_scale", order.rows(gate, up)), ("w2_weight_scale", down)):
        expected = flashinfer.block_scale_interleave(linear.cuda()).cpu().reshape(E, -1)
        assert torch.equal(baked[PREFIX + short].view(torch.uint8).reshape(E, -1), expected), short


def test_scalars_equal_sglang_formulas_on_cuda(bakes):
    baked = {t: load(bakes / t) for t in ("cutedsl", "cutedsl-deepep")}
    raw = {k: baked["cutedsl"][PREFIX + k].cuda() for k in ("w13_weight_scale_2", "w2_weight_scale_2", "w13_input_scale", "w2_input_scale")}
    # SGLang process_weights_after_loading, CuteDSL branch (one rank holding every expert)
    w13_input_scale = raw["w13_input_scale"].max().to(torch.float32).repeat(E)
    g1_alphas = (w13_input_scale * raw["w13_weight_scale_2"][:, 0]).to(torch.float32)
    g1_alphas_up = (w13_input_scale * raw["w13_weight_scale_2"][:, 1]).to(torch.float32)
    g2_alphas = (raw["w2_input_scale"] * raw["w2_weight_scale_2"]).to(torch.float32)
    w13_input_scale_quant = (1 / w13_input_scale).to(torch.float32)
    w2_input_scale_quant = (1 / raw["w2_input_scale"]).to(torch.float32)
    # resolve_cutedsl_standard_scales
    fc2_input_scale = w2_input_scale_quant.min().reshape(1)
    used_input_scale = w13_input_scale_quant.min().reshape(1)
    w1_alpha = raw["w13_weight_scale_2"][:, 0] / torch.clamp(used_input_scale.reshape(()), min=1e-12)
    w2_alpha = raw["w2_weight_scale_2"] / torch.clamp(fc2_input_scale.reshape(-1)[:1], min=1e-12).reshape(())
    expected = {
        "cutedsl-deepep": {
            "g1_alphas": g1_alphas,
            "g1_alphas_up": g1_alphas_up,
            "g2_alphas": g2_alphas,
            "w13_input_scale_quant": w13_input_scale_quant,
            "w2_input_scale_quant": w2_input_scale_quant,
        },
        "cutedsl": {
            "w1_alpha": w1_alpha,
            "w2_alpha": w2_alpha,
            "fc2_input_scale": fc2_input_scale,
            "w13_input_scale_quant": w13_input_scale_quant,
            "g1_alphas_up": g1_alphas_up,
        },
    }
    for target, tensors in expected.items():
        for short, value in tensors.items():
            assert torch.equal(baked[target][PREFIX + short].view(torch.int32), value.cpu().view(torch.int32)), (target, short)


def test_mma_view_equals_convert_sf_to_mma_layout(bakes):
    utils = pytest.importorskip("flashinfer.cute_dsl.utils", reason="needs nvidia-cutlass-dsl")
    sf = load(bakes / "cutedsl")[PREFIX + "w13_weight_scale"].view(torch.uint8).reshape(-1).cuda()
    expected = utils.convert_sf_to_mma_layout(sf, m=2 * I, k=H, num_groups=E, sf_vec_size=16)
    documented = sf.view(E, 2 * I // 128, H // 64, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)
    assert expected.shape == documented.shape and expected.stride() == documented.stride()
    assert torch.equal(expected.cpu(), documented.cpu())
