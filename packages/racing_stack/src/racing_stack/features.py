"""The policy's observation features, for learning outside the Challenge:
`LocalTrack` turns the public observation (and the previous action) into a
flat feature vector in the car's frame: the motion, where the car sits on
the road (lateral offset, heading error, each wheel's distance to the
edge) and the centerline and both boundaries ahead. Pure JAX on the env's
own device (jitted; no host transfer), and the same features in NumPy for
a controller plugin. The env itself is unchanged: its observation is the
Challenge's, and evaluation uses it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from racing_env import TRACK_CAPACITY, ProjectConfig, checks
from racing_env.geometry import road_geometry
from racing_stack.prior import PursuitPrior

__all__ = ["MAX_LENGTH_M", "MOTION", "PREVIEW", "PRIOR", "LocalTrack"]

#: Feature scales: speed (m/s), yaw rate (rad/s), steering (rad),
#: acceleration (m/s^2), road widths and margins (m).
_SPEED, _YAW_RATE, _STEER, _ACCEL, _WIDTH = 20.0, 2.0, 0.6, 8.0, 6.0
#: The longest preview spacing and distance scale (m): longer than any lap.
MAX_LENGTH_M = 1e4
#: The features ahead of the preview, in order: the motion and the previous
#: action, where the car sits on the road, each wheel's margin.
MOTION = ("speed_x", "speed_y", "yaw_rate", "steering", "previous_steering", "previous_acceleration",
          "half_width", "lateral_offset", "sin_heading_error", "cos_heading_error", "margin_front_left",
          "margin_front_right", "margin_rear_left", "margin_rear_right")
#: The lines the preview places lie on, in order; each place adds its x and y.
PREVIEW = ("centerline", "left_boundary", "right_boundary")
#: A prior's action, last.
PRIOR = ("prior_steering", "prior_acceleration")
_VEHICLE = ProjectConfig()


@dataclasses.dataclass(frozen=True)
class LocalTrack:
    """The local-track observation wrapper.

    Features of one world (float32 [size], roughly unit scale; the policy
    normalises them further by running statistics):

    - motion: longitudinal and lateral speed / 20 m/s, yaw rate / 2 rad/s,
      steering / 0.6 rad;
    - the previous action: steering / 0.6 rad, acceleration / 8 m/s^2 (zero
      at an episode's first step);
    - the road: half its width / 6 m, the rear axle's lateral offset / half
      width (+ left), the sine and cosine of the heading error, and each
      wheel's distance inside the edge / 6 m (front left, front right, rear
      left, rear right; negative beyond it);
    - the preview: for each of the ``points`` places ahead the centerline,
      left and right boundary points in the car frame (x forward, y left),
      / ``scale_m``. The places: with ``interpolate``, the rear axle's
      projection on the centerline, then every ``spacing_m`` of centerline
      from it, each interpolated between the two points around it, so that
      the preview moves continuously with the car; without, the nearest
      centerline point, then every ``spacing_m`` rounded to whole points
      (the preview jumps by a point's spacing, about a metre, each time the
      nearest point changes);
    - with a ``prior``, last, its action: steering (rad) and acceleration
      (m/s^2), in the env's units (a residual policy adds to it:
      `racing_stack.ppo.networks.ActorCritic`).

    Attributes:
        points: places ahead, >= 1.
        spacing_m: centerline distance between places (m), > 0.
        scale_m: the distance scale of the point coordinates (m), > 0.
        interpolate: the continuous preview.
        prior: the pure-pursuit prior whose action ends the features (a
            mapping of its gains becomes one), or None.
    """

    points: int = 20
    spacing_m: float = 6.0
    scale_m: float = 25.0
    interpolate: bool = False
    prior: PursuitPrior | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", checks.integer_in(self.points, "points", 1, TRACK_CAPACITY + 1))
        for name in ("spacing_m", "scale_m"):
            object.__setattr__(self, name, checks.real_in(getattr(self, name), name, 0.0, MAX_LENGTH_M,
                                                          low_open=True, unit="m"))
        if not isinstance(self.interpolate, bool):
            raise TypeError(f"interpolate must be a bool, got {checks.shown(self.interpolate)}")
        if isinstance(self.prior, Mapping):  # as JSON and TOML hold it
            object.__setattr__(self, "prior", checks.settings_table(PursuitPrior, self.prior, "prior"))
        if self.prior is not None and not isinstance(self.prior, PursuitPrior):
            raise TypeError(f"prior must be a PursuitPrior, a mapping of its gains or None, "
                            f"got {checks.shown(self.prior)}")

    @property
    def size(self) -> int:
        """Features per world: `MOTION`, two per place of each `PREVIEW`
        line, and `PRIOR` with a prior."""
        return len(MOTION) + 2 * len(PREVIEW) * self.points + (len(PRIOR) if self.prior is not None else 0)

    def __call__(self, obs: Mapping[str, jax.Array], previous_action: jax.Array) -> jax.Array:
        """float32 [E, size] from a vector observation of JAX arrays (on
        their device, jitted), with a leading [E], and the action of the
        step before (float32 [E, 2], env units; zero at an episode's start)."""
        x = _local_track_jax(self.points, float(self.spacing_m), float(self.scale_m), self.interpolate,
                             *(obs[k] for k in _FIELDS), previous_action)
        return x if self.prior is None else jnp.concatenate([x, self.prior(obs)], axis=1)

    def host(self, obs: Mapping[str, np.ndarray], previous_action: np.ndarray) -> np.ndarray:
        """The same features from NumPy fields, computed in NumPy on the host
        (a controller's batch of one, without a device round trip)."""
        x = _local_track(np, self.points, float(self.spacing_m), float(self.scale_m), self.interpolate,
                         *(np.asarray(obs[k]) for k in _FIELDS), np.asarray(previous_action, np.float32))
        return x if self.prior is None else np.concatenate([x, self.prior.host(obs)], axis=1)


_FIELDS = ("position", "yaw", "velocity_body", "yaw_rate", "steering_angle", "centerline", "left_boundary",
           "right_boundary", "track_mask", "track_length")


def _local_track(xp, points, spacing_m, scale_m, interpolate, position, yaw, velocity, yaw_rate, steering,
                 centerline, left, right, mask, length, previous_action):
    """The features, written once for NumPy and JAX (``xp``)."""
    f32 = xp.float32
    # float32 throughout, so that NumPy and JAX round the same values the same way
    position = xp.asarray(position, f32)
    count = xp.maximum(xp.sum(xp.asarray(mask, xp.int32), axis=1), 1)  # [E]
    nearest, half_width, lateral, heading, margins, along = road_geometry(
        xp, position, yaw, centerline, left, count, _VEHICLE.wheelbase_m, _VEHICLE.track_width_m)
    step_m = xp.asarray(length, f32) / count.astype(f32)  # mean point spacing
    ahead = xp.arange(points, dtype=f32)[None, :] * f32(spacing_m) / step_m[:, None]  # [E, K] in points
    if interpolate:
        place = along[:, None] + ahead
        whole = xp.floor(place)
        weight = (place - whole)[..., None]  # [E, K, 1]
        index = whole.astype(xp.int32) % count[:, None]  # [E, K]
    else:
        index = (nearest[:, None] + xp.round(ahead).astype(xp.int32)) % count[:, None]
    c, s = xp.cos(yaw)[:, None], xp.sin(yaw)[:, None]
    rows = xp.arange(position.shape[0])[:, None]

    def local(line):
        p = line[rows, index]  # [E, K, 2]
        if interpolate:
            following = line[rows, (index + 1) % count[:, None]]
            p = p + weight * (following - p)
        p = p - position[:, None, :]
        x = c * p[..., 0] + s * p[..., 1]
        y = -s * p[..., 0] + c * p[..., 1]
        return xp.stack([x, y], axis=-1).reshape(x.shape[0], -1) / f32(scale_m)

    margins = margins / f32(_WIDTH)
    # A column per name of MOTION, in its order (strict: none missing, none left over).
    motion = dict(zip(MOTION, (velocity[:, 0] / _SPEED, velocity[:, 1] / _SPEED, yaw_rate / _YAW_RATE,
                               steering / _STEER, previous_action[:, 0] / _STEER, previous_action[:, 1] / _ACCEL,
                               half_width / _WIDTH, lateral / xp.maximum(half_width, f32(1e-3)), xp.sin(heading),
                               xp.cos(heading), *(margins[:, i] for i in range(margins.shape[1]))), strict=True))
    lines = {"centerline": centerline, "left_boundary": left, "right_boundary": right}
    return xp.concatenate([xp.stack(list(motion.values()), axis=1),
                           *(local(lines[name]) for name in PREVIEW)], axis=1).astype(f32)


_local_track_jax = jax.jit(functools.partial(_local_track, jnp), static_argnums=(0, 1, 2, 3))
