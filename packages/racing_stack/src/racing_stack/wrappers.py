"""Public wrappers for learning, outside the Challenge: a policy's
observation features and a shaped reward, both pure JAX on the env's own
device (jitted; no host transfer).

`LocalTrack` turns the public observation into a flat feature vector in
the car's frame: the speed, yaw rate and steering, and the centerline and
both boundaries at ``points`` places ahead of the car, ``spacing_m`` apart.
`ShapedReward` turns the Challenge's reward (the lap fraction gained) into
metres gained, less a time cost and a penalty for leaving the track. The
env itself is unchanged: its observation, reward and termination are the
Challenge's, and evaluation uses them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from racing_env import TRACK_CAPACITY, TerminationReason

__all__ = ["LocalTrack", "ShapedReward"]

#: Feature scales: speed (m/s), yaw rate (rad/s), steering (rad), distance (m).
_SPEED, _YAW_RATE, _STEER = 20.0, 2.0, 0.6
#: The largest reward constant (a metre's reward, a step's cost, the
#: off-track cost): larger ones make float32 returns and their squared
#: errors overflow on a lap of ~1.5 km (10 km at the most).
MAX_REWARD_TERM = 1e6
#: The longest preview spacing and distance scale (m): longer than any lap.
MAX_LENGTH_M = 1e4


@dataclasses.dataclass(frozen=True)
class LocalTrack:
    """The local-track observation wrapper.

    Features of one world (float32 [size]): longitudinal and lateral speed /
    20 m/s, yaw rate / 2 rad/s, steering / 0.6 rad, then for each of the
    ``points`` places ahead (the nearest centerline point, then every
    ``spacing_m`` of centerline) the centerline, left and right boundary
    points in the car frame (x forward, y left), / ``scale_m``.

    Attributes:
        points: places ahead, >= 1.
        spacing_m: centerline distance between places (m), > 0.
        scale_m: the distance scale of the point coordinates (m), > 0.
    """

    points: int = 12
    spacing_m: float = 5.0
    scale_m: float = 50.0

    def __post_init__(self) -> None:
        if isinstance(self.points, bool) or not isinstance(self.points, int) or self.points < 1:
            raise ValueError(f"points must be an int >= 1, got {self.points!r}")
        if self.points > TRACK_CAPACITY:
            raise ValueError(f"points must be <= TRACK_CAPACITY = {TRACK_CAPACITY}, got {self.points!r}")
        for name in ("spacing_m", "scale_m"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_LENGTH_M:
                raise ValueError(f"{name} must be a number in (0, {MAX_LENGTH_M:g}] m, got {value!r}")

    @property
    def size(self) -> int:
        """Features per world."""
        return 4 + 6 * self.points

    def __call__(self, obs: Mapping[str, jax.Array]) -> jax.Array:
        """float32 [E, size] from a vector observation of JAX arrays (on
        their device, jitted), with a leading [E]."""
        return _local_track_jax(self.points, float(self.spacing_m), float(self.scale_m), *(obs[k] for k in _FIELDS))

    def host(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The same features from NumPy fields, computed in NumPy on the host
        (a controller's batch of one, without a device round trip)."""
        return _local_track(np, self.points, float(self.spacing_m), float(self.scale_m),
                            *(np.asarray(obs[k]) for k in _FIELDS))


_FIELDS = ("position", "yaw", "velocity_body", "yaw_rate", "steering_angle", "centerline", "left_boundary",
           "right_boundary", "track_mask", "track_length")


def _local_track(xp, points, spacing_m, scale_m, position, yaw, velocity, yaw_rate, steering, centerline, left,
                 right, mask, length):
    """The features, written once for NumPy and JAX (``xp``)."""
    position = xp.asarray(position, xp.float32)
    count = xp.maximum(xp.sum(xp.asarray(mask, xp.int32), axis=1), 1)  # [E]
    valid = xp.arange(centerline.shape[1])[None, :] < count[:, None]
    gap = xp.sum((centerline - position[:, None, :]) ** 2, axis=-1)
    nearest = xp.argmin(xp.where(valid, gap, xp.inf), axis=1)  # [E]
    # float32 throughout, so that NumPy and JAX round the same values the same way
    step_m = xp.asarray(length, xp.float32) / count.astype(xp.float32)  # mean point spacing
    ahead = xp.arange(points, dtype=xp.float32)[None, :] * xp.float32(spacing_m)
    offsets = xp.round(ahead / step_m[:, None]).astype(xp.int32)
    index = (nearest[:, None] + offsets) % count[:, None]  # [E, K]
    c, s = xp.cos(yaw)[:, None], xp.sin(yaw)[:, None]

    def local(line):
        p = xp.take_along_axis(line, index[..., None], axis=1) - position[:, None, :]
        x = c * p[..., 0] + s * p[..., 1]
        y = -s * p[..., 0] + c * p[..., 1]
        return xp.stack([x, y], axis=-1).reshape(x.shape[0], -1) / scale_m

    motion = xp.stack([velocity[:, 0] / _SPEED, velocity[:, 1] / _SPEED, yaw_rate / _YAW_RATE,
                       steering / _STEER], axis=1)
    return xp.concatenate([motion, local(centerline), local(left), local(right)], axis=1).astype(xp.float32)


_local_track_jax = jax.jit(functools.partial(_local_track, jnp), static_argnums=(0, 1, 2))


@dataclasses.dataclass(frozen=True)
class ShapedReward:
    """The reward wrapper: ``metres_scale`` x metres of legal progress in the
    step (the Challenge reward x the lap length), less ``step_cost`` every
    step, less ``off_track_penalty`` when the step leaves the track. A
    reset-only call (Challenge reward 0, no termination) earns
    ``-step_cost``; a learner masks those calls out anyway.

    Attributes:
        metres_scale: reward per metre (1/m), >= 0.
        step_cost: the cost of a control step, >= 0 (a faster lap earns more).
        off_track_penalty: the cost of leaving the track, >= 0.
    """

    metres_scale: float = 0.1
    step_cost: float = 0.01
    off_track_penalty: float = 2.0

    def __post_init__(self) -> None:
        for name in ("metres_scale", "step_cost", "off_track_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_REWARD_TERM:
                raise ValueError(f"{name} must be a number in [0, {MAX_REWARD_TERM:g}], got {value!r}")

    def bounds(self, track_length_m: float) -> tuple[float, float]:
        """The least and the greatest reward a step can earn on tracks of at
        most ``track_length_m`` metres: leaving the track, and a whole lap of
        progress in one step (the Challenge reward is the lap fraction gained,
        in [0, 1])."""
        return (-float(self.step_cost) - float(self.off_track_penalty),
                float(self.metres_scale) * float(track_length_m) - float(self.step_cost))

    def __call__(self, reward: jax.Array, obs: Mapping[str, jax.Array], info: Mapping[str, jax.Array]) -> jax.Array:
        """float32 [E] from one step's Challenge reward [E], observation and info."""
        return _shaped(float(self.metres_scale), float(self.step_cost), float(self.off_track_penalty), reward,
                       obs["track_length"], info["termination_reason"])


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _shaped(metres_scale, step_cost, off_track_penalty, reward, length, reason):
    off = (reason == TerminationReason.OFF_TRACK).astype(jnp.float32)
    return (metres_scale * reward * length - step_cost - off_track_penalty * off).astype(jnp.float32)
