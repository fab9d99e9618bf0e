"""The physics backends as the vector env drives them: `BACKENDS`, the one
table from a backend's name to its class, and `Backend`, the interface every
class of it has.

A backend owns its physics (`racing_env.physics`) and the physics state,
and runs the Challenge functions of `racing_env.core` around them:

- `MjxWarpBackend` (``mjx_warp``): a whole step is `core.step`, one jitted
  call with the Challenge and physics states donated.
- `CpuReferenceBackend` (``cpu_reference``): MuJoCo's C library integrates
  on the host between `core.begin` and `core.finish`.

A new backend is its name in `racing_env.backend_names`, one physics class
in `racing_env.physics` and one class here, in `BACKENDS`.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from racing_env import core
from racing_env.backend_names import BACKEND_NAMES
from racing_env.config import ProjectConfig
from racing_env.physics import CpuReferencePhysics, MjxWarpPhysics, PhysicsState
from racing_env.spaces import observation_space
from racing_env.types import EnvState

__all__ = ["BACKENDS", "Backend", "CpuReferenceBackend", "MjxWarpBackend", "backend_type"]


class Backend(Protocol):
    """What the vector env asks of a backend: each class of `BACKENDS` has
    these attributes and exactly these method signatures (tested).

    Attributes:
        name: its key in `BACKENDS` (`racing_env.backend_names`).
        one_world: it runs exactly one world (its envs have ``num_envs=1``).
        uses_gpu: it steps on the GPU when the machine has one (``sim``
            builds its track there too).
        physics: its physics (``mjx_warp``'s is the one `racing_env.core` steps).
        home: where the env's arrays live (`jax.device_put`'s target: a
            sharding or a device).
    """

    name: ClassVar[str]
    one_world: ClassVar[bool]
    uses_gpu: ClassVar[bool]
    physics: MjxWarpPhysics | CpuReferencePhysics
    home: Any

    def __init__(self, config: ProjectConfig, num_envs: int) -> None:
        """Build the physics of `num_envs` cars of `config`."""

    @staticmethod
    def device_bytes_per_world(config: ProjectConfig) -> int | None:
        """Bytes of physics data one world holds on the device (None: the
        physics lives on the host), for the env's footprint check."""

    @staticmethod
    def preload() -> None:
        """Import ahead what building the backend imports, and nothing else
        (``evaluate`` does while a child process checks the plugin)."""

    def reset(self, params: core.EnvParams, root: jax.Array, world: jax.Array, episode: jax.Array,
              rows: jax.Array, explicit: jax.Array) -> tuple[EnvState, dict[str, jax.Array], dict[str, jax.Array]]:
        """Restart every world, physics included (the arguments as
        `racing_env.core.initial`'s): (state, obs, info without
        ``benchmark_version``)."""

    def step(self, params: core.EnvParams, state: EnvState, action: jax.Array, invalid: jax.Array) -> tuple:
        """One control step of every world (action float32 [E, 2], invalid
        bool [E]): (state, obs, reward float32 [E], terminated bool [E],
        truncated bool [E], info without ``benchmark_version``)."""

    def fields(self) -> dict[str, Any]:
        """The physics state by field name, uncopied: a snapshot's
        ``physics.*`` fields."""

    def restore(self, fields: dict[str, Any]) -> None:
        """Continue from `fields` (as `fields` gives them), copied."""

    @staticmethod
    def by_world(fields: dict[str, Any]) -> dict[str, np.ndarray]:
        """A snapshot's physics fields as [E, -1] rows, one a world."""

    @staticmethod
    def positions(fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """(the field holding each car's (x, y, z) in a snapshot's physics
        fields, those: float [E, 3], m)."""

    def velocities(self, fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """(the field holding each car's body velocity in a snapshot's
        physics fields, those: float [E, 3], m/s in the world frame)."""

    def core_data(self) -> PhysicsState:
        """The physics state `racing_env.core.step` continues from.

        Raises:
            ValueError: the physics state is not a JAX one (``cpu_reference``).
        """

    def continue_core(self, data: PhysicsState) -> None:
        """Continue from ``data``, a physics state `racing_env.core.step`
        returned (taken as it is, uncopied: the next step donates it).

        Raises:
            ValueError: the physics state is not a JAX one (``cpu_reference``).
        """


def _reset_physics_first(params: core.EnvParams, physics, data, *args):
    """`core.reset`, its physics state returned first: (data, state, obs, info)."""
    state, data, obs, info = core.reset(params, physics, data, *args)
    return data, state, obs, info


class MjxWarpBackend:
    """``mjx_warp``: a whole step is `core.step`, one jitted call with the
    Challenge and physics states donated; the physics state stays here."""

    name = MjxWarpPhysics.name
    one_world = False
    uses_gpu = True

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
        _LIVE_DEVICE_BACKENDS.add(self)

    @staticmethod
    def device_bytes_per_world(config: ProjectConfig) -> int | None:
        return MjxWarpPhysics.bytes_per_world(config)

    @staticmethod
    def preload() -> None:
        MjxWarpPhysics.preload()

    def reset(self, params: core.EnvParams, root: jax.Array, world: jax.Array, episode: jax.Array,
              rows: jax.Array, explicit: jax.Array) -> tuple[EnvState, dict[str, jax.Array], dict[str, jax.Array]]:
        self.data, state, obs, info = self._reset(params, self.physics, self.data, root, world, episode, rows,
                                                  explicit)
        return state, obs, info

    def step(self, params: core.EnvParams, state: EnvState, action: jax.Array, invalid: jax.Array) -> tuple:
        state, self.data, *out = self._step(params, self.physics, state, self.data, action, invalid)
        return state, *out

    def fields(self) -> dict[str, Any]:
        return self.data._asdict()

    def restore(self, fields: dict[str, Any]) -> None:
        # Copies of the caller's arrays: JAX on a CPU may keep a host array as the device buffer itself.
        self.data = PhysicsState(**{k: jax.device_put(np.array(fields[k]), self.home) for k in PhysicsState._fields})

    @staticmethod
    def by_world(fields: dict[str, Any]) -> dict[str, np.ndarray]:
        """Every `PhysicsState` field as [E, -1] rows, one a world."""
        return {k: np.asarray(fields[k]).reshape(len(fields[k]), -1) for k in PhysicsState._fields}

    @staticmethod
    def positions(fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """("qpos", float [E, 3]): the free joint's first coordinates, m."""
        return "qpos", np.asarray(fields["qpos"])[:, :3]

    def velocities(self, fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """("qvel", float [E, 3]): the free joint's first velocities (the
        world frame's), m/s."""
        return "qvel", np.asarray(fields["qvel"])[:, :3]

    def core_data(self) -> PhysicsState:
        return self.data

    def continue_core(self, data: PhysicsState) -> None:
        self.data = data


class CpuReferenceBackend:
    """``cpu_reference``: MuJoCo's C library integrates on the host between
    `core.begin` and `core.finish` (each jitted); the state crosses twice
    a step, by design."""

    name = CpuReferencePhysics.name
    one_world = True
    uses_gpu = False

    def __init__(self, config: ProjectConfig, num_envs: int) -> None:
        self.physics = CpuReferencePhysics(config, num_envs)
        self.home = jax.devices()[0]
        self._initial = jax.jit(core.initial)
        self._begin = jax.jit(core.begin)
        self._finish = jax.jit(core.finish)

    @staticmethod
    def device_bytes_per_world(config: ProjectConfig) -> int | None:
        return None

    @staticmethod
    def preload() -> None:  # MuJoCo's C library is imported with the physics module
        pass

    def reset(self, params: core.EnvParams, root: jax.Array, world: jax.Array, episode: jax.Array,
              rows: jax.Array, explicit: jax.Array) -> tuple[EnvState, dict[str, jax.Array], dict[str, jax.Array]]:
        state, obs, info, qpos = self._initial(params, root, world, episode, rows, explicit)
        self.physics.reset(np.ones(1, bool), np.asarray(qpos, np.float64))
        return state, obs, info

    def step(self, params: core.EnvParams, state: EnvState, action: jax.Array, invalid: jax.Array) -> tuple:
        _, qvel = self.physics.kinematics()
        ctrl, bad, state = self._begin(params, state, jnp.asarray(qvel, jnp.float32), action, invalid)
        self.physics.step(np.asarray(ctrl, np.float64))
        qpos, qvel = self.physics.kinematics()
        state, obs, reward, terminated, truncated, info, reset, start = self._finish(
            params, state, jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32), bad)
        self.physics.reset(np.asarray(reset), np.asarray(start, np.float64))
        return state, obs, reward, terminated, truncated, info

    def fields(self) -> dict[str, Any]:
        return {"mujoco_state": self.physics.integration_state()}

    def restore(self, fields: dict[str, Any]) -> None:
        self.physics.set_integration_state(fields["mujoco_state"])

    @staticmethod
    def by_world(fields: dict[str, Any]) -> dict[str, np.ndarray]:
        """``mujoco_state`` as one [1, -1] row (the one world)."""
        return {"mujoco_state": np.asarray(fields["mujoco_state"]).reshape(1, -1)}

    @staticmethod
    def positions(fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """("mujoco_state", float [1, 3]), m: ``mjSTATE_INTEGRATION`` starts
        with the time, then qpos, whose free joint comes first."""
        return "mujoco_state", np.asarray(fields["mujoco_state"])[None, 1:4]

    def velocities(self, fields: dict[str, Any]) -> tuple[str, np.ndarray]:
        """("mujoco_state", float [1, 3]), m/s: after the time and qpos
        comes qvel, whose free joint comes first."""
        start = 1 + self.physics.mj_model.nq
        return "mujoco_state", np.asarray(fields["mujoco_state"])[None, start:start + 3]

    def core_data(self) -> PhysicsState:
        raise ValueError("core_state needs the mjx_warp backend: cpu_reference integrates in MuJoCo C, on the host")

    def continue_core(self, data: PhysicsState) -> None:
        raise ValueError("continue_from needs the mjx_warp backend: cpu_reference integrates in MuJoCo C, on the "
                         "host")


#: Each backend's class by name: the env's only dispatch on the backend.
BACKENDS: dict[str, type[Backend]] = {backend.name: backend for backend in (CpuReferenceBackend, MjxWarpBackend)}


def backend_type(name: object) -> type[Backend]:
    """The class of the backend called `name`.

    Raises:
        ValueError: `name` is not one of `BACKEND_NAMES`.
    """
    if name not in BACKEND_NAMES:
        raise ValueError(f"backend must be one of {BACKEND_NAMES}, got {name!r}")
    return BACKENDS[name]


def check_footprint(num_envs: int, config: ProjectConfig, device_bytes_per_world: int | None) -> None:
    """Refuse, before anything is allocated, a batch whose per-world buffers
    cannot fit: the batched observation space's bounds (two observations a
    world) in host memory, and one observation plus the physics data a
    world on the device (``device_bytes_per_world``: the physics data's;
    None: the physics is on the host). A necessary condition, not a promise
    that a batch which passes it fits beside everything else.

    Raises:
        ValueError: either memory is too small, naming it and both sizes (GiB).
    """
    from racing_env._warp import warp

    wp = warp()

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


#: The live mjx_warp backends. With several host devices JAX runs a CPU call
#: on a worker thread, and the Warp physics inside a step is a Python
#: callback: a step still running when the interpreter finalizes waits for
#: it forever. So at exit every env first waits for its last call.
_LIVE_DEVICE_BACKENDS: weakref.WeakSet[MjxWarpBackend] = weakref.WeakSet()


@atexit.register
def _finish_last_calls() -> None:
    for backend in list(_LIVE_DEVICE_BACKENDS):
        try:
            jax.block_until_ready(backend.data)
        except Exception:  # a failed call's donated or failed buffers: nothing left to wait for
            pass
