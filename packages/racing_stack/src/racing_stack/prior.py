"""The pure-pursuit prior of a residual policy: what the reference
controller (`racing_env`'s ``pursuit`` plugin) would do, for a batch of
worlds at once, written once for NumPy and JAX.

The reference steers by pure pursuit towards the centerline point a
speed-dependent distance ahead of the point nearest the car, and drives
towards the slowest speed that the curvature within ``preview_m`` allows
(a corner's speed keeps the lateral acceleration within
``lateral_accel_mps2``; a corner ahead is reached by braking at
``brake_accel_mps2``). `PursuitPrior` computes the same action from the
public observation's padded arrays, on the device and jitted (training,
validation) or in NumPy (the exported plugin), in float32 (NumPy sums the
arc lengths in float64: its float32 running sum drifts by a millimetre a
lap, XLA's by far less); the reference plugin computes it per world in
float64, and the three agree to about 1e-4 (tests hold them together on
random and on real tracks).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from racing_env import ProjectConfig, checks

__all__ = ["PursuitPrior"]

_CAR = ProjectConfig()
#: The fields of the observation the prior reads.
_FIELDS = ("position", "yaw", "velocity_body", "centerline", "track_mask")


@dataclasses.dataclass(frozen=True)
class PursuitPrior:
    """The reference controller's gains (its defaults are those of the
    ``pursuit`` plugin's config.toml) and its action for a vector
    observation.

    Attributes:
        max_speed_mps: never faster, m/s.
        lateral_accel_mps2: a corner's speed is sqrt(this / curvature), m/s^2.
        brake_accel_mps2: the planned deceleration towards a slower corner ahead, m/s^2.
        drive_accel_mps2: the most forward command, m/s^2.
        preview_m: how far ahead the speed profile looks, m.
        lookahead_min_m, lookahead_gain_s: the pursuit point lies
            ``lookahead_min_m + lookahead_gain_s x speed`` ahead, m and s.
    """

    max_speed_mps: float = 22.0
    lateral_accel_mps2: float = 4.5
    brake_accel_mps2: float = 3.0
    drive_accel_mps2: float = 2.0
    preview_m: float = 120.0
    lookahead_min_m: float = 8.0
    lookahead_gain_s: float = 0.6

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            high = 100.0 if field.name.endswith("_s") else 1e4
            object.__setattr__(self, field.name, checks.real_in(getattr(self, field.name), field.name, 0.0, high,
                                                                low_open=field.name != "lookahead_gain_s"))

    def _gains(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, f.name)) for f in dataclasses.fields(self))

    def __call__(self, obs: Mapping[str, jax.Array]) -> jax.Array:
        """float32 [E, 2]: steering (rad) and acceleration (m/s^2) within the
        car's command ranges, from a vector observation of JAX arrays (on
        their device, jitted), with a leading [E]."""
        return _pursuit_jax(self._gains(), *(obs[k] for k in _FIELDS))

    def host(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The same action from NumPy fields, in NumPy on the host."""
        return _pursuit(np, self._gains(), *(np.asarray(obs[k]) for k in _FIELDS))


def _pursuit(xp, gains, position, yaw, velocity, centerline, mask):
    """The prior's action, written once for NumPy and JAX (``xp``), float32
    throughout. Shapes: position [E, 2], yaw [E], velocity [E, 2],
    centerline [E, C, 2], mask [E, C]."""
    max_speed, lateral, brake, drive, preview, lookahead_min, lookahead_gain = gains
    f32 = xp.float32
    position, yaw = xp.asarray(position, f32), xp.asarray(yaw, f32)
    speed = xp.asarray(velocity, f32)[:, 0]
    line = xp.asarray(centerline, f32)
    count = xp.maximum(xp.sum(xp.asarray(mask, xp.int32), axis=1), 1)[:, None]  # [E, 1]
    k = xp.arange(line.shape[1])[None, :]  # [1, C]
    valid = k < count

    def at(index):  # the points of each world's loop at ``index`` [E, C'] (wrapped at its count)
        return xp.take_along_axis(line, (index % count)[..., None], axis=1)

    step = xp.where(valid, xp.sqrt(xp.sum((at(k + 1) - line) ** 2, axis=-1)), f32(0))  # [E, C]
    along = (xp.cumsum(step, axis=1, dtype=np.float64 if xp is np else None) - step).astype(f32)  # to point k
    length = xp.sum(step, axis=1, keepdims=True)
    # Curvature: the circumcircle of each point and its neighbours two points away.
    a, c = at(k - 2), at(k + 2)
    u, v, w = line - a, c - line, c - a
    area2 = xp.abs(u[..., 0] * w[..., 1] - u[..., 1] * w[..., 0])
    sides = xp.sqrt(xp.sum(u * u, -1)) * xp.sqrt(xp.sum(v * v, -1)) * xp.sqrt(xp.sum(w * w, -1))
    curvature = f32(2) * area2 / xp.maximum(sides, f32(1e-12))
    corner = xp.sqrt(f32(lateral) / xp.maximum(curvature, f32(1e-6)))  # [E, C]
    # The nearest point, and every other point's distance ahead of it along the loop.
    gap = xp.sum((line - position[:, None, :]) ** 2, axis=-1)
    nearest = xp.argmin(xp.where(valid, gap, xp.inf), axis=1)[:, None]  # [E, 1]
    distance = along - xp.take_along_axis(along, nearest, axis=1)
    distance = xp.where(k > nearest, distance, distance + length)  # a repeated point after it is 0 ahead
    ahead = valid & (k != nearest)
    # Speed: the slowest corner ahead within the preview, reachable by braking.
    allowed = xp.sqrt(corner**2 + f32(2 * brake) * distance)
    allowed = xp.min(xp.where(ahead & (distance <= f32(preview)), allowed, xp.inf), axis=1)
    here = xp.take_along_axis(corner, nearest, axis=1)[:, 0]
    target = xp.minimum(xp.minimum(f32(max_speed), allowed), here)
    # Steering: pure pursuit on the first point at least the lookahead ahead (else the last point ahead).
    lookahead = f32(lookahead_min) + f32(lookahead_gain) * xp.maximum(speed, f32(0))
    beyond = ahead & (distance >= lookahead[:, None])
    first = xp.argmin(xp.where(beyond, distance, xp.inf), axis=1)[:, None]
    aim = xp.where(xp.any(beyond, axis=1)[:, None], first, (nearest - 1) % count)
    dx, dy = (at(aim)[:, 0] - position).T
    cos, sin = xp.cos(yaw), xp.sin(yaw)
    lx, ly = cos * dx + sin * dy, -sin * dx + cos * dy
    steering = xp.arctan(f32(_CAR.wheelbase_m * 2.0) * ly / xp.maximum(lx * lx + ly * ly, f32(1e-9)))
    accel = xp.minimum(f32(2) * (target - speed), f32(drive))
    low = xp.asarray([-_CAR.max_steering_rad, _CAR.min_acceleration_mps2], f32)
    high = xp.asarray([_CAR.max_steering_rad, _CAR.max_acceleration_mps2], f32)
    return xp.clip(xp.stack([steering, accel], axis=1), low, high).astype(f32)


_pursuit_jax = jax.jit(functools.partial(_pursuit, jnp), static_argnums=(0,))
