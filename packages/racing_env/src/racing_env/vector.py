"""`VecCarRacingEnv`: the Challenge's vector env, the Gymnasium face of
`racing_env.core`.

It holds every world's vehicle, Race Core, seed, termination and NEXT_STEP
autoreset state as JAX arrays, checks arguments, converts host actions and
adds the ``benchmark_version`` string. With ``mjx_warp`` a step is
`racing_env.core.step`, jitted with the state donated, so no step moves
data between host and device. ``cpu_reference`` runs the same Challenge
functions (`core.begin`, `core.finish`) around MuJoCo's C library.
"""

from __future__ import annotations

import atexit
import weakref
from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import mujoco
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from racing_env import core
from racing_env.checks import integer_in, no_render_mode
from racing_env.config import Level, ProjectConfig
from racing_env.physics import BACKENDS, CpuReferencePhysics, MjxWarpPhysics, PhysicsState
from racing_env.race import MIN_POINTS, WINDOW, min_segment_length, track_arrays
from racing_env.spaces import action_space, observation_space
from racing_env.tracks import Track, TrackPool
from racing_env.types import INFO_FIELDS, EnvState, TrackArrays

__all__ = ["VecCarRacingEnv"]

_UINT32_END = 2**32
#: How far outside its track's bounding box (of both boundaries) a restored
#: car may stand, m: a run ends an episode where a wheel leaves the track,
#: so a car of a real snapshot is within a car's length of it.
SNAPSHOT_MARGIN_M = 50.0
#: How far above what a run reaches a restored car's speed may be, as a
#: factor: an episode starts at rest and accelerates at most at the car's
#: largest acceleration until the Level's timeout, so twice that speed
#: leaves room for whatever the wheels' contact adds.
SNAPSHOT_SPEED_FACTOR = 2.0


def _reset_physics_first(params: core.EnvParams, physics, data, *args):
    """`core.reset`, its physics state returned first: (data, state, obs, info)."""
    state, data, obs, info = core.reset(params, physics, data, *args)
    return data, state, obs, info


