"""Benchmark (not a test): whole-model start-up through SGLang: stock, SGLang's presharded reload, and a bake.

A GPT-OSS-format model (synthetic bytes, real shapes: ``gpt-oss-20b``: H = I = 2880, 24 MoE layers of 32 experts,
``gpt-oss-120b``: 36 of 128, vocabulary 201088; ``deepseek-v4-flash``: DeepSeek-V4-Flash's experts, H 4096,
I 2048, 43 layers of 256, top-6, vocabulary 129280, with attention tensors of GPT-OSS's kind at that width; or as
many layers as ``--layers`` says) is loaded onto the GPU three ways, each rank in a process of its own (SGLang's
expert parallelism over a gloo world):

* ``stock``: SGLang 0.5.23 end to end for the source: its default weight iterator
  (``buffered_multi_thread_safetensors_weights_iterator``, 8 threads) over the source's shards, its
  ``FusedMoE`` layers with ``Mxfp4MoEMethod`` (``--moe-runner-backend flashinfer_mxfp4``, SM90),
  GPT-OSS's own MXFP4 expert loader (``GptOssForCausalLM._load_mxfp4_experts_weights``) and the
  method's post-load step (FlashInfer's CUDA interleave, from moebake's reduced module);
* ``presharded``: SGLang's ``--load-format presharded`` (``bench/startup_presharded.py``): a first load
  (stock's) dumps each rank's post-processed tensors (recorded as ``presharded-dump``: its seconds and bytes);
  the timed reload builds the model, runs the post-load step on the uninitialised parameters, and copies the
  rank's dumped tensors in;
* ``bake``: the same iterator over the bake's shards, the same ``FusedMoE`` layers with the moebake
  plugin's method: the baked tensors' loaders read metadata only, each layer's post-load step reads this
  rank's rows with :class:`moebake.loading.rank_loader.RankLoader`, and every other tensor that is one
  parameter whole is read by :class:`moebake.engines.sglang.whole_model.DirectParameterLoader` straight into
  its parameter.

Every other tensor (attention, router, norms, embeddings) is a parameter of the holder, of its name, shape and
dtype; stock copies each with SGLang's ``default_weight_loader``. What is not SGLang's: the model object (a holder
of the MoE layers and plain parameters, not ``GptOssForCausalLM``, whose attention needs SGLang's CUDA kernels),
and the dispatch of names to parameters (SGLang's GPT-OSS ``load_weights`` does the same ``weight_loader(param,
tensor)`` calls). Time is from the start of building the model to the last layer's post-load step, synchronised
(imports, CUDA context and the gloo world are before it).

``--ep`` sizes run on one node. ``--nodes N`` simulates a deployment of N nodes x ``--gpus-per-node`` G GPUs
(EP = N x G), cold: for each node in turn the page cache is dropped and that node's G ranks load while the other
nodes' ranks join the same world and wait; the node's seconds are its slowest rank's, its bytes what its ranks
read from the block device.

Per run it records (``--out``, ``{"runs": [...]}``): engine, path, model, layers, experts, ep, nodes,
gpus_per_node, cache, seconds (slowest rank), node_seconds and node_bytes_read, layer0_xxh3 and others_xxh3 (per
rank: layer 0's parameters, and every non-expert parameter; equal across paths or the run fails), bytes_read
(bytes the ranks read from the block device, from ``/proc/self/io``; near 0 with a warm page cache),
bytes_requested (bytes of tensor data the path consumed), limit_seconds (see :func:`startup_limits.limit_seconds`;
simulated nodes: :func:`node_bytes_needed` at the disk's speed), peak_gpu_extra_gib (peak GPU memory beyond the
parameters resident at the end, largest rank) and peak_host_rss_gib (largest rank's peak RSS, mapped file pages
included: ``VmHWM``, the rank process's own; every run committed up to 2026-11-28 has ``ru_maxrss`` instead, which
also counts the benchmark parent's peak: a floor of 1.7-2.9 GiB under every rank's figure; with
rss_before_load_gib, the process before its first byte, and rss_anon_after_gib / rss_file_after_gib, its anonymous
and file-backed resident memory after the load). ``host_memory_before_load_gib`` (the slowest rank's; absent from
older files): the machine's free memory, page cache, dirty and under-writeback pages and anonymous huge pages before
its first byte (:data:`MEMINFO_FIELDS`). The machine's limits are measured in the same run
(:func:`startup_limits.measure_limits`). Cold runs drop the page cache (root), or else evict the model's files from it
(:func:`startup_limits.drop_page_cache`). ``phases`` (the slowest rank's; absent from older files): seconds of the timed region's
parts, wall clock: ``build`` (the model's construction), ``iterate`` (the weight iteration with every loader it calls;
of it, ``iterate_reads``: moebake's reads of the other tensors, and of those, ``iterate_ring``: what the read calls
spent on the reader's pinned ring, allocating it or waiting for the allocation the plugin began as the model was built
(in files without ``pin_ring``: the allocation, which the first read made), and ``iterate_batches``: ``[seconds,
bytes]`` of each read call), ``pin_ring`` (the ring's allocation itself, wherever it ran: not a part of the clock's
phases), ``post_load`` (every MoE layer's post-load step; of it, ``post_load_reads``: moebake's reads of the experts,
and ``post_load_batches``: ``[seconds, bytes]`` of each MoE layer's read call, in layer order), ``sync`` (the final
CUDA synchronize) and ``other`` (the rest; presharded: its reload but the build). ``readahead`` (the bake's with
``--readahead on|both``, the slowest rank's; absent from older files): what the plugin's read-ahead
(:mod:`moebake.loading.readahead`) did beside those parts: ``seconds`` from its first read to its last, ``bytes``
it read into the page cache of ``planned_bytes``, ``skipped_bytes`` the loader read first, ``max_ahead`` (its most
bytes read ahead of the loader) and ``error`` (why it ended early, or null). ``readahead_enabled`` (bake runs of
``--readahead on|off|both``): whether it ran; ``--readahead both`` runs each bake load four times, off, on, on, off,
and the table compares the two settings. Each world of rank processes prints where its wall clock went
(:func:`_say_world_time`: the setup of its slowest rank, the loads and their digests, the page-cache drops, the rest),
for planning GPU time; that is not in the results.

    python bench/startup_bench.py make --model gpt-oss-120b --layers 18 --dir /data/b120    # source + bake
    python bench/startup_bench.py all --dir /data/b120 --ep 1 2 --cache cold warm --nodes 2 4 --drop-dumps \\
        --out bench/results/startup_h100x2.json
    python bench/startup_bench.py plot bench/results/startup_h100x2.json          # the PNG beside it
    python bench/startup_bench.py table bench/results/startup_h100x2.json         # the .md tables beside it
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import benchkit  # also puts the checkout and tests/ on sys.path (the engine oracles)
import startup_limits
import startup_presharded
import startup_report
from startup_report import PATHS, plot

MODELS = {
    "gpt-oss-20b": {"layers": 24, "experts": 32, "shapes": "gpt-oss"},
    "gpt-oss-120b": {"layers": 36, "experts": 128, "shapes": "gpt-oss"},
    "deepseek-v4-flash": {"layers": 43, "experts": 256, "shapes": "deepseek-v4-flash"},
    "tiny": {"layers": 2, "experts": 4, "shapes": "tiny"},
}
SHAPES = {
    "gpt-oss": {"hidden": 2880, "intermediate": 2880, "heads": 64, "kv_heads": 8, "head_dim": 64, "vocab": 201088, "top_k": 4},
    # DeepSeek-V4-Flash's experts (config.json: hidden 4096, moe_intermediate 2048, 256 routed, top-6) and
    # vocabulary; attention of GPT-OSS's kind at that width (its MLA tensors differ, and weigh little)
    "deepseek-v4-flash": {"hidden": 4096, "intermediate": 2048, "heads": 64, "kv_heads": 8, "head_dim": 64, "vocab": 129280, "top_k": 6},
    "tiny": {"hidden": 256, "intermediate": 128, "heads": 4, "kv_heads": 2, "head_dim": 32, "vocab": 64, "top_k": 2},
}
GIB = 2**30
PHASE_SHARES = ("_reads", "_ring", "_batches")  # parts of another phase (iterate_reads of iterate ...), or beside the
# clock's phases (pin_ring): not added


# ----------------------------------------------------------------------------------------------- make
def _pattern_bytes(count: int, seed: int, low: int = 0, high: int = 256) -> np.ndarray:
    """``count`` pseudo-random bytes in ``[low, high)``: a 16 MiB random block tiled (fast to make at 60 GB)."""
    block = np.random.default_rng(seed).integers(low, high, size=min(count, 16 << 20), dtype=np.uint8)
    return np.resize(block, count)


def write_source(path: Path, model: str, layers: int) -> Path:
    """A GPT-OSS-format checkpoint (one layer per shard, the embeddings in the first and last) at ``path``."""
    import torch
    from safetensors.torch import save_file

    experts = MODELS[model]["experts"]
    s = SHAPES[MODELS[model]["shapes"]]
    H, I, q, kv = s["hidden"], s["intermediate"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]

    def bf16(seed, *shape):
        return torch.from_numpy(_pattern_bytes(2 * int(np.prod(shape)), seed, 0, 64)).view(torch.bfloat16).reshape(shape)

    def u8(seed, low, high, *shape):
        return torch.from_numpy(_pattern_bytes(int(np.prod(shape)), seed, low, high)).reshape(shape)

    path.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    for i in range(layers):
        p, x = f"model.layers.{i}.", f"model.layers.{i}.mlp.experts."
        tensors = {
            p + "input_layernorm.weight": torch.ones(H),
            p + "post_attention_layernorm.weight": torch.ones(H),
            p + "self_attn.q_proj.weight": bf16(i, q, H),
            p + "self_attn.q_proj.bias": bf16(i, q),
            p + "self_attn.k_proj.weight": bf16(i, kv, H),
            p + "self_attn.k_proj.bias": bf16(i, kv),
            p + "self_attn.v_proj.weight": bf16(i, kv, H),
            p + "self_attn.v_proj.bias": bf16(i, kv),
            p + "self_attn.o_proj.weight": bf16(i, H, q),
            p + "self_attn.o_proj.bias": bf16(i, H),
            p + "self_attn.sinks": bf16(i, s["heads"]),
            p + "mlp.router.weight": bf16(i, experts, H),
            p + "mlp.router.bias": bf16(i, experts),
            x + "gate_up_proj_blocks": u8(i, 0, 256, experts, 2 * I, H // 32, 16),
            x + "gate_up_proj_scales": u8(i, 118, 123, experts, 2 * I, H // 32),
            x + "gate_up_proj_bias": bf16(i, experts, 2 * I),
            x + "down_proj_blocks": u8(i, 0, 256, experts, H, I // 32, 16),
            x + "down_proj_scales": u8(i, 118, 123, experts, H, I // 32),
            x + "down_proj_bias": bf16(i, experts, H),
        }
        if i == 0:
            tensors["model.embed_tokens.weight"] = bf16(10_001, s["vocab"], H)
        if i == layers - 1:
            tensors["model.norm.weight"] = torch.ones(H)
            tensors["lm_head.weight"] = bf16(10_002, s["vocab"], H)
        name = f"model-{i:05d}-of-{layers - 1:05d}.safetensors"
        save_file(tensors, path / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        print(f"make: {path.name} layer {i + 1}/{layers}", flush=True)
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    config = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": H,
        "intermediate_size": I,
        "head_dim": s["head_dim"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "num_hidden_layers": layers,
        "num_local_experts": experts,
        "num_experts_per_tok": s["top_k"],
        "experts_per_token": s["top_k"],
        "hidden_act": "silu",
        "swiglu_limit": 7.0,
        "vocab_size": s["vocab"],
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
        },
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def make(directory: Path, model: str, layers: int) -> None:
    """``directory/src`` (the source) and ``directory/out`` (its sm90-cutlass SGLang bake), re-used when present."""
    from moebake.convert.options import ConvertOptions
    from moebake.convert.run import convert

    source, out = directory / "src", directory / "out"
    if not (source / "config.json").is_file():
        write_source(source, model, layers)
    if not (out / "moebake.json").is_file():
        convert(source, out, ConvertOptions("sm90-cutlass"), progress=False)
    (directory / "model.json").write_text(json.dumps({"model": model, "layers": layers, "experts": MODELS[model]["experts"]}))


# ------------------------------------------------------------------------------------------ one rank
def _proc_gib(path: Path, fields: dict[str, str]) -> dict:
    """The ``Name:  N kB`` lines of a ``/proc`` file named in ``fields`` (its name -> the key returned), in GiB;
    those the kernel does not report are left out."""
    found = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            found[fields[name]] = int(value.split()[0]) * 1024 / GIB
    return found


def _rss_gib() -> dict:
    """This process's resident memory (``/proc/self/status``): now, total, anonymous and file-backed (mmap'd shards),
    and its peak (``VmHWM``: the high-water mark of its own address space, which starts anew at ``exec``; not
    ``ru_maxrss``, which Linux carries over from the parent through fork and exec, so that a rank process would report
    the parent's peak where that is higher: the benchmark's parent holds CUDA and its probes' buffers)."""
    return _proc_gib(Path("/proc/self/status"), {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "peak"})


MEMINFO_FIELDS = {"MemFree": "free", "Cached": "cached", "Dirty": "dirty", "Writeback": "writeback", "AnonHugePages": "anon_huge"}
"""The host's memory state a rank records before its first byte (``/proc/meminfo`` field -> its key): how much the
page cache holds, and what it still has to write back (a make's files), which a warm load competes with."""


def _host_memory_gib(meminfo: Path = Path("/proc/meminfo")) -> dict:
    """The machine's memory now, GiB, by :data:`MEMINFO_FIELDS` (those the kernel reports)."""
    return _proc_gib(meminfo, MEMINFO_FIELDS)


def _sglang_world(ep: int, rank: int, device: str):
    """SGLang's process state for EP rank ``rank`` of ``ep`` (the SGLang oracle's ``sglang_engine``: tp = ep = ``ep``,
    a gloo world of ``ep`` processes), ``--moe-runner-backend flashinfer_mxfp4`` on an SM90 platform, FlashInfer's
    kernels from the reduced module."""
    from contextlib import ExitStack
    from unittest import mock

    from engine_oracles import sglang_oracle, standins  # tests/ is on the path: benchkit

    standins.install()
    import sglang.srt.layers.moe.moe_runner.flashinfer_cutlass as runner
    import sglang.srt.layers.quantization.mxfp4 as mxfp4
    from flashinfer.fused_moe.core import ActivationType
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import get_parallel

    sglang_oracle.load_plugins_as_a_server_does()
    # The loader and model modules a server has imported before it loads (each path's clock starts after these).
    import sglang.srt.model_loader.loader  # noqa: F401
    import sglang.srt.model_loader.weight_utils  # noqa: F401
    import sglang.srt.models.gpt_oss  # noqa: F401

    # No NCCL communicators: loading needs no GPU collective, and ranks that share a GPU (simulated nodes, dumps of
    # more ranks than GPUs) cannot each open one on it ("NCCL error: invalid usage").
    stack = ExitStack()
    original_group = parallel_state.init_model_parallel_group
    stack.enter_context(
        mock.patch.object(parallel_state, "init_model_parallel_group", lambda *a, **k: original_group(*a, **{**k, "use_pynccl": False}))
    )
    if parallel_state._WORLD is None:  # local rank = this process's GPU (ranks may share one), not its world rank
        parallel_state.init_distributed_environment(
            world_size=ep, rank=rank, backend="gloo", local_rank=int(device.split(":")[1]) if ":" in device else 0
        )
    stack.enter_context(sglang_oracle.sglang_engine(moe_runner_backend="flashinfer_mxfp4", gpu="sm90", ep=ep, rank=rank, role="bench"))
    stack.enter_context(mock.patch.object(mxfp4, "_FI_HAS_SM90_CUTLASS_MXFP4", True))
    if device.startswith("cuda"):
        from moebake.serve.flashinfer_ops import sm90_moe_ops

        ops = sm90_moe_ops()
        interleave_weights, interleave_scales = ops.interleave_weights, ops.interleave_scales
        stack.enter_context(mock.patch.object(runner, "_flashinfer_cutlass_fused_moe", lambda: (ops.cutlass_fused_moe, ActivationType)))
    else:  # the CPU smoke run: the CUDA kernel's index math emulated, FlashInfer's CPU scale helper
        import flashinfer.fused_moe as fi_moe

        from kernel_emulation import kernel_interleave_v2

        interleave_weights = lambda w, quant_type: kernel_interleave_v2(w)  # noqa: E731
        interleave_scales = fi_moe.interleave_moe_scales_for_sm90_mixed_gemm
    stack.enter_context(mock.patch.object(mxfp4, "interleave_moe_weights_for_sm90_mixed_gemm", interleave_weights, create=True))
    stack.enter_context(mock.patch.object(mxfp4, "interleave_moe_scales_for_sm90_mixed_gemm", interleave_scales, create=True))
    get_parallel().override_permanently(tp_group=parallel_state._TP)
    return stack


def _other_tensors(directory: Path) -> dict:
    """``{name: (shape, torch dtype)}`` of every tensor in ``directory``'s shards that is not an expert's (from the
    headers; SGLang's GPT-OSS loader tells experts apart by ``.experts`` in the name, as here)."""
    from moebake.formats.safetensors_file import DTYPES, read_header

    found = {}
    for shard in sorted(directory.glob("*.safetensors")):
        for name, entry in read_header(shard).tensors.items():
            if ".experts" not in name:
                found[name] = (entry.shape, DTYPES[entry.dtype][0])
    return found


def _build_model(config: dict, quant_config, others: dict):
    """The holder: the MoE layers (SGLang ``FusedMoE``) at the checkpoint's module names, and an uninitialised
    parameter of its name, shape and dtype for every other tensor (``others``, from :func:`_other_tensors`), as
    SGLang's model classes make them, on the current default device."""
    import torch
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    from moebake.formats.gpt_oss import SWIGLU_ALPHA

    root = torch.nn.Module()
    model = torch.nn.Module()
    root.add_module("model", model)
    model.add_module("layers", torch.nn.ModuleList())
    for i in range(config["num_hidden_layers"]):
        block, mlp = torch.nn.Module(), torch.nn.Module()
        mlp.add_module(
            "experts",
            FusedMoE(
                num_experts=config["num_local_experts"],
                top_k=config["num_experts_per_tok"],
                layer_id=i,
                hidden_size=config["hidden_size"],
                intermediate_size=config["intermediate_size"],
                quant_config=quant_config,
                activation=config["hidden_act"],
                gemm1_alpha=SWIGLU_ALPHA,
                gemm1_clamp_limit=config["swiglu_limit"],
                with_bias=True,
                prefix=f"model.layers.{i}.mlp.experts",
                use_weight_loader_fused=quant_config.get_name() != "mxfp4",
            ),
        )
        block.add_module("mlp", mlp)
        model.layers.append(block)
    for name, (shape, dtype) in others.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
            module = module._modules[part]
        module.register_parameter(leaf, torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False))
    return root


