"""The two physics engines, one a backend (`racing_env.backends`).

- `MjxWarpPhysics` (``"mjx_warp"``): MJX-Warp's engine (the mujoco_warp that
  mujoco-mjx ships for ``impl="warp"``) for all worlds at once, stepped
  inside the env's single jitted step through one Warp callable per control
  step. Its JAX state is the car's integration state only (`PhysicsState`).
  Runs on the GPU, and on Warp's CPU device for tests.
- `CpuReferencePhysics` (``"cpu_reference"``): MuJoCo's C library in float64,
  batch one, on the host; the development and Gymnasium-checker path.

Both build the same `car.build_model` and take the same controls from the
same Challenge code; they differ only in who integrates. A reset world
restarts from MuJoCo's reset state (zero velocity, zero warm start, time 0)
at the given qpos. Their calls differ (``step(state, ctrl)``, a pure
function traced under jit, against ``step(ctrl)`` on MuJoCo C's own data):
`racing_env.backends` drives each behind one interface, `Backend`.
"""

from __future__ import annotations

import atexit
import importlib
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from racing_env import car
from racing_env._warp import warp
from racing_env.backend_names import CPU_REFERENCE, MJX_WARP
from racing_env.config import ProjectConfig
from racing_env.moved import moved_names

__all__ = ["PhysicsState", "MjxWarpPhysics", "CpuReferencePhysics"]

#: The backend names' tuple moved: `racing_env.backends.BACKENDS` is the one table.
__getattr__ = moved_names(__name__, {"BACKENDS": "racing_env.backend_names.BACKEND_NAMES"})

#: Contacts per world (four sphere tyres on the plane) with room to spare.
_CONTACTS_PER_WORLD = 8
#: Constraint rows per world: four frictional contacts (pyramidal cones,
#: 4 rows each) with room to spare.
_CONSTRAINTS_PER_WORLD = 48
#: The modules of MJX-Warp's engine (``mujoco.mjx.third_party.mujoco_warp._src``)
#: whose kernels the car's step launches. Warp compiles a module at its
#: first launch, one after another; `MjxWarpPhysics` compiles these ahead,
#: side by side (from a cold start on an H100 they are 43 s of the step's
#: 83 s of serial compiles, the largest 14 s). The kernels the step builds
#: as it runs (Warp's ``__locals__`` modules) still compile at the first
#: step. A test holds this list to exactly what the step loads.
ENGINE_MODULES = ("smooth", "forward", "passive", "derivative", "solver", "support", "constraint")


def _finish_in_flight() -> None:
    """Wait, at interpreter exit, for the JAX work still in flight: a
    script that ends while a step (a Warp callback) is still running on
    Warp's CPU device would otherwise never exit (JAX's CPU client, torn
    down at exit, waits for a worker that waits for that work)."""
    for array in jax.live_arrays():
        try:
            array.block_until_ready()
        except RuntimeError:  # deleted or donated while we looked
            continue


# Registered after JAX's own exit handlers (it is imported above), so it runs before them.
atexit.register(_finish_in_flight)


class PhysicsState(NamedTuple):
    """The integration state of `E` cars: all that one MuJoCo step reads
    from the previous one (the car has no activations, mocap bodies or
    sleeping trees; every other MuJoCo quantity is recomputed each step).

    Attributes:
        qpos: float32 [E, NQ], positions (free joint, then hinges).
        qvel: float32 [E, NV], velocities.
        qacc_warmstart: float32 [E, NV], the solver's warm start, m/s^2 and rad/s^2.
        time: float32 [E], simulated time of each world's episode, s.
    """

    qpos: jax.Array
    qvel: jax.Array
    qacc_warmstart: jax.Array
    time: jax.Array


