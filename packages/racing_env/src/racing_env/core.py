"""The Challenge as pure JAX functions: what `VecCarRacingEnv` jits, public
so that a JAX program can ``jax.lax.scan`` or ``jax.vmap`` the env itself.

One step (`step`) is:

1. the action handling (`begin`): non-finite actions (or those marked in
   ``invalid``) make their active world's action invalid, finite ones are
   clipped into range and counted, worlds whose last call was terminal
   ignore theirs;
2. the physics' control step;
3. the Race Core and termination (`finish`), then the NEXT_STEP reset of the
   worlds whose previous call was terminal: they advance their episode
   counter, draw new seeds and a new TrackPool row (SeedSequence domain 2)
   and return their new initial observation with zero reward and false
   flags.

`reset` and `step` take a physics whose ``step`` and ``reset`` trace under
``jax.jit`` (`racing_env.physics.MjxWarpPhysics`); the MuJoCo C reference
(``cpu_reference``) integrates on the host, and the env calls `begin`,
`initial` and `finish` around it. Every function is pure: the state goes
in and comes out; nothing is kept here.

The state (`racing_env.types.EnvState` and the physics state) is the env's
business, not a controller's: controllers see the observation only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from racing_env import car, seeds
from racing_env.config import Level, ProjectConfig
from racing_env.race import race_reset, race_update
from racing_env.spaces import action_space
from racing_env.types import EnvState, TerminationReason, TrackArrays

__all__ = ["EnvParams", "begin", "finish", "initial", "reset", "step"]


@dataclasses.dataclass(frozen=True)
class EnvParams:
    """What the Challenge reads besides the state: a JAX pytree whose leaves
    are the pool's arrays (``config`` and ``level`` are static: another car
    or Level is another compile).

    Attributes:
        config: the car and the clock.
        level: the Level (its timeout).
        tracks: the TrackPool as the Race Core reads it (P rows).
    """

    config: ProjectConfig
    level: Level
    tracks: TrackArrays

    @property
    def pool_size(self) -> int:
        """P, the pool's rows."""
        return self.tracks.track_id.shape[0]


jax.tree_util.register_dataclass(EnvParams, data_fields=["tracks"], meta_fields=["config", "level"])


