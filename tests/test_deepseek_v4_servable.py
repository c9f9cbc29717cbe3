"""A servable DeepSeek-V4-shaped checkpoint (:func:`write_deepseek_v4_servable`) held to SGLang 0.5.17's own model.

The oracle is SGLang 0.5.17's ``DeepseekV4ForCausalLM`` and its MTP draft ``DeepseekV4ForCausalLMNextN``, built on CPU
from the written config.json (SGLang's ``get_config``) and loaded from the shards by SGLang's ``load_weights`` (its
weight-name mapping, its ``wqkv_a`` and compressor fusions, its parameters' loaders): ``engine_oracles/sglang_dsv4_model.py``,
run in a process with 0.5.17's tree first on ``PYTHONPATH`` (``tests/engine_releases``). Every parameter must get a
checkpoint tensor and every checkpoint tensor must reach a parameter, with the parameter's shape (a loader refuses any
other). Mutated checkpoints (a shape, a missing tensor, an extra tensor) must fail it. ``moebake convert`` must accept
the checkpoint for ``sm90-marlin``, the route moebake's serving records give DeepSeek-V4 on SGLang, and the bake must load
the same way under ``--quantization moebake`` (moebake's SGLang plugin loaded as a server loads it).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from moebake.convert.options import ConvertOptions
from moebake.convert.run import convert
from moebake.reference.synthetic_sources import DEEPSEEK_V4_FLASH_ATTENTION, write_deepseek_v4_servable
from moebake.schema.serving import SGLANG, record

REPO = Path(__file__).resolve().parents[1]
RELEASE = "0.5.17"
SMALL = {"hidden": 512, "intermediate": 128, "num_experts": 4, "vocab": 256}
"""Smaller than the served model (bench/real_server.py's, 4096 wide) only where SGLang's names and shapes do not care;
the attention geometry (:data:`DEEPSEEK_V4_FLASH_ATTENTION`) is the served one."""


@pytest.fixture(scope="module")
def servable(tmp_path_factory):
    return write_deepseek_v4_servable(tmp_path_factory.mktemp("dsv4-servable") / "src", **SMALL)


def _mutated(source: Path, directory: Path, change) -> Path:
    """A copy of ``source`` whose tensors ``change(tensors)`` edits in place (the index follows); a change named
    ``_config_*`` edits its config.json instead."""
    shutil.copytree(source, directory)
    if change.__name__.startswith("_config_"):
        config_path = directory / "config.json"
        config_path.write_text(json.dumps(change(json.loads(config_path.read_text()))))
        return directory
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    tensors = {name: tensor for shard in shards for name, tensor in load_file(directory / shard).items()}
    change(tensors)
    for shard in shards:
        (directory / shard).unlink()
    save_file(tensors, directory / shards[0], metadata={"format": "pt"})
    index["weight_map"] = {name: shards[0] for name in tensors}
    index_path.write_text(json.dumps(index))
    return directory


def _sglang_oracle(*checkpoints: Path) -> list[dict]:
    """SGLang 0.5.17's verdict on each checkpoint (``engine_oracles/sglang_dsv4_model.py``, in 0.5.17's environment)."""
    sys.path.insert(0, str(REPO))
    from tests.engine_releases import prove, trees

    try:
        trees.release_tree("sglang", RELEASE)
    except OSError as err:  # no network and no cached tree
        if os.environ.get("MOEBAKE_REQUIRE_ENGINES") == "1":
            raise
        pytest.skip(f"cannot fetch sglang {RELEASE}'s tree: {err}")
    env = prove.release_env("sglang", RELEASE)
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "engine_oracles" / "sglang_dsv4_model.py"), *map(str, checkpoints)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    verdicts = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(verdicts) == len(checkpoints), done.stderr[-4000:]
    return verdicts


def _shape(tensors):  # one attention projection 128 rows short (its scale follows)
    name = "layers.1.attn.wo_b."
    tensors[name + "weight"] = tensors[name + "weight"][:-128].clone()
    tensors[name + "scale"] = tensors[name + "scale"][:-1].clone()


def _missing(tensors):
    del tensors["layers.0.attn.indexer.weights_proj.weight"]


def _extra(tensors):
    tensors["layers.1.attn.indexer.weights_proj.weight"] = tensors["layers.0.attn.indexer.weights_proj.weight"].clone()


def _mtp_shape(tensors):  # the draft's e_proj half as wide
    tensors["mtp.0.e_proj.weight"] = tensors["mtp.0.e_proj.weight"][:, : SMALL["hidden"] // 2].clone()
    tensors["mtp.0.e_proj.scale"] = tensors["mtp.0.e_proj.scale"][:, : SMALL["hidden"] // 256].clone()


def _config_no_sliding_window(config):  # what the first real-server run had: SGLang's ModelConfig reads it
    config.pop("sliding_window", None)
    return config


MUTATIONS = {"shape": _shape, "missing": _missing, "extra": _extra, "mtp_shape": _mtp_shape, "no_sliding_window": _config_no_sliding_window}


@pytest.fixture(scope="module")
def bake(servable, tmp_path_factory):
    """Its ``sm90-marlin`` bake for SGLang 0.5.17: the target moebake's serving records route DeepSeek-V4 through on
    SGLang (``--quantization moebake --moe-runner-backend marlin``)."""
    assert record(SGLANG, "sm90-marlin", "deepseek-v4").route == "sm90-marlin-deepseek-v4"
    out = tmp_path_factory.mktemp("dsv4-servable-bake") / "sm90-marlin"
    convert(servable, out, ConvertOptions("sm90-marlin", engine=f"sglang=={RELEASE}"), progress=False)
    return out


@pytest.fixture(scope="module")
def verdicts(servable, bake, tmp_path_factory):
    """SGLang 0.5.17's verdict on the source, its bake and each mutated copy of the source, in one process."""
    root = tmp_path_factory.mktemp("dsv4-mutated")
    copies = [_mutated(servable, root / name, change) for name, change in MUTATIONS.items()]
    source, baked, *mutated = _sglang_oracle(servable, bake, *copies)
    return {"source": source, "bake": baked} | dict(zip(MUTATIONS, mutated))


