"""The engine-neutral bake core: what every server of a bake (the SGLang plugin, the vLLM plugin and
``moebake.serve``) does the same way.

* :mod:`moebake.bake.rank_loader` reads one EP rank's rows of every baked tensor of a layer, once,
  straight from the shard files into the final parameters (bounded pinned staging, overlapped
  host-to-device copies; :mod:`moebake.bake.staged_reader`);
* :mod:`moebake.bake.served_manifest` reads a bake's manifest as a server must (strictly, and only if
  config.json names exactly this manifest);
* :mod:`moebake.bake.refusals` holds the checks a server makes before it reads a byte, as plain
  functions returning one line (or ``None``); each engine raises its own error type with it.

Nothing here imports an engine.
"""
