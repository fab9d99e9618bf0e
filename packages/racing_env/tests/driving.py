"""A NumPy pure-pursuit driver for tests: it reads only the public
observation and steers towards a point `lookahead_m` ahead on the
centerline, holding `speed_mps` with a bounded acceleration."""

from __future__ import annotations

import numpy as np


def pursuit(obs, speed_mps: float = 11.0, lookahead_m: float = 12.0, max_accel: float = 2.0) -> np.ndarray:
    """float32 [E, 2] actions for a vector observation."""
    position = np.asarray(obs["position"], np.float64)
    yaw = np.asarray(obs["yaw"], np.float64)
    speed = np.asarray(obs["velocity_body"], np.float64)[:, 0]
    centerline = np.asarray(obs["centerline"], np.float64)
    count = np.asarray(obs["track_mask"]).astype(np.int64).sum(axis=1)
    out = np.zeros((position.shape[0], 2), np.float32)
    for e in range(position.shape[0]):
        line = centerline[e, : count[e]]
        i = int(np.argmin(np.linalg.norm(line - position[e], axis=1)))
        ahead = 0.0
        while ahead < lookahead_m:
            j = (i + 1) % count[e]
            ahead += float(np.linalg.norm(line[j] - line[i]))
            i = j
        dx, dy = line[i] - position[e]
        c, s = np.cos(yaw[e]), np.sin(yaw[e])
        lx, ly = c * dx + s * dy, -s * dx + c * dy
        curvature = 2.0 * ly / (lx * lx + ly * ly)
        out[e, 0] = np.clip(np.arctan(2.6 * curvature), -0.6, 0.6)
        out[e, 1] = np.clip(speed_mps - speed[e], -max_accel, max_accel)
    return out
