"""A real SGLang (or vLLM) server serving a GPT-OSS-shaped model and its bakes, token for token against serving the source.

Run on the GPU device machine with SGLang's stack unpacked by ``bin/gpu-sglang-stack`` (docs/testing.md, "A real
SGLang server"). Nothing of SGLang is stood in for: ``python -m sglang.launch_server`` runs as a user runs it, with its
scheduler, model class (``GptOssForCausalLM``), loaders, post-load step, Triton attention and CUDA graphs (SGLang's
defaults), once per run:

* ``stock``: the source checkpoint (MXFP4 experts, ``quant_method: mxfp4``), with the run's
  ``--moe-runner-backend`` (``flashinfer_mxfp4``: FlashInfer's SM90 CUTLASS W4A16; ``marlin``);
* ``bake``: a bake of that source (``--quantization moebake``, moebake's plugin from this checkout), with the
  backend its manifest names.

Each server gets the same requests on ``/generate`` as token ids (``--skip-tokenizer-init``): greedy, ``ignore_eos``,
``--new-tokens`` new tokens, with logprobs; one prompt alone, then four prompts in one request (a batch), then the
first prompt again (whether one server repeats itself). A bake's output token ids and logprobs are compared with
the stock run of the same backend, exactly (Python floats from JSON, so bit for bit as SGLang returned them).

Per run it records, in ``--out`` (``{"runs": [...]}``): engine, release, model, target, path (stock|bake),
moe_runner_backend, ready_seconds (process start to SGLang's "The server is fired up and ready to roll!"),
load_seconds (SGLang's own "Load weight end. elapsed=..."), peak_gpu_gib (peak PyTorch allocation during
``ModelRunner.load_model``, from bench/real_server_probe.py, an SGLang plugin hook), sglang_load_mem_usage_gib (SGLang's
"mem usage" of the load), tokens_equal_to_stock, logprobs_equal_to_stock (null for a stock run), repeat_equal (the
repeated request gave the same ids and logprobs), the outputs, the server's flags, and an error with the log's tail
if the server did not become ready.

    python bench/real_server.py make --dir /tmp/rs --bake sm90-marlin --engine sglang==0.5.17
    python bench/real_server.py run --dir /tmp/rs --runs stock:marlin bake:marlin:sm90-marlin \\
        --out bench/results/real_server_h100.json
    python bench/real_server.py all --dir /tmp/rs --runs stock:marlin bake:marlin:sm90-marlin --out r.json  # both

``make --model deepseek-v4`` writes a DeepSeek-V4-shaped source instead (:data:`DSV4_MODEL`; SGLang's
``DeepseekV4ForCausalLM``, served with its ``dsv4`` attention backend), e.g. with its ``sm90-marlin`` bake for SGLang
0.5.17 (what moebake's serving records route DeepSeek-V4 through on SGLang):

    python bench/real_server.py make --model deepseek-v4 --dir /tmp/rd --bake sm90-marlin --engine sglang==0.5.17

``--engine vllm`` serves with vLLM instead (``python -m vllm.entrypoints.openai.api_server`` from ``$V26_SITE``;
its command line, requests and log line: bench/real_server_vllm.py), BACKEND being vLLM's ``--moe-backend``; the
records are the same but for vllm_load_mem_usage_gib (vLLM's "Model loading took" memory), and peak_gpu_gib comes from
bench/real_server_vllm_probe.py, a vLLM general plugin:

    python bench/real_server.py all --engine vllm --dir /tmp/rv --runs stock:flashinfer_cutlass \
        bake:flashinfer_cutlass:sm90-cutlass --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "bench"):  # moebake from this checkout (the device has no installed moebake); bench's modules
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
from real_server_vllm import VLLM  # noqa: E402

S17_SITE = os.environ.get("S17_SITE", "/tmp/s17site")
DEEPSEEK_V4_SERVER_ENV = {"SGLANG_JIT_DEEPGEMM_PRECOMPILE": "0", "SGLANG_DSV4_MHC_PREWARM": "0"}
"""SGLang's settings for a DeepSeek-V4 server, stock and bake alike: no warm-up compiles of DeepGEMM's FP8 GEMMs for
every M (the first H200 run spent 136 s on the first of six shapes before its ready limit) or of TileLang's mHC kernels
for every bucket; each kernel is compiled when the server first runs it (CUDA-graph capture, the first prefill)."""
MODEL = {"layers": 2, "experts": 32, "hidden": 2880, "intermediate": 2880, "heads": 64, "kv_heads": 8, "head_dim": 64, "vocab": 2048}
# What GPT-OSS-20B's config.json says beyond what moebake.synthetic.write_gpt_oss writes (SGLang's GptOssForCausalLM
# reads layer_types, sliding_window and the rope parameters).
GPT_OSS_EXTRAS = {
    "attention_bias": True,
    "initial_context_length": 4096,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000,
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
}
DSV4_MODEL = {"layers": 2, "experts": 8, "hidden": 4096, "intermediate": 256, "vocab": 2048}
"""``--model deepseek-v4``: moebake's servable DeepSeek-V4-shaped checkpoint
(:func:`moebake.reference.synthetic_sources.write_deepseek_v4_servable`: V4-Flash's attention, indexer and mHC geometry,
which FlashMLA and DeepGEMM take on SM90; few layers and experts, a small vocabulary), for SGLang's
``DeepseekV4ForCausalLM``; its layers alternate compress ratios 4 (compressed + indexer) and 128, plus one MTP block."""
MODELS = ("gpt-oss", "deepseek-v4")
READY_LINE = "The server is fired up and ready to roll!"
LOAD_RE = re.compile(r"Load weight end\. elapsed=([0-9.]+) s.*?mem usage=([0-9.]+) GB")
PROMPT_LENGTHS = (23, 57, 130, 301)


# ----------------------------------------------------------------------------------------------- make
def make(
    directory: Path,
    layers: int | None,
    experts: int | None,
    vocab: int | None,
    bakes: list[str],
    engine: str | None,
    extra_convert: list[str],
    model: str = "gpt-oss",
) -> None:
    """``directory/src``: a GPT-OSS-format (``model`` ``deepseek-v4``: DeepSeek-V4-format) checkpoint from moebake's
    writer; ``directory/<target>``: its bakes. ``layers``/``experts``/``vocab`` None: the model's defaults."""
    from moebake.synthetic import write_gpt_oss

    source = directory / "src"
    if model == "deepseek-v4" and not (source / "config.json").is_file():
        make_deepseek_v4(source, layers or DSV4_MODEL["layers"], experts or DSV4_MODEL["experts"], vocab or DSV4_MODEL["vocab"])
    layers, experts, vocab = layers or MODEL["layers"], experts or MODEL["experts"], vocab or MODEL["vocab"]
    if not (source / "config.json").is_file():
        start = time.monotonic()
        write_gpt_oss(
            source,
            num_layers=layers,
            num_experts=experts,
            hidden=MODEL["hidden"],
            intermediate=MODEL["intermediate"],
            vocab=vocab,
            heads=MODEL["heads"],
            kv_heads=MODEL["kv_heads"],
            head_dim=MODEL["head_dim"],
            layers_per_shard=1,
            seed=0,
        )
        config = json.loads((source / "config.json").read_text())
        config.update(GPT_OSS_EXTRAS)
        config["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        config["eos_token_id"], config["pad_token_id"] = vocab - 1, vocab - 2
        (source / "config.json").write_text(json.dumps(config, indent=2))
        print(f"make: source {source} ({layers} layers, {experts} experts) in {time.monotonic() - start:.1f} s", flush=True)
    for target in bakes:
        out = directory / target
        if (out / "moebake.json").is_file():
            continue
        command = [sys.executable, "-m", "moebake", "convert", str(source), str(out), "--target", target, "--quiet"]
        command += (["--engine", engine] if engine else []) + extra_convert
        start = time.monotonic()
        subprocess.run(command, check=True, cwd=ROOT)
        print(f"make: bake {out} in {time.monotonic() - start:.1f} s: {' '.join(command[2:])}", flush=True)


def make_deepseek_v4(source: Path, layers: int, experts: int, vocab: int) -> None:
    """The servable DeepSeek-V4-shaped source (:data:`DSV4_MODEL`), its eos and bos ids at the top of the vocabulary, as
    the GPT-OSS source's (the prompts stay below them)."""
    from moebake.reference.synthetic_sources import write_deepseek_v4_servable

    start = time.monotonic()
    write_deepseek_v4_servable(
        source,
        num_layers=layers,
        num_experts=experts,
        hidden=DSV4_MODEL["hidden"],
        intermediate=DSV4_MODEL["intermediate"],
        vocab=vocab,
        compress_ratios=tuple((4, 128)[i % 2] for i in range(layers)),
        seed=0,
    )
    config = json.loads((source / "config.json").read_text())
    config["eos_token_id"], config["bos_token_id"] = vocab - 1, vocab - 2
    (source / "config.json").write_text(json.dumps(config, indent=2))
    print(f"make: DeepSeek-V4 source {source} ({layers} layers, {experts} experts) in {time.monotonic() - start:.1f} s", flush=True)


# ----------------------------------------------------------------------------------------------- run
def prompts(vocab: int) -> list[list[int]]:
    """Fixed token-id prompts (a seeded generator; ids below the special ids at the top of the vocabulary)."""
    import random

    rng = random.Random(35)
    return [[rng.randrange(0, vocab - 2) for _ in range(n)] for n in PROMPT_LENGTHS]


def _publish_plugins(meta_root: Path, with_moebake: bool, engine=None) -> None:
    """Dist-infos that publish the engine's plugins from this checkout: the load probe, and moebake's own for a bake."""
    group, target = (engine or SGLang).probe_plugin
    meta_root.mkdir(parents=True, exist_ok=True)
    probe = meta_root / "moebake_real_server_probe-0.dist-info"
    probe.mkdir(exist_ok=True)
    (probe / "METADATA").write_text("Metadata-Version: 2.1\nName: moebake-real-server-probe\nVersion: 0\n")
    (probe / "entry_points.txt").write_text(f"[{group}]\nmoebake_real_server_probe = {target}\n")
    if with_moebake:
        import tomllib

        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        meta = meta_root / f"moebake-{project['version']}.dist-info"
        meta.mkdir(exist_ok=True)
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: moebake\nVersion: {project['version']}\n")
        (meta / "entry_points.txt").write_text(
            "".join(
                f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in entries.items()) + "\n"
                for group, entries in project["entry-points"].items()
            )
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, payload: dict, timeout: float = 300, raw: bool = False):
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
        return body if raw else json.loads(body)


