"""Synthetic source checkpoints for tests: BF16 MoE, ModelOpt NVFP4 and DeepSeek-V4, in exact on-disk formats.

Written as :mod:`moebake.synthetic` writes GPT-OSS (``safetensors.torch.save_file``, numbered shards
and an index: :func:`moebake.synthetic.save_shards`), with random values drawn from ``seed``; each
writer's docstring gives its tensors' names, dtypes and shapes.
"""

import json
import math
from pathlib import Path
from typing import Any

import torch

from moebake.schema.sizes import round_up
from moebake.synthetic import save_shards

# BF16 MoE styles: where the layers live, the MoE module's name, the per-expert projection names
# (gate, up, down), whether experts are fused by default, and how config.json names the dimensions.
BF16_STYLES: dict[str, dict[str, Any]] = {
    "qwen3.5": {
        "layers": "model.language_model.layers.",
        "moe": "mlp",
        "names": ("gate_proj", "up_proj", "down_proj"),
        "fused": True,
        "model_type": "qwen3_5_moe",
        "architecture": "Qwen3_5MoeForConditionalGeneration",
    },
    "qwen3": {
        "layers": "model.layers.",
        "moe": "mlp",
        "names": ("gate_proj", "up_proj", "down_proj"),
        "fused": False,
        "model_type": "qwen3_moe",
        "architecture": "Qwen3MoeForCausalLM",
    },
    "mixtral": {
        "layers": "model.layers.",
        "moe": "block_sparse_moe",
        "names": ("w1", "w3", "w2"),
        "fused": False,
        "model_type": "mixtral",
        "architecture": "MixtralForCausalLM",
    },
}


def _bf16_experts(prefix: str, E: int, H: int, I: int, fused: bool, names: tuple[str, str, str], g: torch.Generator) -> dict:
    """BF16 expert weights ``[out, in]``: fused ``gate_up_proj`` ``[E, 2I, H]`` (gate half first) + ``down_proj``, or per expert."""
    gate, up, down = ((torch.randn(E, *shape, generator=g) * 0.05).to(torch.bfloat16) for shape in ((I, H), (I, H), (H, I)))
    if fused:
        return {prefix + "gate_up_proj": torch.cat([gate, up], 1), prefix + "down_proj": down}
    return {f"{prefix}{e}.{name}.weight": w[e].clone() for e in range(E) for name, w in zip(names, (gate, up, down))}


def write_bf16_moe(
    path: str | Path,
    *,
    style: str = "qwen3.5",
    num_layers: int = 2,
    num_experts: int = 4,
    hidden: int = 64,
    intermediate: int = 32,
    fused: bool | None = None,
    mtp_layers: int = 0,
    vocab: int = 64,
    seed: int = 0,
) -> Path:
    """Write a BF16 MoE checkpoint in HF form (``style`` from :data:`BF16_STYLES`) to ``path``; returns ``path``.

    One shard per layer; ``mtp_layers`` BF16 draft layers (``mtp.layers.J.``) go in the last shard.
    ``fused`` overrides the style's expert storage (fused ``gate_up_proj``/``down_proj`` vs per expert).
    (An NVFP4 checkpoint with a BF16 MTP layer: :func:`write_modelopt_nvfp4`.)
    """
    path = Path(path)
    spec: dict[str, Any] = BF16_STYLES[style]
    fused = spec["fused"] if fused is None else fused
    E, H, I = num_experts, hidden, intermediate
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def layer(base: str) -> dict:
        tensors = {
            base + "input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
            base + "self_attn.o_proj.weight": rand(H, H),
            f"{base}{spec['moe']}.gate.weight": rand(E, H),
        }
        return tensors | _bf16_experts(f"{base}{spec['moe']}.experts.", E, H, I, fused, spec["names"], g)

    def shards():
        for i in range(num_layers):
            tensors = {"model.embed_tokens.weight": rand(vocab, H)} if i == 0 else {}
            tensors |= layer(f"{spec['layers']}{i}.")
            if i == num_layers - 1:
                tensors |= {"model.norm.weight": torch.ones(H, dtype=torch.bfloat16), "lm_head.weight": rand(vocab, H)}
                if mtp_layers:
                    tensors |= {"mtp.fc.weight": rand(H, 2 * H), "mtp.norm.weight": torch.ones(H, dtype=torch.bfloat16)}
                for j in range(mtp_layers):
                    tensors |= layer(f"mtp.layers.{j}.")
            yield tensors

    save_shards(path, shards(), num_layers)
    dims = {"hidden_size": H, "num_hidden_layers": num_layers, "num_experts_per_tok": min(2, E), "hidden_act": "silu", "vocab_size": vocab}
    if style == "mixtral":
        dims |= {"intermediate_size": I, "num_local_experts": E}
    else:
        dims |= {"intermediate_size": 4 * I, "moe_intermediate_size": I, "num_experts": E, "mtp_num_hidden_layers": mtp_layers}
    config = {"architectures": [spec["architecture"]], "model_type": spec["model_type"]}
    config |= {"text_config": dims} if style == "qwen3.5" else dims
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


