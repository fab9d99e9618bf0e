"""A reference driver: NumPy pure pursuit on the public observation.

It steers towards the centerline point `lookahead_m` ahead of the point
nearest the rear axle (the kinematic bicycle's steering for that arc) and
holds `speed_mps` with an acceleration bounded by `max_accel`. It reads only
the public observation, so it drives any backend; tests, examples and
pictures use it to produce real driving.
"""

from __future__ import annotations

import numpy as np

from racing_env.config import ProjectConfig

__all__ = ["pursuit"]

#: The car it steers (its wheelbase and steering range).
_CAR = ProjectConfig()


def pursuit(
    obs, speed_mps: float = 11.0, lookahead_m: float = 12.0, max_accel: float = 2.0,
    wheelbase_m: float = _CAR.wheelbase_m
) -> np.ndarray:
    """Actions for a vector observation.

    Args:
        obs: a vector observation (NumPy or JAX fields with a leading [E]).
        speed_mps: target speed, m/s.
        lookahead_m: arc length ahead of the nearest centerline point, m.
        max_accel: bound on the longitudinal command, m/s^2.
        wheelbase_m: the car's wheelbase, m (`ProjectConfig`'s).

    Returns:
        float32 [E, 2]: steering (rad, within `ProjectConfig.max_steering_rad`), acceleration (m/s^2).
    """
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
        out[e, 0] = np.clip(np.arctan(wheelbase_m * curvature), -_CAR.max_steering_rad, _CAR.max_steering_rad)
        out[e, 1] = np.clip(speed_mps - speed[e], -max_accel, max_accel)
    return out