def _outputs(response) -> list[dict]:
    """Each prompt's output token ids and their logprobs, from a /generate response (one prompt or a batch)."""
    items = response if isinstance(response, list) else [response]
    return [
        {
            "output_ids": item["output_ids"],
            "logprobs": [entry[0] for entry in item["meta_info"]["output_token_logprobs"]],
            "logprob_ids": [entry[1] for entry in item["meta_info"]["output_token_logprobs"]],
        }
        for item in items
    ]


def parse_log(text: str) -> dict:
    """SGLang's own numbers from a server log: the load's seconds and memory (its "Load weight end." line)."""
    match = LOAD_RE.search(text)
    return {"load_seconds": float(match.group(1)) if match else None, "sglang_load_mem_usage_gib": float(match.group(2)) if match else None}


def compare(outputs: list[dict], reference: list[dict]) -> tuple[bool, bool]:
    """(token ids equal, logprobs equal), exactly, over every prompt's output."""
    if len(outputs) != len(reference):
        return False, False
    tokens = all(o["output_ids"] == r["output_ids"] for o, r in zip(outputs, reference))
    logprobs = all(o["logprobs"] == r["logprobs"] for o, r in zip(outputs, reference))
    return tokens, logprobs


def differences(outputs: list[dict], reference: list[dict]) -> list[dict]:
    """Per prompt: the first output position whose token id differs (None if none), and the largest logprob difference
    over the positions before it (where both runs scored the same token)."""
    found = []
    for o, r in zip(outputs, reference):
        first = next((i for i, (a, b) in enumerate(zip(o["output_ids"], r["output_ids"])) if a != b), None)
        upto = first if first is not None else min(len(o["logprobs"]), len(r["logprobs"]))
        found.append(
            {
                "first_token_differing": first,
                "max_abs_logprob_difference": max((abs(a - b) for a, b in zip(o["logprobs"][:upto], r["logprobs"][:upto])), default=0.0),
            }
        )
    return found


