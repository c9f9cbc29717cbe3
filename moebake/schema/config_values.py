"""Values read from untrusted JSON files (``config.json``, ``hf_quant_config.json``, indexes, manifests).

A Hub checkpoint is untrusted input, so every JSON file goes through :func:`parse_json` (one error
line naming the file for bad UTF-8, bad syntax or nesting too deep for the parser, never a
``RecursionError``), and every value a reader relies on goes through a typed getter of
:class:`ConfigValues`:

* integers are JSON integers (``true`` is not 1); a float is accepted only when it is integral
  (``4096.0``); every integer is range-checked (``minimum``/``maximum``);
* numbers are finite (``NaN``, ``Infinity`` and ``1e999``, which Python's parser reads as inf, are refused);
* sections (``text_config``, ``quantization_config``, ...) are JSON objects, and absent or ``null``
  means "not there";
* strings are strings, lists of strings are lists of strings.

A refusal is a :class:`~moebake.errors.MoebakeError` whose one line names the file and the key
path, e.g. ``/ckpt/config.json: quantization_config.config_groups is a list, expected a JSON object``.
"""

import json
import math
import os
from dataclasses import dataclass
from typing import cast

from moebake.errors import CheckpointError, MoebakeError
from moebake.schema.files import open_regular

MAX_COUNT = (1 << 31) - 1
"""Largest dimension or count accepted from a config file (sizes are then checked against the tensors)."""

_REQUIRED = object()


def parse_json(text: str | bytes, where: str | os.PathLike):
    """The JSON value of ``text``; MoebakeError naming ``where`` for bad UTF-8, bad syntax or deep nesting."""
    try:
        return json.loads(text)
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{where}: not UTF-8 JSON ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{where}: not valid JSON ({err})") from None
    except RecursionError:
        raise CheckpointError(f"{where}: not usable JSON (nested too deeply)") from None


def read_json_object(path: str | os.PathLike) -> dict:
    """The JSON object stored in file ``path``; MoebakeError naming it if unreadable or not an object."""
    with open_regular(path) as f:  # a FIFO would block a plain read
        raw = f.read()
    value = parse_json(raw, path)
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {json_type(value)}")
    return value


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for error lines."""
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    kinds = {dict: "a JSON object", list: "a list", str: "a string", int: "an integer", float: "a number"}
    return kinds.get(type(value), type(value).__name__)


def short_repr(value: object, limit: int = 60) -> str:
    """``value`` as JSON text (``true``, ``NaN``, ``"abc"``), cut to ``limit`` characters (it may be huge)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_count(value: object, *, minimum: int = 0, maximum: float = MAX_COUNT, integral_floats: bool = True) -> int | None:
    """``value`` as an int in ``[minimum, maximum]`` (a JSON integer, or an integral float if
    ``integral_floats``), else None. ``true``/``false`` are never integers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and integral_floats:
        if not value.is_integer():
            return None
        value = int(value)
    if not isinstance(value, int) or not minimum <= value <= maximum:
        return None
    return value


@dataclass(frozen=True)
class ConfigValues:
    """A JSON object from file ``file`` at key path ``path`` (``""`` for the top level), read through typed getters."""

    data: dict
    file: str
    path: str = ""

    @classmethod
    def of_file(cls, data: dict, file: str | os.PathLike) -> "ConfigValues":
        return cls(data, str(file))

    def name(self, key: str) -> str:
        """``key``'s path in the file, for error lines (``quantization_config.quant_algo``)."""
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, problem: str) -> MoebakeError:
        return MoebakeError(f"{self.file}: {self.name(key)} {problem}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: object = None):
        """The untyped value (for echoing only; never compute with it)."""
        return self.data.get(key, default)

    def _get(self, key: str, default: object):
        if key not in self.data:
            if default is _REQUIRED:
                raise self.fail(key, "is missing")
            return _REQUIRED
        return self.data[key]

    def section(self, key: str) -> "ConfigValues | None":
        """Nested object ``key``; None when absent or null; MoebakeError for any other JSON type."""
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(key, f"is {json_type(value)}, expected a JSON object")
        return ConfigValues(value, self.file, self.name(key))

    def sections(self, key: str) -> dict[str, "ConfigValues"]:
        """Object ``key`` whose every value is an object (``config_groups``): ``{name: section}``."""
        outer = self.section(key)
        if outer is None:
            return {}
        for name, value in outer.data.items():
            if not isinstance(value, dict):
                raise outer.fail(name, f"is {json_type(value)}, expected a JSON object")
        return {name: ConfigValues(value, outer.file, outer.name(name)) for name, value in outer.data.items()}

    def integer(self, key: str, default: object = _REQUIRED, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
        """Integer ``key`` in ``[minimum, maximum]`` (``default`` when absent; required without one)."""
        value = self._get(key, default)
        if value is _REQUIRED:
            return cast(int, default)  # the caller's default, of its own choosing
        count = as_count(value, minimum=minimum, maximum=maximum)
        if count is None:
            if as_count(value, minimum=minimum, maximum=math.inf) is not None:  # an integer, too large
                raise self.fail(key, f"is {short_repr(value)}, out of range (at most {maximum})")
            bound = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.fail(key, f"is {short_repr(value)}, expected {bound}" + (f" (at most {maximum})" if maximum != MAX_COUNT else ""))
        return count

    def number(self, key: str, default: object = _REQUIRED, *, positive: bool = False) -> float:
        """Finite number ``key`` (``default`` when absent), > 0 if ``positive``."""
        value = self._get(key, default)
        if value is _REQUIRED:
            return cast(float, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, f"is {short_repr(value)}, expected a finite number")
        if positive and value <= 0:
            raise self.fail(key, f"is {short_repr(value)}, expected a number > 0")
        return float(value)

    def string(self, key: str, default: object = _REQUIRED) -> str:
        """String ``key`` (``default`` when absent)."""
        value = self._get(key, default)
        if value is _REQUIRED:
            return cast(str, default)
        if not isinstance(value, str):
            raise self.fail(key, f"is {json_type(value)}, expected a string")
        return value

    def optional_string(self, key: str) -> str | None:
        """String ``key``, or None when absent or null."""
        return None if self.data.get(key) is None else self.string(key)

    def strings(self, key: str) -> tuple[str, ...]:
        """List of strings ``key``; empty when absent or null."""
        value = self.data.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"is {short_repr(value)}, expected a list of strings")
        return tuple(value)


def model_scopes(config: ConfigValues) -> list[ConfigValues]:
    """Where a model's dimensions live: the language model's ``text_config`` (multimodal families) first, then the top level."""
    text = config.section("text_config")
    return [text, config] if text is not None else [config]


def first_model_integer(config: ConfigValues, keys: tuple[str, ...], *, minimum: int = 1) -> tuple[str, int]:
    """``(key path, value)`` of the first of ``keys`` set in ``text_config`` or at the top level (each key
    looked up in ``text_config`` first), as :meth:`ConfigValues.integer`; MoebakeError if none is set."""
    scopes = model_scopes(config)
    for key in keys:
        for scope in scopes:
            if key in scope:
                return scope.name(key), scope.integer(key, minimum=minimum)
    raise CheckpointError(f"{config.file}: none of {' / '.join(keys)} is set")


def first_model_value(config: ConfigValues, key: str):
    """The untyped value of ``key`` in ``text_config`` or at the top level (for display only)."""
    for scope in model_scopes(config):
        if key in scope:
            return scope.raw(key)
    return None