def _holder_config(directory: Path):
    from transformers import PretrainedConfig

    return PretrainedConfig(**json.loads((directory / "config.json").read_text()))


def _quant_config(path: str, config: dict):
    """The quantization config each path's server would build: SGLang's ``Mxfp4Config`` for the source (stock and
    presharded), moebake's for the bake."""
    if path == "bake":
        from moebake.engines.sglang.config import MoebakeConfig

        return MoebakeConfig.from_config(config["quantization_config"])
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    return Mxfp4Config.from_config(config["quantization_config"])


@contextmanager
def _timed(phases: dict, name: str):
    """Add the seconds of the ``with`` block to ``phases[name]``."""
    began = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - began


def _load_from_checkpoint(path: str, root, quant, files: list[str], directory: Path, device: str, phases: dict) -> int:
    """Load ``root`` from the checkpoint's shards through SGLang's iterator and loaders, then run every MoE layer's
    post-load step; the bytes of tensor data the path consumed. Adds the seconds of its parts to ``phases``."""
    import torch
    from sglang.srt.model_loader import loader
    from sglang.srt.model_loader.weight_utils import default_weight_loader
    from sglang.srt.models.gpt_oss import GptOssForCausalLM

    params = dict(root.named_parameters())
    # SGLang's default iterator, as its loader module binds it (for a bake, the plugin's wrapper: shard_iterator)
    weights = loader.buffered_multi_thread_safetensors_weights_iterator(files, max_workers=loader.DefaultModelLoader.DEFAULT_NUM_THREADS)
    requested = 0

    def load(name, tensor):
        nonlocal requested
        param = params[name]
        getattr(param, "weight_loader", default_weight_loader)(param, tensor)
        requested += tensor.numel() * tensor.element_size()

    with _timed(phases, "iterate"):
        if path != "bake":  # as GptOssForCausalLM._load_weights_mxfp4: experts loaded as they come, the rest after
            held = []

            def experts():
                nonlocal requested
                for name, tensor in weights:
                    if ".experts" in name:
                        requested += tensor.numel() * tensor.element_size()
                        yield name, tensor
                    else:
                        held.append((name, tensor))  # lazy mmap views until loaded below

            root.config = _holder_config(directory)
            GptOssForCausalLM._load_mxfp4_experts_weights(root, experts())
            for name, tensor in held:
                load(name, tensor)
            held.clear()  # SGLang drops its held views once they are loaded
        else:  # as its generic load_weights: every tensor in the iterator's order (the post-load step replaces no parameter)
            direct = _direct_loader(root, quant, directory, device)
            for name, tensor in direct.filter(weights) if direct else weights:
                if ".experts" in name:
                    params[name].weight_loader(params[name], tensor)  # the plugin's loader: metadata only
                else:
                    load(name, tensor)
            requested += direct.stats.loaded_bytes if direct else 0
            phases["iterate_reads"] = direct.stats.seconds if direct else 0.0
            if direct is not None:
                phases["iterate_ring"] = direct.reader.ring_wait_seconds  # the reads' time on the shared ring
                phases["pin_ring"] = direct.reader.ring_seconds  # its pinning, wherever it ran (the model's build)
                phases["iterate_batches"] = [list(batch) for batch in direct.stats.batches]
    params.clear()  # SGLang's load_weights drops its name -> parameter map before the post-load step replaces them
    with _timed(phases, "post_load"):
        for layer in _moe_layers(root):
            layer.quant_method.process_weights_after_loading(layer)
            stats = getattr(layer.quant_method, "load_stats", None)
            if stats is not None:
                requested += stats.bytes
                phases["post_load_reads"] = phases.get("post_load_reads", 0.0) + stats.seconds
                phases.setdefault("post_load_batches", []).append([stats.seconds, stats.bytes])
    stop = getattr(quant, "stop_readahead", None)  # as the plugin's interception ends it, after the post-load steps
    if stop is not None:
        found = stop()
        if found:
            phases["readahead"] = {
                "seconds": found[0].seconds,
                "bytes": found[0].bytes,
                "planned_bytes": found[0].planned_bytes,
                "skipped_bytes": found[0].skipped_bytes,
                "max_ahead": found[0].max_ahead,
                "error": found[0].error,
            }
    if device.startswith("cuda"):
        with _timed(phases, "sync"):
            torch.cuda.synchronize()
    return requested