class _DeviceStepper:
    """``mjx_warp``: a whole step is `core.step`, one jitted call with the
    Challenge and physics states donated; the physics state stays here."""

    def __init__(self, config: ProjectConfig, num_envs: int) -> None:
        self.physics = MjxWarpPhysics(config, num_envs)
        self.data = self.physics.initial()
        # Explicit output shardings make JAX alias each donated input to
        # the output of the same place in the tree (left to XLA, buffers
        # of one shape swap places from call to call): the state and
        # data are updated in place, step after step. JAX gives each
        # output, in order, the first donated input of its shape and type:
        # the reset returns the physics state first, so that no Challenge
        # output of a physics field's shape takes that field's buffer.
        self.home = self.data.qpos.sharding
        self._reset = jax.jit(_reset_physics_first, static_argnums=(1,), donate_argnums=(2,),
                              out_shardings=self.home, keep_unused=True)
        self._step = jax.jit(core.step, static_argnums=(1,), donate_argnums=(2, 3), out_shardings=self.home,
                             keep_unused=True)
        _LIVE_DEVICE_STEPPERS.add(self)

    @staticmethod
    def device_bytes_per_world(config: ProjectConfig) -> int:
        return MjxWarpPhysics.bytes_per_world(config)

    def reset(self, params: core.EnvParams, *args):
        self.data, state, obs, info = self._reset(params, self.physics, self.data, *args)
        return state, obs, info

    def step(self, params: core.EnvParams, state: EnvState, action: jax.Array, invalid: jax.Array):
        state, self.data, *out = self._step(params, self.physics, state, self.data, action, invalid)
        return state, *out

    def fields(self) -> dict[str, jax.Array]:
        return self.data._asdict()

    def restore(self, fields: dict[str, Any]) -> None:
        # Copies of the caller's arrays: JAX on a CPU may keep a host array as the device buffer itself.
        self.data = PhysicsState(**{k: jax.device_put(np.array(fields[k]), self.home) for k in PhysicsState._fields})

    @staticmethod
    def by_world(fields: dict[str, Any]) -> dict[str, np.ndarray]:
        """A snapshot's physics fields as [E, -1] rows, one a world."""
        return {k: np.asarray(fields[k]).reshape(len(fields[k]), -1) for k in PhysicsState._fields}

    @staticmethod
    def positions(fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """("qpos", float [E, 3]): the field holding each car's (x, y, z) in
        a snapshot's physics fields, and those, m (the free joint's first
        coordinates)."""
        return "qpos", np.asarray(fields["qpos"])[:, :3]

    def velocities(self, fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """("qvel", float [E, 3]): the field holding each car's body velocity
        in a snapshot's physics fields, and those, m/s (the free joint's
        first velocities: the world frame's)."""
        return "qvel", np.asarray(fields["qvel"])[:, :3]

    def core_data(self) -> PhysicsState:
        return self.data


class _HostStepper:
    """``cpu_reference``: MuJoCo's C library integrates on the host between
    `core.begin` and `core.finish` (each jitted); the state crosses twice
    a step, by design."""

    def __init__(self, config: ProjectConfig, num_envs: int) -> None:
        self.physics = CpuReferencePhysics(config, num_envs)
        self.home = jax.devices()[0]
        self._initial = jax.jit(core.initial)
        self._begin = jax.jit(core.begin)
        self._finish = jax.jit(core.finish)

    @staticmethod
    def device_bytes_per_world(config: ProjectConfig) -> None:
        return None

    def reset(self, params: core.EnvParams, *args):
        state, obs, info, qpos = self._initial(params, *args)
        self.physics.reset(np.ones(1, bool), np.asarray(qpos, np.float64))
        return state, obs, info

    def step(self, params: core.EnvParams, state: EnvState, action: jax.Array, invalid: jax.Array):
        _, qvel = self.physics.kinematics()
        ctrl, bad, state = self._begin(params, state, jnp.asarray(qvel, jnp.float32), action, invalid)
        self.physics.step(np.asarray(ctrl, np.float64))
        qpos, qvel = self.physics.kinematics()
        state, obs, reward, terminated, truncated, info, reset, start = self._finish(
            params, state, jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32), bad)
        self.physics.reset(np.asarray(reset), np.asarray(start, np.float64))
        return state, obs, reward, terminated, truncated, info

    def fields(self) -> dict[str, np.ndarray]:
        return {"mujoco_state": self.physics.integration_state()}

    def restore(self, fields: dict[str, Any]) -> None:
        self.physics.set_integration_state(fields["mujoco_state"])

    @staticmethod
    def by_world(fields: dict[str, Any]) -> dict[str, np.ndarray]:
        """A snapshot's physics fields as [1, -1] rows (the one world)."""
        return {"mujoco_state": np.asarray(fields["mujoco_state"]).reshape(1, -1)}

    @staticmethod
    def positions(fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """("mujoco_state", float [1, 3]): the field holding the car's (x, y,
        z) in a snapshot's physics fields, and those, m
        (``mjSTATE_INTEGRATION`` starts with the time, then qpos, whose free
        joint comes first)."""
        return "mujoco_state", np.asarray(fields["mujoco_state"])[None, 1:4]

    def velocities(self, fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """("mujoco_state", float [1, 3]): the field holding the car's body
        velocity in a snapshot's physics fields, and that, m/s (after the
        time and qpos comes qvel, whose free joint comes first)."""
        start = 1 + self.physics.mj_model.nq
        return "mujoco_state", np.asarray(fields["mujoco_state"])[None, start:start + 3]

    def core_data(self) -> None:
        raise ValueError("core_state needs the mjx_warp backend: cpu_reference integrates in MuJoCo C, on the host")


#: How each backend steps: the env's only dispatch on it.
_STEPPERS = {"mjx_warp": _DeviceStepper, "cpu_reference": _HostStepper}


def _track_boxes(tracks: TrackArrays) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) float32 [P, 2]: each pool row's bounding box of both
    boundaries' valid points, m."""
    valid = jnp.tile(tracks.track_mask.astype(bool), (1, 2))[..., None]
    points = jnp.concatenate([tracks.left_boundary, tracks.right_boundary], axis=1)
    low = jnp.min(jnp.where(valid, points, jnp.inf), axis=1)
    high = jnp.max(jnp.where(valid, points, -jnp.inf), axis=1)
    return np.asarray(low), np.asarray(high)


def _missing(**given: Any) -> list[str]:
    return [name for name, value in given.items() if value is None]


class VecCarRacingEnv(gymnasium.vector.VectorEnv):
    """`num_envs` worlds of the Challenge with strict NEXT_STEP autoreset.

    Args:
        num_envs: number of worlds (1 for ``cpu_reference``).
        config: the car and clock (required).
        level: the Level (required).
        backend: ``"mjx_warp"`` or ``"cpu_reference"`` (required).
        track: one fixed Track for every world, or
        track_pool: a TrackPool of this Level (exactly one of the two).
        render_mode: None only (``gymnasium.make_vec(..., render_mode=)``):
            the env renders nothing itself; any other value is a ValueError.
        first_world: the world index of world 0 in the seed words: the
            worlds are ``first_world .. first_world + num_envs - 1``
            (default 0). Processes that each drive a share of one batch
            take consecutive ranges, so that together they drive exactly
            the worlds of one env of all of them.

    `reset` and `step` return JAX arrays (observation fields with a leading
    ``num_envs`` axis; reward float32 [E]; terminated, truncated bool [E])
    and the seven-field info of `racing_env.types.INFO_FIELDS`.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(
        self,
        num_envs: int,
        *,
        config: ProjectConfig | None = None,
        level: Level | None = None,
        backend: str | None = None,
        track: Track | None = None,
        track_pool: TrackPool | None = None,
        render_mode: str | None = None,
        first_world: int = 0,
    ) -> None:
        no_render_mode(render_mode, "VecCarRacingEnv")
        self.render_mode = None
        missing = _missing(config=config, level=level, backend=backend)
        if track is None and track_pool is None:
            missing.append("track or track_pool")
        if missing:
            raise TypeError(f"VecCarRacingEnv needs explicit {', '.join(missing)}")
        integer_in(num_envs, "num_envs", 1)
        if not isinstance(config, ProjectConfig):
            raise TypeError(f"config must be a ProjectConfig, got {type(config).__name__}")
        if not isinstance(level, Level):
            raise TypeError(f"level must be a Level, got {type(level).__name__}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if track is not None and track_pool is not None:
            raise ValueError("give exactly one track source: track or track_pool, not both")
        if track is not None:
            if not isinstance(track, Track):
                raise TypeError(f"track must be a Track, got {type(track).__name__}")
            track_pool = TrackPool.from_tracks([track], level_id=level.level_id, split="fixed")
        elif not isinstance(track_pool, TrackPool):
            raise TypeError(f"track_pool must be a TrackPool, got {type(track_pool).__name__}")
        if track_pool.level_id != level.level_id:
            raise ValueError(
                f"track_pool belongs to level {track_pool.level_id}, not to level {level.level_id}"
            )
        num_envs = int(num_envs)
        stepper_type = _STEPPERS[backend]
        _check_footprint(num_envs, config, stepper_type.device_bytes_per_world(config))
        first_world = integer_in(first_world, "first_world", 0, _UINT32_END - num_envs + 1,
                                 f"2**32 - num_envs + 1 = {_UINT32_END - num_envs + 1}")
        tracks = jax.jit(track_arrays)(
            track_pool.centerline,
            track_pool.left_boundary,
            track_pool.right_boundary,
            track_pool.track_mask,
            track_pool.track_length,
            track_pool.track_id,
        )
        _check_geometry(tracks, config)
        self.num_envs = num_envs
        self.config = config
        self.level = level
        self.backend = backend
        self.track_pool = track_pool
        self.benchmark_version = track_pool.benchmark_version
        self.single_action_space = action_space(config)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.single_observation_space = observation_space()
        self.observation_space = batch_space(self.single_observation_space, num_envs)

        self.first_world = first_world
        self._world = jnp.arange(num_envs, dtype=jnp.uint32) + jnp.uint32(first_world)
        self._no_invalid = jnp.zeros(num_envs, bool)
        self._state: EnvState | None = None
        self._stepper = stepper_type(config, num_envs)
        # The env's tracks live where its state does, wherever the pool lives
        # (a pool built on the CPU drives GPU worlds).
        self._params = core.EnvParams(config=config, level=level, tracks=jax.device_put(tracks, self._stepper.home))

    # -- the public API --------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Reset every world.

        Args:
            seed: the root seed, an int in [0, 2**32): episode counters
                restart at 0. ``None`` continues: the root stays (a random
                one on the first reset) and every world's counter advances.
            options: ``{"track_indices": [E ints]}`` picks each world's
                TrackPool row instead of the domain-2 choice.

        Returns:
            (obs, info).
        """
        rows, explicit = self._track_indices(options)
        if seed is not None:
            root = integer_in(seed, "seed", 0, _UINT32_END, "2**32")
            episode = np.zeros(self.num_envs, np.uint32)
        elif self._state is not None:
            root = int(self._state.root_seed)
            episode = np.asarray(self._state.episode) + np.uint32(1)
        else:
            root = int(np.random.SeedSequence().generate_state(1, np.uint32)[0])
            episode = np.zeros(self.num_envs, np.uint32)
        self._np_random_seed = root
        args = (
            jnp.asarray(root, jnp.uint32),
            self._world,
            jnp.asarray(episode, jnp.uint32),
            jnp.asarray(rows, jnp.int32),
            jnp.asarray(explicit),
        )
        self._state, obs, info = self._stepper.reset(self._params, *args)
        return obs, self._public_info(info)

    def step(self, actions):
        """Advance every world one control step.

        Args:
            actions: float32 [E, 2] (a JAX array stays on its device). A
                wrong overall shape or a failed conversion makes every
                active world's action invalid; a row that is NaN, infinite,
                of the wrong length or not numeric makes that world's.

        Returns:
            (obs, reward, terminated, truncated, info).
        """
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        action, invalid = self._convert(actions)
        self._state, obs, reward, terminated, truncated, info = self._stepper.step(
            self._params, self._state, action, invalid)
        return obs, reward, terminated, truncated, self._public_info(info)

    def snapshot(self) -> dict[str, np.ndarray]:
        """Everything the env's next call depends on, as host NumPy copies
        (for a checkpoint): every world's Challenge state and its physics
        integration state. `restore` puts it back; the env then continues
        exactly as this one would have.

        Raises:
            RuntimeError: before the first reset.
        """
        if self._state is None:
            raise RuntimeError("call reset() before snapshot()")
        return {key: np.array(value) for key, value in self._snapshot_fields().items()}

    def _snapshot_fields(self) -> dict[str, Any]:
        """The arrays a snapshot holds, by name, uncopied: the Challenge
        state's leaves in tree order, then the physics state."""
        leaves = jax.tree_util.tree_flatten_with_path(self._state)[0]
        out = {f"state{jax.tree_util.keystr(path)}": leaf for path, leaf in leaves}
        return {**out, **{f"physics.{k}": v for k, v in self._stepper.fields().items()}}

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from a `snapshot` of an env of the same backend, worlds,
        config and pool (the pool's size is checked; its contents are the
        caller's to match), after `check_snapshot`. The env keeps copies:
        the caller may change or reuse the arrays afterwards.

        Raises:
            As `check_snapshot`; nothing is changed then.
        """
        self.check_snapshot(snapshot)
        mine = self._snapshot_fields()
        treedef = jax.tree_util.tree_structure(self._state)
        sharding = jax.tree.leaves(self._state)[0].sharding
        state_keys = [key for key in mine if key.startswith("state")]  # in tree order
        # Copies of the caller's arrays: JAX on a CPU may keep a host array as the device buffer itself.
        self._state = jax.tree_util.tree_unflatten(
            treedef, [jax.device_put(np.array(snapshot[k]), sharding) for k in state_keys])
        self._stepper.restore({k[len("physics."):]: v for k, v in snapshot.items() if k.startswith("physics.")})
        self._np_random_seed = int(snapshot["state.root_seed"])

    def check_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Whether `restore` would take ``snapshot``, changing nothing (a
        caller that must agree with others before anything changes, as the
        processes of one training run do, checks first).

        Raises:
            RuntimeError: before the first reset (its arrays give the layout).
            TypeError: ``snapshot`` is not a dict.
            ValueError: a missing, extra or differently shaped or typed
                field, or a value no run of this env reaches (`_check_values`),
                named.
        """
        if self._state is None:
            raise RuntimeError("call reset() before restore()")
        if not isinstance(snapshot, dict):
            raise TypeError(f"snapshot must be a dict, got {type(snapshot).__name__}")
        mine = self._snapshot_fields()  # the layout, read from the live arrays without copying them
        if set(snapshot) != set(mine):
            raise ValueError(f"snapshot fields differ: missing {sorted(set(mine) - set(snapshot))}, "
                             f"unexpected {sorted(set(snapshot) - set(mine))}")
        for key, want in mine.items():
            got = np.asarray(snapshot[key])
            if got.shape != tuple(want.shape) or got.dtype != want.dtype:
                raise ValueError(f"snapshot[{key!r}] is {got.dtype}{list(got.shape)}, expected "
                                 f"{want.dtype}{list(want.shape)}")
        rows = np.asarray(snapshot["state.race.row"])
        if rows.size and not (0 <= rows.min() and rows.max() < len(self.track_pool)):
            raise ValueError(f"snapshot's track rows are outside this env's {len(self.track_pool)} pool rows")
        self._check_values(snapshot, rows)

    def _check_values(self, snapshot: dict[str, Any], rows: np.ndarray) -> None:
        """Refuse a snapshot (of the right layout, its rows in the pool)
        holding values that no run of this env reaches, by field and world:
        a crafted or miswritten file would otherwise be stepped from as
        state (a lap faked by a progress past the finish, episodes longer
        than the Level's timeout, a car kilometres off its track).

        Args:
            snapshot: the snapshot `restore` was given.
            rows: int32 [E], its worlds' pool rows (already in the pool).

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
        tracks = self._params.tracks
        n = np.asarray(tracks.num_points)[rows]
        lap = np.asarray(tracks.lap_m)[rows]
        value = {key: np.asarray(snapshot[key]) for key in
                 ("state.world", "state.race.local_segment", "state.race.progress_segment",
                  "state.race.progress_m", "state.steps", "state.clipped")}
        segment, passed, progress = (value[f"state.race.{k}"] for k in ("local_segment", "progress_segment",
                                                                          "progress_m"))
        steps, limit = value["state.steps"], self.level.max_episode_steps
        physics = {k[len("physics."):]: v for k, v in snapshot.items() if k.startswith("physics.")}
        low, high = _track_boxes(tracks)
        ground = np.zeros((len(rows), 1), low.dtype)  # the track lies at z = 0
        low, high = np.concatenate([low[rows], ground], axis=1), np.concatenate([high[rows], ground], axis=1)
        where, xyz = self._stepper.positions(physics)
        moving, velocity = self._stepper.velocities(physics)
        with np.errstate(over="ignore", invalid="ignore"):  # a speed past float64 is inf: refused below
            speed = np.linalg.norm(velocity.astype(np.float64), axis=1)
        top = SNAPSHOT_SPEED_FACTOR * self.config.max_acceleration_mps2 * limit * self.config.control_dt_s
        # (field, ok bool [E], what it must be, what a world holds instead: [E] values or words)
        checks = [
            ("state.world", value["state.world"] == np.asarray(self._state.world), "this env's world indices",
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
              for name, per_world in self._stepper.by_world(physics).items()),
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
                raise ValueError(f"snapshot[{name!r}] must be {want}; world {self.first_world + i} (entry {i}, "
                                 f"pool row {rows[i]} of {n[i]} segments) holds "
                                 f"{held if isinstance(held, str) else held[i]}")

    @property
    def params(self) -> core.EnvParams:
        """The car, the Level and the pool's arrays, as `racing_env.core` takes them."""
        return self._params

    @property
    def physics(self) -> MjxWarpPhysics | CpuReferencePhysics:
        """The physics backend (``mjx_warp``: the one `racing_env.core` steps)."""
        return self._stepper.physics

    def core_state(self) -> tuple[EnvState, PhysicsState]:
        """(the Challenge state, the physics state) that the next `step`
        continues from, for `racing_env.core.step`: a JAX program can scan
        the env from here (``mjx_warp`` only).

        The arrays are the env's own: its next `step` or `reset` consumes
        them (they are donated), so copy them to keep them
        (``jax.tree.map(jnp.copy, env.core_state())``).

        Raises:
            RuntimeError: before the first reset.
            ValueError: a ``cpu_reference`` env (its physics state is MuJoCo
                C's, on the host).
        """
        data = self._stepper.core_data()
        if self._state is None:
            raise RuntimeError("call reset() before core_state()")
        return self._state, data

    @property
    def clipped_action_count(self) -> jax.Array:
        """int32 [E]: finite out-of-range actions clipped in each world since
        the last seeded reset."""
        if self._state is None:
            raise RuntimeError("call reset() first")
        return self._state.clipped

    # -- helpers ---------------------------------------------------------------

    def _public_info(self, info: dict[str, jax.Array]) -> dict[str, Any]:
        """The seven whitelisted fields in their order; the string is added here
        because a jitted function cannot return one."""
        return {key: self.benchmark_version if key == "benchmark_version" else info[key] for key in INFO_FIELDS}

    def _track_indices(self, options: dict | None) -> tuple[np.ndarray, bool]:
        value = reset_option(options, "track_indices")
        if value is None:
            return np.zeros(self.num_envs, np.int32), False
        return _indices(value, self.num_envs, len(self.track_pool)), True

    def _convert(self, actions) -> tuple[jax.Array, jax.Array]:
        e = self.num_envs
        if isinstance(actions, jax.Array) and jnp.issubdtype(actions.dtype, jnp.number) and not jnp.issubdtype(
            actions.dtype, jnp.complexfloating
        ):
            if actions.shape != (e, 2):
                return jnp.zeros((e, 2), jnp.float32), ~self._no_invalid
            if jnp.issubdtype(actions.dtype, jnp.floating) and actions.dtype.itemsize > 4:
                # As on the host path: finite but beyond float32 is clipped, not infinite.
                actions = jnp.where(jnp.isfinite(actions), jnp.clip(actions, -_FLOAT32_MAX, _FLOAT32_MAX), actions)
            return actions.astype(jnp.float32), self._no_invalid
        action, invalid = _host_actions(actions, e)
        return jnp.asarray(action), jnp.asarray(invalid)


def _check_geometry(tracks: TrackArrays, config: ProjectConfig) -> None:
    """Refuse pools the Race Core cannot follow (one host read of a few
    scalars, at construction)."""
    seg = jnp.diff(jnp.concatenate([tracks.arc, tracks.lap_m[:, None]], axis=1), axis=1)
    valid = jnp.arange(tracks.arc.shape[1])[None, :] < tracks.num_points[:, None]
    shortest, fewest, mismatch = jax.device_get(
        (
            jnp.min(jnp.where(valid, seg, jnp.inf)),
            jnp.min(tracks.num_points),
            jnp.max(jnp.abs(tracks.track_length - tracks.lap_m) / tracks.lap_m),
        )
    )
    if fewest < MIN_POINTS:
        raise ValueError(f"track_pool has a track of {int(fewest)} points; the Race Core needs >= {MIN_POINTS}")
    if shortest < min_segment_length(config):
        raise ValueError(
            f"track_pool has a centerline segment of {float(shortest):.3f} m; the Race Core needs every "
            f"segment >= {min_segment_length(config):.3f} m for this car"
        )
    if mismatch > 1e-3:
        raise ValueError(
            f"track_pool has a track_length {float(mismatch):.2%} away from its centerline's perimeter; "
            "track_length must be the closed centerline's length"
        )


def _check_footprint(num_envs: int, config: ProjectConfig, device_bytes_per_world: int | None) -> None:
    """Refuse, before anything is allocated, a batch whose per-world buffers
    cannot fit: the batched observation space's bounds (two observations a
    world) in host memory, and one observation plus the physics data a
    world on the device (``device_bytes_per_world``: the physics data's;
    None: the physics is on the host). A necessary condition, not a promise
    that a batch which passes it fits beside everything else."""
    import os

    import warp as wp

    obs = sum(int(np.prod(space.shape)) * np.dtype(space.dtype).itemsize
              for space in observation_space().spaces.values())
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = {"host memory": (2 * obs * num_envs, host)}
    if device_bytes_per_world is not None:
        device = wp.get_device("cuda:0").total_memory if jax.default_backend() == "gpu" else host
        need["device memory"] = ((obs + device_bytes_per_world) * num_envs, device)
    for where, (needed, available) in need.items():
        if needed > available:
            raise ValueError(f"num_envs={num_envs} needs at least {needed / 2**30:.1f} GiB of {where} "
                             f"for its per-world buffers; this machine has {available / 2**30:.1f} GiB")


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


_FLOAT32_MAX = float(np.finfo(np.float32).max)


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


#: The live mjx_warp steppers. With several host devices JAX runs a CPU call
#: on a worker thread, and the Warp physics inside a step is a Python
#: callback: a step still running when the interpreter finalizes waits for
#: it forever. So at exit every env first waits for its last call.
_LIVE_DEVICE_STEPPERS: weakref.WeakSet[_DeviceStepper] = weakref.WeakSet()


@atexit.register
def _finish_last_calls() -> None:
    for stepper in list(_LIVE_DEVICE_STEPPERS):
        try:
            jax.block_until_ready(stepper.data)
        except Exception:  # a failed call's donated or failed buffers: nothing left to wait for
            pass