def _where(mask: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``mask`` [E] is set, else ``old``, leaf by leaf."""
    return jax.tree.map(lambda a, b: jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b), new, old)


def begin(params: EnvParams, state: EnvState, qvel: jax.Array, action: jax.Array, invalid: jax.Array):
    """The action handling.

    Args:
        qvel: float32 [E, NV], the physics' velocities. action: float32 [E, 2].
        invalid: bool [E], actions the host already found invalid.

    Returns:
        (controls [E, NU], the invalid-action mask [E], the state with its
        clipped-action counts updated).
    """
    space = action_space(params.config)
    active = ~state.pending
    finite = jnp.all(jnp.isfinite(action), axis=1)
    bad = active & (invalid | ~finite)
    safe = jnp.where(finite[:, None], action, 0.0)
    clipped = jnp.clip(safe, space.low, space.high)
    was_clipped = active & ~bad & jnp.any(clipped != safe, axis=1)
    applied = jnp.where((active & ~bad)[:, None], clipped, 0.0)
    ctrl = car.controls(params.config, applied, qvel)
    return ctrl, bad, state._replace(clipped=state.clipped + was_clipped.astype(jnp.int32))


def _identity(params: EnvParams, root: jax.Array, world: jax.Array, episode: jax.Array):
    """(episode seed, controller seed, drawn pool row) of each world's episode."""
    episode_seed = seeds.seed_word(root, seeds.EPISODE_DOMAIN, world, episode)
    controller_seed = seeds.seed_word(root, seeds.CONTROLLER_DOMAIN, world, episode)
    row = seeds.pool_row(seeds.seed_word(root, seeds.TRACK_DOMAIN, world, episode), params.pool_size)
    return episode_seed, controller_seed, row


def _observe(tracks: TrackArrays, row, qpos, qvel, progress) -> dict[str, jax.Array]:
    obs = car.planar_state(qpos, qvel)
    obs["track_progress"] = progress
    obs["centerline"] = tracks.centerline[row]
    obs["left_boundary"] = tracks.left_boundary[row]
    obs["right_boundary"] = tracks.right_boundary[row]
    obs["track_mask"] = tracks.track_mask[row]
    obs["track_length"] = tracks.track_length[row]
    return obs


def _start_qpos(params: EnvParams, row: jax.Array) -> jax.Array:
    start = params.tracks.start[row]
    return car.start_qpos(params.config, start[:, 0], start[:, 1], start[:, 2])


def _info(state: EnvState, tracks: TrackArrays, reason, lap_time) -> dict[str, jax.Array]:
    return {
        "episode_seed": state.episode_seed,
        "controller_seed": state.controller_seed,
        "track_id": tracks.track_id[state.race.row],
        "termination_reason": reason,
        "lap_completed": reason == TerminationReason.SUCCESS,
        "lap_time_s": lap_time,
    }


def initial(params: EnvParams, root: jax.Array, world: jax.Array, episode: jax.Array, rows: jax.Array,
            explicit: jax.Array):
    """The Challenge's reset of every world.

    Args:
        root: uint32 [], the root seed. world: uint32 [E], world indices.
        episode: uint32 [E], the new episode counters. rows: int32 [E], the
        pool rows used where ``explicit`` (bool []) is set, instead of the
        domain-2 choice.

    Returns:
        (state, obs, info without ``benchmark_version``, the start qpos
        [E, NQ] the physics restarts at).
    """
    episode_seed, controller_seed, drawn = _identity(params, root, world, episode)
    row = jnp.where(explicit, rows, drawn)
    e = world.shape[0]
    state = EnvState(
        race=race_reset(row),
        root_seed=root,
        world=world,
        episode=episode,
        episode_seed=episode_seed,
        controller_seed=controller_seed,
        steps=jnp.zeros(e, jnp.int32),
        pending=jnp.zeros(e, bool),
        clipped=jnp.zeros(e, jnp.int32),
    )
    qpos = _start_qpos(params, row)
    obs = _observe(params.tracks, row, qpos, jnp.zeros((e, car.NV), jnp.float32), jnp.zeros(e, jnp.float32))
    info = _info(state, params.tracks, jnp.zeros(e, jnp.int32), jnp.zeros(e, jnp.float32))
    return state, obs, info, qpos


def finish(params: EnvParams, state: EnvState, qpos: jax.Array, qvel: jax.Array, bad: jax.Array):
    """Race Core, termination and NEXT_STEP reset after the physics step.

    Args:
        qpos: [E, NQ] and qvel: [E, NV], the physics state after the step.
        bad: bool [E], `begin`'s invalid-action mask.

    Returns:
        (state, obs, reward, terminated, truncated, info without
        ``benchmark_version``, the reset mask [E], the reset qpos [E, NQ]:
        the physics restarts the masked worlds there).
    """
    tracks, config = params.tracks, params.config
    qpos = qpos.astype(jnp.float32)
    qvel = qvel.astype(jnp.float32)
    kin = car.planar_state(qpos, qvel)
    wheels = car.wheel_points(config, kin["position"], kin["yaw"])
    length = tracks.lap_m[state.race.row]
    before = jnp.minimum(state.race.progress_m, length)
    race, progress, off_track, lap_done = race_update(tracks, state.race, kin["position"], wheels)
    steps = state.steps + 1
    reason = jnp.select(
        [bad, off_track, lap_done, steps >= params.level.max_episode_steps],
        [
            TerminationReason.INVALID_ACTION,
            TerminationReason.OFF_TRACK,
            TerminationReason.SUCCESS,
            TerminationReason.TIMEOUT,
        ],
        TerminationReason.NONE,
    ).astype(jnp.int32)
    reward = (jnp.minimum(race.progress_m, length) - before) / length
    lap_time = jnp.where(reason == TerminationReason.SUCCESS, steps * config.control_dt_s, 0.0)

    # NEXT_STEP: worlds whose previous call was terminal start over now.
    reset_mask = state.pending
    episode = state.episode + reset_mask.astype(jnp.uint32)
    episode_seed, controller_seed, drawn = _identity(params, state.root_seed, state.world, episode)
    row = jnp.where(reset_mask, drawn, race.row)
    race = _where(reset_mask, race_reset(row), race)
    start = _start_qpos(params, row)
    qpos = jnp.where(reset_mask[:, None], start, qpos)
    qvel = jnp.where(reset_mask[:, None], 0.0, qvel)
    progress = jnp.where(reset_mask, 0.0, progress)
    reward = jnp.where(reset_mask, 0.0, reward).astype(jnp.float32)
    reason = jnp.where(reset_mask, TerminationReason.NONE, reason)
    lap_time = jnp.where(reset_mask, 0.0, lap_time).astype(jnp.float32)
    terminated = (reason == TerminationReason.SUCCESS) | (reason == TerminationReason.OFF_TRACK)
    terminated = terminated | (reason == TerminationReason.INVALID_ACTION)
    truncated = reason == TerminationReason.TIMEOUT
    state = state._replace(
        race=race,
        episode=episode,
        episode_seed=jnp.where(reset_mask, episode_seed, state.episode_seed),
        controller_seed=jnp.where(reset_mask, controller_seed, state.controller_seed),
        steps=jnp.where(reset_mask, 0, steps),
        pending=terminated | truncated,
    )
    obs = _observe(tracks, row, qpos, qvel, progress)
    info = _info(state, tracks, reason, lap_time)
    return state, obs, reward, terminated, truncated, info, reset_mask, start


def reset(params: EnvParams, physics, data, root: jax.Array, world: jax.Array, episode: jax.Array,
          rows: jax.Array, explicit: jax.Array):
    """Reset every world, physics included (`initial`, then every car at
    rest at its start).

    Args:
        physics: a physics whose ``reset`` traces under jit (``MjxWarpPhysics``).
        data: its state (any contents: every world restarts).
        root, world, episode, rows, explicit: as `initial`.

    Returns:
        (state, physics state, obs, info without ``benchmark_version``).
    """
    state, obs, info, qpos = initial(params, root, world, episode, rows, explicit)
    data = physics.reset(data, jnp.ones(world.shape, bool), qpos)
    return state, data, obs, info


def step(params: EnvParams, physics, state: EnvState, data, action: jax.Array, invalid: jax.Array | None = None):
    """One control step of every world (`begin`, the physics, `finish`, the
    physics' NEXT_STEP reset).

    Args:
        physics: a physics whose ``step`` and ``reset`` trace under jit (``MjxWarpPhysics``).
        data: its state. action: float32 [E, 2] in env units.
        invalid: bool [E], actions to treat as invalid (None: none).

    Returns:
        (state, physics state, obs, reward float32 [E], terminated bool [E],
        truncated bool [E], info without ``benchmark_version``).
    """
    if invalid is None:
        invalid = jnp.zeros(action.shape[0], bool)
    qvel = physics.kinematics(data)[1]
    ctrl, bad, state = begin(params, state, qvel, action, invalid)
    data = physics.step(data, ctrl)
    qpos, qvel = physics.kinematics(data)
    state, obs, reward, terminated, truncated, info, reset_mask, start = finish(params, state, qpos, qvel, bad)
    data = physics.reset(data, reset_mask, start)
    return state, data, obs, reward, terminated, truncated, info