def _direct_loader(root, quant, directory: Path, device: str):
    """moebake's loader of the bake's other tensors (straight into their parameters), where this checkout has it; as
    the plugin makes it where it can (the model holds the bake's config, whose reader the experts' loads share)."""
    import torch

    try:
        from moebake.engines.sglang.whole_model import DirectParameterLoader
    except ImportError:
        return None
    if not hasattr(DirectParameterLoader, "for_served_model"):
        return DirectParameterLoader(root, directory, device)
    root.quant_config = quant  # as SGLang's model classes hold it
    return DirectParameterLoader.for_served_model(root, torch.device(device))


def _moe_layers(root) -> list:
    return [block.mlp.experts for block in root.model.layers]


def load_rank(path: str, directory: Path, ep: int, rank: int, device: str) -> dict:
    """Load the model of ``directory`` as EP rank ``rank`` of ``ep`` the ``path`` way; the rank's measurements.

    ``presharded-dump`` is the stock load followed by SGLang's presharded dump (timed apart); ``presharded`` reloads
    that dump (:func:`startup_presharded.recorded_dump`)."""
    import torch

    config = json.loads((directory / "config.json").read_text())
    files = sorted(str(p) for p in directory.glob("*.safetensors"))
    others = _other_tensors(directory)
    quant = _quant_config(path, config)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    io_before = benchkit.io_read_bytes() or 0
    rss_before = _rss_gib()  # the process (torch, CUDA context, the engine's imports) before its first byte
    host_before = _host_memory_gib()
    began = time.perf_counter()

    phases = {}

    def build():
        with _timed(phases, "build"):
            return _build_model(config, quant, others)

    result = {}
    if path == "presharded":
        dump = startup_presharded.recorded_dump(directory.parent, ep)
        root = startup_presharded.reload(build, quant, directory, dump, device)
        if cuda:
            with _timed(phases, "sync"):
                torch.cuda.synchronize()
        requested = startup_presharded.rank_bytes(dump, rank)
    else:
        with torch.device(device):
            root = build()
        requested = _load_from_checkpoint(path, root, quant, files, directory, device, phases)
    seconds = time.perf_counter() - began
    if "readahead" in phases:  # what the bake's read-ahead did (not a part of the time: it runs beside the rest)
        result["readahead"] = phases.pop("readahead")
    phases["other"] = seconds - sum(v for k, v in phases.items() if not k.endswith(PHASE_SHARES))
    rss_after = _rss_gib()  # its peak before the digest's own copies
    resident = torch.cuda.memory_allocated() if cuda else 0
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    bytes_read = (benchkit.io_read_bytes() or 0) - io_before
    if path == "presharded-dump":
        began = time.perf_counter()
        dump = startup_presharded.dump(root, build, quant, directory)
        result["dump_seconds"] = time.perf_counter() - began
        if rank == 0:
            startup_presharded.record_dump(directory.parent, ep, dump)
    layers = _moe_layers(root)
    moe = {id(p) for layer in layers for p in layer.parameters()}
    return {
        **result,
        "seconds": seconds,
        "phases": phases,
        "layer0_xxh3": _digest(layers[0].named_parameters()),
        "others_xxh3": _digest((n, p) for n, p in root.named_parameters() if id(p) not in moe),
        "peak_host_rss_gib": rss_after["peak"],
        "rss_before_load_gib": rss_before.get("rss", 0.0),
        "rss_anon_after_gib": rss_after.get("anon", 0.0),
        "rss_file_after_gib": rss_after.get("file", 0.0),
        "host_memory_before_load_gib": host_before,
        "bytes_read": bytes_read,
        "bytes_requested": requested,
        "peak_gpu_extra_gib": (peak - resident) / GIB,
        "resident_gib": resident / GIB,
    }


