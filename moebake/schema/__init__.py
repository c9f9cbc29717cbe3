"""The one vocabulary every part of moebake reads: enums, records, the index, the target tables.

Neutral ground: this package imports nothing of :mod:`moebake.convert`, :mod:`moebake.serve` or
:mod:`moebake.hub`, so the converter, the runtime, the engine plugins, ``inspect``/``verify`` and the
model card all depend on it and not on each other.

  :mod:`~moebake.schema.enums`     gate/up orders, activation kinds, dtype names, the FlashInfer layout era
  :mod:`~moebake.schema.manifest`  ``moebake.json``: typed records (manifest, layer, tensor) and its reader
  :mod:`~moebake.schema.index`     ``model.safetensors.index.json``: its one reader and writer
  :mod:`~moebake.schema.sizes`     padding arithmetic
"""
