"""Tests for racing_env.car and racing_env.config: the MuJoCo car, the
documented action mapping, the observation read-outs and ProjectConfig/Level
validation.

Physics runs on MuJoCo's C library (float64) on flat ground. Every control
step recomputes the controls from the current qvel with `car.controls`
(jitted once per config), then holds them for `config.substeps` physics steps,
exactly as the env does. Every expectation (rotations, body velocities,
torques) is recomputed here with NumPy, never with the library's own routines.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from racing_env import car
from racing_env.config import LEVEL_0, Level, ProjectConfig

DEFAULT = ProjectConfig()
#: A different car (heavier, smaller tyres, longer wheelbase, other brake
#: split) so the mapping is not tuned to the defaults.
OTHER = ProjectConfig(
    chassis_mass_kg=1500.0,
    wheel_mass_kg=25.0,
    wheel_radius_m=0.30,
    wheelbase_m=2.9,
    track_width_m=1.55,
    com_ahead_of_rear_axle_m=1.2,
    brake_front_share=0.6,
    brake_fade_speed_mps=1.0,
)

WHEELS = ("front_left", "front_right", "rear_left", "rear_right")
SETTLE_STEPS = 50  # 1 s at the default 50 Hz

ACCEL_COMMANDS = (0.5, 1.0, 2.0, 3.0, 4.0)  # m/s^2
ACCEL_STEPS = 75  # 1.5 s
BRAKE_COMMANDS = (-2.0, -5.0, -8.0)  # m/s^2
BRAKE_START_SPEED = 20.0  # m/s
HOLD_STEPS = 150  # 3 s of -8 m/s^2 at standstill
STEER_COMMANDS = (-0.6, -0.3, 0.1, 0.45)  # rad
STEER_SPEED = 5.0  # m/s
STEER_STEPS = 25  # 0.5 s
YAW_COMMANDS = (0.05, 0.1, -0.1)  # rad
YAW_SPEED = 10.0  # m/s
YAW_STEPS = 100  # 2 s; the yaw rate is averaged over the second second

ACCEL_RTOL = 0.01
STEER_ATOL = 1e-3  # rad
YAW_RTOL = 0.05
NO_REVERSE_MPS = -0.05
WHEEL_SLIP_RTOL = 0.03
STILL_DRIFT_M = 1e-3


# --------------------------------------------------------------------------- oracles


def quat_to_mat(quat: np.ndarray) -> np.ndarray:
    """float64 [..., 3, 3] rotation matrices of unit quaternions (w, x, y, z) [..., 4]."""
    w, x, y, z = np.moveaxis(np.asarray(quat, np.float64), -1, 0)
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        -1,
    )


def axis_quat(angle: np.ndarray, axis: int) -> np.ndarray:
    q = np.zeros(np.shape(angle) + (4,))
    q[..., 0] = np.cos(angle / 2)
    q[..., 1 + axis] = np.sin(angle / 2)
    return q


def body_velocity(qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
    """float64 [..., 3]: rear-axle velocity in the chassis frame (R^T v)."""
    rot = quat_to_mat(qpos[..., 3:7])
    return np.einsum("...ji,...j->...i", rot, qvel[..., 0:3])


def wrap(angle: np.ndarray) -> np.ndarray:
    return (np.asarray(angle) + np.pi) % (2 * np.pi) - np.pi


def oracle_wheel_points(config: ProjectConfig, position: np.ndarray, yaw: np.ndarray) -> np.ndarray:
    """float64 [E, 4, 2]: the documented local offsets rotated by yaw."""
    half = config.track_width_m / 2
    local = np.array(
        [[config.wheelbase_m, half], [config.wheelbase_m, -half], [0.0, half], [0.0, -half]]
    )
    c, s = np.cos(yaw), np.sin(yaw)
    rot = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)  # [E, 2, 2]
    return position[:, None, :] + np.einsum("eij,wj->ewi", rot, local)


def oracle_wheel_torques(config: ProjectConfig, accel: np.ndarray, spin: np.ndarray) -> np.ndarray:
    """float64 [E, 4] wheel torques (FL, FR, RL, RR) of the documented mapping."""
    r = config.wheel_radius_m
    force_torque = config.effective_mass_kg * np.abs(accel) * r
    torque = np.zeros((len(accel), 4))
    driving = accel > 0
    torque[driving, 2] = torque[driving, 3] = force_torque[driving] / 2
    braking = accel < 0
    shares = np.array([config.brake_front_share] * 2 + [1 - config.brake_front_share] * 2) / 2
    fade = np.clip(np.abs(spin) * r / config.brake_fade_speed_mps, 0.0, 1.0)
    brake = -np.sign(spin) * force_torque[:, None] * shares * fade
    torque[braking] = brake[braking]
    return torque


# --------------------------------------------------------------------------- simulation


class Trace(NamedTuple):
    """States at the end of each control step, index 0 being the start state."""

    time: np.ndarray  # [T + 1] s
    qpos: np.ndarray  # [T + 1, NQ]
    qvel: np.ndarray  # [T + 1, NV]
    ctrl: np.ndarray  # [T, NU], the controls held during each control step

    @property
    def forward_speed(self) -> np.ndarray:
        """[T + 1] m/s along the chassis x axis."""
        return body_velocity(self.qpos, self.qvel)[:, 0]

    def wheel_surface_speed(self, config: ProjectConfig) -> np.ndarray:
        """[T + 1, 4] m/s, omega * r of FL, FR, RL, RR."""
        return self.qvel[:, list(car.WHEEL_QVEL)] * config.wheel_radius_m


class Sim:
    """One car in MuJoCo C, driven by the env's control law."""

    def __init__(self, config: ProjectConfig) -> None:
        self.config = config
        self.model = car.build_model(config)
        self.controls = jax.jit(functools.partial(car.controls, config))

    def fresh(self) -> mujoco.MjData:
        return mujoco.MjData(self.model)

    def settled(self) -> mujoco.MjData:
        data = self.fresh()
        self.drive(data, (0.0, 0.0), SETTLE_STEPS)
        return data

    def drive(self, data: mujoco.MjData, action: tuple[float, float], steps: int) -> Trace:
        """`steps` control steps of a constant public action; mutates `data`."""
        act = jnp.asarray([action], jnp.float32)
        times, qpos, qvel, ctrl = [data.time], [data.qpos.copy()], [data.qvel.copy()], []
        for _ in range(steps):
            u = np.asarray(self.controls(act, jnp.asarray(data.qvel[None], jnp.float32)))[0]
            data.ctrl[:] = u
            for _ in range(self.config.substeps):
                mujoco.mj_step(self.model, data)
            times.append(data.time)
            qpos.append(data.qpos.copy())
            qvel.append(data.qvel.copy())
            ctrl.append(u)
        return Trace(np.array(times), np.array(qpos), np.array(qvel), np.array(ctrl))

    def at_speed(self, speed: float, accel: float = 4.0) -> mujoco.MjData:
        """Settled, then driven straight from rest at `accel` until ~`speed`."""
        data = self.settled()
        steps = int(round(speed / accel / self.config.control_dt_s))
        self.drive(data, (0.0, accel), steps)
        return data


