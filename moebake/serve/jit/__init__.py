"""The JIT build of the compiled code ``moebake.serve`` runs: moebake's reduced FlashInfer SM90 fused-MoE module.

* :mod:`moebake.serve.jit.flashinfer_paths`: the module's sources for each FlashInfer release (the W4A16 and Humming
  W4A8 runners and the GEMM tiles compiled), generated from FlashInfer's own tree;
* :mod:`moebake.serve.jit.flashinfer_build`: builds it with FlashInfer's JIT machinery (or loads a prebuilt one checked
  against its sidecar) and hands it to FlashInfer's module getter.

The ops that call it are :mod:`moebake.serve.flashinfer_ops` and the runtimes beside it.
"""
