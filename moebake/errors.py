"""The one exception type moebake raises for bad input.

Its message is a single line naming the file or tensor and what was expected; the CLI prints
it as ``error: <message>`` and exits with status 2, without a traceback.
"""


class MoebakeError(Exception):
    """Bad input or an unusable checkpoint. ``str(err)`` is one self-contained line."""
