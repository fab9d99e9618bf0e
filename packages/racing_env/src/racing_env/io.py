"""Every crossing between the host and the vector env's device state, as
MuJoCo Warp's ``io.py`` holds its:

- actions in: `convert_actions` (a numeric JAX array stays on its device;
  anything else is converted on the host and copied once);
- reset options in: `reset_option`, `track_indices`;
- snapshots out and back in: `snapshot`, `check_snapshot` (the layout,
  then every value a run of the env reaches, bounded by
  `SNAPSHOT_MARGIN_M` and `SNAPSHOT_SPEED_FACTOR`), `restored_state` and
  `physics_fields`.

`racing_env.vector.VecCarRacingEnv` calls these; nothing else in the env
moves data between host and device after its construction.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from racing_env import core
from racing_env.backends import Backend
from racing_env.checks import integer_in
from racing_env.race import WINDOW
from racing_env.types import EnvState, TrackArrays

__all__ = ["SNAPSHOT_MARGIN_M", "SNAPSHOT_SPEED_FACTOR", "check_snapshot", "convert_actions", "physics_fields",
           "reset_option", "restored_state", "snapshot", "snapshot_fields", "track_indices"]

#: How far outside its track's bounding box (of both boundaries) a restored
#: car may stand, m: a run ends an episode where a wheel leaves the track,
#: so a car of a real snapshot is within a car's length of it.
SNAPSHOT_MARGIN_M = 50.0
#: How far above what a run reaches a restored car's speed may be, as a
#: factor: an episode starts at rest and accelerates at most at the car's
#: largest acceleration until the Level's timeout, so twice that speed
#: leaves room for whatever the wheels' contact adds.
SNAPSHOT_SPEED_FACTOR = 2.0
_FLOAT32_MAX = float(np.finfo(np.float32).max)


# -- actions -------------------------------------------------------------------


def convert_actions(actions: object, no_invalid: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(float32 [E, 2], bool [E] invalid): a step's actions on the device.

    Args:
        actions: a numeric JAX array stays on its device (of another shape
            than [E, 2], every world's action is invalid; wider floats are
            clipped to float32's range, as on the host); anything else is
            converted on the host (`_host_actions`) and copied once.
        no_invalid: bool [E], all False, on the env's device: the mask of a
            JAX array of the right shape (E is its length).
    """
    e = no_invalid.shape[0]
    if isinstance(actions, jax.Array) and jnp.issubdtype(actions.dtype, jnp.number) and not jnp.issubdtype(
        actions.dtype, jnp.complexfloating
    ):
        if actions.shape != (e, 2):
            return jnp.zeros((e, 2), jnp.float32), ~no_invalid
        if jnp.issubdtype(actions.dtype, jnp.floating) and actions.dtype.itemsize > 4:
            # As on the host path: finite but beyond float32 is clipped, not infinite.
            actions = jnp.where(jnp.isfinite(actions), jnp.clip(actions, -_FLOAT32_MAX, _FLOAT32_MAX), actions)
        return actions.astype(jnp.float32), no_invalid
    action, invalid = _host_actions(actions, e)
    return jnp.asarray(action), jnp.asarray(invalid)


def _real_float32(value: object) -> np.ndarray | None:
    """`value` as a float32 array, or None when it is not real numbers
    (strings, complex numbers, objects that do not convert). Finite values
    beyond float32's range become its largest finite value, so they are
    clipped and counted like any finite out-of-range action, not turned
    into infinities."""
    try:
        array = np.asarray(value)
        if array.dtype.kind == "O":
            array = array.astype(np.float64)
    except (TypeError, ValueError, OverflowError):
        return None
    if array.dtype.kind not in "biuf":
        return None
    wide = array.astype(np.float64)
    with np.errstate(invalid="ignore"):
        wide = np.where(np.isfinite(wide), np.clip(wide, -_FLOAT32_MAX, _FLOAT32_MAX), wide)
    return wide.astype(np.float32)


