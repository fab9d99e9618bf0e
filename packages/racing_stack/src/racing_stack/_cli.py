"""What the command lines check before any work: a bad number is a usage
error (exit 2) naming its flag."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["SEED_END", "int_in", "float_in"]

#: Reset seeds are one uint32 SeedSequence word: ``[0, 2**32)``.
SEED_END = 2**32


def int_in(low: int, end: int | None = None, end_text: str | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[low, end)`` (no upper bound
    when ``end`` is None; ``end_text`` spells it in the message)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low or (end is not None and value >= end):
            bound = f"[{low}, {end_text or end})" if end is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {'in ' if end is not None else ''}{bound}, got {value}")
        return value

    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``(low, high]``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(f"must be in ({low:g}, {high:g}], got {text}")
        return value

    return parse