class MjxWarpPhysics:
    """Batched MJX-Warp physics of `num_envs` identical cars.

    The state is a `PhysicsState` of JAX arrays with a leading world axis;
    the methods below are pure functions of it, meant to be traced inside
    the env's jitted step. `step` is one Warp callable that copies the state
    and controls into a Warp-side MuJoCo data of all worlds, runs `substeps`
    MuJoCo steps on it and copies the state out: four small arrays cross the
    JAX-Warp boundary per control step, where MJX's own `mjx.step` stages
    every field of its data (hundreds of arrays) at every physics step.

    On CUDA the callable replays one CUDA graph captured by Warp with
    staging buffers (`wp.JaxCallableGraphMode.WARP_STAGED`): the graph
    copies XLA's operand buffers in and out, so it is captured once per
    jitted call site whatever runs between steps. Keyed on the operands'
    addresses instead (Warp's default), a graph is captured anew whenever
    XLA places its temporaries elsewhere, which any JAX allocation between
    steps (a policy, a rollout buffer) can cause; on an H200 that made steps
    100x slower. Warp's CPU device runs the callable eagerly.
    """

    name = MJX_WARP

    def __init__(self, config: ProjectConfig, num_envs: int) -> None:
        wp = warp()
        from mujoco.mjx.third_party import mujoco_warp as mjwarp

        self.config = config
        self.num_envs = num_envs
        self.mj_model = mj_model = car.build_model(config)
        cuda = jax.default_backend() == "gpu"
        self.device = wp.get_device(_warp_device())
        _compile_engine(self.device)
        with wp.ScopedDevice(self.device):
            model = mjwarp.put_model(mj_model)
            # Contact-budget overflow is not printed from inside the kernels.
            model.opt.warn_overflow = 0
            data = _warp_data(mj_model, num_envs)
            # Compile and load every kernel now, outside any graph capture.
            mjwarp.step(model, data)
        substeps = config.substeps

        def advance(
            qpos: wp.array2d(dtype=wp.float32),
            qvel: wp.array2d(dtype=wp.float32),
            qacc_warmstart: wp.array2d(dtype=wp.float32),
            time: wp.array(dtype=wp.float32),
            ctrl: wp.array2d(dtype=wp.float32),
        ):
            wp.copy(data.qpos, qpos)
            wp.copy(data.qvel, qvel)
            wp.copy(data.qacc_warmstart, qacc_warmstart)
            wp.copy(data.time, time)
            wp.copy(data.ctrl, ctrl)
            for _ in range(substeps):
                mjwarp.step(model, data)
            wp.copy(qpos, data.qpos)
            wp.copy(qvel, data.qvel)
            wp.copy(qacc_warmstart, data.qacc_warmstart)
            wp.copy(time, data.time)

        mode = wp.JaxCallableGraphMode.WARP_STAGED if cuda else wp.JaxCallableGraphMode.NONE
        self._advance = wp.jax_callable(
            advance,
            num_outputs=4,
            graph_mode=mode,
            in_out_argnames=("qpos", "qvel", "qacc_warmstart", "time"),
        )

    @staticmethod
    def preload() -> None:
        """Import the engine as building this physics does (Warp, quietly,
        then MuJoCo Warp: seconds on a first import), and nothing else: a
        caller waiting on other work meanwhile overlaps the two."""
        warp()
        from mujoco.mjx.third_party import mujoco_warp  # noqa: F401

    @staticmethod
    def bytes_per_world(config: ProjectConfig) -> int:
        """Device bytes one more world adds to the Warp-side MuJoCo data
        (measured on a one- and a two-world data on the backend's device;
        the JAX state and the staging copies add a few hundred bytes more)."""
        wp = warp()

        mj_model = car.build_model(config)
        with wp.ScopedDevice(_warp_device()):
            one, two = (_nbytes(_warp_data(mj_model, n)) for n in (1, 2))
        return two - one

    def initial(self) -> PhysicsState:
        """Fresh state, every car at MuJoCo's default pose and at rest."""
        e, nv = self.num_envs, self.mj_model.nv
        qpos0 = jnp.asarray(self.mj_model.qpos0, jnp.float32)
        return PhysicsState(
            qpos=jnp.tile(qpos0, (e, 1)),
            qvel=jnp.zeros((e, nv), jnp.float32),
            qacc_warmstart=jnp.zeros((e, nv), jnp.float32),
            time=jnp.zeros(e, jnp.float32),
        )

    def kinematics(self, state: PhysicsState) -> tuple[jax.Array, jax.Array]:
        """(qpos float32 [E, NQ], qvel float32 [E, NV])."""
        return state.qpos, state.qvel

    def step(self, state: PhysicsState, ctrl: jax.Array) -> PhysicsState:
        """One control step: `substeps` physics steps holding `ctrl` [E, NU]."""
        return PhysicsState(*self._advance(*state, ctrl.astype(jnp.float32)))

    def reset(self, state: PhysicsState, mask: jax.Array, qpos: jax.Array) -> PhysicsState:
        """Worlds where `mask` [E] is set restart at rest at `qpos` [E, NQ]."""
        m = mask[:, None]
        return PhysicsState(
            qpos=jnp.where(m, qpos, state.qpos),
            qvel=jnp.where(m, 0.0, state.qvel),
            qacc_warmstart=jnp.where(m, 0.0, state.qacc_warmstart),
            time=jnp.where(mask, 0.0, state.time),
        )


