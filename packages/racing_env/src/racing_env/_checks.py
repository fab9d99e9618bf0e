"""Argument checks shared by the public functions (errors name the argument)."""

from __future__ import annotations

import numpy as np


def integer_in(value: object, name: str, low: int, end: int, end_text: str | None = None) -> int:
    """``value`` as a Python int in ``[low, end)``.

    Raises:
        TypeError: bools, floats and non-integers.
        ValueError: an int outside the range (``end_text`` spells ``end``
            in the message, e.g. ``"2**32"``).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if not low <= value < end:
        raise ValueError(f"{name} must be in [{low}, {end_text or end}), got {value}")
    return value
