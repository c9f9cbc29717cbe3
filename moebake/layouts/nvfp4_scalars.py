"""Per-expert F32 scalars SGLang derives at load time for its FlashInfer CuteDSL NVFP4 MoE paths.

Inputs are SGLang's ``ModelOptNvFp4FusedMoEMethod`` parameters as loaded from a ModelOpt checkpoint,
for all ``E`` experts (one rank holds every expert):

  ``w13_weight_scale_2``  F32 ``[E, 2]``  weight globals, column 0 = gate, column 1 = up
  ``w2_weight_scale_2``   F32 ``[E]``
  ``w13_input_scale``     F32 ``[E, 2]``  static activation globals (gate, up)
  ``w2_input_scale``      F32 ``[E]``

The formulas and the order of their F32 operations are SGLang's (0.5.23,
``process_weights_after_loading`` CuteDSL branch, ``_compute_gemm1_alphas`` and
``resolve_cutedsl_standard_scales``); every operation is a correctly rounded IEEE F32 multiply,
divide, reciprocal, max or min, so CPU and CUDA give the same bits.
"""

import torch

_EPS = 1e-12  # resolve_cutedsl_standard_scales clamps the scalar divisors to at least this


def load_time_scales(raw: dict[str, torch.Tensor], local: slice = slice(None)) -> dict[str, torch.Tensor]:
    """``process_weights_after_loading`` for CuteDSL, from the four parameters above by name: F32 ``[E]`` each.

    ``local``: the experts of one expert-parallel rank, as SGLang holds them: the input scales stay global
    (``[E, 2]``, ``[E]``), the weight globals are the rank's rows, and the results are the rank's rows.

    ``g1_alphas = max(w13_input_scale) * w13_weight_scale_2[:, 0]`` (one activation scale for all
    experts and both halves), ``g1_alphas_up`` the same with the up half's global (``[:, 1]``; SGLang
    0.5.23's ``_compute_gemm1_alphas``), ``g2_alphas = w2_input_scale * w2_weight_scale_2``, and the
    "quant-domain" reciprocals ``w13_input_scale_quant = 1 / max(w13_input_scale)``,
    ``w2_input_scale_quant = 1 / w2_input_scale``.
    """
    experts = raw["w13_input_scale"].shape[0]
    w13_input = raw["w13_input_scale"].max().to(torch.float32).repeat(experts)[local]
    w2_input = raw["w2_input_scale"][local]
    return {
        "g1_alphas": (w13_input * raw["w13_weight_scale_2"][:, 0]).to(torch.float32),
        "g1_alphas_up": (w13_input * raw["w13_weight_scale_2"][:, 1]).to(torch.float32),
        "g2_alphas": (w2_input * raw["w2_weight_scale_2"]).to(torch.float32),
        "w13_input_scale_quant": (1 / w13_input).to(torch.float32),
        "w2_input_scale_quant": (1 / w2_input).to(torch.float32),
    }


def cutedsl_wrapper_scales(raw: dict[str, torch.Tensor], load_time: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``resolve_cutedsl_standard_scales`` (first forward of ``CuteDslMoEWrapper``), from :func:`load_time_scales`.

    ``fc2_input_scale`` F32 ``[1]`` = ``min(w2_input_scale_quant)`` (= 1 / max raw), ``w2_alpha`` F32
    ``[E]`` = ``w2_weight_scale_2 / fc2_input_scale``, ``w1_alpha`` F32 ``[E]`` =
    ``w13_weight_scale_2[:, 0] / min(w13_input_scale_quant)``. With expert parallelism SGLang takes
    the minimum over a rank's local experts; these are for one rank holding all experts.
    """
    fc2_input_scale = load_time["w2_input_scale_quant"].to(torch.float32).min().reshape(1)
    input_scale = load_time["w13_input_scale_quant"].to(torch.float32).min().reshape(1)
    return {
        "w1_alpha": raw["w13_weight_scale_2"][:, 0].to(torch.float32) / torch.clamp(input_scale.reshape(()), min=_EPS),
        "w2_alpha": raw["w2_weight_scale_2"].to(torch.float32) / torch.clamp(fc2_input_scale.reshape(-1)[:1], min=_EPS).reshape(()),
        "fc2_input_scale": fc2_input_scale,
    }
