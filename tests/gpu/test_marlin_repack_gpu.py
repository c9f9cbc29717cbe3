"""moebake's CPU Marlin repack (``moebake.layouts.marlin.repack``) vs the CUDA op ``gptq_marlin_repack`` itself, at real sizes.

The op is vLLM's CUDA source, compiled on the GPU machine from the ignored ``.gpu-cache/marlin/``
(``tests/gpu/marlin_oracle.py``; ``bin/gpu-harness marlin-oracle`` runs this file). Every expert of a
GPT-OSS-120B layer (E = 128, H = I = 2880, as SGLang's Marlin path pads them: H 3072, I 2944) and of a
DeepSeek-V4-sized layer (H = 7168, I = 3072; 32 experts) is random bytes, repacked on the GPU as the
engines call the op (``w.view(int32).T``, no perm, 4 bits) and on the CPU, and compared byte for byte.
Skipped without CUDA or without the carried source.
"""

import zlib

import pytest
import torch

from moebake.layouts.marlin import repack

pytestmark = pytest.mark.gpu

SHAPES = {  # name -> (experts, N, K) of one weight tensor as the Marlin preparation repacks it
    "gpt-oss-120b/w13": (128, 2 * 2944, 3072),
    "gpt-oss-120b/w2": (128, 3072, 2944),
    "deepseek-v4/w13": (32, 2 * 3072, 7168),
    "deepseek-v4/w2": (32, 7168, 3072),
}
CHUNK = 16  # experts compared at a time


@pytest.fixture(scope="module")
def cuda_repack():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from marlin_oracle import SOURCE_DIR, build, repack_source

    if repack_source() is None:
        pytest.skip(f"no gptq_marlin_repack.cu under {SOURCE_DIR} (bin/marlin-oracle-source VLLM_CHECKOUT, carry .gpu-cache)")
    return build().repack


@pytest.mark.parametrize("name", SHAPES)
def test_cpu_repack_equals_cuda_gptq_marlin_repack(cuda_repack, name):
    experts, n, k = SHAPES[name]
    generator = torch.Generator(device="cuda").manual_seed(zlib.crc32(name.encode()))
    for start in range(0, experts, CHUNK):
        count = min(CHUNK, experts - start)
        w = torch.randint(0, 256, (count, n, k // 2), dtype=torch.uint8, device="cuda", generator=generator)
        on_gpu = torch.stack([cuda_repack(w[e].view(torch.int32).T.contiguous(), k, n) for e in range(count)]).cpu()
        on_cpu = repack(w.cpu())
        assert on_gpu.dtype == on_cpu.dtype == torch.int32 and on_gpu.shape == on_cpu.shape == (count, k // 16, 2 * n)
        different = (on_gpu != on_cpu).flatten(1).any(1)
        assert not different.any(), f"{name}: experts {(different.nonzero().flatten() + start).tolist()} differ"


def test_e8m0_bytes_survive_the_bf16_round_trip_on_cuda():
    """The engines' scale step (E8M0 -> BF16 -> E8M0) on the GPU keeps every byte, as it does on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    every = torch.arange(256, dtype=torch.uint8, device="cuda")
    back = every.view(torch.float8_e8m0fnu).to(torch.bfloat16).to(torch.float8_e8m0fnu).view(torch.uint8)
    assert torch.equal(back.cpu(), every.cpu())
