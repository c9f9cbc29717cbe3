"""What bench/real_server.py needs to know of a real vLLM server (``--engine vllm``): its command line, its readiness,
its requests and answer format, its load line.

The server is ``python -m vllm.entrypoints.openai.api_server`` (what ``vllm serve`` runs) from vLLM's stack unpacked by
``bin/gpu-vllm-stack`` into ``$V26_SITE`` (docs/testing.md, "vLLM 0.26.0 and DeepSeek-V4 on the image"), with:

* ``--moe-backend BACKEND``: the run's MoE backend (``flashinfer_cutlass``: vLLM's ``FLASHINFER_CUTLASS_MXFP4_BF16``,
  FlashInfer's SM90 CUTLASS W4A16, for the source's MXFP4 experts and the ``sm90-cutlass`` bake alike; vLLM's
  ``auto`` would take Triton first on SM90);
* ``--attention-backend TRITON_ATTN`` (the carried wheel has no FlashAttention), ``--skip-tokenizer-init`` (token ids
  in and out), CUDA graphs and torch.compile as vLLM's defaults;
* ``--no-enable-prefix-caching`` (each request is computed from scratch, as SGLang's runs flush the radix cache) and
  ``--no-enable-flashinfer-autotune`` (FlashInfer's default tactic in both servers, not a tactic picked by timing,
  which the reduced module may not have compiled);
* for a bake, ``--quantization moebake --load-format moebake`` (moebake's vLLM plugin: its quantization method and
  its loader, as ``moebake convert`` prints for a vLLM bake).

Requests go to ``/v1/completions`` with the prompt as token ids (one prompt, or a list of them for a batch),
``temperature`` 0, ``ignore_eos``, ``max_tokens`` new tokens, ``logprobs: 0`` (the sampled token's logprob),
``return_token_ids`` and ``return_tokens_as_token_ids`` (logprob tokens as ``token_id:N``). The server is ready when
``/health`` answers 200. vLLM logs ``Model loading took X GiB memory and Y seconds`` (the GPU model runner).
"""

from __future__ import annotations

import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

V26_SITE = os.environ.get("V26_SITE", "/tmp/v26site")
SERVED_NAME = "moebake-real-server"
LOAD_RE = re.compile(r"Model loading took ([0-9.]+) GiB(?: memory)? and ([0-9.]+) seconds")


class VLLM:
    """bench/real_server.py's engine interface for vLLM (see the module docstring)."""

    name = dist = "vllm"
    probe_plugin = ("vllm.general_plugins", "real_server_vllm_probe:register")

    @staticmethod
    def site() -> str:
        return V26_SITE

    @staticmethod
    def command(model: Path, backend: str, bake: bool, port: int, extra: list[str]) -> list[str]:
        command = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            SERVED_NAME,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--skip-tokenizer-init",
            "--attention-backend",
            "TRITON_ATTN",
            "--moe-backend",
            backend,
            "--max-model-len",
            "4096",
            "--gpu-memory-utilization",
            "0.5",
            "--no-enable-prefix-caching",
            "--no-enable-flashinfer-autotune",
            "--seed",
            "0",
        ]
        return command + (["--quantization", "moebake", "--load-format", "moebake"] if bake else []) + extra

    @staticmethod
    def env(caches: Path) -> dict:
        return {"VLLM_CACHE_ROOT": str(caches / "vllm"), "VLLM_LOGGING_LEVEL": "INFO"}

    @staticmethod
    def ready(text: str, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    @staticmethod
    def parse_log(text: str) -> dict:
        """vLLM's own numbers from a server log: the load's seconds and memory (its "Model loading took" line)."""
        match = LOAD_RE.search(text)
        return {
            "load_seconds": float(match.group(2)) if match else None,
            "vllm_load_mem_usage_gib": float(match.group(1)) if match else None,
        }

    @staticmethod
    def request(prompt, new_tokens: int) -> dict:
        """A ``/v1/completions`` body for one prompt (a list of token ids) or a batch (a list of them)."""
        return {
            "model": SERVED_NAME,
            "prompt": prompt,
            "max_tokens": new_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }

    @staticmethod
    def outputs(response: dict) -> list[dict]:
        """Each prompt's output token ids and their logprobs, from a ``/v1/completions`` response, in prompt order."""
        choices = sorted(response["choices"], key=lambda choice: choice["index"])
        return [
            {
                "output_ids": choice["token_ids"],
                "logprobs": choice["logprobs"]["token_logprobs"],
                "logprob_ids": [int(token.removeprefix("token_id:")) for token in choice["logprobs"]["tokens"]],
            }
            for choice in choices
        ]

    @classmethod
    def ask(cls, port: int, prompts: list[list[int]], new_tokens: int, post) -> tuple[list, list, list]:
        """One prompt, the batch of all, the first again: each prompt's outputs (``post(url, body)``: JSON in, out)."""
        url = f"http://127.0.0.1:{port}/v1/completions"
        first = cls.outputs(post(url, cls.request(prompts[0], new_tokens)))
        batch = cls.outputs(post(url, cls.request(prompts, new_tokens)))
        again = cls.outputs(post(url, cls.request(prompts[0], new_tokens)))
        return first, batch, again
