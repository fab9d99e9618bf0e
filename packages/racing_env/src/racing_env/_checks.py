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


def no_render_mode(render_mode: object, env: str) -> None:
    """Refuse any ``render_mode`` but None: the envs render nothing
    themselves (their ``metadata["render_modes"]`` is empty).

    Raises:
        ValueError: any other value, naming ``render_mode`` and the way to
            watch or record episodes.
    """
    if render_mode is not None:
        raise ValueError(
            f"render_mode must be None, got {render_mode!r}: {env} renders nothing itself "
            "(metadata['render_modes'] is empty); to watch or record episodes pass a "
            "racing_env.render.EpisodeView to racing_env.runner.run(..., view=...), or run "
            "sim/evaluate with --render or --record FILE"
        )
