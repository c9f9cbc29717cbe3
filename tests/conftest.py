"""Shared fixtures: small synthetic checkpoints in exact source formats."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from moebake.synthetic import write_gpt_oss

# A GPT-OSS shape whose dims need padding: H=160 -> 256, I=96 -> 128.
TINY = {"num_layers": 2, "num_experts": 3, "hidden": 160, "intermediate": 96, "vocab": 64}


@pytest.fixture(scope="session")
def gpt_oss_tiny(tmp_path_factory):
    """A 2-layer, 3-expert GPT-OSS checkpoint (one shard per layer), read-only for tests."""
    return write_gpt_oss(tmp_path_factory.mktemp("src") / "gpt-oss-tiny", **TINY)


@pytest.fixture()
def gpt_oss_copy(tmp_path, gpt_oss_tiny):
    """A private copy of the tiny checkpoint that a test may damage."""
    import shutil

    return shutil.copytree(gpt_oss_tiny, tmp_path / "src")


def random_u8(*shape, seed=0):
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def load_all(directory) -> dict:
    """Every tensor of every shard in a checkpoint directory, via safetensors' own reader."""
    tensors = {}
    for shard in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(shard))
    return tensors


@pytest.fixture(scope="session")
def sm90_gpu():
    """The CUDA device, with FlashInfer's SM90 fused-MoE module ready; skips without an SM90 GPU or FlashInfer."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an SM90 GPU")
    pytest.importorskip("flashinfer")
    from moebake.serve.flashinfer_ops import sm90_moe_ops

    sm90_moe_ops()
    return torch.device("cuda")
