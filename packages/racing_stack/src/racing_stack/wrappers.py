"""Public wrappers for learning, outside the Challenge: a policy's
observation features and a shaped reward with training-only endings, pure
JAX on the env's own device (jitted; no host transfer), and the same
features in NumPy for a controller plugin.

`LocalTrack` turns the public observation (and the previous action) into a
flat feature vector in the car's frame: the motion, where the car sits on
the road (lateral offset, heading error, each wheel's distance to the
edge) and the centerline and both boundaries ahead. `ShapedReward` turns
the Challenge's reward (the lap fraction gained) into metres gained, less
a crash cost that grows with the speed², and ends a *training* episode
(for the return, not for the env) where the car enters a band
``edge_margin_m`` inside the real edge or stops making progress. The env
itself is unchanged: its observation, reward and termination are the
Challenge's, and evaluation uses them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from racing_env import TRACK_CAPACITY, ProjectConfig, TerminationReason, checks
from racing_stack.prior import PursuitPrior

__all__ = ["Endings", "LocalTrack", "ShapedReward", "road_geometry"]

#: Feature scales: speed (m/s), yaw rate (rad/s), steering (rad),
#: acceleration (m/s^2), road widths and margins (m).
_SPEED, _YAW_RATE, _STEER, _ACCEL, _WIDTH = 20.0, 2.0, 0.6, 8.0, 6.0
#: The largest reward constant (a metre's reward, a step's cost, a crash's
#: cost): larger ones make float32 returns and their squared errors
#: overflow on a lap of ~1.5 km (10 km at the most).
MAX_REWARD_TERM = 1e6
#: The longest preview spacing and distance scale (m): longer than any lap.
MAX_LENGTH_M = 1e4
#: The speed (m/s) above which a crash costs no more: bounds the reward.
MAX_CRASH_SPEED_MPS = 100.0
#: Centerline segments searched on either side of the nearest point for
#: each wheel (the Race Core's window: they reach every wheel).
_WINDOW = 16
_VEHICLE = ProjectConfig()


def road_geometry(xp, position, yaw, centerline, left, count, wheelbase_m, track_width_m):
    """Where a car sits on its road, written once for NumPy and JAX (``xp``).

    Args:
        position: float32 [E, 2] rear axle, m. yaw: float32 [E], rad.
        centerline, left: float32 [E, C, 2], m. count: int32 [E] valid points.
        wheelbase_m, track_width_m: the car's wheel layout.

    Returns:
        (nearest int32 [E] centerline point to the rear axle, half_width
        float32 [E] m, lateral float32 [E] m (rear axle, + left of the
        centerline), heading_error float32 [E] rad (yaw less the road's
        direction, in (-pi, pi]), margins float32 [E, 4] m (each wheel's
        distance inside the nearest edge; < 0 beyond it), in the order front
        left, front right, rear left, rear right), along float32 [E] (the
        rear axle's projection on the centerline as a point index with a
        fraction: i + t is the point t of the way from point i to i + 1; it
        moves continuously with the car)).
        Every wheel's margin takes the road's half width at the rear axle's
        nearest point: exact on roads of constant width (track_gen's), off
        by the width's change over a wheelbase elsewhere.
    """
    f32 = xp.float32
    # Gathers index the rows explicitly (NumPy's take_along_axis costs ~10x
    # more per call, which a controller's batch of one pays every step).
    rows = xp.arange(centerline.shape[0])
    valid = xp.arange(centerline.shape[1])[None, :] < count[:, None]
    gap = xp.sum((centerline - position[:, None, :]) ** 2, axis=-1)
    nearest = xp.argmin(xp.where(valid, gap, xp.inf), axis=1)  # [E]
    k = xp.arange(-_WINDOW, _WINDOW)[None, :]
    first = (nearest[:, None] + k) % count[:, None]  # [E, S] segment starts
    a = centerline[rows[:, None], first]  # [E, S, 2]
    b = centerline[rows[:, None], (first + 1) % count[:, None]]
    half = f32(track_width_m / 2)
    layout = xp.asarray([[0.0, 0.0], [wheelbase_m, half], [wheelbase_m, -half], [0.0, half], [0.0, -half]], f32)
    c, s = xp.cos(yaw)[:, None], xp.sin(yaw)[:, None]
    q = xp.stack([position[:, None, 0] + c * layout[:, 0] - s * layout[:, 1],
                  position[:, None, 1] + s * layout[:, 0] + c * layout[:, 1]], axis=-1)  # [E, 5, 2]
    ab = (b - a)[:, None]  # [E, 1, S, 2]
    ap = q[:, :, None, :] - a[:, None]  # [E, 5, S, 2]
    length2 = xp.maximum(xp.sum(ab * ab, axis=-1), f32(1e-12))
    t = xp.clip(xp.sum(ap * ab, axis=-1) / length2, f32(0), f32(1))
    d = ap - t[..., None] * ab
    dist2 = xp.sum(d * d, axis=-1)  # [E, 5, S]
    best = xp.argmin(dist2, axis=-1)  # [E, 5]
    cross = ab[..., 0] * ap[..., 1] - ab[..., 1] * ap[..., 0]
    wheel = xp.arange(best.shape[1])[None, :]
    side = xp.where(cross[rows[:, None], wheel, best] >= 0, f32(1), f32(-1))
    offset = side * xp.sqrt(dist2[rows[:, None], wheel, best])  # [E, 5]
    half_width = xp.sqrt(xp.sum((left[rows, nearest] - centerline[rows, nearest]) ** 2, axis=-1))
    direction = ab[:, 0][rows, best[:, 0]]  # [E, 2] the rear axle's segment
    heading = yaw - xp.arctan2(direction[:, 1], direction[:, 0])
    heading = xp.arctan2(xp.sin(heading), xp.cos(heading))
    margins = half_width[:, None] - xp.abs(offset[:, 1:])
    rear = best[:, 0]
    along = first[rows, rear].astype(f32) + t[rows, 0, rear]
    return (nearest, half_width.astype(f32), offset[:, 0].astype(f32), heading.astype(f32), margins.astype(f32),
            along.astype(f32))


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
        """Features per world."""
        return 14 + 6 * self.points + (2 if self.prior is not None else 0)

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

    motion = xp.stack([velocity[:, 0] / _SPEED, velocity[:, 1] / _SPEED, yaw_rate / _YAW_RATE,
                       steering / _STEER, previous_action[:, 0] / _STEER, previous_action[:, 1] / _ACCEL,
                       half_width / _WIDTH, lateral / xp.maximum(half_width, f32(1e-3)), xp.sin(heading),
                       xp.cos(heading)], axis=1)
    return xp.concatenate([motion, margins / f32(_WIDTH), local(centerline), local(left), local(right)],
                          axis=1).astype(f32)


_local_track_jax = jax.jit(functools.partial(_local_track, jnp), static_argnums=(0, 1, 2, 3))


class Endings(NamedTuple):
    """`ShapedReward`'s per-world memory between steps.

    Attributes:
        inside: bool [E], the car was inside the margin band after the last step.
        still: int32 [E], control steps since the stall count last restarted.
        progress: float32 [E], metres of legal progress since then.
    """

    inside: jax.Array
    still: jax.Array
    progress: jax.Array


#: `ShapedReward`'s ending codes: none, the margin band entered, stalled.
NO_ENDING, MARGIN, STALL = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class ShapedReward:
    """The reward wrapper, with the training episode's own endings.

    Reward per step: ``metres_scale`` x metres of legal progress in the step
    (the Challenge reward x the lap length), less ``step_cost``, less the
    crash cost ``off_track_penalty + crash_energy_cost x v²`` (v the speed
    in m/s, capped at `MAX_CRASH_SPEED_MPS`) when the step leaves the track
    or first enters the band ``edge_margin_m`` inside the edge (once if
    both), less ``stall_penalty`` when the car has made no legal progress
    for ``stall_steps`` steps (driving the wrong way makes none), less the
    slide cost ``slip_cost x (|v_y| - slip_free_mps)²`` where the body's
    lateral speed |v_y| (m/s, capped at `MAX_CRASH_SPEED_MPS`) exceeds
    ``slip_free_mps``: a car that slides has lost grip, and slides come
    before crashes (a dense signal of the near misses of a rare event).
    A trainer's crash weight scales the crash and slide costs alike.

    Entering the band and stalling *end the training episode*: the return
    is cut there (a termination for GAE), while the env drives on; a stall's
    count restarts, so a car that stays stuck ends again ``stall_steps``
    later. A reset-only call (Challenge reward 0, no termination) earns
    ``-step_cost``; a learner masks those calls out anyway.

    Attributes:
        metres_scale: reward per metre (1/m), >= 0.
        step_cost: the cost of a control step, >= 0.
        off_track_penalty: a crash's fixed cost, >= 0.
        crash_energy_cost: a crash's cost per (m/s)², >= 0: a crash at speed
            costs more than the progress it bought, one at a crawl little.
        edge_margin_m: the band's width (m) inside the real edge, >= 0 (0: no band).
        stall_steps: control steps without progress that end the training
            episode, >= 1.
        stall_penalty: the cost of a stall, >= 0.
        stall_progress_m: the legal progress (m) that restarts the stall
            count, >= 0: over ``stall_steps`` steps it is the least average
            speed the car must keep (6 m in 150 steps of 20 ms: 2 m/s), so
            a crawl stalls too.
        slip_cost: the slide cost per step per (m/s)² of lateral speed
            beyond ``slip_free_mps``, >= 0 (0: none).
        slip_free_mps: the lateral speed (m/s) a step may have at no
            cost, in [0, `MAX_CRASH_SPEED_MPS`].
    """

    metres_scale: float = 0.1
    step_cost: float = 0.0
    off_track_penalty: float = 1.0
    crash_energy_cost: float = 0.1
    edge_margin_m: float = 0.75
    stall_steps: int = 150
    stall_penalty: float = 10.0
    stall_progress_m: float = 0.0
    slip_cost: float = 0.0
    slip_free_mps: float = 1.0

    def __post_init__(self) -> None:
        for name in ("metres_scale", "step_cost", "off_track_penalty", "crash_energy_cost", "stall_penalty",
                     "slip_cost"):
            object.__setattr__(self, name, checks.real_in(getattr(self, name), name, 0.0, MAX_REWARD_TERM))
        for name in ("edge_margin_m", "stall_progress_m"):
            object.__setattr__(self, name, checks.real_in(getattr(self, name), name, 0.0, MAX_LENGTH_M, unit="m"))
        object.__setattr__(self, "slip_free_mps", checks.real_in(self.slip_free_mps, "slip_free_mps", 0.0,
                                                                 MAX_CRASH_SPEED_MPS, unit="m/s"))
        object.__setattr__(self, "stall_steps", checks.integer_in(self.stall_steps, "stall_steps", 1, 2**31, "2**31"))

    def bounds(self, track_length_m: float) -> tuple[float, float]:
        """The least and the greatest reward a step can earn on tracks of at
        most ``track_length_m`` metres: a crash at the capped speed, sliding
        sideways at it, that is also a stall, and a whole lap of progress in
        one step (the Challenge reward is the lap fraction gained, in [0, 1]).

        Raises:
            ValueError: ``track_length_m`` is not a positive finite number.
        """
        track_length_m = checks.positive(track_length_m, "track_length_m")
        crash = float(self.off_track_penalty) + float(self.crash_energy_cost) * MAX_CRASH_SPEED_MPS**2
        slide = float(self.slip_cost) * (MAX_CRASH_SPEED_MPS - float(self.slip_free_mps))**2
        return (-float(self.step_cost) - crash - slide - float(self.stall_penalty),
                float(self.metres_scale) * float(track_length_m) - float(self.step_cost))

    def start(self, worlds: int) -> Endings:
        """The memory of ``worlds`` fresh episodes."""
        return Endings(jnp.zeros(worlds, bool), jnp.zeros(worlds, jnp.int32), jnp.zeros(worlds, jnp.float32))

    def __call__(self, endings: Endings, reward: jax.Array, obs: Mapping[str, jax.Array],
                 info: Mapping[str, jax.Array], done: jax.Array, active: jax.Array, crash_weight: float = 1.0
                 ) -> tuple[jax.Array, jax.Array, Endings]:
        """One step's shaped reward.

        Args:
            endings: the memory after the step before.
            reward: the Challenge reward [E]; obs, info: the step's outputs.
            done: bool [E], the env ended the episode in this step.
            active: [E], nonzero where the world is driven (zero: held at
                the start; its memory stays fresh and it never ends).
            crash_weight: what share of the crash and slide costs is
                paid, in [0, 1] (a trainer's warm-up; the endings stay): a
                number, or a float32 scalar on the device (no transfer per
                call).

        Returns:
            (reward float32 [E], ending int32 [E]: `NO_ENDING`, `MARGIN` or
            `STALL`, the memory for the next step).

        Raises:
            ValueError: ``crash_weight`` is a number outside [0, 1] (one on
                the device is the caller's to keep there).
        """
        if not isinstance(crash_weight, jax.Array):
            crash_weight = jnp.float32(checks.real_in(crash_weight, "crash_weight", 0.0, 1.0))
        return _shaped(self, endings, reward, obs["track_length"], info["termination_reason"], obs["velocity_body"],
                       obs["position"], obs["yaw"], obs["centerline"], obs["left_boundary"], obs["track_mask"], done,
                       active, crash_weight)


@functools.partial(jax.jit, static_argnums=0)
def _shaped(shaper: ShapedReward, endings, reward, length, reason, velocity, position, yaw, centerline, left, mask,
            done, active, crash_weight):
    """`ShapedReward.__call__`'s step, compiled once per setting (a frozen
    dataclass of Python numbers: static, hashed by value)."""
    active = active != 0
    off = reason == TerminationReason.OFF_TRACK
    count = jnp.maximum(jnp.sum(mask.astype(jnp.int32), axis=1), 1)
    margins = road_geometry(jnp, position.astype(jnp.float32), yaw, centerline, left, count,
                            _VEHICLE.wheelbase_m, _VEHICLE.track_width_m)[4]
    inside = (jnp.min(margins, axis=1) < shaper.edge_margin_m) if shaper.edge_margin_m > 0 else jnp.zeros_like(off)
    entered = inside & ~endings.inside & active
    speed = jnp.minimum(jnp.linalg.norm(velocity, axis=-1), MAX_CRASH_SPEED_MPS)
    crashed = off | entered
    metres = reward * length
    progress = endings.progress + metres
    moved = progress > shaper.stall_progress_m
    still = jnp.where(moved, 0, endings.still + 1)
    stalled = (still >= shaper.stall_steps) & active
    shaped = (shaper.metres_scale * reward * length - shaper.step_cost
              - jnp.where(crashed, crash_weight * (shaper.off_track_penalty + shaper.crash_energy_cost * speed**2), 0.0)
              - jnp.where(stalled, shaper.stall_penalty, 0.0))
    if shaper.slip_cost:  # static: without a slide cost the reward is computed as it always was
        slide = jnp.maximum(jnp.minimum(jnp.abs(velocity[:, 1]), MAX_CRASH_SPEED_MPS) - shaper.slip_free_mps, 0.0)
        shaped = shaped - crash_weight * shaper.slip_cost * slide**2
    ending = jnp.where(entered, MARGIN, jnp.where(stalled, STALL, NO_ENDING)).astype(jnp.int32)
    fresh = done | ~active  # the next call starts a new episode, or the world is not driven yet
    restart = fresh | stalled | moved
    memory = Endings(inside=jnp.where(fresh, False, inside), still=jnp.where(fresh | stalled, 0, still),
                     progress=jnp.where(restart, 0.0, progress).astype(jnp.float32))
    return shaped.astype(jnp.float32), ending, memory