def _warp_device() -> str:
    """The Warp device of JAX's default backend."""
    return "cuda:0" if jax.default_backend() == "gpu" else "cpu"


def _compile_engine(device) -> None:
    """Compile and load `ENGINE_MODULES` on Warp ``device``, in parallel
    threads (Warp's compilers run outside Python's lock); a module already
    loaded or in Warp's kernel cache costs only its load."""
    wp = warp()

    modules = [wp.get_module(importlib.import_module(f"mujoco.mjx.third_party.mujoco_warp._src.{name}").__name__)
               for name in ENGINE_MODULES]
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    wp.force_load(device=device, modules=modules, max_workers=min(len(modules), cpus))


def _warp_data(mj_model: mujoco.MjModel, num_envs: int):
    """A Warp-side MuJoCo data of `num_envs` worlds on Warp's current device."""
    from mujoco.mjx.third_party import mujoco_warp as mjwarp

    return mjwarp.make_data(
        mj_model, nworld=num_envs, naconmax=_CONTACTS_PER_WORLD * num_envs, njmax=_CONSTRAINTS_PER_WORLD
    )


def _nbytes(tree: object) -> int:
    """Bytes of every Warp array in a (nested) dataclass."""
    import dataclasses

    wp = warp()

    total = 0
    for field in dataclasses.fields(tree):
        value = getattr(tree, field.name)
        if isinstance(value, wp.array):
            total += value.size * wp.types.type_size_in_bytes(value.dtype)
        elif dataclasses.is_dataclass(value):
            total += _nbytes(value)
    return total


class CpuReferencePhysics:
    """One car in MuJoCo's C library (float64), on the host."""

    name = CPU_REFERENCE

    def __init__(self, config: ProjectConfig, num_envs: int) -> None:
        if num_envs != 1:
            raise ValueError(f"num_envs must be 1 for the cpu_reference backend, got {num_envs}")
        self.config = config
        self.num_envs = 1
        self.mj_model = car.build_model(config)
        self.data = mujoco.MjData(self.mj_model)

    def kinematics(self) -> tuple[np.ndarray, np.ndarray]:
        """(qpos float64 [1, NQ], qvel float64 [1, NV]), copies."""
        return self.data.qpos[None].copy(), self.data.qvel[None].copy()

    def step(self, ctrl: np.ndarray) -> None:
        """One control step: `substeps` physics steps holding `ctrl` [1, NU]."""
        self.data.ctrl[:] = ctrl[0]
        for _ in range(self.config.substeps):
            mujoco.mj_step(self.mj_model, self.data)

    def integration_state(self) -> np.ndarray:
        """float64 [S]: MuJoCo's whole integration state (``mjSTATE_INTEGRATION``), a copy."""
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(self.mj_model, spec), np.float64)
        mujoco.mj_getState(self.mj_model, self.data, state, spec)
        return state

    def set_integration_state(self, state: np.ndarray) -> None:
        """Restore what `integration_state` returned."""
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        mujoco.mj_setState(self.mj_model, self.data, np.asarray(state, np.float64), spec)
        mujoco.mj_forward(self.mj_model, self.data)

    def reset(self, mask: np.ndarray, qpos: np.ndarray) -> None:
        """Restart at rest at `qpos` [1, NQ] if `mask` [1] is set."""
        if bool(mask[0]):
            mujoco.mj_resetData(self.mj_model, self.data)
            self.data.qpos[:] = qpos[0]
