"""Test aid, on PYTHONPATH only in the process-safety fuzz cases: with MOEBAKE_TEST_SLOW_CHUNK=<s>,
every chunk a conversion writes is preceded by a sleep of that many seconds, in the converting
process and in its workers, so a tiny conversion runs long enough to be interrupted or raced."""

import os

if os.environ.get("MOEBAKE_TEST_SLOW_CHUNK"):
    import time

    from moebake.convert import writer

    _pause, _chunks = float(os.environ["MOEBAKE_TEST_SLOW_CHUNK"]), writer._timed_chunks

    def _slow_chunks(chunks):
        for chunk in _chunks(chunks):
            time.sleep(_pause)
            yield chunk

    writer._timed_chunks = _slow_chunks
