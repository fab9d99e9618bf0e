"""Independent NumPy oracles for the environment tests (they never call
the library's geometry)."""

from __future__ import annotations

import numpy as np


def inside_loop(points: np.ndarray, loop: np.ndarray) -> np.ndarray:
    """Even-odd test of points [M, 2] against the closed polygon loop [N, 2]."""
    x, y = points[:, 0:1], points[:, 1:2]
    x0, y0 = loop[None, :, 0], loop[None, :, 1]
    x1, y1 = np.roll(loop, -1, axis=0)[None, :, 0], np.roll(loop, -1, axis=0)[None, :, 1]
    straddle = (y0 > y) != (y1 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    return (np.sum(straddle & (x < x_cross), axis=1) % 2) == 1


def on_track(points: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """A point is on the road when it is inside exactly one boundary loop."""
    return inside_loop(points, left) != inside_loop(points, right)


def wheel_points(position: np.ndarray, yaw: float, wheelbase: float, track_width: float) -> np.ndarray:
    """The four wheel ground points [4, 2] of a car whose rear axle is at position."""
    c, s = np.cos(yaw), np.sin(yaw)
    local = np.array([[wheelbase, track_width / 2], [wheelbase, -track_width / 2],
                      [0.0, track_width / 2], [0.0, -track_width / 2]])
    return position[None, :] + local @ np.array([[c, s], [-s, c]])