MODELOPT_MISMATCHES = ((1, 0.3), (3, 4.0))
"""Default (expert, up/gate global ratio) pairs of :func:`write_modelopt_nvfp4`: up rescaled, then gate."""


def _nvfp4_linear(
    prefix: str, N: int, K: int, weight_global: float, input_global: float | None, scalar_shape: tuple[int, ...], g: torch.Generator
) -> dict:
    """One ModelOpt NVFP4 linear ``[N, K]``: packed E2M1 ``weight`` U8 ``[N, K/2]``, ``weight_scale`` F8_E4M3
    ``[N, K/16]`` (every positive finite code, subnormals included), F32 ``weight_scale_2``/``input_scale``
    (no ``input_scale`` for a weight-only W4A16_NVFP4 linear: ``input_global`` None)."""
    linear = {
        prefix + "weight": torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g),
        prefix + "weight_scale": torch.randint(1, 0x7F, (N, K // 16), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn),
        prefix + "weight_scale_2": torch.full(scalar_shape, weight_global, dtype=torch.float32),
    }
    if input_global is not None:
        linear[prefix + "input_scale"] = torch.full(scalar_shape, input_global, dtype=torch.float32)
    return linear


def _fp8_linear(prefix: str, N: int, K: int, g: torch.Generator) -> dict:
    """One ModelOpt FP8 linear (per-tensor): F8_E4M3 ``weight`` ``[N, K]``, F32 scalar ``weight_scale``/``input_scale``."""
    return {
        prefix + "weight": (torch.randn(N, K, generator=g) * 0.5).to(torch.float8_e4m3fn),
        prefix + "weight_scale": torch.tensor(0.01, dtype=torch.float32),
        prefix + "input_scale": torch.tensor(0.02, dtype=torch.float32),
    }


def write_modelopt_nvfp4(
    path: str | Path,
    *,
    num_layers: int = 3,
    num_experts: int = 4,
    hidden: int = 128,
    intermediate: int = 64,
    vocab: int = 64,
    mismatches: tuple[tuple[int, float], ...] = MODELOPT_MISMATCHES,
    quant_config: str = "both",
    group_size: int = 16,
    scalar_shape: tuple[int, ...] = (),
    mixed_precision: bool = False,
    expert_algo: str = "NVFP4",
    seed: int = 0,
) -> Path:
    """Write a DeepSeek-V3-style ModelOpt NVFP4 checkpoint to ``path`` (as nvidia/DeepSeek-R1-FP4); returns ``path``.

    Layer 0 is a dense NVFP4 MLP (``first_k_dense_replace = 1``), layers ``1..num_layers-1`` are MoE:
    BF16 router ``mlp.gate`` (excluded), NVFP4 shared expert and routed experts
    ``model.layers.N.mlp.experts.E.{gate,up,down}_proj.{weight,weight_scale,weight_scale_2,input_scale}``.
    Attention and norms are BF16; attention, router, embeddings and ``lm_head`` are excluded. Layer
    ``num_layers`` is the multi-token-prediction layer with BF16 experts, excluded as a whole. Each MoE
    layer's experts are split over two shards. In each MoE layer, expert ``e`` of ``mismatches`` gets an
    up global of ``ratio`` times its gate global; all other gate/up globals agree. ``quant_config``:
    ``"both"``, ``"config"`` (config.json only) or ``"hf_quant_config"`` (sidecar only).

    ``mixed_precision``: as NVIDIA's current MoE releases, ``quant_algo: MIXED_PRECISION`` with a
    per-module ``quantized_layers`` map: attention ``q_proj``/``o_proj`` FP8 (F8_E4M3 weight, F32
    scalar scales), dense and shared-expert MLPs NVFP4, routed experts ``expert_algo`` (``NVFP4``, or
    ``W4A16_NVFP4``: weight-only, no ``input_scale``), the MTP layer not listed (BF16). config.json's
    ``quantization_config`` is what ModelOpt's ``convert_hf_quant_config_format`` derives from the
    sidecar: one ``config_groups`` entry per distinct module setting (``targets`` = module names,
    sorted) plus the ``quantized_layers`` map itself.
    """
    path = Path(path)
    E, H, I, L = num_experts, hidden, intermediate, num_layers
    g = torch.Generator().manual_seed(seed)
    ratios = dict(mismatches)

    def rand(*shape: int):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def globals_():
        return float(torch.rand((), generator=g) * 1e-3 + 1e-4), float(torch.rand((), generator=g) * 1e-2 + 1e-3)

    quantized_layers: dict[str, dict] = {}

    def mlp(prefix: str, inner: int, up_ratio: float = 1.0, algo: str = "NVFP4") -> dict:
        (weight, inputs), (down_weight, down_inputs) = globals_(), globals_()
        up_weight = float(torch.tensor(weight * up_ratio, dtype=torch.float32))
        weight_only = algo == "W4A16_NVFP4"
        quantized_layers.update({f"{prefix}{proj}_proj": {"quant_algo": algo, "group_size": group_size} for proj in ("gate", "up", "down")})
        return {
            **_nvfp4_linear(prefix + "gate_proj.", inner, H, weight, None if weight_only else inputs, scalar_shape, g),
            **_nvfp4_linear(prefix + "up_proj.", inner, H, up_weight, None if weight_only else inputs, scalar_shape, g),
            **_nvfp4_linear(prefix + "down_proj.", H, inner, down_weight, None if weight_only else down_inputs, scalar_shape, g),
        }

    def common(i: int) -> dict:
        p = f"model.layers.{i}."
        if not mixed_precision or i == L:
            attention = {p + "self_attn.q_proj.weight": rand(H, H), p + "self_attn.o_proj.weight": rand(H, H)}
        else:
            quantized_layers.update({f"{p}self_attn.{proj}": {"quant_algo": "FP8"} for proj in ("q_proj", "o_proj")})
            attention = _fp8_linear(p + "self_attn.q_proj.", H, H, g) | _fp8_linear(p + "self_attn.o_proj.", H, H, g)
        return {
            p + "input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
            **attention,
            p + "post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
        }

    def shards():
        yield {"model.embed_tokens.weight": rand(vocab, H), **common(0), **mlp("model.layers.0.mlp.", 2 * I)}
        for i in range(1, L):
            p = f"model.layers.{i}.mlp."
            head = {
                **common(i),
                p + "gate.weight": rand(E, H),
                p + "gate.e_score_correction_bias": torch.zeros(E),
                **mlp(p + "shared_experts.", I),
            }
            experts = [mlp(f"{p}experts.{e}.", I, ratios.get(e, 1.0), expert_algo if mixed_precision else "NVFP4") for e in range(E)]
            yield head | {k: v for x in experts[: E // 2] for k, v in x.items()}
            yield {k: v for x in experts[E // 2 :] for k, v in x.items()}
        mtp = f"model.layers.{L}."
        yield {
            "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
            "lm_head.weight": rand(vocab, H),
            **common(L),
            mtp + "eh_proj.weight": rand(H, 2 * H),
            mtp + "mlp.gate.weight": rand(E, H),
            **{
                f"{mtp}mlp.experts.{e}.{proj}_proj.weight": rand(*shape)
                for e in range(E)
                for proj, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I)))
            },
        }

    save_shards(path, shards(), 2 * L)
    exclude = ["lm_head", "model.embed_tokens", "*.mlp.gate", f"model.layers.{L}*"]
    if not mixed_precision:
        exclude.insert(2, "*.self_attn*")
    config: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": H,
        "intermediate_size": 2 * I,
        "moe_intermediate_size": I,
        "n_routed_experts": E,
        "n_shared_experts": 1,
        "num_experts_per_tok": min(2, E),
        "first_k_dense_replace": 1,
        "num_hidden_layers": L,
        "num_nextn_predict_layers": 1,
        "hidden_act": "silu",
        "vocab_size": vocab,
    }
    producer = {"name": "modelopt", "version": "0.37.0"}
    if quant_config in ("both", "config"):
        weights = {"num_bits": 4, "type": "float", "group_size": group_size}
        config["quantization_config"] = {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "producer": producer,
            "ignore": exclude,
            "config_groups": {"group_0": {"input_activations": dict(weights), "weights": weights, "targets": ["Linear"]}},
        }
        if mixed_precision:
            config["quantization_config"].update(
                quant_algo="MIXED_PRECISION", quantized_layers=quantized_layers, config_groups=_mixed_precision_groups(quantized_layers)
            )
    if quant_config in ("both", "hf_quant_config"):
        sidecar = {
            "producer": producer,
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": group_size, "exclude_modules": exclude},
        }
        if mixed_precision:
            sidecar["quantization"] = {
                "quant_algo": "MIXED_PRECISION",
                "kv_cache_quant_algo": "FP8",
                "quantized_layers": quantized_layers,
                "exclude_modules": exclude,
            }
        (path / "hf_quant_config.json").write_text(json.dumps(sidecar, indent=2))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    return path


def _mixed_precision_groups(quantized_layers: dict[str, dict]) -> dict:
    """config.json ``config_groups`` of a MIXED_PRECISION checkpoint: one group per distinct module setting."""
    by_setting: dict[tuple, list[str]] = {}
    for module, setting in quantized_layers.items():
        by_setting.setdefault(tuple(sorted(setting.items())), []).append(module)
    groups = {}
    for index, (pairs, modules) in enumerate(by_setting.items()):
        setting = dict(pairs)
        bits = 8 if setting["quant_algo"] == "FP8" else 4
        weights = {"dynamic": False, "num_bits": bits, "type": "float", **({"group_size": setting["group_size"]} if bits == 4 else {})}
        group = {"weights": weights, "targets": sorted(modules)}
        if setting["quant_algo"] != "W4A16_NVFP4":
            group["input_activations"] = dict(weights)
        groups[f"group_{index}"] = group
    return groups


def _deepseek_v4_layer(
    base: str, E: int, H: int, I: int, vocab: int, top_k: int, hash_routed: bool, g: torch.Generator, placeholder_attention: bool = True
) -> dict:
    """One DeepSeek-V4 block under ``base`` (``layers.L.`` / ``mtp.J.``) with DeepSeek's on-disk dtypes.

    Routed experts: I8 packed E2M1 ``[out, in/2]`` + F8_E8M0 ``[out, in/32]``; shared experts and
    attention projections: F8_E4M3 with F8_E8M0 128x128 block scales; router BF16 weight + F32 bias.
    ``placeholder_attention`` False leaves out the few small attention tensors that stand for the real ones
    (a servable checkpoint writes those with :func:`_deepseek_v4_attention` instead).
    """

    def bf16(*shape: int):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    def e8m0(*shape: int):
        return torch.randint(118, 123, shape, dtype=torch.uint8, generator=g).view(torch.float8_e8m0fnu)

    def fp8_block(out: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = (torch.randn(out, k, generator=g) * 0.5).to(torch.float8_e4m3fn)
        return weight, e8m0(round_up(out, 128) // 128, round_up(k, 128) // 128)

    t = {base + "attn_norm.weight": torch.ones(H, dtype=torch.bfloat16), base + "ffn_norm.weight": torch.ones(H, dtype=torch.bfloat16)}
    t |= {base + "attn.attn_sink": torch.zeros(4)} if placeholder_attention else {}
    t |= {base + "ffn.gate.weight": bf16(E, H), base + "ffn.gate.bias": torch.zeros(E)}
    attention = (("attn.wq_a", (64, H)), ("attn.wkv", (64, H)), ("attn.wo_b", (H, 64))) if placeholder_attention else ()
    for name, (out, k) in (
        *attention,
        ("ffn.shared_experts.w1", (I, H)),
        ("ffn.shared_experts.w3", (I, H)),
        ("ffn.shared_experts.w2", (H, I)),
    ):
        t[f"{base}{name}.weight"], t[f"{base}{name}.scale"] = fp8_block(out, k)
    if hash_routed:
        t[base + "ffn.gate.tid2eid"] = torch.randint(0, E, (vocab, top_k), dtype=torch.int32, generator=g)
    for e in range(E):
        for name, (out, k) in (("w1", (I, H)), ("w3", (I, H)), ("w2", (H, I))):
            p = f"{base}ffn.experts.{e}.{name}."
            t[p + "weight"] = torch.randint(-128, 128, (out, k // 2), dtype=torch.int8, generator=g)
            t[p + "scale"] = e8m0(out, k // 32)
    return t


def write_deepseek_v4(
    path: str | Path,
    *,
    num_layers: int = 2,
    num_experts: int = 4,
    hidden: int = 256,
    intermediate: int = 128,
    mtp_layers: int = 1,
    vocab: int = 64,
    top_k: int = 2,
    swiglu_limit: float | None = 10.0,
    shard_bytes: int = 256 << 10,
    seed: int = 0,
) -> Path:
    """Write a DeepSeek-V4-format checkpoint (DeepSeek-native names, MXFP4 routed experts) to ``path``.

    Tensors are cut into shards of about ``shard_bytes`` in name order of their layer, so the
    per-expert tensors of one layer straddle shards, as in the real 46-shard V4-Flash release.
    Layer 0 is hash-routed (``ffn.gate.tid2eid``); ``mtp_layers`` MTP blocks (``mtp.J.``) follow.
    ``swiglu_limit`` None leaves it out of config.json. Its attention is a few small placeholder tensors:
    what the converters read; a checkpoint an engine can serve is :func:`write_deepseek_v4_servable`'s.
    """
    path = Path(path)
    E, H, I = num_experts, hidden, intermediate
    g = torch.Generator().manual_seed(seed)
    tensors = {"embed.weight": (torch.randn(vocab, H, generator=g) * 0.02).to(torch.bfloat16)}
    for i in range(num_layers):
        tensors |= _deepseek_v4_layer(f"layers.{i}.", E, H, I, vocab, top_k, i == 0, g)
    for j in range(mtp_layers):
        tensors |= _deepseek_v4_layer(f"mtp.{j}.", E, H, I, vocab, top_k, False, g)
    tensors |= {"norm.weight": torch.ones(H, dtype=torch.bfloat16), "head.weight": torch.zeros(vocab, H, dtype=torch.bfloat16)}
    config = _deepseek_v4_config(H, I, E, top_k, num_layers, mtp_layers, vocab, swiglu_limit)
    return _save_deepseek_v4(path, tensors, shard_bytes, config)


def _save_deepseek_v4(path: Path, tensors: dict, shard_bytes: int, config: dict) -> Path:
    shards, current, size = [], {}, 0
    for name, tensor in tensors.items():
        current[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= shard_bytes:
            shards.append(current)
            current, size = {}, 0
    shards += [current] if current else []
    save_shards(path, shards, len(shards))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 65536}))
    return path


def _deepseek_v4_config(
    H: int, I: int, E: int, top_k: int, num_layers: int, mtp_layers: int, vocab: int, swiglu_limit: float | None
) -> dict:
    """config.json's MoE and quantization keys (what the converters read)."""
    config = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "hidden_size": H,
        "moe_intermediate_size": I,
        "n_routed_experts": E,
        "n_shared_experts": 1,
        "num_experts_per_tok": top_k,
        "num_hidden_layers": num_layers,
        "num_nextn_predict_layers": mtp_layers,
        "num_hash_layers": 1,
        "vocab_size": vocab,
        "expert_dtype": "fp4",
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128],
        },
    }
    if swiglu_limit is not None:
        config["swiglu_limit"] = swiglu_limit
    return config


DEEPSEEK_V4_FLASH_ATTENTION: dict[str, Any] = {
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_nope_head_dim": 448,
    "qk_rope_head_dim": 64,
    "v_head_dim": 512,
    "kv_lora_rank": 512,
    "q_lora_rank": 1024,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "window_size": 128,
    "sliding_window": 128,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "rope_theta": 10000,
    "compress_rope_theta": 40000,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "first_k_dense_replace": 0,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}
"""DeepSeek-V4-Flash's attention, indexer and mHC hyper-parameters, as SGLang 0.5.17's ``DeepSeekV4Config`` defaults
give them (its defaults are V4-Flash's; SGLang's config loader reads config.json into a DeepseekV3Config alias, which
keeps no V4 default, so config.json must say each). The kernels hold them: FlashMLA on SM90 takes V4's 512-wide KV rows
(``head_dim``) and 64 or 128 query heads per CTA, DeepGEMM's SM90 paged-MQA indexer 32 or 64 indexer heads of 128.
``n_group``/``topk_group`` 1: V4's router (sqrtsoftplus, noaux_tc) groups nothing."""

DEEPSEEK_V4_ROPE_SCALING = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}
"""V4-Flash's YaRN rope scaling (from the DeepSeek-V4 config as the engines read it; SGLang reads
``original_max_position_embeddings`` from it unconditionally)."""