def mean_acceleration(trace: Trace, last: int | None = None) -> float:
    """Finite difference of the forward speed from the end of the first control
    step to index `last` (default: the end), m/s^2."""
    last = len(trace.time) - 1 if last is None else last
    v = trace.forward_speed
    return float((v[last] - v[1]) / (trace.time[last] - trace.time[1]))


@pytest.fixture(scope="module")
def sim() -> Sim:
    return Sim(DEFAULT)


@pytest.fixture(scope="module")
def other_sim() -> Sim:
    return Sim(OTHER)


@pytest.fixture(scope="module")
def braking_runs(sim: Sim) -> dict[float, tuple[float, Trace, Trace]]:
    """Per brake command: (start speed, the brake-to-rest trace, then 3 s of -8 at rest)."""
    start = sim.at_speed(BRAKE_START_SPEED)
    v0 = float(body_velocity(start.qpos, start.qvel)[0])
    runs = {}
    for a in BRAKE_COMMANDS:
        data = copy.copy(start)
        # The fade makes the last 0.5 m/s an exponential approach with time
        # constant brake_fade_speed_mps / |a|: allow 2 s for it.
        stop_steps = int(math.ceil(v0 / abs(a) / sim.config.control_dt_s)) + 100
        braking = sim.drive(data, (0.0, a), stop_steps)
        hold = sim.drive(data, (0.0, DEFAULT.min_acceleration_mps2), HOLD_STEPS)
        runs[a] = (v0, braking, hold)
    return runs


# --------------------------------------------------------------------------- model structure


def joint_id(model: mujoco.MjModel, name: str) -> int:
    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)


def geom_id(model: mujoco.MjModel, name: str) -> int:
    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, name)


def test_build_model_refuses_a_non_config() -> None:
    with pytest.raises(TypeError, match="config"):
        car.build_model({"wheel_radius_m": 0.33})


@pytest.mark.parametrize("config", [DEFAULT, OTHER], ids=["default", "other"])
def test_model_sizes_match_the_constants(config: ProjectConfig) -> None:
    model = car.build_model(config)
    assert (model.nq, model.nv, model.nu) == (car.NQ, car.NV, car.NU)
    assert model.opt.timestep == config.physics_dt_s
    assert model.opt.integrator == mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    assert model.opt.solver == mujoco.mjtSolver.mjSOL_NEWTON