def _digest(named_parameters) -> str:
    """xxh3-128 over parameters (name order; each one's name and bytes), after the timed load."""
    import torch
    import xxhash

    digest = xxhash.xxh3_128()
    for name, parameter in sorted(named_parameters, key=lambda item: item[0]):
        digest.update(name.encode())
        flat = parameter.data.contiguous().view(-1).view(torch.uint8)
        for start in range(0, flat.numel(), 64 << 20):
            digest.update(flat[start : start + (64 << 20)].cpu().numpy())
    return digest.hexdigest()


def _barrier(ep: int) -> None:
    """Every rank of the world meets here (the gloo world SGLang's state was built on)."""
    import torch.distributed as dist

    if ep > 1 and dist.is_initialized():
        dist.barrier()


def _wait_for(path: Path) -> None:
    """Until ``path`` exists (the parent's signal: a node's turn)."""
    while not path.exists():
        time.sleep(0.05)


def _write_result(path: Path, result: dict) -> None:
    """``result`` as JSON at ``path``, whole or not at all (the parent polls for it)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(result))
    part.replace(path)


def run_rank(args) -> None:
    """One rank in a process of its own (``all`` starts ``--ep`` of them at once). With ``--turns DIR`` (simulated
    nodes) each rank loads when its node's turn comes (the file ``DIR/go<node>``, node = rank // ``--gpus-per-node``),
    writes its result and drops the model, so that no page of the checkpoint stays mapped when the page cache is
    dropped for the next node."""
    import gc

    directory = Path(args.dir) / ("out" if args.path == "bake" else "src")
    stack = _sglang_world(args.ep, args.rank, args.device)
    with stack, _model_directory(directory):
        _barrier(args.ep)  # every rank set up before any starts its clock
        ready = time.time()
        if args.turns:
            _wait_for(Path(args.turns) / f"go{args.rank // args.gpus_per_node}")
        turn = time.time()
        result = load_rank(args.path, directory, args.ep, args.rank, args.device)
        gc.collect()  # the model is dropped (no page of the checkpoint mapped) before the parent sees the result
        spawned = float(os.environ.get(SPAWNED_ENV, ready))
        result["lifecycle"] = {"setup_s": ready - spawned, "load_and_digest_s": time.time() - turn}
        _write_result(Path(args.result), result)
        _barrier(args.ep)


SPAWNED_ENV = "MOEBAKE_STARTUP_BENCH_SPAWNED"
"""The ``time.time()`` at which ``_spawn`` started the rank processes (a rank's ``lifecycle.setup_s`` counts from it)."""


def _model_directory(directory: Path):
    from unittest import mock

    return mock.patch("moebake.engines.sglang.config.model_directory", return_value=directory)


def _bake_bytes(directory: Path) -> tuple[int, int]:
    """The bake's baked (expert) bytes, and the bytes of every other tensor, from its manifest and shards."""
    from moebake.formats.safetensors_file import tensor_nbytes
    from moebake.schema.manifest import Manifest, read_manifest

    out = directory / "out"
    manifest = Manifest.from_json(read_manifest(out), out / "moebake.json")
    baked = sum(tensor_nbytes(t.dtype.value, t.shape) for layer in manifest.layers for t in layer.tensors.values())
    return baked, sum(f.stat().st_size for f in out.glob("*.safetensors")) - baked


def rank_bytes(directory: Path, ep: int) -> int:
    """The bake's bytes one EP rank needs: its share of every baked tensor, and every other tensor whole."""
    baked, others = _bake_bytes(directory)
    return others + baked // ep


def node_bytes_needed(directory: Path, ep: int, gpus_per_node: int) -> int:
    """The bake's bytes one node of ``gpus_per_node`` EP ranks (of ``ep``) needs from its disk: its ranks' shares of
    the baked tensors, and every other tensor once (the node's ranks share its page cache)."""
    baked, others = _bake_bytes(directory)
    return others + baked // ep * gpus_per_node


# ------------------------------------------------------------------------------------------------ all
def run_all(args) -> None:
    """Measure the limits, then every (ep, cache, path) on one node, then every (nodes, path) cold, node by node."""
    import torch

    directory = Path(args.dir)
    about = json.loads((directory / "model.json").read_text())
    results_path = Path(args.out)
    results = json.loads(results_path.read_text()) if results_path.is_file() else {"runs": []}
    gpus = torch.cuda.device_count()
    runnable = [ep for ep in args.ep if not gpus or ep <= gpus]  # this machine's GPUs hold each of its ranks
    limits = startup_limits.measure_limits(directory, node_ranks=runnable if "warm" in args.cache else ())  # on this one node
    results.setdefault("limits", []).append({"model": about["model"], "layers": about["layers"], **limits})
    print("limits:", json.dumps(limits), flush=True)
    if gpus:  # the CUDA context, module and page tables once, so the first timed run is not a warm-up
        _spawn(args, "bake", 1, directory)
    differ = []

    def record(run: dict) -> None:
        run = {"engine": "sglang", "model": about["model"], "layers": about["layers"], "experts": about["experts"], **run}
        if run["path"] != "presharded-dump":
            differ.extend(_compare_with_earlier(run, results["runs"]))
        results["runs"].append(run)
        print(json.dumps(run), flush=True)
        results_path.write_text(json.dumps(results, indent=1) + "\n")

    for ep in args.ep:
        if ep not in runnable:
            print(f"skip ep={ep}: {gpus} GPU(s)", flush=True)
            continue
        for cache in args.cache:
            for path, readahead in _variants(args):
                if path == "presharded":
                    _ensure_dump(args, directory, ep, record)
                startup_limits.drop_page_cache(directory) if cache == "cold" else _read_into_cache(_files_of(path, directory, ep))
                ranks = _spawn(args, path, ep, directory, readahead=readahead)
                record(
                    {
                        **_ranks_record(path, ep, 1, ep, cache, [ranks]),
                        **_readahead_field(readahead),
                        "limit_seconds": startup_limits.limit_seconds(rank_bytes(directory, ep), ep, cache, limits),
                    }
                )
        if args.drop_dumps:
            startup_presharded.drop_dump(directory, ep)  # --drop-dumps: the disk holds one at a time
    for nodes in args.nodes:
        g = args.gpus_per_node
        ep = nodes * g
        needed = node_bytes_needed(directory, ep, g)
        for path, readahead in _variants(args):
            if path == "presharded":
                _ensure_dump(args, directory, ep, record)
            ranks = _spawn(args, path, ep, directory, readahead=readahead, gpus_per_node=g)
            per_node = [ranks[node * g : node * g + g] for node in range(nodes)]
            record(
                {
                    **_ranks_record(path, ep, nodes, g, "cold", per_node),
                    **_readahead_field(readahead),
                    "node_bytes_needed": needed,
                    "limit_seconds": max(
                        needed / (limits["disk_gbps"] * 1e9),
                        rank_bytes(directory, ep) / (limits.get("h2d_pinned_gbps", float("inf")) * 1e9),
                    ),
                }
            )
        if args.drop_dumps:
            startup_presharded.drop_dump(directory, ep)  # --drop-dumps: the disk holds one at a time
    if differ:
        raise SystemExit("error: parameters differ between paths: " + "; ".join(differ))


def _variants(args) -> list[tuple[str, bool | None]]:
    """``(path, read-ahead on?)`` for each run of one (EP, cache) or deployment: the bake once per ``--readahead``
    setting (``both``: off, on, on, off, so that a drift over the run (a disk's burst credit running out, seen on
    the CPU box: the second of two identical cold loads took 1.2-1.5x the first) weighs on both alike), the other
    paths once (None: they have no read-ahead)."""
    settings = {"on": [True], "off": [False], "both": [False, True, True, False]}[args.readahead]
    return [(path, setting) for path in args.paths for setting in (settings if path == "bake" else [None])]


def _readahead_field(readahead: bool | None) -> dict:
    """A bake run's ``readahead_enabled`` (absent from other paths' runs and from files before the option)."""
    return {} if readahead is None else {"readahead_enabled": readahead}


def _ranks_record(path: str, ep: int, nodes: int, gpus_per_node: int, cache: str, per_node: list[list[dict]]) -> dict:
    """One run's record from its ranks' results, node by node (``per_node[n]``: node n's ranks, in rank order)."""
    ranks = [r for node in per_node for r in node]
    slowest = max(ranks, key=lambda r: r["seconds"])
    return {
        "path": path,
        "ep": ep,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "cache": cache,
        "seconds": max(r["seconds"] for r in ranks),
        "node_seconds": [max(r["seconds"] for r in node) for node in per_node],
        "node_bytes_read": [sum(r["bytes_read"] for r in node) for node in per_node],
        "layer0_xxh3": [r["layer0_xxh3"] for r in ranks],
        "others_xxh3": [r["others_xxh3"] for r in ranks],
        "bytes_read": sum(r["bytes_read"] for r in ranks),
        "bytes_requested": sum(r["bytes_requested"] for r in ranks),
        "peak_gpu_extra_gib": max(r["peak_gpu_extra_gib"] for r in ranks),
        "resident_gib": max(r["resident_gib"] for r in ranks),
        "peak_host_rss_gib": max(r["peak_host_rss_gib"] for r in ranks),
        **{key: max(r[key] for r in ranks) for key in ("rss_before_load_gib", "rss_anon_after_gib", "rss_file_after_gib")},
        **({"phases": slowest["phases"]} if "phases" in slowest else {}),
        "host_memory_before_load_gib": slowest["host_memory_before_load_gib"],
        **({"readahead": slowest["readahead"]} if "readahead" in slowest else {}),
    }


def _compare_with_earlier(run: dict, earlier: list[dict]) -> list[str]:
    """Set ``run["layer0_equal_to_stock"]`` (and ``others_equal_to_stock``) from the earlier runs of the same model and
    EP size on another path; what differs, in words."""
    twins = [
        r
        for r in earlier
        if r["path"] not in (run["path"], "presharded-dump")
        and r["ep"] == run["ep"]
        and (r["model"], r["layers"]) == (run["model"], run["layers"])
    ]
    found = []
    for key in ("layer0_xxh3", "others_xxh3"):
        mine = [r[key] for r in twins if key in r]
        run[key.replace("xxh3", "equal_to_stock")] = all(m == run[key] for m in mine) if mine else None
        found += [
            f"ep={run['ep']} {key}: {run['path']} {run[key]} vs {r['path']} {r[key]}" for r in twins if key in r and r[key] != run[key]
        ]
    return found


def _files_of(path: str, directory: Path, ep: int) -> list[Path]:
    """The files a path reads: the source's shards, the dump's files, or the bake's shards."""
    if path == "presharded":
        return sorted(p for p in startup_presharded.recorded_dump(directory, ep).iterdir() if p.is_file())
    return sorted((directory / ("out" if path == "bake" else "src")).glob("*.safetensors"))


def _read_into_cache(files: list[Path]) -> None:
    """Read ``files`` once (a warm page cache for the run after)."""
    for path in files:
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def _ensure_dump(args, directory: Path, ep: int, record) -> None:
    """SGLang's presharded dump for EP ``ep`` (every rank at once, GPUs shared round-robin), unless one is there;
    its time and size recorded as a ``presharded-dump`` run."""
    if startup_presharded.recorded_dump(directory, ep) is not None:
        return
    ranks = _spawn(args, "presharded-dump", ep, directory)
    dump = startup_presharded.recorded_dump(directory, ep)
    record(
        {
            "path": "presharded-dump",
            "ep": ep,
            "nodes": 1,
            "gpus_per_node": ep,
            "cache": "-",
            "seconds": max(r["dump_seconds"] for r in ranks),
            "load_seconds": max(r["seconds"] for r in ranks),
            "dump_bytes": startup_presharded.dump_bytes(dump),
            "layer0_xxh3": [r["layer0_xxh3"] for r in ranks],
            "others_xxh3": [r["others_xxh3"] for r in ranks],
        }
    )


def _spawn(args, path: str, ep: int, directory: Path, readahead: bool | None = None, gpus_per_node: int | None = None) -> list[dict]:
    """A world of ``ep`` rank processes of ``path`` at once, loading on GPUs 0, 1, ... (round-robin when there are
    more ranks than GPUs); every rank's result, in rank order. ``readahead``: the ranks run with
    ``MOEBAKE_READAHEAD=1`` (True) or ``=0``.

    ``gpus_per_node`` (simulated nodes): the ranks load node by node, ``gpus_per_node`` at a time (on GPUs 0, 1, ...
    of their node), the page cache dropped before each node's turn; the others wait in the world. One world for all
    the nodes: the processes start, and import SGLang, once."""
    import socket

    import torch

    gpus = max(torch.cuda.device_count(), 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), SPAWNED_ENV: repr(time.time())}
    if readahead is not None:
        env["MOEBAKE_READAHEAD"] = "1" if readahead else "0"
    outs = [directory / f".rank{r}.json" for r in range(ep)]
    for out in outs:
        out.unlink(missing_ok=True)
    turns = directory / ".turns"
    shutil.rmtree(turns, ignore_errors=True)
    if gpus_per_node:
        turns.mkdir()
    procs, began = [], time.perf_counter()
    for r in range(ep):
        local = r % gpus_per_node if gpus_per_node else r
        device = f"cuda:{local % gpus}" if args.device == "cuda" else "cpu"
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "rank",
                    "--dir",
                    str(directory),
                    "--path",
                    path,
                    "--ep",
                    str(ep),
                    "--rank",
                    str(r),
                    "--device",
                    device,
                    "--result",
                    str(outs[r]),
                ]
                + (["--turns", str(turns), "--gpus-per-node", str(gpus_per_node)] if gpus_per_node else []),
                env=env,
            )
        )
    drops = 0.0
    try:
        if gpus_per_node:
            drops = _take_turns(directory, turns, outs, gpus_per_node, procs)
        codes = [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(turns, ignore_errors=True)
    if any(codes):
        raise SystemExit(f"error: {path} ep={ep}: rank exit codes {codes}")
    ranks = [json.loads(out.read_text()) for out in outs]
    _say_world_time(path, ep, time.perf_counter() - began, drops, ranks, gpus_per_node or ep)
    return ranks


def _say_world_time(path: str, ep: int, wall: float, drops: float, ranks: list[dict], per_turn: int) -> None:
    """Where a world's wall clock went, for planning GPU time: its ranks' slowest setup (process start to the
    world's barrier: imports, CUDA, the gloo world), the loads with their digests (``per_turn`` ranks at a time: the
    sum over the turns of each turn's slowest rank), the page-cache drops between turns, and the rest (exits)."""
    setup = max(r["lifecycle"]["setup_s"] for r in ranks)
    loads = [r["lifecycle"]["load_and_digest_s"] for r in ranks]
    busy = sum(max(loads[i : i + per_turn]) for i in range(0, len(loads), per_turn))
    print(
        f"{path} ep={ep}: {ep} rank processes, {wall:.0f} s from start to exit: setup {setup:.0f} s (slowest rank), "
        f"loads and digests {busy:.0f} s, page-cache drops {drops:.0f} s, the rest {wall - setup - busy - drops:.0f} s",
        flush=True,
    )


def _take_turns(directory: Path, turns: Path, outs: list[Path], gpus_per_node: int, procs: list) -> float:
    """Node by node: drop the page cache, signal the node's turn (``turns/go<node>``), wait for its ranks' results;
    stops at the first rank that fails (its exit code says so). Returns the seconds the drops took."""
    drops = 0.0
    for node in range(len(outs) // gpus_per_node):
        began = time.perf_counter()
        startup_limits.drop_page_cache(directory)
        drops += time.perf_counter() - began
        (turns / f"go{node}").touch()
        while not all(out.exists() for out in outs[node * gpus_per_node : (node + 1) * gpus_per_node]):
            if any(p.poll() not in (None, 0) for p in procs):
                return drops
            time.sleep(0.05)
    return drops


def table(results_path: Path, md: Path | None = None) -> Path:
    """The Markdown tables of a results JSON, beside it as ``.md`` (:func:`startup_report.table`), with what in the
    benchmark is SGLang's from this docstring."""
    method = next(p for p in __doc__.split("\n\n") if p.startswith("Every other tensor"))
    return startup_report.table(results_path, md, method=method)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("make", help="write the source and its bake")
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--layers", type=int, help="MoE layers (default: the model's)")
    p.add_argument("--dir", required=True)
    p = sub.add_parser("all", help="measure the limits, then every (ep, cache, path)")
    p.add_argument("--dir", required=True)
    p.add_argument("--ep", type=int, nargs="*", default=[1], help="EP sizes on one node (none: only --nodes)")
    p.add_argument("--cache", nargs="+", choices=["cold", "warm"], default=["warm"])
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    p.add_argument(
        "--readahead",
        choices=["on", "off", "both"],
        default="off",
        help="the bake's read-ahead (MOEBAKE_READAHEAD, opt-in): off (default, as the plugin), on, or both "
        "(each bake load four times: off, on, on, off; the table compares the settings)",
    )
    p.add_argument(
        "--nodes", type=int, nargs="*", default=[], help="simulated deployments of N nodes x --gpus-per-node GPUs, cold, one node at a time"
    )
    p.add_argument("--gpus-per-node", type=int, default=1)
    p.add_argument(
        "--drop-dumps", action="store_true", help="delete each presharded dump once its EP size is measured (a disk that holds one)"
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", required=True)
    p = sub.add_parser("rank", help="(internal) one rank's load")
    p.add_argument("--dir", required=True)
    p.add_argument("--path", choices=[*PATHS, "presharded-dump"], required=True)
    p.add_argument("--turns", help="a folder of go<node> files: load when this rank's node's file appears")
    p.add_argument("--gpus-per-node", type=int, default=1, help="with --turns: this rank's node is rank // this")
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--result", required=True)
    benchkit.add_report_commands(sub)
    args = parser.parse_args(argv)
    if benchkit.run_report_command(args, table, plot):
        return
    if args.command == "make":
        make(Path(args.dir), args.model, args.layers or MODELS[args.model]["layers"])
    elif args.command == "all":
        run_all(args)
    else:
        run_rank(args)


if __name__ == "__main__":
    main()