def test_sglang_0517_loads_every_tensor_of_the_source(verdicts):
    good = verdicts["source"]
    assert good["model_config_error"] is None, good["model_config_error"]
    assert good["error"] is None, good["error"]
    assert good["unloaded"] == [], good["unloaded"]
    assert good["unused"] == [], good["unused"]
    parameters = good["parameters"]
    geometry = DEEPSEEK_V4_FLASH_ATTENTION
    heads, head_dim = geometry["num_attention_heads"], geometry["head_dim"]
    # The model SGLang built is the kernels' geometry: 64 query heads of 512, 64 indexer heads of 128.
    assert parameters["model.layers.0.self_attn.wq_b.weight"] == [[heads * head_dim, geometry["q_lora_rank"]], "torch.float8_e4m3fn"]
    assert parameters["model.layers.0.self_attn.indexer.wq_b.weight"][0] == [64 * 128, geometry["q_lora_rank"]]
    assert "model.layers.1.self_attn.indexer.wq_b.weight" not in parameters  # a ratio-128 layer has no indexer
    assert "nextn:model.decoder.self_attn.wqkv_a.weight" in parameters  # the MTP layer was built and loaded too
    assert parameters["model.layers.0.mlp.experts.w13_weight"][1] == "torch.int8"


def test_the_checks_can_fail(verdicts):
    assert verdicts["shape"]["error"], verdicts["shape"]
    assert verdicts["mtp_shape"]["error"], verdicts["mtp_shape"]
    assert verdicts["missing"]["unloaded"] == ["model.layers.0.self_attn.indexer.weights_proj.weight"], verdicts["missing"]
    assert verdicts["extra"]["unused"] == ["layers.1.attn.indexer.weights_proj.weight"], verdicts["extra"]
    assert "sliding_window" in (verdicts["no_sliding_window"]["model_config_error"] or ""), verdicts["no_sliding_window"]


def test_sglang_0517_loads_every_tensor_of_the_bake_through_moebakes_plugin(verdicts):
    """The bake under ``--quantization moebake``: every expert layer of SGLang's model (``model.layers.N.mlp.experts``,
    the draft's ``model.decoder.mlp.experts``) gets moebake's method from the manifest's DeepSeek-native record
    (``layers.N.ffn.experts.``, ``mtp.0.ffn.experts.``), its baked tensors reach its parameters, and every other tensor
    SGLang's own. Without that prefix mapping SGLang's FP8 method took the experts and its loader refused the bake."""
    baked = verdicts["bake"]
    assert baked["error"] is None, baked["error"]
    assert baked["unloaded"] == [] and baked["unused"] == [], (baked["unloaded"], baked["unused"])
    for layer in ("model.layers.0.mlp.experts.", "model.layers.1.mlp.experts.", "nextn:model.decoder.mlp.experts."):
        assert layer + "w13_weight_scale" in baked["parameters"], layer  # the bake's names: moebake's method built it
        assert layer + "w13_weight_scale_inv" not in baked["parameters"], layer
    source = verdicts["source"]["parameters"]
    assert {n: v for n, v in baked["parameters"].items() if ".experts." not in n} == {
        n: v for n, v in source.items() if ".experts." not in n
    }


def test_written_geometry_and_dtypes(servable):
    config = json.loads((servable / "config.json").read_text())
    for key, value in DEEPSEEK_V4_FLASH_ATTENTION.items():
        assert config[key] == value, key
    assert config["compress_ratios"] == [4, 128, 0]
    tensors = {name: t for shard in sorted(servable.glob("*.safetensors")) for name, t in load_file(shard).items()}
    assert tensors["layers.0.attn.wq_b.weight"].dtype == torch.float8_e4m3fn
    assert tensors["layers.0.attn.wq_b.scale"].dtype == torch.float8_e8m0fnu
    assert tensors["layers.0.ffn.experts.0.w1.weight"].dtype == torch.int8
    assert tensors["layers.0.ffn.experts.0.w1.scale"].dtype == torch.float8_e8m0fnu
    assert tensors["layers.0.attn.compressor.ape"].dtype == torch.float32
    assert "layers.0.ffn.gate.bias" not in tensors and "layers.0.ffn.gate.tid2eid" in tensors
    assert all(torch.isfinite(t.float()).all() for t in tensors.values() if t.dtype.is_floating_point and t.element_size() > 1)


def test_moebake_convert_takes_it_for_sglangs_dsv4_route(bake):
    """``moebake convert --target sm90-marlin --engine sglang==0.5.17`` takes the source; the attention travels with
    the bake."""
    config = json.loads((bake / "config.json").read_text())["quantization_config"]
    assert (config["quant_method"], config["target"], config["engine_version"]) == ("moebake", "sm90-marlin", RELEASE)
    baked = {name for shard in bake.glob("*.safetensors") for name in load_file(shard)}
    assert {"layers.0.attn.indexer.weights_proj.weight", "mtp.0.e_proj.weight", "hc_head_fn"} <= baked
    assert "layers.1.attn.indexer.weights_proj.weight" not in baked