def test_joint_layout(sim: Sim) -> None:
    model = sim.model
    free = [j for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
    assert free == [0], "exactly one free joint, the first (chassis) one"
    assert model.jnt_bodyid[0] == 1 and model.body(1).name == "chassis"
    assert model.jnt_qposadr[0] == 0 and model.jnt_dofadr[0] == 0

    names = [model.joint(j).name for j in range(model.njnt)]
    assert names == [
        "chassis",
        "front_left_steer",
        "front_left_spin",
        "front_right_steer",
        "front_right_spin",
        "rear_left_spin",
        "rear_right_spin",
    ]
    hinge = mujoco.mjtJoint.mjJNT_HINGE
    steer = [joint_id(model, f"{w}_steer") for w in WHEELS[:2]]
    spin = [joint_id(model, f"{w}_spin") for w in WHEELS]
    for j in steer:
        assert model.jnt_type[j] == hinge
        np.testing.assert_array_equal(model.jnt_axis[j], [0, 0, 1])
        assert model.jnt_limited[j] == 0
    for j in spin:
        assert model.jnt_type[j] == hinge
        np.testing.assert_array_equal(model.jnt_axis[j], [0, 1, 0])
        assert model.jnt_limited[j] == 0
    assert tuple(int(model.jnt_qposadr[j]) for j in steer) == car.STEER_QPOS
    assert tuple(int(model.jnt_dofadr[j]) for j in spin) == car.WHEEL_QVEL


def test_wheel_positions_in_the_body_frame(sim: Sim) -> None:
    """Steering hinges and wheel centres sit at the documented body-frame points:
    front axle at +wheelbase, rear axle at the origin, +-track/2 to the sides."""
    model, c = sim.model, sim.config
    data = sim.fresh()
    mujoco.mj_forward(model, data)  # default pose: chassis frame = world, shifted up by r
    expected = {
        "front_left": (c.wheelbase_m, c.track_width_m / 2),
        "front_right": (c.wheelbase_m, -c.track_width_m / 2),
        "rear_left": (0.0, c.track_width_m / 2),
        "rear_right": (0.0, -c.track_width_m / 2),
    }
    for name, (x, y) in expected.items():
        np.testing.assert_allclose(data.geom(f"{name}_tyre").xpos, [x, y, c.wheel_radius_m], atol=1e-12)
    for name in WHEELS[:2]:
        j = joint_id(model, f"{name}_steer")
        np.testing.assert_allclose(data.xanchor[j], data.geom(f"{name}_tyre").xpos, atol=1e-12)
    np.testing.assert_allclose(data.qpos[:7], [0, 0, c.wheel_radius_m, 1, 0, 0, 0])


def test_actuator_order_and_kind(sim: Sim) -> None:
    model, c = sim.model, sim.config
    names = [model.actuator(i).name for i in range(model.nu)]
    assert names == [
        "steer_front_left",
        "steer_front_right",
        "torque_front_left",
        "torque_front_right",
        "torque_rear_left",
        "torque_rear_right",
    ]
    targets = [f"{w}_steer" for w in WHEELS[:2]] + [f"{w}_spin" for w in WHEELS]
    for i, joint in enumerate(targets):
        assert model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT
        assert model.actuator_trnid[i, 0] == joint_id(model, joint)
        assert model.actuator_gear[i, 0] == 1.0
    # Steering: position servos, force = kp * (ctrl - q) - kv * qdot, ctrl within +-max steering.
    for i in (0, 1):
        assert model.actuator_gainprm[i, 0] == c.steer_kp
        np.testing.assert_array_equal(model.actuator_biasprm[i, :3], [0.0, -c.steer_kp, -c.steer_kv])
        assert model.actuator_ctrllimited[i] == 1
        np.testing.assert_allclose(model.actuator_ctrlrange[i], [-c.max_steering_rad, c.max_steering_rad])
    # Wheels: plain torque motors, no control or force clamp.
    for i in range(2, 6):
        assert model.actuator_gainprm[i, 0] == 1.0
        np.testing.assert_array_equal(model.actuator_biasprm[i, :3], 0.0)
        assert model.actuator_ctrllimited[i] == 0
        assert model.actuator_forcelimited[i] == 0


@pytest.mark.parametrize("config", [DEFAULT, OTHER], ids=["default", "other"])
def test_model_mass_matches_the_config(config: ProjectConfig) -> None:
    model = car.build_model(config)
    assert model.body_subtreemass[1] == pytest.approx(config.total_mass_kg, rel=1e-12)
    assert model.body_subtreemass[0] == pytest.approx(config.total_mass_kg, rel=1e-12)
    r = config.wheel_radius_m
    spin_inertia = []
    for name in WHEELS:
        body = model.body(name)
        assert body.mass[0] == pytest.approx(config.wheel_mass_kg)
        spin_inertia.append(body.inertia[1])
    np.testing.assert_allclose(spin_inertia, config.wheel_spin_inertia, rtol=1e-12)
    # The mass a longitudinal force accelerates, read off the model.
    effective = model.body_subtreemass[1] + sum(spin_inertia) / r**2
    assert effective == pytest.approx(config.effective_mass_kg, rel=1e-12)


@pytest.mark.parametrize("config", [DEFAULT, OTHER], ids=["default", "other"])
def test_tyres_are_spheres_and_only_tyre_ground_pairs_can_collide(config: ProjectConfig) -> None:
    model = car.build_model(config)
    ground = geom_id(model, "ground")
    assert model.geom_type[ground] == mujoco.mjtGeom.mjGEOM_PLANE
    assert model.geom_bodyid[ground] == 0
    tyres = {geom_id(model, f"{w}_tyre") for w in WHEELS}
    assert -1 not in tyres
    for g in tyres | {ground}:
        assert model.geom_friction[g, 0] == config.tyre_friction
    for g in tyres:
        assert model.geom_type[g] == mujoco.mjtGeom.mjGEOM_SPHERE
        assert model.geom_size[g, 0] == config.wheel_radius_m
        assert model.geom_condim[g] == 3
    can_collide = set()
    for a in range(model.ngeom):
        for b in range(a + 1, model.ngeom):
            if (model.geom_contype[a] & model.geom_conaffinity[b]) or (
                model.geom_contype[b] & model.geom_conaffinity[a]
            ):
                can_collide.add(frozenset((a, b)))
    assert can_collide == {frozenset((ground, t)) for t in tyres}


def test_settled_car_rests_on_exactly_four_tyre_contacts(sim: Sim) -> None:
    data = sim.settled()
    model, c = sim.model, sim.config
    assert data.ncon == 4
    ground = geom_id(model, "ground")
    tyres = []
    for i in range(data.ncon):
        contact = data.contact[i]
        pair = {int(contact.geom1), int(contact.geom2)}
        assert ground in pair
        (tyre,) = pair - {ground}
        tyres.append(model.geom(tyre).name)
        assert contact.friction[0] == pytest.approx(c.tyre_friction)
        # Contact point on the ground under the wheel centre.
        np.testing.assert_allclose(contact.pos[:2], data.geom_xpos[tyre][:2], atol=1e-6)
        assert abs(contact.pos[2]) < 1e-3
    assert sorted(tyres) == sorted(f"{w}_tyre" for w in WHEELS)
    # Sitting on its tyres, barely compressed, level.
    assert abs(data.qpos[2] - c.wheel_radius_m) < 1e-3
    np.testing.assert_allclose(data.qpos[3:7], [1, 0, 0, 0], atol=1e-5)
    np.testing.assert_allclose(data.qvel, 0.0, atol=1e-5)


# --------------------------------------------------------------------------- longitudinal


@pytest.mark.parametrize("a", ACCEL_COMMANDS)
def test_acceleration_from_rest_matches_the_command(sim: Sim, a: float) -> None:
    data = sim.settled()
    trace = sim.drive(data, (0.0, a), ACCEL_STEPS)
    measured = mean_acceleration(trace)
    assert measured == pytest.approx(a, rel=ACCEL_RTOL)
    # Every control step after the first, too.
    per_step = np.diff(trace.forward_speed[1:]) / np.diff(trace.time[1:])
    np.testing.assert_allclose(per_step, a, rtol=ACCEL_RTOL)
    # Straight ahead, wheels rolling with the car (the driven ones creep a few
    # mm/s ahead: MuJoCo's soft contact), not spinning up.
    assert np.max(np.abs(trace.qpos[:, 1])) < 1e-6
    v = trace.forward_speed[-1]
    np.testing.assert_allclose(trace.wheel_surface_speed(sim.config)[-1], v, rtol=WHEEL_SLIP_RTOL)


@pytest.mark.parametrize("a", BRAKE_COMMANDS)
def test_braking_deceleration_matches_the_command(
    braking_runs: dict[float, tuple[float, Trace, Trace]], a: float
) -> None:
    v0, braking, _ = braking_runs[a]
    assert v0 == pytest.approx(BRAKE_START_SPEED, rel=0.01)
    v = braking.forward_speed
    fast = np.nonzero(v > 2.0)[0]
    assert fast[0] == 0 and np.all(np.diff(fast) == 1)
    last = int(fast[-1])
    assert mean_acceleration(braking, last) == pytest.approx(a, rel=ACCEL_RTOL)
    per_step = np.diff(v[1 : last + 1]) / np.diff(braking.time[1 : last + 1])
    np.testing.assert_allclose(per_step, a, rtol=ACCEL_RTOL)
    # Stopping distance v0^2 / (2|a|); the fade near standstill adds only centimetres.
    distance = braking.qpos[-1, 0] - braking.qpos[0, 0]
    assert distance == pytest.approx(v0**2 / (2 * abs(a)), rel=ACCEL_RTOL)


@pytest.mark.parametrize("a", BRAKE_COMMANDS)
def test_braking_stops_the_car_and_holds_it_without_reverse(
    braking_runs: dict[float, tuple[float, Trace, Trace]], a: float
) -> None:
    _, braking, hold = braking_runs[a]
    assert abs(braking.forward_speed[-1]) < 1e-3, "at rest by the end of the brake run"
    assert np.min(braking.forward_speed) > NO_REVERSE_MPS
    v = hold.forward_speed
    assert np.min(v) > NO_REVERSE_MPS, "a negative command at standstill must not reverse"
    assert np.max(np.abs(v)) < 1e-3
    assert np.max(np.abs(hold.qpos[:, 0:2] - hold.qpos[0, 0:2])) < STILL_DRIFT_M
    np.testing.assert_allclose(hold.qvel[:, list(car.WHEEL_QVEL)], 0.0, atol=0.01)


def test_rear_wheels_do_not_lock_at_full_braking(
    braking_runs: dict[float, tuple[float, Trace, Trace]],
) -> None:
    _, braking, _ = braking_runs[DEFAULT.min_acceleration_mps2]
    v = braking.forward_speed
    fast = v > 2.0
    surface = braking.wheel_surface_speed(DEFAULT)[fast]
    ratio = surface / v[fast, None]
    np.testing.assert_allclose(ratio[:, 2:], 1.0, atol=WHEEL_SLIP_RTOL, err_msg="rear wheels")
    np.testing.assert_allclose(ratio[:, :2], 1.0, atol=WHEEL_SLIP_RTOL, err_msg="front wheels")


def test_acceleration_and_braking_mapping_holds_for_another_car(other_sim: Sim) -> None:
    data = other_sim.settled()
    accel = other_sim.drive(data, (0.0, 3.0), ACCEL_STEPS)
    assert mean_acceleration(accel) == pytest.approx(3.0, rel=ACCEL_RTOL)
    brake = other_sim.drive(data, (0.0, -6.0), 140)
    v = brake.forward_speed
    last = int(np.nonzero(v > 2.0)[0][-1])
    assert mean_acceleration(brake, last) == pytest.approx(-6.0, rel=ACCEL_RTOL)
    assert abs(v[-1]) < 1e-3 and np.min(v) > NO_REVERSE_MPS


# --------------------------------------------------------------------------- steering


@pytest.fixture(scope="module")
def at_steer_speed(sim: Sim) -> mujoco.MjData:
    return sim.at_speed(STEER_SPEED)


@pytest.mark.parametrize("steer", STEER_COMMANDS)
def test_steering_angle_tracks_the_command(sim: Sim, at_steer_speed: mujoco.MjData, steer: float) -> None:
    data = copy.copy(at_steer_speed)
    assert body_velocity(data.qpos, data.qvel)[0] == pytest.approx(STEER_SPEED, rel=0.02)
    trace = sim.drive(data, (steer, 0.0), STEER_STEPS)
    qpos, qvel = trace.qpos[-1], trace.qvel[-1]
    for name in WHEELS[:2]:
        adr = sim.model.jnt_qposadr[joint_id(sim.model, f"{name}_steer")]
        assert abs(qpos[adr] - steer) < STEER_ATOL, name
    state = car.planar_state(jnp.asarray(qpos[None], jnp.float32), jnp.asarray(qvel[None], jnp.float32))
    assert abs(float(state["steering_angle"][0]) - steer) < STEER_ATOL
    np.testing.assert_array_equal(trace.ctrl[:, :2], np.float32(steer))
    assert trace.forward_speed[-1] > 0.8 * STEER_SPEED, "still rolling"


@pytest.fixture(scope="module")
def at_yaw_speed(sim: Sim) -> mujoco.MjData:
    return sim.at_speed(YAW_SPEED)


@pytest.mark.parametrize("steer", YAW_COMMANDS)
def test_yaw_rate_matches_the_kinematic_bicycle(sim: Sim, at_yaw_speed: mujoco.MjData, steer: float) -> None:
    data = copy.copy(at_yaw_speed)
    trace = sim.drive(data, (steer, 0.0), YAW_STEPS)
    window = slice(YAW_STEPS // 2 + 1, YAW_STEPS + 1)  # the second second, after the transient
    v = trace.forward_speed[window]
    assert np.all(np.abs(v - YAW_SPEED) < 0.02 * YAW_SPEED)
    yaw_rate = trace.qvel[window, 5]
    bicycle = v * np.tan(steer) / sim.config.wheelbase_m
    assert np.mean(yaw_rate) / np.mean(bicycle) == pytest.approx(1.0, abs=YAW_RTOL)
    # The heading actually turns at that rate (planar yaw from the quaternion).
    rot = quat_to_mat(trace.qpos[window, 3:7])
    heading = np.unwrap(np.arctan2(rot[:, 1, 0], rot[:, 0, 0]))
    turned = (heading[-1] - heading[0]) / (trace.time[window][-1] - trace.time[window][0])
    assert turned / np.mean(bicycle) == pytest.approx(1.0, abs=YAW_RTOL)


def test_zero_action_at_rest_holds_the_car_still(sim: Sim) -> None:
    data = sim.settled()
    trace = sim.drive(data, (0.0, 0.0), int(round(5.0 / sim.config.control_dt_s)))
    drift = np.linalg.norm(trace.qpos[:, 0:3] - trace.qpos[0, 0:3], axis=1)
    assert np.max(drift) < STILL_DRIFT_M
    quat = trace.qpos[:, 3:7]
    np.testing.assert_allclose(quat, np.broadcast_to(quat[0], quat.shape), atol=1e-6)
    np.testing.assert_array_equal(trace.ctrl, 0.0)


# --------------------------------------------------------------------------- read-outs


def random_states(rng: np.random.Generator, n: int, tilt: float) -> tuple[np.ndarray, np.ndarray]:
    """float64 qpos [n, NQ], qvel [n, NV]: any yaw, roll/pitch up to `tilt`, random
    quaternion sign, random velocities and joint angles."""
    yaw = rng.uniform(-np.pi, np.pi, n)
    yaw[:4] = [0.0, np.pi / 2, -np.pi / 2, np.pi - 1e-3]
    quat = quat_mul(
        axis_quat(yaw, 2),
        quat_mul(axis_quat(rng.uniform(-tilt, tilt, n), 1), axis_quat(rng.uniform(-tilt, tilt, n), 0)),
    )
    quat *= rng.choice([-1.0, 1.0], size=(n, 1))
    qpos = np.concatenate(
        [
            rng.uniform(-300, 300, (n, 2)),
            rng.uniform(0.2, 0.4, (n, 1)),
            quat,
            rng.uniform(-0.6, 0.6, (n, car.NQ - 7)),
        ],
        axis=1,
    )
    qvel = np.concatenate(
        [rng.uniform(-30, 30, (n, 3)), rng.uniform(-2, 2, (n, 3)), rng.uniform(-100, 100, (n, car.NV - 6))],
        axis=1,
    )
    return qpos, qvel


@pytest.mark.parametrize("tilt", [0.0, 0.1], ids=["level", "tilted"])
def test_planar_state_matches_numpy(tilt: float) -> None:
    qpos, qvel = random_states(np.random.default_rng(20261201), 256, tilt)
    state = car.planar_state(jnp.asarray(qpos, jnp.float32), jnp.asarray(qvel, jnp.float32))
    assert set(state) == {"position", "yaw", "velocity_body", "yaw_rate", "steering_angle"}
    shapes = {
        "position": (256, 2),
        "yaw": (256,),
        "velocity_body": (256, 2),
        "yaw_rate": (256,),
        "steering_angle": (256,),
    }
    for key, value in state.items():
        assert value.dtype == jnp.float32, key
        assert value.shape == shapes[key], key

    rot = quat_to_mat(qpos[:, 3:7])
    heading = rot[:, 0:2, 0] / np.linalg.norm(rot[:, 0:2, 0], axis=1, keepdims=True)
    left = np.stack([-heading[:, 1], heading[:, 0]], axis=1)
    yaw = np.arctan2(heading[:, 1], heading[:, 0])
    velocity_body = np.stack([np.sum(heading * qvel[:, 0:2], 1), np.sum(left * qvel[:, 0:2], 1)], axis=1)

    np.testing.assert_allclose(np.asarray(state["position"]), qpos[:, 0:2], rtol=1e-6)
    got_yaw = np.asarray(state["yaw"])
    assert np.all(np.abs(got_yaw) <= np.pi)
    np.testing.assert_allclose(wrap(got_yaw - yaw), 0.0, atol=2e-6)
    np.testing.assert_allclose(np.asarray(state["velocity_body"]), velocity_body, atol=5e-5)
    np.testing.assert_allclose(np.asarray(state["yaw_rate"]), qvel[:, 5], rtol=1e-6)
    steer = 0.5 * (qpos[:, car.STEER_QPOS[0]] + qpos[:, car.STEER_QPOS[1]])
    np.testing.assert_allclose(np.asarray(state["steering_angle"]), steer, atol=1e-6)
    if tilt == 0.0:
        # On level ground the body velocity is the full rotation R^T v.
        full = body_velocity(qpos, qvel)[:, 0:2]
        np.testing.assert_allclose(np.asarray(state["velocity_body"]), full, atol=5e-5)


def test_start_qpos_places_the_rear_axle_at_the_pose() -> None:
    rng = np.random.default_rng(7)
    n = 64
    x, y = rng.uniform(-500, 500, n), rng.uniform(-500, 500, n)
    yaw = rng.uniform(-np.pi, np.pi, n)
    qpos = car.start_qpos(DEFAULT, *(jnp.asarray(v, jnp.float32) for v in (x, y, yaw)))
    assert qpos.shape == (n, car.NQ) and qpos.dtype == jnp.float32
    qpos = np.asarray(qpos, np.float64)
    np.testing.assert_allclose(qpos[:, 0], x, rtol=1e-6)
    np.testing.assert_allclose(qpos[:, 1], y, rtol=1e-6)
    np.testing.assert_allclose(qpos[:, 2], DEFAULT.wheel_radius_m, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(qpos[:, 3:7], axis=1), 1.0, atol=1e-6)
    rot = quat_to_mat(qpos[:, 3:7])
    np.testing.assert_allclose(rot[:, 2, 2], 1.0, atol=1e-6)  # level
    np.testing.assert_allclose(wrap(np.arctan2(rot[:, 1, 0], rot[:, 0, 0]) - yaw), 0.0, atol=1e-5)
    np.testing.assert_array_equal(qpos[:, 7:], 0.0)  # wheels straight, not turned


def test_start_qpos_in_mujoco_puts_the_tyres_on_the_wheel_points(sim: Sim) -> None:
    x, y, yaw = 12.5, -40.0, 2.4
    x_, y_, yaw_ = (jnp.array([v], jnp.float32) for v in (x, y, yaw))
    qpos = car.start_qpos(DEFAULT, x_, y_, yaw_)
    data = sim.fresh()
    data.qpos[:] = np.asarray(qpos[0], np.float64)
    mujoco.mj_forward(sim.model, data)
    np.testing.assert_allclose(data.xpos[1], [x, y, DEFAULT.wheel_radius_m], atol=1e-5)
    points = np.asarray(car.wheel_points(DEFAULT, jnp.stack([x_, y_], axis=1), yaw_))[0]
    centres = np.array([data.geom(f"{w}_tyre").xpos for w in WHEELS])
    np.testing.assert_allclose(centres[:, 0:2], points, atol=1e-4)
    np.testing.assert_allclose(centres[:, 2], DEFAULT.wheel_radius_m, atol=1e-5)
    # It then settles onto four contacts without moving off the pose.
    sim.drive(data, (0.0, 0.0), SETTLE_STEPS)
    assert data.ncon == 4
    np.testing.assert_allclose(data.qpos[0:2], [x, y], atol=1e-4)


@pytest.mark.parametrize("config", [DEFAULT, OTHER], ids=["default", "other"])
def test_wheel_points_match_numpy(config: ProjectConfig) -> None:
    rng = np.random.default_rng(11)
    n = 128
    position = rng.uniform(-300, 300, (n, 2))
    yaw = rng.uniform(-np.pi, np.pi, n)
    got = car.wheel_points(config, jnp.asarray(position, jnp.float32), jnp.asarray(yaw, jnp.float32))
    assert got.shape == (n, 4, 2) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), oracle_wheel_points(config, position, yaw), atol=1e-4)
    # Distances between the points are the car's geometry whatever the pose.
    got = np.asarray(got, np.float64)
    np.testing.assert_allclose(np.linalg.norm(got[:, 0] - got[:, 2], axis=1), config.wheelbase_m, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(got[:, 2] - got[:, 3], axis=1), config.track_width_m, atol=1e-4)