def is_deepseek_v4(config: dict) -> bool:
    """Whether a ``config.json`` is DeepSeek-V4's (SGLang's ``DeepseekV4ForCausalLM``)."""
    return config.get("model_type") == "deepseek_v4"


def attention_backend(model: Path) -> str:
    """SGLang's attention backend for the model: ``dsv4`` (FlashMLA, DeepGEMM's indexer; the only one SGLang 0.5.17's
    DeepSeek-V4 runs, its server-argument overrides pin it) for a DeepSeek-V4 config, else ``triton``."""
    config = model / "config.json"
    return "dsv4" if config.is_file() and is_deepseek_v4(json.loads(config.read_text())) else "triton"


def server_command(model: Path, backend: str, bake: bool, port: int, extra: list[str]) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--skip-tokenizer-init",
        "--attention-backend",
        attention_backend(model),
        "--moe-runner-backend",
        backend,
        "--context-length",
        "4096",
        "--mem-fraction-static",
        "0.5",
        "--log-level",
        "info",
    ]
    return command + (["--quantization", "moebake"] if bake else []) + extra


def _ask_sglang(port: int, ask: list[list[int]], new_tokens: int, post) -> tuple[list, list, list]:
    """One prompt, the batch of all, the first again on SGLang's ``/generate``, each from an empty radix cache."""
    base = f"http://127.0.0.1:{port}/generate"
    sampling = {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True}
    flush = f"http://127.0.0.1:{port}/flush_cache"  # each request from scratch: no prefix of it in the radix cache
    first = _outputs(post(base, {"input_ids": ask[0], "sampling_params": sampling, "return_logprob": True}))
    post(flush, {}, raw=True)
    batch = _outputs(post(base, {"input_ids": ask, "sampling_params": sampling, "return_logprob": True}))
    post(flush, {}, raw=True)
    again = _outputs(post(base, {"input_ids": ask[0], "sampling_params": sampling, "return_logprob": True}))
    return first, batch, again


