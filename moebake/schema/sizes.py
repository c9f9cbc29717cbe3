"""Padding arithmetic shared by the converter and the runtime."""


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` (> 0) that is >= ``value``."""
    return -(-value // multiple) * multiple
