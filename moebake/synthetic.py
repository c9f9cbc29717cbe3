"""A synthetic GPT-OSS checkpoint in its exact on-disk source format, for the demo, tests and benchmarks.

Written with ``safetensors.torch.save_file`` (not moebake's writer), one shard per
``layers_per_shard`` layers, with Hugging Face's shard names ``model-0000k-of-0000N`` (``k`` from 1 to
``N``, the number of shards). Values are random: packed E2M1 bytes uniform in [0, 256), E8M0
scales in [118, 123) (2^-9..2^-5, as in FlashInfer's tests), small BF16 biases.
:func:`save_shards` writes the shards and index of every synthetic writer; those of the other source
formats serve tests only (:mod:`moebake.reference.synthetic_sources`).
"""

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file


def save_shards(path: Path, shards: Iterable[dict[str, torch.Tensor]], num_shards: int) -> None:
    """Write ``num_shards`` shard dicts (made one at a time) as ``model-0000k-of-0000N`` plus the index."""
    path.mkdir(parents=True, exist_ok=True)
    weight_map, total_size = {}, 0
    for shard_id, tensors in enumerate(shards):
        name = f"model-{shard_id + 1:05d}-of-{num_shards:05d}.safetensors"
        save_file(tensors, path / name, metadata={"format": "pt"})
        weight_map.update({t: name for t in tensors})
        total_size += sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _gpt_oss_layer(index: int, E: int, H: int, I: int, heads: int, kv_heads: int, head_dim: int, g: torch.Generator) -> dict:
    def rand_bf16(*shape: int):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    p, x = f"model.layers.{index}.", f"model.layers.{index}.mlp.experts."
    return {
        p + "input_layernorm.weight": torch.ones(H),
        p + "post_attention_layernorm.weight": torch.ones(H),
        p + "self_attn.q_proj.weight": rand_bf16(heads * head_dim, H),
        p + "self_attn.q_proj.bias": rand_bf16(heads * head_dim),
        p + "self_attn.k_proj.weight": rand_bf16(kv_heads * head_dim, H),
        p + "self_attn.k_proj.bias": rand_bf16(kv_heads * head_dim),
        p + "self_attn.v_proj.weight": rand_bf16(kv_heads * head_dim, H),
        p + "self_attn.v_proj.bias": rand_bf16(kv_heads * head_dim),
        p + "self_attn.o_proj.weight": rand_bf16(H, heads * head_dim),
        p + "self_attn.o_proj.bias": rand_bf16(H),
        p + "self_attn.sinks": rand_bf16(heads),
        p + "mlp.router.weight": rand_bf16(E, H),
        p + "mlp.router.bias": rand_bf16(E),
        x + "gate_up_proj_blocks": torch.randint(0, 256, (E, 2 * I, H // 32, 16), dtype=torch.uint8, generator=g),
        x + "gate_up_proj_scales": torch.randint(118, 123, (E, 2 * I, H // 32), dtype=torch.uint8, generator=g),
        x + "gate_up_proj_bias": rand_bf16(E, 2 * I),
        x + "down_proj_blocks": torch.randint(0, 256, (E, H, I // 32, 16), dtype=torch.uint8, generator=g),
        x + "down_proj_scales": torch.randint(118, 123, (E, H, I // 32), dtype=torch.uint8, generator=g),
        x + "down_proj_bias": rand_bf16(E, H),
    }


def write_gpt_oss(
    path: str | Path,
    *,
    num_layers: int = 2,
    num_experts: int = 4,
    hidden: int = 2880,
    intermediate: int = 2880,
    vocab: int = 1024,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
    layers_per_shard: int = 1,
    swiglu_limit: float = 7.0,
    seed: int = 0,
) -> Path:
    """Write a GPT-OSS-format checkpoint (HF layout, MXFP4 experts) to ``path``; returns ``path``."""
    path = Path(path)
    g = torch.Generator().manual_seed(seed)
    groups = [list(range(i, min(i + layers_per_shard, num_layers))) for i in range(0, num_layers, layers_per_shard)]

    def shards():
        for shard_id, layer_ids in enumerate(groups):
            tensors = {}
            if shard_id == 0:
                tensors["model.embed_tokens.weight"] = (torch.randn(vocab, hidden, generator=g) * 0.02).to(torch.bfloat16)
            for i in layer_ids:
                tensors.update(_gpt_oss_layer(i, num_experts, hidden, intermediate, heads, kv_heads, head_dim, g))
            if shard_id == len(groups) - 1:
                tensors["model.norm.weight"] = torch.ones(hidden)
                tensors["lm_head.weight"] = (torch.randn(vocab, hidden, generator=g) * 0.02).to(torch.bfloat16)
            yield tensors

    save_shards(path, shards(), len(groups))
    config = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "head_dim": head_dim,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "num_hidden_layers": num_layers,
        "num_local_experts": num_experts,
        "num_experts_per_tok": min(4, num_experts),
        "experts_per_token": min(4, num_experts),
        "hidden_act": "silu",
        "swiglu_limit": swiglu_limit,
        "vocab_size": vocab,
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
        },
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"do_sample": True, "eos_token_id": [vocab - 1]}))
    (path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 131072}))
    return path