def _deepseek_v4_attention(base: str, H: int, geometry: dict, compress_ratio: int, g: torch.Generator) -> dict:
    """The attention of one servable DeepSeek-V4 block under ``base``: the names, dtypes and shapes SGLang 0.5.17's
    ``MQALayer`` loads, in DeepSeek's on-disk form (``attn.wq_a``/``wkv``/``wq_b``/``wo_a``/``wo_b`` F8_E4M3 with
    F8_E8M0 128x128 block scales; norms BF16; ``attn_sink`` F32), the compressor of a ``compress_ratio`` 4 or 128 layer
    (``wkv``/``wgate`` BF16, ``ape`` F32, ``norm`` BF16) and a ratio-4 layer's indexer (``wq_b`` FP8,
    ``weights_proj`` BF16, its own compressor at ``index_head_dim``), and the block's mHC mixing (F32)."""
    heads, head_dim, q_rank = geometry["num_attention_heads"], geometry["head_dim"], geometry["q_lora_rank"]
    groups, o_rank, hc = geometry["o_groups"], geometry["o_lora_rank"], geometry["hc_mult"]

    def fp8_linear(name: str, out: int, k: int) -> dict:
        # E4M3 values of unit spread, one power-of-two block scale of 1/sqrt(k): each output of spread ~1.
        weight = torch.randn(out, k, generator=g).clamp(-4, 4).to(torch.float8_e4m3fn)
        exponent = 127 - round(math.log2(math.sqrt(k)))
        scale = torch.full((round_up(out, 128) // 128, round_up(k, 128) // 128), exponent, dtype=torch.uint8)
        return {f"{base}{name}.weight": weight, f"{base}{name}.scale": scale.view(torch.float8_e8m0fnu)}

    def bf16(*shape: int, spread: float = 1.0):
        return (torch.randn(*shape, generator=g) * spread / math.sqrt(shape[-1])).to(torch.bfloat16)

    def compressor(name: str, dim: int) -> dict:
        coff = 2 if compress_ratio == 4 else 1  # ratio 4 overlaps two windows
        return {
            f"{base}{name}.wkv.weight": bf16(coff * dim, H),
            f"{base}{name}.wgate.weight": bf16(coff * dim, H),
            f"{base}{name}.ape": torch.randn(compress_ratio, coff * dim, generator=g) * 0.02,
            f"{base}{name}.norm.weight": torch.ones(dim, dtype=torch.bfloat16),
        }

    t = {base + "attn.attn_sink": torch.zeros(heads)}
    t |= fp8_linear("attn.wq_a", q_rank, H) | fp8_linear("attn.wkv", head_dim, H)
    t |= {
        base + "attn.q_norm.weight": torch.ones(q_rank, dtype=torch.bfloat16),
        base + "attn.kv_norm.weight": torch.ones(head_dim, dtype=torch.bfloat16),
    }
    t |= fp8_linear("attn.wq_b", heads * head_dim, q_rank)
    t |= fp8_linear("attn.wo_a", groups * o_rank, heads * head_dim // groups)
    t |= fp8_linear("attn.wo_b", H, groups * o_rank)
    if compress_ratio:
        t |= compressor("attn.compressor", head_dim)
    if compress_ratio == 4:
        index_heads, index_dim = geometry["index_n_heads"], geometry["index_head_dim"]
        t |= fp8_linear("attn.indexer.wq_b", index_heads * index_dim, q_rank)
        t |= {base + "attn.indexer.weights_proj.weight": bf16(index_heads, H)}
        t |= compressor("attn.indexer.compressor", index_dim)
    mix = (2 + hc) * hc  # pre (hc), post (hc) and the hc x hc combination
    for part in ("attn", "ffn"):
        t |= {
            f"{base}hc_{part}_fn": torch.randn(mix, hc * H, generator=g) * 1e-3,
            f"{base}hc_{part}_base": torch.zeros(mix),
            f"{base}hc_{part}_scale": torch.ones(3),
        }
    return t


def write_deepseek_v4_servable(
    path: str | Path,
    *,
    num_layers: int = 2,
    num_experts: int = 8,
    hidden: int = 4096,
    intermediate: int = 256,
    mtp_layers: int = 1,
    vocab: int = 2048,
    top_k: int = 2,
    compress_ratios: tuple[int, ...] = (4, 128),
    max_position_embeddings: int = 65536,
    shard_bytes: int = 64 << 20,
    seed: int = 0,
) -> Path:
    """Write a DeepSeek-V4-shaped checkpoint an engine can serve (SGLang 0.5.17's ``DeepseekV4ForCausalLM``) to ``path``.

    The MoE part is :func:`write_deepseek_v4`'s (:func:`_deepseek_v4_layer`: MXFP4 routed experts, FP8 shared experts,
    router, norms; layer 0 hash-routed); around it, every tensor SGLang's model loads: each block's attention, compressor,
    indexer and mHC (:func:`_deepseek_v4_attention`), the head's mHC (``hc_head_{fn,base,scale}``, F32), a random head
    (distinct logits, so outputs compare token for token), and per MTP block (``mtp.J.``) the draft model's ``e_proj``/
    ``h_proj`` (FP8), ``enorm``/``hnorm``/``norm`` and its head mHC, its attention uncompressed (SGLang's MTP layer has
    compress ratio 0). Geometry: :data:`DEEPSEEK_V4_FLASH_ATTENTION` (V4-Flash's, which FlashMLA and DeepGEMM take);
    only the layer count, experts, expert width and vocabulary are small. ``compress_ratios``: one per layer, each 0
    (sliding window only), 4 (compressed + indexer) or 128.
    """
    assert len(compress_ratios) == num_layers and set(compress_ratios) <= {0, 4, 128}, compress_ratios
    path = Path(path)
    E, H, I, geometry = num_experts, hidden, intermediate, DEEPSEEK_V4_FLASH_ATTENTION
    hc: int = geometry["hc_mult"]
    g = torch.Generator().manual_seed(seed)

    def head_mixing(base: str) -> dict:
        return {
            base + "hc_head_fn": torch.randn(hc, hc * H, generator=g) * 1e-3,
            base + "hc_head_base": torch.zeros(hc),
            base + "hc_head_scale": torch.ones(1),
        }

    tensors = {"embed.weight": torch.randn(vocab, H, generator=g).to(torch.bfloat16)}
    for i, ratio in enumerate(compress_ratios):
        base = f"layers.{i}."
        tensors |= _deepseek_v4_layer(base, E, H, I, vocab, top_k, i == 0, g, placeholder_attention=False)
        if i == 0:  # a hash-routed layer's router has no score-correction bias (SGLang's has no parameter for one)
            del tensors[base + "ffn.gate.bias"]
        tensors |= _deepseek_v4_attention(base, H, geometry, ratio, g)
    for j in range(mtp_layers):
        base = f"mtp.{j}."
        tensors |= _deepseek_v4_layer(base, E, H, I, vocab, top_k, False, g, placeholder_attention=False)
        tensors |= _deepseek_v4_attention(base, H, geometry, 0, g)
        for name in ("e_proj", "h_proj"):
            weight = torch.randn(H, H, generator=g).clamp(-4, 4).to(torch.float8_e4m3fn)
            scale = torch.full((H // 128, H // 128), 127 - round(math.log2(math.sqrt(H))), dtype=torch.uint8)
            tensors |= {f"{base}{name}.weight": weight, f"{base}{name}.scale": scale.view(torch.float8_e8m0fnu)}
        tensors |= {f"{base}{name}.weight": torch.ones(H, dtype=torch.bfloat16) for name in ("enorm", "hnorm", "norm")}
        tensors |= head_mixing(base)
    tensors |= head_mixing("")
    tensors |= {
        "norm.weight": torch.ones(H, dtype=torch.bfloat16),
        "head.weight": (torch.randn(vocab, H, generator=g) * 2 / math.sqrt(H)).to(torch.bfloat16),
    }
    config = _deepseek_v4_config(H, I, E, top_k, num_layers, mtp_layers, vocab, 10.0) | geometry
    config |= {
        "compress_ratios": [*compress_ratios, *[0] * mtp_layers],
        "rope_scaling": dict(DEEPSEEK_V4_ROPE_SCALING),
        "max_position_embeddings": max_position_embeddings,
        "intermediate_size": I,
    }
    return _save_deepseek_v4(path, tensors, shard_bytes, config)