# --------------------------------------------------------------------------- controls


def spins(rng: np.random.Generator, n: int, config: ProjectConfig) -> np.ndarray:
    """float32 qvel [n, NV] whose wheel surface speeds cover the fade band, zero,
    both signs and full speed."""
    qvel = rng.uniform(-5, 5, (n, car.NV))
    fade = config.brake_fade_speed_mps / config.wheel_radius_m  # rad/s at the fade speed
    choices = np.array([0.0, 0.25 * fade, -0.5 * fade, 0.999 * fade, fade, -1.5 * fade, 60.0, -60.0])
    qvel[:, list(car.WHEEL_QVEL)] = rng.choice(choices, size=(n, 4)) * rng.uniform(0.9, 1.0, (n, 4))
    return qvel.astype(np.float32)


@pytest.mark.parametrize("config", [DEFAULT, OTHER], ids=["default", "other"])
def test_controls_match_the_documented_mapping(config: ProjectConfig) -> None:
    rng = np.random.default_rng(3)
    n = 512
    accel = rng.uniform(config.min_acceleration_mps2, config.max_acceleration_mps2, n)
    accel[:3] = [0.0, config.min_acceleration_mps2, config.max_acceleration_mps2]
    steer = rng.uniform(-config.max_steering_rad, config.max_steering_rad, n)
    action = np.stack([steer, accel], 1).astype(np.float32)
    qvel = spins(rng, n, config)
    got = jax.jit(functools.partial(car.controls, config))(jnp.asarray(action), jnp.asarray(qvel))
    assert got.shape == (n, car.NU) and got.dtype == jnp.float32
    got = np.asarray(got, np.float64)
    np.testing.assert_array_equal(got[:, 0], action[:, 0])
    np.testing.assert_array_equal(got[:, 1], action[:, 0])
    spin = qvel[:, list(car.WHEEL_QVEL)].astype(np.float64)
    expected = oracle_wheel_torques(config, action[:, 1].astype(np.float64), spin)
    np.testing.assert_allclose(got[:, 2:], expected, rtol=1e-5, atol=1e-3)


