"""Imported by the fork server of ``moebake convert --workers`` (:mod:`moebake.convert.workers`), and
only there: it loads what every worker needs before the server forks any, so that the workers share
those pages with it copy-on-write instead of each loading them afresh.

That is the workers' modules (torch, numba and the conversion's), the compiled kernels' machine code
(:func:`moebake.layouts.compiled.load`), and then :func:`gc.freeze`: the objects made so far are
left out of every later garbage collection, which would otherwise write to each of them in each
worker and so copy their pages there.
"""

import gc

import moebake.convert.workers  # noqa: F401 (imported for its imports)
from moebake.layouts import compiled

compiled.load()
gc.freeze()