class SGLang:
    """The engine interface for SGLang (bench/real_server_vllm.py's ``VLLM`` is vLLM's): its site, command line,
    readiness, requests, load line and probe plugin."""

    name = dist = "sglang"
    probe_plugin = ("sglang.srt.plugins", "real_server_probe:register")

    @staticmethod
    def site() -> str:
        return S17_SITE

    @staticmethod
    def command(model: Path, backend: str, bake: bool, port: int, extra: list[str]) -> list[str]:
        return server_command(model, backend, bake, port, extra)

    @staticmethod
    def env(caches: Path) -> dict:
        return {}

    @staticmethod
    def ready(text: str, port: int) -> bool:
        return READY_LINE in text

    @staticmethod
    def parse_log(text: str) -> dict:
        return parse_log(text)

    @staticmethod
    def ask(port: int, ask: list[list[int]], new_tokens: int, post) -> tuple[list, list, list]:
        return _ask_sglang(port, ask, new_tokens, post)


ENGINES = {"sglang": SGLang, "vllm": VLLM}


def cache_env(caches: Path) -> dict[str, str]:
    """Every kernel cache a server start writes, under ``caches`` (moebake/kernels/locations.py says where each library
    looks): SGLang's tvm-ffi JIT modules, FlashInfer's JIT workspace, Triton's, TileLang's and DeepGEMM's caches (SGLang
    0.5.17 sets ``DG_JIT_CACHE_DIR`` from ``SGLANG_DG_CACHE_DIR``, so both), torch inductor's and the CUDA driver's PTX
    cache. An empty ``caches`` folder is a fresh node's caches."""
    return {
        "TVM_FFI_CACHE_DIR": str(caches / "tvm-ffi"),
        "FLASHINFER_WORKSPACE_BASE": str(caches / "flashinfer"),
        "TRITON_CACHE_DIR": str(caches / "triton"),
        "TILELANG_CACHE_DIR": str(caches / "tilelang"),
        "DG_JIT_CACHE_DIR": str(caches / "deep_gemm"),
        "SGLANG_DG_CACHE_DIR": str(caches / "deep_gemm"),
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "CUDA_CACHE_PATH": str(caches / "cuda"),
    }


