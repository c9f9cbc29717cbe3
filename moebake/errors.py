"""The exceptions moebake raises, one hierarchy (as huggingface_hub's ``errors``), and their one formatter.

Every error moebake raises on purpose is a :class:`MoebakeError`: its message is a single line
naming the file or tensor and what was expected. The CLI prints :func:`format_error` of it on
stderr and exits with status 2, without a traceback. Catch the subclass that says what went wrong:

  :class:`CheckpointError`   a checkpoint directory (source or baked): config, index, shard headers, tensors
  :class:`ManifestError`     ``moebake.json``: missing, unreadable, or a field of the wrong type or value
  :class:`UnsupportedError`  a model, target or combination moebake does not convert or run
  :class:`OptionError`       a conversion or runtime option out of range
  :class:`OutputError`       the output directory cannot be written as asked
  :class:`IntegrityError`    bytes differ from what the manifest records
  :class:`PlatformError`     the GPU or FlashInfer present is not the one a checkpoint was baked for
  :class:`HubError`          a Hugging Face Hub request failed
  :class:`WorkerError`       a worker process of ``convert --workers`` died before finishing its shard
  :class:`EngineRefusal`     an engine plugin (SGLang, vLLM) refuses to serve a bake (also a ``RuntimeError``,
                             so the engine reports it as its own start-up errors)
  :class:`InvalidArgumentError`  an argument of the Python API (also a ``ValueError``)
  :class:`InternalError`     a broken invariant of moebake itself (a bug; also a ``RuntimeError``)

Ctrl-C or SIGTERM is no error: it stops a command with :class:`Interrupted` (a ``KeyboardInterrupt``),
whose message says what was kept and what to do next.
"""


class MoebakeError(Exception):
    """Bad input or an unusable checkpoint. ``str(err)`` is one self-contained line."""


class CheckpointError(MoebakeError):
    """A checkpoint directory is not what its format requires (config, index, shard header, tensor)."""


class ManifestError(MoebakeError):
    """``moebake.json`` is missing, unreadable, of an unknown schema, or has a field of the wrong type or value."""


class UnsupportedError(MoebakeError):
    """A model, target, source format or combination of them that moebake does not support."""


class OptionError(MoebakeError):
    """A conversion or runtime option has a value outside what it accepts."""


class OutputError(MoebakeError):
    """The output directory cannot be written as asked (it exists, or is not a moebake output)."""


class IntegrityError(MoebakeError):
    """A file's bytes, size or header differ from what the manifest records."""


class PlatformError(MoebakeError):
    """The GPU, CUDA or FlashInfer present cannot run a checkpoint (wrong architecture or byte layout)."""


class HubError(MoebakeError):
    """A Hugging Face Hub request failed (refused, missing repo or revision, offline)."""


class WorkerError(MoebakeError):
    """A worker process of ``convert --workers`` died before finishing its shard (killed, out of memory, crashed)."""


class EngineRefusal(MoebakeError, RuntimeError):
    """An engine's moebake plugin refuses to serve a bake here: the GPU, the installed FlashInfer's layout, the
    parallelism, the runner backend, config.json and the manifest disagree, or a baked tensor is missing or wrong."""


class InvalidArgumentError(MoebakeError, ValueError):
    """An argument of moebake's Python API (a tensor's dtype or shape, a count) is out of its contract."""


class InternalError(MoebakeError, RuntimeError):
    """An invariant of moebake itself failed: a bug, reported rather than written to disk."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or, with ``terminated``, SIGTERM stopped a command; ``str(err)`` says what was kept and
    what to do next (empty when there is nothing to say). The CLI prints :meth:`line` and exits with :attr:`status`."""

    def __init__(self, message: str = "", *, terminated: bool = False):
        super().__init__(message)
        self.terminated = terminated

    @property
    def status(self) -> int:
        """The shell's status for a process ended by the signal: 128 + its number (130 SIGINT, 143 SIGTERM)."""
        return 143 if self.terminated else 130

    def line(self) -> str:
        """``interrupted: <message>``, or ``terminated (SIGTERM): <message>``."""
        what = "terminated (SIGTERM)" if self.terminated else "interrupted"
        return f"{what}: {self}" if str(self) else what


def format_error(err: MoebakeError) -> str:
    """The one line the CLI prints for ``err``: ``error: <message>`` (``internal error: ...`` for a bug)."""
    prefix = "internal error" if isinstance(err, InternalError) else "error"
    return f"{prefix}: {err}"
