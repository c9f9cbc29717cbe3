"""The engine-neutral serving core: what every server of a bake (the SGLang plugin, the vLLM plugin and
``moebake.serve``) does the same way.

* :mod:`moebake.serving_core.rank_loader` reads one EP rank's rows of every baked tensor of a layer, once,
  straight from the shard files into the final parameters (bounded pinned staging, overlapped
  host-to-device copies; :mod:`moebake.serving_core.staged_reader`);
* :mod:`moebake.serving_core.served_manifest` reads a bake's manifest as a server must (strictly, and only if
  config.json names exactly this manifest);
* :mod:`moebake.serving_core.refusals` holds the checks a server makes before it reads a byte, as plain
  functions returning one line (or ``None``); each engine raises its own error type with it.

Nothing here imports an engine.
"""
