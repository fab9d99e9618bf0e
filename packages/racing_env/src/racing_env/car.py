"""The car: its MuJoCo model, how the public action becomes actuator
controls, and what the public observation reads off the physics state.

Body frame: x forward, y left, z up, origin at the centre of the rear axle
(the car's reference point). The chassis hangs on a free joint, so
``qpos[0:3]`` is the rear-axle centre in the world, ``qpos[3:7]`` the chassis
quaternion (w, x, y, z), ``qvel[0:3]`` the rear-axle velocity in the world
frame and ``qvel[3:6]`` the chassis angular velocity in the body frame.

The action mapping (the same JAX code for every backend):

- steering: both front steering servos target ``action[0]`` (rad; parallel
  steering, no Ackermann geometry);
- ``action[1] >= 0``: drive torque ``effective_mass * a * r`` split evenly over
  the two rear wheels, so on flat ground the car accelerates at ``a``;
- ``action[1] < 0``: braking torque of the same size, ``brake_front_share`` on
  the front axle, each wheel's torque opposing its own spin and fading
  linearly to zero below ``brake_fade_speed_mps`` of wheel surface speed. A
  negative command brakes to a standstill and holds; there is no reverse.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mujoco

from racing_env.config import KNUCKLE_MASS_KG, ProjectConfig

__all__ = [
    "NQ",
    "NV",
    "NU",
    "STEER_QPOS",
    "WHEEL_QVEL",
    "build_model",
    "wheel_layout",
    "wheel_points",
    "controls",
    "start_qpos",
    "planar_state",
]

#: Joint layout: free joint (7 qpos, 6 qvel), then per front wheel a steering
#: hinge and a spin hinge, then the two rear spin hinges.
NQ = 13
NV = 12
NU = 6
#: qpos addresses of the two steering hinges (front left, front right).
STEER_QPOS = (7, 9)
#: qvel addresses of the wheel spin hinges: front left, front right, rear left, rear right.
WHEEL_QVEL = (7, 9, 10, 11)


def build_model(config: ProjectConfig) -> mujoco.MjModel:
    """The car on an infinite flat ground plane, as a compiled MuJoCo model.

    Actuators, in order: steering servo front left, front right (position,
    rad); wheel torque front left, front right, rear left, rear right (N m).
    """
    if not isinstance(config, ProjectConfig):
        raise TypeError(f"config must be a ProjectConfig, got {type(config).__name__}")
    return mujoco.MjModel.from_xml_string(_mjcf(config))


def _mjcf(c: ProjectConfig) -> str:
    length, width, height = c.chassis_size_m
    # The steering knuckles are part of the sprung mass.
    m = c.chassis_mass_kg - 2 * KNUCKLE_MASS_KG
    ixx = m / 12 * (width**2 + height**2)
    iyy = m / 12 * (length**2 + height**2)
    izz = m / 12 * (length**2 + width**2)
    com_z = c.com_height_m - c.wheel_radius_m
    r = c.wheel_radius_m
    half_track = c.track_width_m / 2
    wheel_i = c.wheel_spin_inertia
    knuckle_i = 0.01

    def tyre(name: str) -> str:
        return (
            f'<joint name="{name}_spin" type="hinge" axis="0 1 0"/>'
            f'<geom name="{name}_tyre" type="sphere" size="{r}" mass="0" '
            f'contype="1" conaffinity="0" friction="{c.tyre_friction} 0 0"/>'
            f'<inertial pos="0 0 0" mass="{c.wheel_mass_kg}" diaginertia="{wheel_i} {wheel_i} {wheel_i}"/>'
        )

    def wheel(name: str, x: float, y: float, steered: bool) -> str:
        if not steered:
            return f'<body name="{name}" pos="{x} {y} 0">{tyre(name)}</body>'
        return (
            f'<body name="{name}_knuckle" pos="{x} {y} 0">'
            f'<joint name="{name}_steer" type="hinge" axis="0 0 1"/>'
            f'<inertial pos="0 0 0" mass="{KNUCKLE_MASS_KG}" diaginertia="{knuckle_i} {knuckle_i} {knuckle_i}"/>'
            f'<body name="{name}">{tyre(name)}</body></body>'
        )

    steer = c.max_steering_rad
    return f"""
<mujoco model="racing_env_car">
  <option timestep="{c.physics_dt_s}" integrator="implicitfast" solver="Newton"
          iterations="{c.solver_iterations}" ls_iterations="{c.ls_iterations}"/>
  <worldbody>
    <geom name="ground" type="plane" size="0 0 1" contype="0" conaffinity="1"
          friction="{c.tyre_friction} 0 0"/>
    <body name="chassis" pos="0 0 {r}">
      <freejoint name="chassis"/>
      <inertial pos="{c.com_ahead_of_rear_axle_m} 0 {com_z}" mass="{m}" diaginertia="{ixx} {iyy} {izz}"/>
      <geom name="body" type="box" size="{length / 2} {width / 2} {height / 2}"
            pos="{c.wheelbase_m / 2} 0 {height / 2}" contype="0" conaffinity="0" mass="0"/>
      {wheel("front_left", c.wheelbase_m, half_track, True)}
      {wheel("front_right", c.wheelbase_m, -half_track, True)}
      {wheel("rear_left", 0.0, half_track, False)}
      {wheel("rear_right", 0.0, -half_track, False)}
    </body>
  </worldbody>
  <actuator>
    <position name="steer_front_left" joint="front_left_steer" kp="{c.steer_kp}" kv="{c.steer_kv}"
              ctrlrange="{-steer} {steer}"/>
    <position name="steer_front_right" joint="front_right_steer" kp="{c.steer_kp}" kv="{c.steer_kv}"
              ctrlrange="{-steer} {steer}"/>
    <motor name="torque_front_left" joint="front_left_spin"/>
    <motor name="torque_front_right" joint="front_right_spin"/>
    <motor name="torque_rear_left" joint="rear_left_spin"/>
    <motor name="torque_rear_right" joint="rear_right_spin"/>
  </actuator>
