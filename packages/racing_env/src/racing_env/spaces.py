"""The public action and observation spaces, and the info whitelist.

Nothing else is observable: no projection index, lateral error, target
speed, checkpoint state, physics diagnostics or simulator object.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from racing_env.config import ProjectConfig
from racing_env.types import TRACK_CAPACITY

__all__ = ["action_space", "observation_space"]

def action_space(config: ProjectConfig) -> spaces.Box:
    """float32 (2,): steering (rad), longitudinal acceleration (m/s^2)."""
    low = np.array([-config.max_steering_rad, config.min_acceleration_mps2], np.float32)
    high = np.array([config.max_steering_rad, config.max_acceleration_mps2], np.float32)
    return spaces.Box(low=low, high=high, dtype=np.float32)


def observation_space() -> spaces.Dict:
    """The single-world observation Dict (a vector env adds a leading
    ``num_envs`` axis to every field)."""
    inf = np.float32(np.inf)
    pi = np.float32(np.pi)

    def box(shape, low=-inf, high=inf, dtype=np.float32):
        return spaces.Box(low=low, high=high, shape=shape, dtype=dtype)

    return spaces.Dict(
        {
            "position": box((2,)),
            "yaw": box((), -pi, pi),
            "velocity_body": box((2,)),
            "yaw_rate": box(()),
            "steering_angle": box(()),
            "track_progress": box((), np.float32(0), np.float32(1)),
            "centerline": box((TRACK_CAPACITY, 2)),
            "left_boundary": box((TRACK_CAPACITY, 2)),
            "right_boundary": box((TRACK_CAPACITY, 2)),
            "track_mask": box((TRACK_CAPACITY,), 0, 1, np.int8),
            "track_length": box((), np.float32(0), inf),
        }
    )