def test_drive_torque_goes_to_the_rear_wheels_only() -> None:
    rng = np.random.default_rng(5)
    a = np.array([0.5, 1.0, 2.0, 4.0], np.float32)
    action = np.stack([np.zeros(4), a], 1).astype(np.float32)
    qvel = spins(rng, 4, DEFAULT)
    torque = np.asarray(car.controls(DEFAULT, jnp.asarray(action), jnp.asarray(qvel)), np.float64)[:, 2:]
    np.testing.assert_array_equal(torque[:, 0:2], 0.0)
    np.testing.assert_allclose(torque[:, 2], torque[:, 3])
    total = DEFAULT.effective_mass_kg * a * DEFAULT.wheel_radius_m
    np.testing.assert_allclose(torque.sum(1), total, rtol=1e-6)
    # Drive does not depend on the wheels' spin (same command, wheels at rest).
    still = np.asarray(car.controls(DEFAULT, jnp.asarray(action), jnp.zeros((4, car.NV), jnp.float32)))[:, 2:]
    np.testing.assert_allclose(still, torque, rtol=1e-6)


def test_zero_command_gives_zero_torque() -> None:
    qvel = spins(np.random.default_rng(6), 16, DEFAULT)
    action = np.zeros((16, 2), np.float32)
    action[:, 0] = np.linspace(-0.6, 0.6, 16)
    got = np.asarray(car.controls(DEFAULT, jnp.asarray(action), jnp.asarray(qvel)))
    np.testing.assert_array_equal(got[:, 2:], 0.0)


