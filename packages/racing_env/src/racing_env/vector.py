"""`VecCarRacingEnv`: the Challenge's vector env, the Gymnasium face of
`racing_env.core`.

It holds every world's vehicle, Race Core, seed, termination and NEXT_STEP
autoreset state as JAX arrays, checks arguments and adds the
``benchmark_version`` string. Its backend (`racing_env.backends.BACKENDS`)
steps: with ``mjx_warp`` a step is `racing_env.core.step`, jitted with the
state donated, so no step moves data between host and device;
``cpu_reference`` runs the same Challenge functions (`core.begin`,
`core.finish`) around MuJoCo's C library. Every host crossing (actions,
reset options, snapshots) is `racing_env.io`'s.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from racing_env import core, io
from racing_env.backends import backend_type, check_footprint
from racing_env.checks import integer_in, no_render_mode
from racing_env.config import Level, ProjectConfig
from racing_env.moved import moved_names
from racing_env.physics import CpuReferencePhysics, MjxWarpPhysics, PhysicsState
from racing_env.race import MIN_POINTS, min_segment_length, track_arrays
from racing_env.spaces import action_space, observation_space
from racing_env.tracks import Track, TrackPool
from racing_env.types import INFO_FIELDS, EnvState, TrackArrays

__all__ = ["VecCarRacingEnv"]

#: Host crossings that moved to `racing_env.io`.
__getattr__ = moved_names(__name__, {name: f"racing_env.io.{name}" for name in
                                     ("SNAPSHOT_MARGIN_M", "SNAPSHOT_SPEED_FACTOR", "reset_option")})

_UINT32_END = 2**32


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
        backend_class = backend_type(backend)
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
        check_footprint(num_envs, config, backend_class.device_bytes_per_world(config))
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
        self._backend = backend_class(config, num_envs)
        # The env's tracks live where its state does, wherever the pool lives
        # (a pool built on the CPU drives GPU worlds).
        self._params = core.EnvParams(config=config, level=level, tracks=jax.device_put(tracks, self._backend.home))

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
        rows, explicit = io.track_indices(options, self.num_envs, len(self.track_pool))
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
        self._state, obs, info = self._backend.reset(self._params, *args)
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
        action, invalid = io.convert_actions(actions, self._no_invalid)
        self._state, obs, reward, terminated, truncated, info = self._backend.step(
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
        return io.snapshot(self._state, self._backend)

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Continue from a `snapshot` of an env of the same backend, worlds,
        config and pool (the pool's size is checked; its contents are the
        caller's to match), after `check_snapshot`. The env keeps copies:
        the caller may change or reuse the arrays afterwards.

        Raises:
            As `check_snapshot`; nothing is changed then.
        """
        self.check_snapshot(snapshot)
        self._state = io.restored_state(snapshot, self._state)
        self._backend.restore(io.physics_fields(snapshot))
        self._np_random_seed = int(snapshot["state.root_seed"])

    def check_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Whether `restore` would take ``snapshot``, changing nothing (a
        caller that must agree with others before anything changes, as the
        processes of one training run do, checks first).

        Raises:
            RuntimeError: before the first reset (its arrays give the layout).
            TypeError: ``snapshot`` is not a dict.
            ValueError: a missing, extra or differently shaped or typed
                field, or a value no run of this env reaches, named
                (`racing_env.io.check_snapshot`).
        """
        if self._state is None:
            raise RuntimeError("call reset() before restore()")
        io.check_snapshot(snapshot, state=self._state, backend=self._backend, params=self._params,
                          first_world=self.first_world, pool_size=len(self.track_pool))

    @property
    def params(self) -> core.EnvParams:
        """The car, the Level and the pool's arrays, as `racing_env.core` takes them."""
        return self._params

    @property
    def physics(self) -> MjxWarpPhysics | CpuReferencePhysics:
        """The physics backend (``mjx_warp``: the one `racing_env.core` steps)."""
        return self._backend.physics

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
        data = self._backend.core_data()
        if self._state is None:
            raise RuntimeError("call reset() before core_state()")
        return self._state, data

    def continue_from(self, state: EnvState, data: PhysicsState) -> None:
        """Continue from ``(state, data)``: what `racing_env.core.step`
        returned to a JAX program that stepped this env on from
        `core_state` (``mjx_warp`` only). The env's next `step`,
        `snapshot` or `core_state` starts there, as if the env had made
        those calls itself. The arrays become the env's own, uncopied (its
        next step donates them). Nothing is checked but their layout: the
        values are the caller's to have stepped from this env's state.

        Raises:
            RuntimeError: before the first reset.
            ValueError: a ``cpu_reference`` env, or arrays whose structure,
                shapes or dtypes differ from `core_state`'s (nothing is
                changed then).
        """
        if self._state is None:
            raise RuntimeError("call reset() before continue_from()")
        try:
            own = self._state, self._backend.core_data()
        except ValueError:
            raise ValueError("continue_from needs the mjx_warp backend: cpu_reference integrates in MuJoCo C, on "
                             "the host") from None
        for name, mine, theirs in (("state", own[0], state), ("data", own[1], data)):
            if jax.tree.structure(theirs) != jax.tree.structure(mine):
                raise ValueError(f"{name} must have core_state's structure {jax.tree.structure(mine)}, got "
                                 f"{jax.tree.structure(theirs)}")
            for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(mine)[0], jax.tree.leaves(theirs)):
                if not isinstance(b, jax.Array) or b.shape != a.shape or b.dtype != a.dtype:
                    shown = (f"{b.dtype}{list(b.shape)}" if isinstance(b, jax.Array) else type(b).__name__)
                    raise ValueError(f"{name}{jax.tree_util.keystr(path)} must be a JAX {a.dtype}{list(a.shape)} "
                                     f"array, got {shown}")
        self._backend.continue_core(data)
        self._state = state

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
