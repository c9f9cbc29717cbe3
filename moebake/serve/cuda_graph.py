"""Capturing a call in a CUDA graph, as CUDA graphs need it: one eager warm-up call on a side stream first
(kernels compiled, workspaces allocated, lazy state set), then the capture on the current device."""

from collections.abc import Callable
from typing import Any

import torch


def capture(call: Callable[[], Any]):
    """``(graph, result)``: ``call()`` recorded in a ``torch.cuda.CUDAGraph`` and the result of the captured call
    (tensors that each ``graph.replay()`` rewrites in place)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = call()
    return graph, result
