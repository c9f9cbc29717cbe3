"""Fixtures shared by the GPU tests (marker ``gpu``; run on the device with ``bin/gpu-harness``)."""

import pytest
import torch


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
