"""Shapes and inputs shared by the GPU proofs of the SM90 Humming preprocess (FP8 activations x MXFP4).

Used by ``tests/gpu/test_sm90_humming_gpu.py`` (FlashInfer's own wrappers on its compiled module) and
``bin/gpu-harness oracle`` (the nvcc-compiled ``moe_gemm_mixed_utils.cu`` alone). Real sizes: GPT-OSS
(E 128, H = I = 2880) as SGLang 0.5.23 pads it (W13 ``[128, 2 * 2944, 3072 / 2]``, W2 ``[128, 3072, 2944 / 2]``)
and DeepSeek-V4-Pro's expert shape (H 7168, I 3072; 32 of its 384 experts: the preprocess is per expert).
"""

import torch

# name: (E, rows, K) of one weight matrix, K in elements (the packed bytes are K / 2, the scales K / 32)
REAL_SHAPES = {
    "gpt-oss w13 (E 128, 2 x I_pad 2944, H_pad 3072)": (128, 5888, 3072),
    "gpt-oss w2 (E 128, H_pad 3072, I_pad 2944)": (128, 3072, 2944),
    "deepseek-v4-pro w13 (32 of 384 experts, 2 x I 3072, H 7168)": (32, 6144, 7168),
    "deepseek-v4-pro w2 (32 of 384 experts, H 7168, I 3072)": (32, 7168, 3072),
}
SMALL_SHAPES = {f"{e}x{n}x{k}": (e, n, k) for e, n, k in [(3, 48, 256), (1, 2064, 192), (1, 64, 4480), (2, 2944, 2944)]}


def weights(shape, seed: int) -> torch.Tensor:
    """Random packed E2M1 payload uint8 ``[E, n, K/2]`` (every code, -0 included)."""
    E, n, K = shape
    return torch.randint(0, 256, (E, n, K // 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def scales(shape, seed: int) -> torch.Tensor:
    """E8M0 scales uint8 ``[E, n, K/32]`` like a checkpoint's (about 2^-12 .. 2^0), with experts that exercise
    every branch: most within the kept range 11, some with outliers far below it (clamped groups,
    rewritten codes), one of a single value, one spanning 0 .. 254."""
    E, n, K = shape
    g = torch.Generator().manual_seed(seed)
    out = torch.randint(116, 128, (E, n, K // 32), dtype=torch.uint8, generator=g)
    outliers = torch.rand(out.shape, generator=g) < 0.01
    out[outliers] = torch.randint(90, 116, (int(outliers.sum()),), dtype=torch.uint8, generator=g)
    out[: max(1, E // 4)] = torch.randint(122, 128, out[: max(1, E // 4)].shape, dtype=torch.uint8, generator=g)  # no clamp
    if E > 2:
        out[1] = 120
        out[2] = torch.randint(0, 255, out[2].shape, dtype=torch.uint8, generator=g)
    return out


def compare(name: str, what: str, actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Print one line saying whether ``actual`` (moebake, CPU) equals ``expected`` (FlashInfer, GPU) byte for byte."""
    same_layout = actual.shape == expected.shape and actual.dtype == expected.dtype
    a, b = actual.contiguous().view(torch.uint8).reshape(-1), expected.contiguous().view(torch.uint8).reshape(-1)
    differing = int((a != b).sum()) if same_layout else -1
    verdict = "MATCH" if differing == 0 else ("MISMATCH (shape/dtype)" if differing < 0 else f"MISMATCH ({differing} bytes differ)")
    print(
        f"{verdict}: {what}, {name}: moebake CPU {actual.dtype} {list(actual.shape)} vs FlashInfer GPU "
        f"{expected.dtype} {list(expected.shape)}, {a.numel()} bytes",
        flush=True,
    )
    return differing == 0