@pytest.mark.parametrize("config", [DEFAULT, OTHER], ids=["default", "other"])
def test_braking_shares_fade_and_sign(config: ProjectConfig) -> None:
    r = config.wheel_radius_m
    a = -5.0
    total = config.effective_mass_kg * abs(a) * r
    fast = 20.0 / r  # rad/s, well above the fade speed
    action = jnp.asarray([[0.0, a]] * 3, jnp.float32)
    qvel = np.zeros((3, car.NV), np.float32)
    qvel[0, list(car.WHEEL_QVEL)] = fast  # rolling forward
    qvel[1, list(car.WHEEL_QVEL)] = -fast  # rolling backward
    qvel[2, list(car.WHEEL_QVEL)] = 0.0  # at rest
    torque = np.asarray(car.controls(config, action, jnp.asarray(qvel)), np.float64)[:, 2:]
    # Full torque above the fade speed, opposing the spin, split by brake_front_share.
    assert torque[0, 0:2].sum() == pytest.approx(-config.brake_front_share * total, rel=1e-6)
    assert torque[0, 2:4].sum() == pytest.approx(-(1 - config.brake_front_share) * total, rel=1e-6)
    assert torque[0].sum() == pytest.approx(-total, rel=1e-6)
    np.testing.assert_allclose(torque[0, 0], torque[0, 1])
    np.testing.assert_allclose(torque[0, 2], torque[0, 3])
    np.testing.assert_allclose(torque[1], -torque[0], rtol=1e-6)
    np.testing.assert_array_equal(torque[2], 0.0)  # no torque, so no reverse, at standstill

    # Fade: proportional to the surface speed below brake_fade_speed_mps, full above.
    surface = np.array([0.0, 0.1, 0.25, 0.5, 0.75, 0.999, 1.0, 1.2, 3.0]) * config.brake_fade_speed_mps
    n = len(surface)
    qvel = np.zeros((n, car.NV), np.float32)
    qvel[:, list(car.WHEEL_QVEL)] = (surface / r)[:, None]
    fade_action = jnp.asarray([[0.0, a]] * n, jnp.float32)
    fade_torque = np.asarray(car.controls(config, fade_action, jnp.asarray(qvel)), np.float64)[:, 2:]
    expected_fraction = np.minimum(surface / config.brake_fade_speed_mps, 1.0)
    np.testing.assert_allclose(fade_torque.sum(1), -total * expected_fraction, rtol=1e-5, atol=1e-6)


