"""Loading a bake, the same way for every server of it (the SGLang plugin, the vLLM plugin and ``moebake.serve``):
the reads, the manifest as a server reads it, and the refusals a server makes before its first byte.

* :mod:`moebake.loading.rank_loader` reads one EP rank's rows of every baked tensor of a layer, once,
  straight from the shard files into the final parameters (bounded pinned staging, overlapped
  host-to-device copies; :mod:`moebake.loading.staged_reader`);
* :mod:`moebake.loading.served_manifest` reads a bake's manifest as a server must (strictly, and only if
  config.json names exactly this manifest);
* :mod:`moebake.loading.refusals` holds the checks a server makes before it reads a byte, as plain
  functions returning one line (or ``None``); each engine raises its own error type with it.

Nothing here imports an engine.
"""
