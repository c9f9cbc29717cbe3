"""Reading one step ahead: while the caller works on one chunk of source bytes, the next is read.

One reading thread per process serves every producer (reads keep their order, and at most two
chunks of source bytes are held at a time: the one in use and the one being read). With ``O_DIRECT``
reads (:mod:`moebake.convert.direct_io`) this is what keeps the disk busy while the CPU works.
"""

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from moebake.convert.stages import STAGES

T = TypeVar("T")
_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moebake-read", initializer=STAGES.off_critical_path)


def read_ahead(reads: list[Callable[[], T]]) -> Iterator[T]:
    """The results of ``reads``, in order; each next one runs on the reading thread while the caller
    uses the current one. Time spent waiting for a result counts as ``read``."""
    upcoming = _reader.submit(reads[0]) if reads else None
    for index in range(len(reads)):
        assert upcoming is not None  # submitted for every index below len(reads)
        with STAGES.timing("read", 0):  # waiting for the reading thread
            result = upcoming.result()
        upcoming = _reader.submit(reads[index + 1]) if index + 1 < len(reads) else None
        yield result
