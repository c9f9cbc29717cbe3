"""The BF16 MTP (draft) layer of a ModelOpt NVFP4 checkpoint, baked for deepep-bf16 while the NVFP4 layers pass through."""

import pytest
import torch
from click.testing import CliRunner

from conftest import load_all
from moebake.cli import main
from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.formats import detect_format
from moebake.formats.checkpoint import open_checkpoint
from moebake.reference.synthetic_sources import write_modelopt_nvfp4
from moebake.schema.manifest import read_manifest

L, E, H, I = 3, 4, 128, 64


@pytest.fixture(scope="module")
def baked(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvfp4mtp")
    source = write_modelopt_nvfp4(root / "src", num_layers=L, num_experts=E, hidden=H, intermediate=I)
    convert(source, root / "out", ConvertOptions(target="deepep-bf16"), progress=False)
    return source, root / "out"


def test_the_checkpoint_is_nvfp4_unless_a_target_asks_for_bf16_moe(baked):
    source, _ = baked
    assert detect_format(open_checkpoint(source)) == "modelopt-nvfp4"
    assert detect_format(open_checkpoint(source), ("bf16-moe",)) == "bf16-moe"


def test_only_the_mtp_layer_is_baked_and_nvfp4_bytes_pass_through(baked):
    source, out = baked
    src, dst = load_all(source), load_all(out)
    manifest = read_manifest(out)
    mtp = f"model.layers.{L}.mlp.experts."
    assert [r["prefix"] for r in manifest["layers"]] == [mtp]
    assert manifest["source"]["format"] == "bf16-moe" and manifest["layers"][0]["dispatcher_output_dtype"] == "bf16"
    w13, w2 = dst[mtp + "w13_weight"], dst[mtp + "w2_weight"]
    for e in range(E):  # [gate; up] as SGLang's EP loader fills it: w1 -> rows [:I], w3 -> rows [I:]
        assert torch.equal(w13[e, :I], src[f"{mtp}{e}.gate_proj.weight"])
        assert torch.equal(w13[e, I:], src[f"{mtp}{e}.up_proj.weight"])
        assert torch.equal(w2[e], src[f"{mtp}{e}.down_proj.weight"])
    untouched = {k for k in src if not k.startswith(mtp)}
    assert set(dst) == untouched | {mtp + "w13_weight", mtp + "w2_weight"}
    for name in untouched:  # the NVFP4 experts, scales and everything else, byte for byte
        same_bytes = torch.equal(src[name].reshape(-1).view(torch.uint8), dst[name].reshape(-1).view(torch.uint8))
        assert src[name].dtype == dst[name].dtype and same_bytes, name


def test_verify_with_source_reopens_it_as_baked(baked):
    source, out = baked
    result = CliRunner().invoke(main, ["verify", str(out), "--source", str(source)])
    assert result.exit_code == 0, result.output