def run_one(
    directory: Path,
    path: str,
    backend: str,
    target: str | None,
    new_tokens: int,
    ready_timeout: float,
    extra: list[str],
    log_dir: Path,
    order: int = 1,
    engine: str = "sglang",
    caches: Path | None = None,
) -> dict:
    """Start one server, wait until it is ready, send the requests, stop it; the run's record. ``caches``: the folder of
    its kernel caches (:func:`cache_env`; default ``$MOEBAKE_REAL_SERVER_CACHES``)."""
    server_kind = ENGINES[engine]
    bake = path == "bake"
    model = directory / (target if bake else "src")
    label = f"{order}-{path}-{backend}" + (f"-{target}" if bake else "")
    log_path, probe_path = log_dir / f"server-{label}.log", log_dir / f"probe-{label}.jsonl"
    stacks_path, jit_path = log_dir / f"stacks-{label}.txt", log_dir / f"jit-{label}.jsonl"
    for stale in (probe_path, stacks_path, jit_path):
        stale.unlink(missing_ok=True)
    meta = Path(f"/tmp/moebake-real-server-meta/{label}")
    _publish_plugins(meta, with_moebake=bake, engine=server_kind)
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")  # SGLang's and FlashInfer's JIT kernels need nvcc
    caches = caches or Path(os.environ.get("MOEBAKE_REAL_SERVER_CACHES", "/tmp/moebake-real-server-caches"))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([server_kind.site(), str(ROOT), str(ROOT / "bench"), str(meta)]),
        MOEBAKE_REAL_SERVER_PROBE=str(probe_path),
        MOEBAKE_REAL_SERVER_STACKS=str(stacks_path),
        MOEBAKE_REAL_SERVER_JIT=str(jit_path),
        SGLANG_LOG_MS="1",  # log times to the millisecond: the phases
        PYTHONUNBUFFERED="1",
        CUDA_HOME=cuda_home,
        **cache_env(caches),
        PATH=f"{cuda_home}/bin{os.pathsep}{os.environ.get('PATH', '')}",
        **server_kind.env(caches),
    )
    config = json.loads((directory / "src" / "config.json").read_text())
    if is_deepseek_v4(config):
        env |= DEEPSEEK_V4_SERVER_ENV
    port = _free_port()
    command = server_kind.command(model, backend, bake, port, extra)
    record = {
        "order": order,
        "engine": engine,
        "release": _release(server_kind),
        "model": _model_name(config),
        "layers": config.get("num_hidden_layers"),
        "target": target,
        "path": path,
        "moe_runner_backend": backend,
        "server_flags": command[3:],
        "log": str(log_path),
        "jit_events": str(jit_path),
        "caches": str(caches),
        "server_env": {k: env[k] for k in DEEPSEEK_V4_SERVER_ENV if k in env},
        "ready_seconds": None,
        "load_seconds": None,
        "peak_gpu_gib": None,
        "tokens_equal_to_stock": None,
        "logprobs_equal_to_stock": None,
    }
    if os.environ.get("MOEBAKE_FLASHINFER_MOE_SO"):  # bench/real_server_probe.py installs it in the server
        record["flashinfer_moe_module"] = reduced_module_of(Path(os.environ["MOEBAKE_FLASHINFER_MOE_SO"]))
    print(f"== {label}: {' '.join(command)}", flush=True)
    record["start_wall"] = time.time()  # the server log's clock: its phases are measured from here
    start = time.monotonic()
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    compiling: list[str] = []
    next_sample = 10.0
    try:
        while True:
            text = log_path.read_text(errors="replace")
            if server_kind.ready(text, port):
                record["ready_seconds"] = time.monotonic() - start
                break
            if server.poll() is not None or time.monotonic() - start > ready_timeout:
                why = f"exited with {server.returncode}" if server.poll() is not None else f"not ready after {ready_timeout:.0f} s"
                record["error"] = why
                record["log_tail"] = [line[:300] for line in text.splitlines()[-15:]]
                record["compilers_seen"] = compiling[-20:]
                if server.poll() is None:
                    record["stacks"] = _stacks(server, stacks_path)
                print(f"   {label}: {why}; log tail:\n" + "\n".join(record["log_tail"]), flush=True)
                print("   compilers seen while waiting:\n" + "\n".join(compiling[-20:]), flush=True)
                _keep_stacks_if_taken(record, stacks_path)
                return record | server_kind.parse_log(text) | _probe(probe_path)
            if time.monotonic() - start >= next_sample:  # every 10 s: which compilers run (a JIT build)
                compiling += [f"{next_sample:.0f} s: {line}" for line in compilers_running()]
                next_sample += 10
            time.sleep(0.1)
        first, batch, again = server_kind.ask(port, prompts(config["vocab_size"]), new_tokens, _post)
        record["outputs"] = first + batch
        record["repeat_equal"] = compare(again, first) == (True, True)
        record["new_tokens"] = [len(o["output_ids"]) for o in record["outputs"]]
        print(
            f"   {label}: ready in {record['ready_seconds']:.1f} s; new tokens {record['new_tokens']}; "
            f"first ids {first[0]['output_ids'][:12]}...; repeat equal {record['repeat_equal']}",
            flush=True,
        )
    finally:
        _stop(server)
    _keep_stacks_if_taken(record, stacks_path)
    text = log_path.read_text(errors="replace")
    return record | server_kind.parse_log(text) | _probe(probe_path)


