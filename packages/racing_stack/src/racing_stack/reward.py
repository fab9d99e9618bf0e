"""A shaped reward with training-only endings, for learning outside the
Challenge, pure JAX on the env's own device (jitted; no host transfer).

`ShapedReward` turns the Challenge's reward (the lap fraction gained) into
metres gained, less a crash cost that grows with the speed², and ends a
*training* episode (for the return, not for the env) where the car enters a
band ``edge_margin_m`` inside the real edge or stops making progress. The
env itself is unchanged: its reward and termination are the Challenge's,
and evaluation uses them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from racing_env import ProjectConfig, TerminationReason, checks
from racing_env.geometry import road_geometry
from racing_stack.features import MAX_LENGTH_M

__all__ = ["MARGIN", "MAX_CRASH_SPEED_MPS", "MAX_REWARD_TERM", "NO_ENDING", "STALL", "Endings", "ShapedReward"]

#: The largest reward constant (a metre's reward, a step's cost, a crash's
#: cost): larger ones make float32 returns and their squared errors
#: overflow on a lap of ~1.5 km (10 km at the most).
MAX_REWARD_TERM = 1e6
#: The speed (m/s) above which a crash costs no more: bounds the reward.
MAX_CRASH_SPEED_MPS = 100.0
_VEHICLE = ProjectConfig()


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
