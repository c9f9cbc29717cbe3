"""SourceCheckpoint.read_experts and zip_expert_chunks: stacked tensors and per-expert patterns, vs safetensors' own loader."""

import pytest
import torch

from conftest import load_all as all_tensors
from moebake.convert.targets.expert_chunks import experts_per_chunk, zip_expert_chunks
from moebake.formats.checkpoint import open_checkpoint, per_expert_names
from moebake.reference.synthetic_sources import write_bf16_moe


@pytest.fixture(scope="module")
def per_expert(tmp_path_factory):
    return write_bf16_moe(tmp_path_factory.mktemp("re") / "qwen3", style="qwen3", num_experts=5, hidden=32, intermediate=16)


def test_per_expert_names_expand_the_index():
    assert per_expert_names("a.*.w1.weight", 3) == ("a.0.w1.weight", "a.1.w1.weight", "a.2.w1.weight")


@pytest.mark.parametrize("start, stop", [(0, 5), (1, 3), (4, 5)])
def test_read_experts_stacks_per_expert_tensors(per_expert, start, stop):
    checkpoint, stored = open_checkpoint(per_expert), all_tensors(per_expert)
    got = checkpoint.read_experts("model.layers.1.mlp.experts.*.down_proj.weight", start, stop)
    expected = torch.stack([stored[f"model.layers.1.mlp.experts.{e}.down_proj.weight"] for e in range(start, stop)])
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_read_experts_slices_stacked_tensors(tmp_path):
    root = write_bf16_moe(tmp_path / "fused", num_experts=5, hidden=32, intermediate=16)
    name = "model.language_model.layers.0.mlp.experts.gate_up_proj"
    assert torch.equal(open_checkpoint(root).read_experts(name, 2, 4), all_tensors(root)[name][2:4])


def test_zip_expert_chunks_reads_names_in_step_within_the_chunk_budget(per_expert):
    checkpoint, stored = open_checkpoint(per_expert), all_tensors(per_expert)
    names = ("model.layers.0.mlp.experts.*.gate_proj.weight", "model.layers.0.mlp.experts.*.up_proj.weight")
    one_expert = 2 * 16 * 32 * 2  # gate + up, BF16
    assert experts_per_chunk(checkpoint, names, 2 * one_expert) == 2
    seen = []
    chunks = list(zip_expert_chunks(checkpoint, names, 5, 2 * one_expert, lambda g, u: (seen.append(len(g)), g - u)[1])())
    assert seen == [2, 2, 1]
    expected = [
        stored[f"model.layers.0.mlp.experts.{e}.gate_proj.weight"] - stored[f"model.layers.0.mlp.experts.{e}.up_proj.weight"]
        for e in range(5)
    ]
    assert torch.equal(torch.cat(chunks), torch.stack(expected))