def _keep_stacks_if_taken(record: dict, stacks_path: Path) -> None:
    """Every server's probe opens its stacks file as it starts; it is kept only for a server whose stacks were taken
    (one not ready in time), so a healthy server leaves no ``stacks-*.txt`` beside its log."""
    if not record.get("stacks"):
        stacks_path.unlink(missing_ok=True)


MODULE_CHECK = (
    "import flashinfer.fused_moe.core as core; from real_server_probe import install_reduced_module; "
    "install_reduced_module(); core.get_cutlass_fused_moe_module('90')"
)
"""Load the prebuilt reduced module with the servers' probe's own code (its sidecar checked against the engine's
FlashInfer)."""


def check_reduced_module(engine: str = "sglang") -> None:
    """Before any server starts: the module ``$MOEBAKE_FLASHINFER_MOE_SO`` names loads with the engine's FlashInfer
    (its site first on the path), or SystemExit with the loader's last line; nothing to check without it."""
    so = os.environ.get("MOEBAKE_FLASHINFER_MOE_SO")
    if not so:
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ENGINES[engine].site(), str(ROOT), str(ROOT / "bench")]))
    done = subprocess.run([sys.executable, "-c", MODULE_CHECK], env=env, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(
            f"error: the reduced FlashInfer module {so} does not load with {engine}'s FlashInfer: {last[:400]}; no server was started"
        )
    print(f"reduced FlashInfer module {so}: loads", flush=True)


def reduced_module_of(so_path: Path) -> dict:
    """What a run's prebuilt reduced FlashInfer MoE module is: its sidecar (FlashInfer release, GEMM configurations
    compiled, sha256) and its path."""
    sidecar = so_path.with_suffix(".json")
    meta = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    return {"path": str(so_path), **{k: meta[k] for k in ("module", "flashinfer", "tvm_ffi", "configs", "sha256") if k in meta}}


COMPILERS = ("nvcc", "cicc", "ptxas", "ninja", "fatbinary", "nvlink", "ld.lld", "c++", "g++")


def compilers_running(ps_output: str | None = None) -> list[str]:
    """Compiler processes running now (``ps``), shortened: which JIT build a server that is slow to start waits for."""
    if ps_output is None:
        ps_output = subprocess.run(["ps", "-eo", "etimes=,args="], capture_output=True, text=True).stdout
    found = []
    for line in ps_output.splitlines():
        fields = line.split()
        if len(fields) >= 2 and Path(fields[1]).name in COMPILERS:
            outputs = [a for a in fields if a.endswith((".o", ".so", ".cubin", ".ptx")) or a.endswith(".cu")]
            found.append(f"{Path(fields[1]).name} ({fields[0]} s) {' '.join(outputs[-2:])[:200]}")
    return found


def _stacks(server: subprocess.Popen, stacks_path: Path) -> list[str]:
    """Every server process's Python stacks (SIGUSR2, armed by bench/real_server_probe.py), innermost frames kept."""
    ps = subprocess.run(["ps", "-eo", "pid=,pgid="], capture_output=True, text=True).stdout.split("\n")
    for line in ps:
        pid, _, pgid = line.strip().partition(" ")
        if pgid.strip() == str(server.pid):
            try:
                os.kill(int(pid), signal.SIGUSR2)
            except (ProcessLookupError, ValueError):
                pass
    time.sleep(2)
    if not stacks_path.is_file():
        return []
    lines = [line.strip()[:200] for line in stacks_path.read_text(errors="replace").splitlines()]
    return [line for line in lines if line.startswith(("==", "Thread", "Current thread", 'File "'))][:400]


def _probe(probe_path: Path) -> dict:
    if not probe_path.is_file() or not probe_path.read_text().strip():
        return {}
    line = json.loads(probe_path.read_text().strip().splitlines()[-1])
    return {"peak_gpu_gib": line["peak_allocated_gib"], "probe": line}


def _stop(server: subprocess.Popen) -> None:
    """Stop the server this script started (its own process group: the scheduler and detokenizer too)."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _release(engine=None) -> str | None:
    """The release of the engine's distribution in its site folder (``$S17_SITE``, ``$V26_SITE``)."""
    engine = engine or SGLang
    site = Path(engine.site())
    dist = next(site.glob(f"{engine.dist}-*.dist-info"), None) if site.is_dir() else None
    return release_of(dist.name) if dist else None


def release_of(dist_info: str) -> str:
    """``sglang-0.5.17.dist-info`` -> ``0.5.17`` (``vllm-0.26.0.dist-info`` -> ``0.26.0``)."""
    return dist_info.removesuffix(".dist-info").split("-", 1)[1]


def _model_name(config: dict) -> str:
    if is_deepseek_v4(config):
        return (
            f"deepseek-v4-shaped synthetic: {config['num_hidden_layers']} layers (+{config['num_nextn_predict_layers']} MTP), "
            f"{config['n_routed_experts']} experts, H={config['hidden_size']}, I={config['moe_intermediate_size']}, "
            f"vocab {config['vocab_size']}"
        )
    return (
        f"gpt-oss-shaped synthetic: {config['num_hidden_layers']} layers, {config['num_local_experts']} experts, "
        f"H=I={config['hidden_size']}, vocab {config['vocab_size']}"
    )


def run(
    directory: Path,
    specs: list[str],
    new_tokens: int,
    ready_timeout: float,
    extra: list[str],
    out: Path | None,
    log_dir: Path,
    engine: str = "sglang",
) -> list[dict]:
    """Run ``specs`` (``stock:BACKEND`` or ``bake:BACKEND:TARGET``) in order; compare each bake, and each stock run after
    the first of its backend, with that backend's first stock run that answered. JIT builds (SGLang's Marlin MoE, Triton,
    FlashInfer) are cached on the machine by the first server that needs them: a later run's ready_seconds has them
    warm (``order`` says which ran first), so list a stock run again after the bake for a like-for-like start-up."""
    import torch

    log_dir.mkdir(parents=True, exist_ok=True)
    check_reduced_module(engine)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    runs = []
    for order, spec in enumerate(specs, 1):
        path, backend, *rest = spec.split(":")
        timeout = float(rest[1]) if len(rest) > 1 else ready_timeout
        record = run_one(
            directory, path, backend, rest[0] if rest and rest[0] else None, new_tokens, timeout, extra, log_dir, order, engine
        )
        record["device"] = device
        stock = next((r for r in runs if r["path"] == "stock" and r["moe_runner_backend"] == backend and "outputs" in r), None)
        runs.append(record)
        if stock is not None and "outputs" in record:
            record["tokens_equal_to_stock"], record["logprobs_equal_to_stock"] = compare(record["outputs"], stock["outputs"])
            record["stock_order"] = stock["order"]
            record["differences_per_prompt"] = differences(record["outputs"], stock["outputs"])
            print(
                f"   {path} vs stock run {stock['order']} ({backend}): tokens equal {record['tokens_equal_to_stock']}, "
                f"logprobs equal {record['logprobs_equal_to_stock']}",
                flush=True,
            )
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return runs


def _bakes_of(specs: list[str]) -> list[str]:
    """The bake targets the run specs name (``bake:BACKEND:TARGET[:TIMEOUT]``), in order, once each."""
    targets = [spec.split(":")[2] for spec in specs if spec.startswith("bake:")]
    return list(dict.fromkeys(targets))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_make = sub.add_parser("make", help="write the source and its bakes")
    p_run = sub.add_parser("run", help="serve each run, send the requests, record")
    p_all = sub.add_parser("all", help="make (the bakes the runs name, for the installed engine's release), then run")
    for p in (p_make, p_run, p_all):
        p.add_argument("--dir", type=Path, required=True)
    for p in (p_make, p_all):
        p.add_argument(
            "--model",
            choices=MODELS,
            default="gpt-oss",
            help="the source's shape: gpt-oss (default) or deepseek-v4 (SGLang's DeepseekV4ForCausalLM)",
        )
        p.add_argument("--layers", type=int, default=None, help="default: the model's (2)")
        p.add_argument("--experts", type=int, default=None, help="default: the model's (gpt-oss 32, deepseek-v4 8)")
        p.add_argument("--vocab", type=int, default=None, help="default: 2048")
        p.add_argument("--convert-arg", action="append", default=[], help="one more moebake convert argument")
    p_make.add_argument("--bake", nargs="*", default=[], help="targets to bake (sm90-cutlass, sm90-marlin)")
    p_make.add_argument("--engine", default=None, help="moebake convert --engine (e.g. sglang==0.5.17, vllm==0.26.0)")
    for p in (p_run, p_all):
        p.add_argument("--engine", choices=sorted(ENGINES), default="sglang", help="the server to run (default sglang)")
        p.add_argument(
            "--runs",
            nargs="+",
            required=True,
            help="stock:BACKEND[::TIMEOUT] or bake:BACKEND:TARGET[:TIMEOUT], e.g. stock:marlin bake:marlin:sm90-marlin",
        )
        p.add_argument("--new-tokens", type=int, default=48)
        p.add_argument("--ready-timeout", type=float, default=420)
        p.add_argument("--server-arg", action="append", default=[], help="one more server argument")
        p.add_argument("--out", type=Path, default=None)
        p.add_argument("--log-dir", type=Path, default=Path(os.environ.get("OUT", "/tmp/moebake-real-server")))
    args = parser.parse_args(argv)
    if args.command == "make":
        make(args.dir, args.layers, args.experts, args.vocab, args.bake, args.engine, args.convert_arg, args.model)
        return
    if args.command == "all":
        release = _release(ENGINES[args.engine])
        make(
            args.dir,
            args.layers,
            args.experts,
            args.vocab,
            _bakes_of(args.runs),
            f"{args.engine}=={release}" if release else None,
            args.convert_arg,
            args.model,
        )
    run(args.dir, args.runs, args.new_tokens, args.ready_timeout, args.server_arg, args.out, args.log_dir, args.engine)


if __name__ == "__main__":
    main()
