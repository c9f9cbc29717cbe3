"""A vLLM general plugin that measures the model load in a real vLLM server's worker (bench/real_server.py --engine vllm).

``bench/real_server.py`` publishes it under vLLM's ``vllm.general_plugins`` entry-point group (a dist-info of its own on
``PYTHONPATH``), so vLLM's ``load_general_plugins()`` runs :func:`register` once in each server process (API server,
engine core, worker), for the stock and the bake runs alike. It wraps :data:`TARGET`, the GPU worker's ``load_model``
(which calls the model runner's: weights, quantization method's post-load step and their temporaries; no KV cache or
CUDA graphs yet), with bench/real_server_probe.py's measurement: one JSON line per load in
``$MOEBAKE_REAL_SERVER_PROBE``. Like the SGLang probe it arms SIGUSR2 for Python stacks and, where
``$MOEBAKE_FLASHINFER_MOE_SO`` names a prebuilt reduced FlashInfer SM90 MoE module, makes FlashInfer's fused-MoE getter
return it in that process: vLLM's ``FLASHINFER_CUTLASS_MXFP4_BF16`` path calls FlashInfer's
``interleave_moe_weights_for_sm90_mixed_gemm`` at load (stock) and ``cutlass_fused_moe`` at run (stock and bake),
both through ``flashinfer.fused_moe.core.get_cutlass_fused_moe_module``. Every call into the module is FlashInfer's and
vLLM's own.
"""

import functools
import importlib

from real_server_probe import _measured_load, arm_stacks, install_reduced_module

TARGET = "vllm.v1.worker.gpu_worker.Worker.load_model"


def register() -> None:
    arm_stacks()
    module, cls, method = TARGET.rsplit(".", 2)
    owner = getattr(importlib.import_module(module), cls)
    original = getattr(owner, method)
    if not getattr(original, "_moebake_probe", False):  # once per process, however often vLLM loads plugins

        @functools.wraps(original)
        def load_model(*args, **kwargs):
            return _measured_load(original, *args, **kwargs)

        load_model._moebake_probe = True
        setattr(owner, method, load_model)
    install_reduced_module()