def _host_actions(actions: object, num_envs: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 [E, 2] and the invalid mask [E] of a host action batch."""
    whole = _real_float32(actions)
    if whole is not None and whole.shape == (num_envs, 2):
        return whole, np.zeros(num_envs, bool)
    # A list of per-world rows: only the rows that are wrong are invalid.
    out = np.zeros((num_envs, 2), np.float32)
    invalid = np.ones(num_envs, bool)
    if isinstance(actions, (list, tuple)) and len(actions) == num_envs:
        for i, row in enumerate(actions):
            value = _real_float32(row)
            if value is not None and value.shape == (2,):
                out[i], invalid[i] = value, False
    return out, invalid


# -- reset options -------------------------------------------------------------


def reset_option(options: dict | None, key: str) -> object | None:
    """The value of the one reset option `key` (None when absent), after
    checking that `options` is None or a dict holding no other key."""
    if options is None:
        return None
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict or None, got {type(options).__name__}")
    unknown = set(options) - {key}
    if unknown:
        raise ValueError(f"options has unknown keys {sorted(unknown)}; the only option is {key!r}")
    return options.get(key)


def track_indices(options: dict | None, num_envs: int, pool_size: int) -> tuple[np.ndarray, bool]:
    """(int32 [E] pool rows, whether they were given): the vector env's
    ``options={"track_indices": [E ints]}``, checked (zeros when absent).

    Raises:
        TypeError, ValueError: as `reset_option`, or rows that are not one
            integer in [0, pool_size) per world, naming the entry.
    """
    value = reset_option(options, "track_indices")
    if value is None:
        return np.zeros(num_envs, np.int32), False
    return _indices(value, num_envs, pool_size), True


def _indices(value: object, num_envs: int, pool_size: int) -> np.ndarray:
    name = "options['track_indices']"
    if isinstance(value, jax.Array):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        if not np.issubdtype(value.dtype, np.integer):
            raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
        items = value.tolist()
        if value.ndim != 1:
            raise ValueError(f"{name} must be one integer per world ({num_envs}), got shape {value.shape}")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise TypeError(f"{name} must be a sequence of {num_envs} integers, got {type(value).__name__}")
    if len(items) != num_envs:
        raise ValueError(f"{name} must hold exactly one integer per world ({num_envs}), got {len(items)}")
    return np.asarray([integer_in(item, f"{name}[{i}]", 0, pool_size) for i, item in enumerate(items)], np.int32)


# -- snapshots -----------------------------------------------------------------


def _state_fields(state: EnvState) -> dict[str, jax.Array]:
    """The Challenge state's leaves by snapshot name (``state.*``), in tree order."""
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {f"state{jax.tree_util.keystr(path)}": leaf for path, leaf in leaves}


def snapshot_fields(state: EnvState, backend: Backend) -> dict[str, Any]:
    """The arrays a snapshot holds, by name, uncopied: the Challenge
    state's leaves in tree order, then the physics state (``physics.*``)."""
    return {**_state_fields(state), **{f"physics.{k}": v for k, v in backend.fields().items()}}


def snapshot(state: EnvState, backend: Backend) -> dict[str, np.ndarray]:
    """`snapshot_fields` as host NumPy copies."""
    return {key: np.array(value) for key, value in snapshot_fields(state, backend).items()}


def physics_fields(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A snapshot's ``physics.*`` fields, by the backend's names."""
    return {k[len("physics."):]: v for k, v in snapshot.items() if k.startswith("physics.")}


def restored_state(snapshot: dict[str, Any], state: EnvState) -> EnvState:
    """The Challenge state a checked `snapshot` holds, in `state`'s tree and
    on its device: copies, so the caller may change or reuse its arrays."""
    treedef = jax.tree_util.tree_structure(state)
    sharding = jax.tree.leaves(state)[0].sharding
    # Copies of the caller's arrays: JAX on a CPU may keep a host array as the device buffer itself.
    return jax.tree_util.tree_unflatten(
        treedef, [jax.device_put(np.array(snapshot[k]), sharding) for k in _state_fields(state)])


def check_snapshot(snapshot: object, *, state: EnvState, backend: Backend, params: core.EnvParams,
                   first_world: int, pool_size: int) -> None:
    """Refuse a `snapshot` that the env whose state, backend, params, first
    world and pool size these are cannot continue from, changing nothing.

    Raises:
        TypeError: ``snapshot`` is not a dict.
        ValueError: a missing, extra or differently shaped or typed
            field, rows outside the pool, or a value no run of this env
            reaches (`_check_values`), named.
    """
    if not isinstance(snapshot, dict):
        raise TypeError(f"snapshot must be a dict, got {type(snapshot).__name__}")
    mine = snapshot_fields(state, backend)  # the layout, read from the live arrays without copying them
    if set(snapshot) != set(mine):
        raise ValueError(f"snapshot fields differ: missing {sorted(set(mine) - set(snapshot))}, "
                         f"unexpected {sorted(set(snapshot) - set(mine))}")
    for key, want in mine.items():
        got = np.asarray(snapshot[key])
        if got.shape != tuple(want.shape) or got.dtype != want.dtype:
            raise ValueError(f"snapshot[{key!r}] is {got.dtype}{list(got.shape)}, expected "
                             f"{want.dtype}{list(want.shape)}")
    rows = np.asarray(snapshot["state.race.row"])
    if rows.size and not (0 <= rows.min() and rows.max() < pool_size):
        raise ValueError(f"snapshot's track rows are outside this env's {pool_size} pool rows")
    _check_values(snapshot, rows, state, backend, params, first_world)


def _check_values(snapshot: dict[str, Any], rows: np.ndarray, state: EnvState, backend: Backend,
                  params: core.EnvParams, first_world: int) -> None:
    """Refuse a snapshot (of the right layout, its rows in the pool)
    holding values that no run of this env reaches, by field and world:
    a crafted or miswritten file would otherwise be stepped from as
    state (a lap faked by a progress past the finish, episodes longer
    than the Level's timeout, a car kilometres off its track).

    Args:
        snapshot: the snapshot `check_snapshot` was given.
        rows: int32 [E], its worlds' pool rows (already in the pool).
        state, backend, params, first_world: the env's.

    Raises:
        ValueError: other world indices than this env's; a segment
            outside its row's loop (``progress_segment`` may pass the
            finish by up to `racing_env.race.WINDOW` segments); progress
            not finite or outside [0, 2 laps]; step counts outside [0,
            the Level's timeout]; negative clip counts; a physics
            value that is not finite or is beyond ``mujoco.mjMAXVAL``
            (1e10), where MuJoCo takes a state for diverged and resets
            it; a car more than `SNAPSHOT_MARGIN_M` outside
            its track's bounding box (the track at z = 0, so also above
            or below the ground), faster than `SNAPSHOT_SPEED_FACTOR`
            times the speed its largest acceleration gives over the
            Level's timeout.
    """
    tracks, config = params.tracks, params.config
    n = np.asarray(tracks.num_points)[rows]
    lap = np.asarray(tracks.lap_m)[rows]
    value = {key: np.asarray(snapshot[key]) for key in
             ("state.world", "state.race.local_segment", "state.race.progress_segment",
              "state.race.progress_m", "state.steps", "state.clipped")}
    segment, passed, progress = (value[f"state.race.{k}"] for k in ("local_segment", "progress_segment",
                                                                      "progress_m"))
    steps, limit = value["state.steps"], params.level.max_episode_steps
    physics = physics_fields(snapshot)
    low, high = _track_boxes(tracks)
    ground = np.zeros((len(rows), 1), low.dtype)  # the track lies at z = 0
    low, high = np.concatenate([low[rows], ground], axis=1), np.concatenate([high[rows], ground], axis=1)
    where, xyz = backend.positions(physics)
    moving, velocity = backend.velocities(physics)
    with np.errstate(over="ignore", invalid="ignore"):  # a speed past float64 is inf: refused below
        speed = np.linalg.norm(velocity.astype(np.float64), axis=1)
    top = SNAPSHOT_SPEED_FACTOR * config.max_acceleration_mps2 * limit * config.control_dt_s
    # (field, ok bool [E], what it must be, what a world holds instead: [E] values or words)
    checks = [
        ("state.world", value["state.world"] == np.asarray(state.world), "this env's world indices",
         value["state.world"]),
        ("state.race.local_segment", (segment >= 0) & (segment < n), "in [0, its row's segments)", segment),
        ("state.race.progress_segment", (passed >= 0) & (passed <= n + WINDOW),
         f"in [0, its row's segments + {WINDOW}]", passed),
        ("state.race.progress_m", np.isfinite(progress) & (progress >= 0) & (progress <= 2 * lap),
         "finite, in [0, twice its row's lap] m", progress),
        ("state.steps", (steps >= 0) & (steps <= limit), f"in [0, {limit}] (the Level's timeout)", steps),
        ("state.clipped", value["state.clipped"] >= 0, ">= 0", value["state.clipped"]),
        *((f"physics.{name}", (np.abs(per_world) <= mujoco.mjMAXVAL).all(axis=1),
           f"finite and at most {mujoco.mjMAXVAL:g} in size (past it MuJoCo takes a state for diverged)",
           f"a value that is not finite or is beyond {mujoco.mjMAXVAL:g}")
          for name, per_world in backend.by_world(physics).items()),
        (f"physics.{where}", np.all((xyz >= low - SNAPSHOT_MARGIN_M) & (xyz <= high + SNAPSHOT_MARGIN_M),
                                    axis=1),
         f"a car within {SNAPSHOT_MARGIN_M:g} m of its track's bounding box (at z = 0)",
         [f"a car at {tuple(point.tolist())} m" for point in xyz]),
        (f"physics.{moving}", speed <= top,
         f"a car at most {top:g} m/s fast ({SNAPSHOT_SPEED_FACTOR:g} x its largest acceleration over the "
         f"Level's timeout)", [f"a car at {v:g} m/s" for v in speed]),
    ]
    for name, ok, want, held in checks:
        if not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            raise ValueError(f"snapshot[{name!r}] must be {want}; world {first_world + i} (entry {i}, "
                             f"pool row {rows[i]} of {n[i]} segments) holds "
                             f"{held if isinstance(held, str) else held[i]}")


def _track_boxes(tracks: TrackArrays) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) float32 [P, 2]: each pool row's bounding box of both
    boundaries' valid points, m."""
    valid = jnp.tile(tracks.track_mask.astype(bool), (1, 2))[..., None]
    points = jnp.concatenate([tracks.left_boundary, tracks.right_boundary], axis=1)
    low = jnp.min(jnp.where(valid, points, jnp.inf), axis=1)
    high = jnp.max(jnp.where(valid, points, -jnp.inf), axis=1)
    return np.asarray(low), np.asarray(high)