</mujoco>
"""


def controls(config: ProjectConfig, action: jax.Array, qvel: jax.Array) -> jax.Array:
    """Actuator controls for a clipped, finite public action.

    Args:
        config: the car.
        action: float32 [E, 2]: steering (rad), longitudinal acceleration
            (m/s^2), already inside the configured ranges.
        qvel: float32 [E, NV], the state the control step starts from (the
            braking torque opposes each wheel's spin at that moment).

    Returns:
        float32 [E, NU]: steering targets (rad) then wheel torques (N m), in
        the actuator order of `build_model`.
    """
    steering = action[:, 0]
    accel = action[:, 1]
    r = config.wheel_radius_m
    force_torque = config.effective_mass_kg * jnp.abs(accel) * r
    drive = jnp.where(accel > 0, force_torque, 0.0)
    brake = jnp.where(accel < 0, force_torque, 0.0)
    spin = qvel[:, jnp.array(WHEEL_QVEL)]
    fade = jnp.clip(spin * (r / config.brake_fade_speed_mps), -1.0, 1.0)
    front = config.brake_front_share / 2
    rear = (1.0 - config.brake_front_share) / 2
    share = jnp.array([front, front, rear, rear], dtype=jnp.float32)
    wheel_torque = -brake[:, None] * share * fade
    wheel_torque = wheel_torque.at[:, 2:].add(drive[:, None] / 2)
    return jnp.concatenate([steering[:, None], steering[:, None], wheel_torque], axis=1).astype(jnp.float32)


def start_qpos(config: ProjectConfig, x: jax.Array, y: jax.Array, yaw: jax.Array) -> jax.Array:
    """qpos of the car at rest with its rear axle at (x, y), heading `yaw`.

    Args:
        x, y: float32 [E], m. yaw: float32 [E], rad.

    Returns:
        float32 [E, NQ]: wheels straight, axle at tyre-radius height.
    """
    half = 0.5 * yaw
    zeros = jnp.zeros_like(x)
    base = jnp.stack(
        [x, y, zeros + config.wheel_radius_m, jnp.cos(half), zeros, zeros, jnp.sin(half)], axis=1
    )
    return jnp.concatenate([base, jnp.zeros((x.shape[0], NQ - 7), jnp.float32)], axis=1).astype(jnp.float32)


def _yaw(qpos: jax.Array) -> jax.Array:
    w, qx, qy, qz = qpos[:, 3], qpos[:, 4], qpos[:, 5], qpos[:, 6]
    return jnp.arctan2(2 * (w * qz + qx * qy), 1 - 2 * (qy * qy + qz * qz))


def planar_state(qpos: jax.Array, qvel: jax.Array) -> dict[str, jax.Array]:
    """The car's public kinematics, read off the physics state.

    Args:
        qpos: float [E, NQ]. qvel: float [E, NV].

    Returns:
        float32 fields: ``position`` [E, 2] rear-axle (x, y), m; ``yaw`` [E]
        in [-pi, pi], rad; ``velocity_body`` [E, 2] rear-axle velocity along
        the body's x and y axes (the heading projected on the ground), m/s;
        ``yaw_rate`` [E] body yaw rate, rad/s; ``steering_angle`` [E] mean
        of the two steering hinges, rad.
    """
    yaw = _yaw(qpos)
    c, s = jnp.cos(yaw), jnp.sin(yaw)
    vx, vy = qvel[:, 0], qvel[:, 1]
    velocity_body = jnp.stack([c * vx + s * vy, -s * vx + c * vy], axis=1)
    steer = 0.5 * (qpos[:, STEER_QPOS[0]] + qpos[:, STEER_QPOS[1]])
    return {
        "position": qpos[:, 0:2].astype(jnp.float32),
        "yaw": yaw.astype(jnp.float32),
        "velocity_body": velocity_body.astype(jnp.float32),
        "yaw_rate": qvel[:, 5].astype(jnp.float32),
        "steering_angle": steer.astype(jnp.float32),
    }


def wheel_layout(wheelbase_m: float, track_width_m: float) -> tuple[tuple[float, float], ...]:
    """The four wheel centres in the body frame (x forward, y left, from the
    rear axle's centre), m: front left, front right, rear left, rear right.
    The one place the wheel layout is written (`wheel_points`,
    `racing_env.geometry.road_geometry`)."""
    half = track_width_m / 2
    return ((wheelbase_m, half), (wheelbase_m, -half), (0.0, half), (0.0, -half))


def wheel_points(config: ProjectConfig, position: jax.Array, yaw: jax.Array) -> jax.Array:
    """Ground points under the four wheel centres (the points that must stay
    on the track), in the order front left, front right, rear left, rear right.

    Args:
        position: float32 [E, 2] rear-axle (x, y), m. yaw: float32 [E], rad.

    Returns:
        float32 [E, 4, 2], m.
    """
    local = jnp.array(wheel_layout(config.wheelbase_m, config.track_width_m), jnp.float32)
    c, s = jnp.cos(yaw)[:, None], jnp.sin(yaw)[:, None]
    x = position[:, None, 0] + c * local[None, :, 0] - s * local[None, :, 1]
    y = position[:, None, 1] + s * local[None, :, 0] + c * local[None, :, 1]
    return jnp.stack([x, y], axis=-1)
