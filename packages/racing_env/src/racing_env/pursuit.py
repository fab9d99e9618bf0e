"""Pure pursuit on the public observation, written once for NumPy and JAX
(``xp``) and for any float dtype: the reference controller (the ``pursuit``
plugin: float64, one world), the residual policy's prior
(``racing_stack.prior.PursuitPrior``: float32, batched, jitted on the
device or in NumPy) and the `pursuit` driver of tests and examples all
compute `plan` on a centerline's `loop`.

It steers by pure pursuit towards the centerline point a speed-dependent
distance ahead of the point nearest the car, and drives towards the slowest
speed that the curvature within ``preview_m`` allows (a corner's speed keeps
the lateral acceleration within ``lateral_accel_mps2``; a corner ahead is
reached by braking at ``brake_accel_mps2``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from racing_env import geometry
from racing_env.config import ProjectConfig

__all__ = ["FIELDS", "Gains", "Loop", "Plan", "loop", "plan", "pursue", "pursue_jax", "pursuit"]

#: The fields of the observation pure pursuit reads, in the order `pursue` takes them.
FIELDS = ("position", "yaw", "velocity_body", "centerline", "track_mask")
#: The car `pursuit` steers by default (its wheelbase and steering range).
_CAR = ProjectConfig()


class Gains(NamedTuple):
    """Pure pursuit's gains (hashable: static under ``jax.jit``).

    Attributes:
        max_speed_mps: never faster, m/s.
        lateral_accel_mps2: a corner's speed is sqrt(this / curvature), m/s^2
            (inf: no corner slows the car).
        brake_accel_mps2: the planned deceleration towards a slower corner ahead, m/s^2.
        drive_accel_mps2: the most forward command, m/s^2.
        preview_m: how far ahead the speed profile looks, m.
        lookahead_min_m, lookahead_gain_s: the pursuit point lies
            ``lookahead_min_m + lookahead_gain_s x speed`` ahead, m and s.
    """

    max_speed_mps: float
    lateral_accel_mps2: float
    brake_accel_mps2: float
    drive_accel_mps2: float
    preview_m: float
    lookahead_min_m: float
    lookahead_gain_s: float


class Loop(NamedTuple):
    """What pure pursuit reads of each world's padded centerline (`loop`),
    the same for every call on that loop: a caller that drives one loop
    for many calls (the reference plugin) computes it once.

    Attributes:
        line: [E, C, 2] the centerline, m. count: int [E], its points used (>= 1).
        along: [E, C] the arc length from point 0 to each point, m.
        length: [E, 1] the lap, m.
        curvature: [E, C] at each point (the circumcircle of the point and
            its neighbours two points away), 1/m.
    """

    line: Any
    count: Any
    along: Any
    length: Any
    curvature: Any


class Plan(NamedTuple):
    """`plan`'s result for E worlds.

    Attributes:
        action: [E, 2] steering (rad) and acceleration (m/s^2), within ``low`` and ``high``.
        aim: int [E], the centerline point pursued.
        target_mps: [E], the speed driven towards, m/s.
    """

    action: Any
    aim: Any
    target_mps: Any


def loop(xp: Any, centerline: Any, mask: Any, *, dtype: Any) -> Loop:
    """The `Loop` of each world's centerline, in ``dtype``.

    Args:
        xp: ``numpy`` or ``jax.numpy``.
        centerline: [E, C, 2], m. mask: [E, C], nonzero on the loop's points
            (the rest is padding).
        dtype: the float type (``xp.float32`` or ``xp.float64``); NumPy sums
            the arc lengths in float64 whatever it is (its float32 running
            sum drifts by a millimetre a lap, XLA's by far less).
    """
    line = xp.asarray(centerline, dtype)
    count = xp.maximum(xp.sum(xp.asarray(mask, xp.int32), axis=1), 1)  # [E]
    k = xp.arange(line.shape[1])[None, :]  # [1, C]
    step = geometry.loop_segments(xp, line, count)[1]  # [E, C], m
    along = (xp.cumsum(step, axis=1, dtype=np.float64 if xp is np else None) - step).astype(dtype)  # to point k
    rows = xp.arange(line.shape[0])[:, None]
    a, c = line[rows, (k - 2) % count[:, None]], line[rows, (k + 2) % count[:, None]]
    u, v, w = line - a, c - line, c - a
    area2 = xp.abs(u[..., 0] * w[..., 1] - u[..., 1] * w[..., 0])
    sides = xp.sqrt(xp.sum(u * u, -1)) * xp.sqrt(xp.sum(v * v, -1)) * xp.sqrt(xp.sum(w * w, -1))
    curvature = dtype(2) * area2 / xp.maximum(sides, dtype(1e-12))
    return Loop(line, count, along, xp.sum(step, axis=1, keepdims=True), curvature)


def plan(xp: Any, gains: Gains, track: Loop, position: Any, yaw: Any, velocity: Any, *, wheelbase_m: float,
         low: Any, high: Any, dtype: Any) -> Plan:
    """Pure pursuit's action for each world on its `Loop`, computed in
    ``dtype`` (the loop's) throughout.

    Args:
        xp: ``numpy`` or ``jax.numpy``.
        gains: the controller's `Gains`.
        track: the worlds' `Loop`.
        position: [E, 2] rear axle, m. yaw: [E], rad. velocity: [E, 2] body frame, m/s.
        wheelbase_m: the car's wheelbase, m.
        low, high: [2] the action's bounds (steering rad, acceleration m/s^2).
        dtype: the float type of the arithmetic and the result.
    """
    max_speed, lateral, brake, drive, preview, lookahead_min, lookahead_gain = gains
    line, count, along, length, curvature = track
    position, yaw = xp.asarray(position, dtype), xp.asarray(yaw, dtype)
    speed = xp.asarray(velocity, dtype)[:, 0]
    k = xp.arange(line.shape[1])[None, :]  # [1, C]
    rows = xp.arange(line.shape[0])[:, None]
    corner = xp.sqrt(dtype(lateral) / xp.maximum(curvature, dtype(1e-6)))  # [E, C]
    # The nearest point, and every other point's distance ahead of it along the loop.
    nearest = geometry.nearest_point(xp, line, count, position)[:, None]  # [E, 1]
    distance = along - along[rows, nearest]
    distance = xp.where(k > nearest, distance, distance + length)  # a repeated point after it is 0 ahead
    ahead = (k < count[:, None]) & (k != nearest)
    # Speed: the slowest corner ahead within the preview, reachable by braking.
    allowed = xp.sqrt(corner**2 + dtype(2 * brake) * distance)
    allowed = xp.min(xp.where(ahead & (distance <= dtype(preview)), allowed, xp.inf), axis=1)
    here = corner[rows, nearest][:, 0]
    target = xp.minimum(xp.minimum(dtype(max_speed), allowed), here)
    # Steering: pure pursuit on the first point at least the lookahead ahead (else the last point ahead).
    lookahead = dtype(lookahead_min) + dtype(lookahead_gain) * xp.maximum(speed, dtype(0))
    beyond = ahead & (distance >= lookahead[:, None])
    first = xp.argmin(xp.where(beyond, distance, xp.inf), axis=1)
    aim = xp.where(xp.any(beyond, axis=1), first, (nearest[:, 0] - 1) % count)
    dx, dy = (line[rows[:, 0], aim] - position).T
    cos, sin = xp.cos(yaw), xp.sin(yaw)
    lx, ly = cos * dx + sin * dy, -sin * dx + cos * dy
    steering = xp.arctan(dtype(wheelbase_m * 2.0) * ly / xp.maximum(lx * lx + ly * ly, dtype(1e-9)))
    accel = xp.minimum(dtype(2) * (target - speed), dtype(drive))
    action = xp.clip(xp.stack([steering, accel], axis=1), xp.asarray(low, dtype), xp.asarray(high, dtype))
    return Plan(action.astype(dtype), aim, target)


def pursue(xp: Any, gains: Gains, position: Any, yaw: Any, velocity: Any, centerline: Any, mask: Any, *,
           wheelbase_m: float, low: Any, high: Any, dtype: Any) -> Plan:
    """`plan` on the `loop` of ``centerline`` and ``mask`` (for a caller
    that keeps no loop between calls); the arguments are theirs, in the
    order of `FIELDS`."""
    return plan(xp, gains, loop(xp, centerline, mask, dtype=dtype), position, yaw, velocity,
                wheelbase_m=wheelbase_m, low=low, high=high, dtype=dtype)


#: `pursue` in JAX, jitted: ``pursue_jax(gains, position, yaw, velocity, centerline, mask, wheelbase_m=...,
#: low=..., high=..., dtype=...)`` (``gains``, the bounds as tuples and ``dtype`` are static).
pursue_jax = jax.jit(functools.partial(pursue, jnp), static_argnums=(0,),
                     static_argnames=("wheelbase_m", "low", "high", "dtype"))


def pursuit(obs: Mapping[str, Any], speed_mps: float = 11.0, lookahead_m: float = 12.0, max_accel: float = 2.0,
            wheelbase_m: float = _CAR.wheelbase_m) -> np.ndarray:
    """A reference driver for tests, examples and pictures: `pursue` in NumPy
    (float64) at a constant target speed (no corner slows it) with a fixed
    lookahead. It reads only the public observation, so it drives any backend.

    Args:
        obs: a vector observation (NumPy or JAX fields with a leading [E]).
        speed_mps: target speed, m/s.
        lookahead_m: arc length ahead of the nearest centerline point, m.
        max_accel: bound on the longitudinal command either way, m/s^2.
        wheelbase_m: the car's wheelbase, m (`ProjectConfig`'s).

    Returns:
        float32 [E, 2]: steering (rad, within `ProjectConfig.max_steering_rad`), acceleration (m/s^2).
    """
    gains = Gains(max_speed_mps=speed_mps, lateral_accel_mps2=math.inf, brake_accel_mps2=0.0,
                  drive_accel_mps2=max_accel, preview_m=0.0, lookahead_min_m=lookahead_m, lookahead_gain_s=0.0)
    steer = _CAR.max_steering_rad
    return pursue(np, gains, *(np.asarray(obs[k]) for k in FIELDS), wheelbase_m=wheelbase_m,
                  low=(-steer, -max_accel), high=(steer, max_accel), dtype=np.float64).action.astype(np.float32)
