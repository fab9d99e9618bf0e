"""The car alone on the flat ground plane, driven by public actions and read
like an instrumented test car: the rig under `racing_env.envelope`.

No track and no Race Core: `CpuReferencePhysics` (MuJoCo C, float64, the
env's model, ``dt`` and substeps) stepped directly, each control step's
actuator controls computed from the action by the env's own mapping
(`racing_env.car.controls`, fed the float32 ``qvel`` as the
``cpu_reference`` backend feeds it), the action clipped into the action
space as the env clips it.

What the rig reads after each control step (every quantity recomputed from
the new ``qpos``/``qvel`` by MuJoCo's own kinematics):

- the car's centre of mass (the whole car: chassis, knuckles and wheels)
  and its horizontal velocity;
- its acceleration over the step: the change of that velocity divided by
  the control step, rotated into the heading at the middle of the step
  (x forward, y left), m/s^2;
- heading (yaw), yaw rate, and the rear axle's sideslip angle (zero while
  the rear tyres roll without sliding sideways: they do not steer);
- the rear axle's rise above its height at rest (the car has no suspension:
  a rise of more than the tyres' millimetre of sink means they left the
  ground).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import mujoco
import numpy as np

from racing_env import car
from racing_env.config import ProjectConfig
from racing_env.physics import CpuReferencePhysics
from racing_env.spaces import action_space

__all__ = ["Reading", "Rig", "SpeedHold", "wrap_angle"]

#: Control steps the car stands at rest after a launch, for its tyres to
#: settle into the ground before it is set rolling (0.5 s at 50 Hz).
_REST_STEPS = 25


def wrap_angle(angle: float) -> float:
    """``angle`` in [-pi, pi), rad."""
    return (angle + math.pi) % (2 * math.pi) - math.pi


@dataclass(frozen=True)
class Reading:
    """The car after one control step.

    Attributes:
        com_xy: float64 [2], the car's centre of mass in the world, m.
        speed_mps: horizontal speed of the centre of mass, m/s.
        a_x_mps2: acceleration along the heading over the step, m/s^2.
        a_y_mps2: acceleration to the left of the heading over the step
            (centripetal in a left turn), m/s^2.
        yaw_rad: heading in [-pi, pi), rad.
        yaw_rate_radps: chassis yaw rate, rad/s (left positive).
        rear_slip_rad: sideslip angle of the rear axle's centre, rad.
        rise_m: the rear axle's centre above its height at rest, m.
    """

    com_xy: np.ndarray
    speed_mps: float
    a_x_mps2: float
    a_y_mps2: float
    yaw_rad: float
    yaw_rate_radps: float
    rear_slip_rad: float
    rise_m: float


@functools.lru_cache(maxsize=8)
def _controls(config: ProjectConfig):
    """`car.controls` for one car, jitted once per config."""
    return jax.jit(functools.partial(car.controls, config))


class Rig:
    """One car of `config` on the flat ground, stepped one control step at a time."""

    def __init__(self, config: ProjectConfig) -> None:
        self.config = config
        self.physics = CpuReferencePhysics(config, 1)
        self.model, self.data = self.physics.mj_model, self.physics.data
        space = action_space(config)
        self._low = space.low.astype(np.float64)
        self._high = space.high.astype(np.float64)
        self._controls = _controls(config)
        self._chassis = self.model.body("chassis").id
        self.dt = config.control_dt_s
        self._velocity = np.zeros(2)
        self._yaw = 0.0
        self._rest_height = config.wheel_radius_m

    def launch(self, heading_rad: float, speed_mps: float) -> Reading:
        """Restart: the car stands on the plane heading `heading_rad` until
        its tyres settle, then rolls straight ahead at `speed_mps` (chassis
        and wheel spin set together, so no tyre slides)."""
        zero = jnp.zeros(1, jnp.float32)
        qpos = car.start_qpos(self.config, zero, zero, jnp.full(1, heading_rad, jnp.float32))
        self.physics.reset(np.ones(1, bool), np.asarray(qpos, np.float64))
        for _ in range(_REST_STEPS):
            self.step(0.0, 0.0)
        d = self.data
        self._rest_height = float(d.qpos[2])
        d.qvel[:] = 0.0
        d.qvel[0:2] = speed_mps * math.cos(heading_rad), speed_mps * math.sin(heading_rad)
        rolling_radius = d.qpos[2]  # the wheel centres' height: the tyres' sink included
        for address in car.WHEEL_QVEL:
            d.qvel[address] = speed_mps / rolling_radius
        return self._read(first=True)

    def step(self, steering_rad: float, accel_mps2: float) -> Reading:
        """One control step of the action (steering, longitudinal
        acceleration), clipped into the action space."""
        action = np.clip([steering_rad, accel_mps2], self._low, self._high)
        qvel = jnp.asarray(self.data.qvel[None], jnp.float32)
        ctrl = self._controls(jnp.asarray(action[None], jnp.float32), qvel)
        self.physics.step(np.asarray(ctrl, np.float64))
        return self._read()

    def snapshot(self) -> tuple:
        """Everything the next step and reading depend on (`restore` returns to it)."""
        return self.physics.integration_state(), self._velocity.copy(), self._yaw, self._rest_height

    def restore(self, snapshot: tuple) -> None:
        state, velocity, self._yaw, self._rest_height = snapshot
        self.physics.set_integration_state(state)
        self._velocity = velocity.copy()

    def _read(self, first: bool = False) -> Reading:
        m, d = self.model, self.data
        # Position and velocity quantities of the new state (the next mj_step
        # recomputes them itself: reading them changes nothing it integrates).
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        mujoco.mj_comVel(m, d)
        mujoco.mj_subtreeVel(m, d)
        rot = d.xmat[self._chassis].reshape(3, 3)
        yaw = math.atan2(rot[1, 0], rot[0, 0])
        velocity = d.subtree_linvel[self._chassis, :2].copy()
        if first:
            self._velocity, self._yaw = velocity, yaw
        mid = self._yaw + 0.5 * wrap_angle(yaw - self._yaw)
        dv = (velocity - self._velocity) / self.dt
        c, s = math.cos(mid), math.sin(mid)
        rear = rot.T @ d.qvel[0:3]  # the free joint's origin is the rear axle's centre
        self._velocity, self._yaw = velocity, yaw
        return Reading(
            com_xy=d.subtree_com[self._chassis, :2].copy(),
            speed_mps=float(np.hypot(*velocity)),
            a_x_mps2=float(c * dv[0] + s * dv[1]),
            a_y_mps2=float(-s * dv[0] + c * dv[1]),
            yaw_rad=wrap_angle(yaw),
            yaw_rate_radps=float(d.qvel[5]),
            rear_slip_rad=math.atan2(rear[1], abs(rear[0])) if abs(rear[0]) > 1e-9 else 0.0,
            rise_m=float(d.qpos[2]) - self._rest_height,
        )


class SpeedHold:
    """A PI speed controller: the longitudinal command that holds
    `target_mps` (clipped by the rig into the action range; the integral
    stops growing while the command is out of range)."""

    KP = 2.0  # (m/s^2) / (m/s)
    KI = 0.5  # (m/s^2) / m

    def __init__(self, target_mps: float, low: float, high: float, dt: float) -> None:
        self.target_mps = target_mps
        self.low, self.high, self.dt = low, high, dt
        self.integral = 0.0

    def command(self, speed_mps: float) -> float:
        error = self.target_mps - speed_mps
        integral = self.integral + error * self.dt
        command = self.KP * error + self.KI * integral
        if self.low <= command <= self.high:
            self.integral = integral
        return float(np.clip(command, self.low, self.high))
