"""What the product is checked against, and what only tests make: nothing here bakes or serves.

* :mod:`moebake.reference.moe_fp32`: a MoE layer computed in fp32 from the source checkpoint, and
  reproducible decode-step inputs (``moebake.serve.ep_launch --source`` and the tests compare a runtime with it);
* :mod:`moebake.reference.synthetic_sources`: synthetic BF16 MoE, ModelOpt NVFP4 and DeepSeek-V4 source
  checkpoints for tests (the demo's GPT-OSS writer is :mod:`moebake.synthetic`);
* :mod:`moebake.reference.registration`: taking a test's toy target out of the registries again.

The layouts' numpy implementations stay in :mod:`moebake.layouts`: they are the conversion's fallback where
the compiled kernels are unavailable, as well as the kernels' oracle.
"""
