"""Compiled kernels shipped with a bake: packed, recorded, verified, and installed only on the operator's command.

A serving engine's first start compiles kernels (FlashInfer JIT modules, SGLang's tvm-ffi JIT modules, DeepGEMM's
and Triton's kernels, moebake's reduced FlashInfer MoE module) into cache folders on the machine. A bake may carry
those kernels, made once for one engine release and one GPU architecture, so that a fresh node need not compile them.

Layout in a bake::

    BAKE/kernels/<set id>/<kind>/<path in the kind's cache>      e.g. kernels/sglang-0.5.17-sm90/tvm-ffi/<dir>/<m>.so

and one record in ``moebake.json`` (a top-level field, :mod:`moebake.kernels.record`): per set, the engine release,
the GPU architecture, the versions of FlashInfer, DeepGEMM, apache-tvm-ffi, Triton, torch and CUDA the kernels were
built with, and the sha256 and size of every file. The field is protected by the manifest's self-checksum and left
out of the bake digest in ``config.json`` (kernels are added after the bake and do not change its tensors); the
files under ``kernels/`` are listed there, not in the manifest's ``files``.

Modules:

* :mod:`moebake.kernels.locations`: the kinds, where each engine library reads and writes its cache;
* :mod:`moebake.kernels.environment`: the installed stack's versions and the GPU architecture;
* :mod:`moebake.kernels.record`: the manifest record, read and validated;
* :mod:`moebake.kernels.harvest`: copy the caches one server start wrote (``moebake kernels harvest``);
* :mod:`moebake.kernels.pack`: put kernel files into a bake (``moebake kernels add``), check them (``verify``),
  list them (``inspect``, ``upload``);
* :mod:`moebake.kernels.install`: check every digest and compatibility field against the installed stack, then
  place the files where the engine looks for them (``moebake kernels install``), and remove them again
  (``moebake kernels uninstall``).

Nothing here runs when a server starts: compiled code from a bake is placed only by ``moebake kernels install``.
"""