def test_controls_per_wheel_fade_and_sign_are_independent() -> None:
    """Each wheel's braking torque follows its own spin."""
    r, fade_speed = DEFAULT.wheel_radius_m, DEFAULT.brake_fade_speed_mps
    qvel = np.zeros((1, car.NV), np.float32)
    qvel[0, list(car.WHEEL_QVEL)] = np.array([30.0, -0.5 * fade_speed, 0.0, 0.25 * fade_speed]) / r
    action = jnp.asarray([[0.2, -8.0]], jnp.float32)
    torque = np.asarray(car.controls(DEFAULT, action, jnp.asarray(qvel)), np.float64)[0, 2:]
    total = DEFAULT.effective_mass_kg * 8.0 * r
    front, rear = DEFAULT.brake_front_share / 2 * total, (1 - DEFAULT.brake_front_share) / 2 * total
    np.testing.assert_allclose(torque, [-front, 0.5 * front, 0.0, -0.25 * rear], rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- config validation


def test_default_config_and_derived_values() -> None:
    c = DEFAULT
    assert c.control_dt_s == pytest.approx(0.02)
    assert c.total_mass_kg == pytest.approx(1110.0 + 4 * 20.0)
    assert c.wheel_spin_inertia == pytest.approx(0.4 * 20.0 * 0.33**2)
    assert c.effective_mass_kg == pytest.approx(1190.0 + 4 * 0.4 * 20.0)
    # The public action ranges of the issue.
    assert (c.max_steering_rad, c.min_acceleration_mps2, c.max_acceleration_mps2) == (0.6, -8.0, 4.0)
    assert OTHER.control_dt_s == pytest.approx(OTHER.physics_dt_s * OTHER.substeps)


INT_FIELDS = ["substeps", "solver_iterations", "ls_iterations"]
FLOAT_FIELDS = [
    f.name
    for f in dataclasses.fields(ProjectConfig)
    if f.name not in (*INT_FIELDS, "chassis_size_m", "min_acceleration_mps2")
]


def _bad(field: str, value: object, error: type[Exception], match: str | None = None) -> None:
    with pytest.raises(error, match=re.escape(match or field)):
        ProjectConfig(**{field: value})


@pytest.mark.parametrize("value", [-1.0, 0.0, float("nan"), float("inf"), -float("inf"), 0], ids=repr)
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_positive_float_fields_refuse_bad_values(field: str, value: float) -> None:
    _bad(field, value, ValueError)


@pytest.mark.parametrize("value", [True, False, "1.0", None, [1.0]], ids=repr)
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_float_fields_refuse_wrong_types(field: str, value: object) -> None:
    _bad(field, value, TypeError)


@pytest.mark.parametrize("field", INT_FIELDS)
def test_count_fields(field: str) -> None:
    for value in (0, -1):
        _bad(field, value, ValueError)
    for value in (True, 2.0, 1.5, "2", None):
        _bad(field, value, TypeError)
    assert getattr(ProjectConfig(**{field: 1}), field) == 1


def test_chassis_size_validation() -> None:
    _bad("chassis_size_m", [4.2, 1.75, 0.5], TypeError)
    _bad("chassis_size_m", (4.2, 1.75), TypeError)
    _bad("chassis_size_m", (4.2, 1.75, 0.5, 1.0), TypeError)
    _bad("chassis_size_m", (4.2, 0.0, 0.5), ValueError, "chassis_size_m[1]")
    _bad("chassis_size_m", (4.2, 1.75, float("nan")), ValueError, "chassis_size_m[2]")
    _bad("chassis_size_m", (-4.2, 1.75, 0.5), ValueError, "chassis_size_m[0]")
    _bad("chassis_size_m", (4.2, True, 0.5), TypeError, "chassis_size_m[1]")


def test_min_acceleration_validation() -> None:
    for value in (0.0, 0, 1.0, float("nan"), -float("inf")):
        _bad("min_acceleration_mps2", value, ValueError)
    for value in (True, "-8", None):
        _bad("min_acceleration_mps2", value, TypeError)
    assert ProjectConfig(min_acceleration_mps2=-1e-3).min_acceleration_mps2 == -1e-3


def test_brake_front_share_validation() -> None:
    for value in (1.0000001, 1.5, 2.0):
        _bad("brake_front_share", value, ValueError)
    assert ProjectConfig(brake_front_share=1.0).brake_front_share == 1.0
    assert ProjectConfig(brake_front_share=1e-3).brake_front_share == 1e-3


def test_centre_of_mass_must_lie_between_the_axles() -> None:
    for com in (2.6, 3.0, 0.0, -0.1):
        _bad("com_ahead_of_rear_axle_m", com, ValueError)
    with pytest.raises(ValueError, match="com_ahead_of_rear_axle_m"):
        ProjectConfig(wheelbase_m=1.4)  # the default CoM (1.43 m) now lies ahead of the front axle
    assert ProjectConfig(com_ahead_of_rear_axle_m=2.59).com_ahead_of_rear_axle_m == 2.59


def test_an_accepted_chassis_mass_builds_a_model() -> None:
    """The model takes two 1 kg steering knuckles out of chassis_mass_kg. A
    config that leaves no sprung mass must be refused by ProjectConfig naming
    the field, or still build; it must not reach MuJoCo's compiler."""
    try:
        config = ProjectConfig(chassis_mass_kg=2.0)
    except ValueError as error:
        assert "chassis_mass_kg" in str(error)
        return
    model = car.build_model(config)
    assert model.body_subtreemass[1] == pytest.approx(config.total_mass_kg)


def test_config_and_level_are_frozen() -> None:
    config = ProjectConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.wheel_radius_m = 0.4
    with pytest.raises(dataclasses.FrozenInstanceError):
        LEVEL_0.max_episode_steps = 10
    assert config == ProjectConfig() and hash(config) == hash(ProjectConfig())
    with pytest.raises(ValueError, match="wheel_radius_m"):
        dataclasses.replace(config, wheel_radius_m=-1.0)


def test_level_validation() -> None:
    assert (LEVEL_0.level_id, LEVEL_0.max_episode_steps) == (0, 3970)
    assert Level(level_id=0, name="x", max_episode_steps=1).level_id == 0
    cases = [
        (dict(level_id=-1), ValueError, "level_id"),
        (dict(level_id=True), TypeError, "level_id"),
        (dict(level_id=1.0), TypeError, "level_id"),
        (dict(level_id="0"), TypeError, "level_id"),
        (dict(name=""), (TypeError, ValueError), "name"),
        (dict(name=3), TypeError, "name"),
        (dict(max_episode_steps=0), ValueError, "max_episode_steps"),
        (dict(max_episode_steps=-5), ValueError, "max_episode_steps"),
        (dict(max_episode_steps=10.0), TypeError, "max_episode_steps"),
        (dict(max_episode_steps=False), TypeError, "max_episode_steps"),
        (dict(max_episode_steps=2**31), ValueError, r"max_episode_steps must be in \[1, 2147483647\]"),
        (dict(max_episode_steps=10**30), ValueError, "max_episode_steps"),
    ]
    for override, error, field in cases:
        kwargs = dict(level_id=1, name="one", max_episode_steps=100) | override
        with pytest.raises(error, match=field):
            Level(**kwargs)


@pytest.mark.parametrize("field", ["substeps", "solver_iterations", "ls_iterations"])
def test_iteration_counts_are_bounded(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ProjectConfig(**{field: 10**9})
