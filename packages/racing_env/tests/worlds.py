"""Worlds the tests share: a short Level and circle tracks (imported by
the tests and by conftest.py; a module of its own, so that `pytest` from the
repository root, where several packages have a conftest, finds it)."""

from __future__ import annotations

import numpy as np

from racing_env import Level, Track

#: A Level whose episodes time out after a few steps, for NEXT_STEP timelines.
SHORT_LEVEL = Level(level_id=7, name="short", max_episode_steps=4)


def circle_track(radius: float, points: int, half_width: float, track_id: int) -> Track:
    """A counter-clockwise circle starting at (radius, 0)."""
    theta = np.linspace(0.0, 2 * np.pi, points, endpoint=False)
    centerline = np.stack([radius * np.cos(theta), radius * np.sin(theta)], axis=1)
    return Track.from_centerline(centerline, half_width, track_id)
