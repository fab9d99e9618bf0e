"""The two physics backends behind one small interface.

- `MjxWarpPhysics` (``"mjx_warp"``): MJX with ``impl="warp"``; all worlds'
  state is one batched `mjx.Data` (JAX arrays), stepped inside the env's
  single jitted step. Runs on the GPU, and on Warp's CPU device for tests.
- `CpuReferencePhysics` (``"cpu_reference"``): MuJoCo's C library in float64,
  batch one, on the host; the development and Gymnasium-checker path.

Both build the same `car.build_model` and take the same controls from the
same Challenge code; they differ only in who integrates. A reset world
restarts from MuJoCo's reset state (zero velocity, zero warm start, time 0)
at the given qpos.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from racing_env import car
from racing_env.config import ProjectConfig

__all__ = ["BACKENDS", "MjxWarpPhysics", "CpuReferencePhysics"]

#: The backend names the environments accept.
BACKENDS = ("cpu_reference", "mjx_warp")

#: Contacts per world (four sphere tyres on the plane) with room to spare.
_CONTACTS_PER_WORLD = 8
#: Constraint rows per world: four frictional contacts (pyramidal cones,
#: 4 rows each) with room to spare.
_CONSTRAINTS_PER_WORLD = 48


class MjxWarpPhysics:
    """Batched MJX-Warp physics of `num_envs` identical cars.

    The state is an `mjx.Data` whose arrays carry a leading world axis. The
    methods below are pure functions of it, meant to be traced inside the
    env's jitted step.

    On CUDA each `mjx.step` replays one CUDA graph captured by Warp with
    staging buffers (`wp.JaxCallableGraphMode.WARP_STAGED`): the graph
    copies XLA's operand buffers in and out, so it is captured once per
    jitted call site. MJX's default mode keys its graphs on the operands'
    addresses, which are XLA temporaries: any JAX allocation between two
    steps (a policy, a metric) moves them, and on an H200 every step then
    captured anew, 100x slower at 1,024 worlds (1.4 to 136 ms a step).
    Staging costs ~0.8 ms a step at 1,024 worlds and ~2.7 ms at 65,536, and
    holds whatever runs between steps. Warp's CPU device runs the calls
    eagerly (MJX's CPU default).
    """

    name = "mjx_warp"

    def __init__(self, config: ProjectConfig, num_envs: int) -> None:
        import warp as wp
        from mujoco import mjx

        self.config = config
        self.num_envs = num_envs
        self.mj_model = car.build_model(config)
        # Contact-budget overflow is kept in the data (`overflow`), not printed
        # from inside the kernels on every step.
        cuda = jax.default_backend() == "gpu"
        graph_mode = wp.JaxCallableGraphMode.WARP_STAGED if cuda else None
        self.model = mjx.put_model(self.mj_model, impl="warp", graph_mode=graph_mode).tree_replace(
            {"opt._impl.warn_overflow": 0}
        )
        self._mjx = mjx

    def initial(self) -> object:
        """Fresh batched data, every car at MuJoCo's default pose."""
        mj_model, mjx = self.mj_model, self._mjx
        naconmax = _CONTACTS_PER_WORLD * self.num_envs

        def one(_):
            return mjx.make_data(mj_model, impl="warp", naconmax=naconmax, njmax=_CONSTRAINTS_PER_WORLD)

        return jax.jit(jax.vmap(one))(jnp.arange(self.num_envs))

    def kinematics(self, data) -> tuple[jax.Array, jax.Array]:
        """(qpos float32 [E, NQ], qvel float32 [E, NV])."""
        return data.qpos, data.qvel

    def step(self, data, ctrl: jax.Array):
        """One control step: `substeps` physics steps holding `ctrl` [E, NU]."""
        data = data.replace(ctrl=ctrl)
        step = jax.vmap(self._mjx.step, in_axes=(None, 0))
        for _ in range(self.config.substeps):
            data = step(self.model, data)
        return data

    def reset(self, data, mask: jax.Array, qpos: jax.Array):
        """Worlds where `mask` [E] is set restart at rest at `qpos` [E, NQ]."""
        m = mask[:, None]
        return data.replace(
            qpos=jnp.where(m, qpos, data.qpos),
            qvel=jnp.where(m, 0.0, data.qvel),
            qacc_warmstart=jnp.where(m, 0.0, data.qacc_warmstart),
            time=jnp.where(mask, 0.0, data.time),
        )


class CpuReferencePhysics:
    """One car in MuJoCo's C library (float64), on the host."""

    name = "cpu_reference"

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

    def reset(self, mask: np.ndarray, qpos: np.ndarray) -> None:
        """Restart at rest at `qpos` [1, NQ] if `mask` [1] is set."""
        if bool(mask[0]):
            mujoco.mj_resetData(self.mj_model, self.data)
            self.data.qpos[:] = qpos[0]
