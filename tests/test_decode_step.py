"""The sm90-cutlass decode step's buffers and refusals on CPU (its kernel calls and CUDA graph: tests/gpu/test_sm90_serve.py)."""

import pytest
import torch

from moebake.errors import InvalidArgumentError, PlatformError
from moebake.loading.staged_reader import LoadStats
from moebake.serve.sm90_cutlass import Sm90CutlassExperts

E, H, H_PAD, I_PAD = 4, 2880, 3072, 2944


@pytest.fixture
def experts():
    tensors = {
        "w13_weight": torch.zeros(E, 2 * I_PAD, H_PAD // 2, dtype=torch.uint8),
        "w2_weight": torch.zeros(E, H_PAD, I_PAD // 2, dtype=torch.uint8),
        "w13_weight_scale": torch.zeros(E, 2 * I_PAD // 64, H_PAD // 128, 16, 16, dtype=torch.uint8),
        "w2_weight_scale": torch.zeros(E, H_PAD // 64, I_PAD // 128, 16, 16, dtype=torch.uint8),
    }
    return Sm90CutlassExperts(
        tensors, hidden=H, hidden_padded=H_PAD, swiglu=(1.702, 1.0, 7.0), ep_rank=0, ep_size=1, load_stats=LoadStats(0, 0.0, 4, "cpu")
    )


def test_decode_step_buffers_are_the_kernels_inputs_at_the_padded_width(experts):
    step = experts.decode_step(max_tokens=16, top_k=4)
    assert (step.hidden_padded.dtype, tuple(step.hidden_padded.shape)) == (torch.bfloat16, (16, H_PAD))
    assert (step.topk_ids.dtype, tuple(step.topk_ids.shape)) == (torch.int32, (16, 4))
    assert (step.topk_weights.dtype, tuple(step.topk_weights.shape)) == (torch.float32, (16, 4))
    assert (step.output.dtype, tuple(step.output.shape)) == (torch.bfloat16, (16, H_PAD))
    step.hidden.fill_(1.0)  # the caller's view: the first H columns of the padded buffer, same storage
    assert step.hidden.shape == (16, H) and step.hidden.data_ptr() == step.hidden_padded.data_ptr()
    assert step.hidden_padded[:, :H].eq(1).all() and not step.hidden_padded[:, H:].any()


def test_decode_step_refusals(experts):
    with pytest.raises(InvalidArgumentError, match="max_tokens and top_k must be at least 1"):
        experts.decode_step(max_tokens=0, top_k=4)
    step = experts.decode_step(max_tokens=8, top_k=4)
    with pytest.raises(InvalidArgumentError, match=r"tokens must be in 1\.\.8, got 9"):
        step.run(9)
    with pytest.raises(PlatformError, match="needs a CUDA device"):
        step.run(1)
    with pytest.raises(InvalidArgumentError, match="nothing captured yet"):
        step.replay()
