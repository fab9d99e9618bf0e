"""Tests for racing_env.envelope: the car's measured envelope.

The envelope is measured once on the short schedule (a few seconds of one
CPU core) and held against references it does not compute itself:

- a steady circle's lateral acceleration against the circle fitted to the
  car's own path (v^2 / R, its sideslip read off the path's tangent and the
  heading) and against v times the yaw rate;
- the straight-line limits against the action range of `ProjectConfig`
  (the documented mapping makes the command the car's acceleration while
  the tyres grip);
- the lateral limit against the friction and the cone of the compiled
  MJCF (sliding friction mu, gravity, MuJoCo's pyramidal cone, whose
  weakest directions are the world diagonals: mu g / sqrt 2);
- every g-g point against the most friction a pyramidal cone gives, mu g;
- the rig's trajectory against `CpuReferencePhysics` stepped by hand with
  `car.controls`, as the ``cpu_reference`` backend steps it;
- `config_hash` against its documented recipe, interpolation against
  hand-made tables.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import jax
import jax.numpy as jnp
import mujoco
import numpy as np
import pytest

from racing_env import car
from racing_env._rig import Rig
from racing_env.config import ProjectConfig
from racing_env.envelope import (
    FORMAT,
    SHORT_SCHEDULE,
    Envelope,
    Schedule,
    config_hash,
    measure_envelope,
    steady_circle,
)
from racing_env.physics import CpuReferencePhysics

#: The axis-aligned heading and the diagonal of the short schedule.
AXIS, DIAGONAL = 0, 1


@pytest.fixture(scope="module")
def measured(config) -> Envelope:
    assert SHORT_SCHEDULE.headings_rad == (0.0, math.pi / 4)
    return measure_envelope(config, SHORT_SCHEDULE)


def tyre_reference(config: ProjectConfig) -> tuple[float, float, bool]:
    """(mu, g, pyramidal) read off the compiled model: MuJoCo combines two
    geoms' friction by the larger one (the default ``priority``/``solmix``)."""
    model = car.build_model(config)
    tyre = model.geom("rear_left_tyre").id
    ground = model.geom("ground").id
    mu = max(model.geom_friction[tyre, 0], model.geom_friction[ground, 0])
    return float(mu), float(np.linalg.norm(model.opt.gravity)), model.opt.cone == mujoco.mjtCone.mjCONE_PYRAMIDAL


# --------------------------------------------------------------------------- a steady circle


def fit_circle(xy: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(centre [2], radius, largest radial residual) of the least-squares
    circle x^2 + y^2 + D x + E y + F = 0 through the points (Kasa's fit)."""
    x, y = xy[:, 0], xy[:, 1]
    (d, e, f), *_ = np.linalg.lstsq(np.stack([x, y, np.ones_like(x)], 1), -(x * x + y * y), rcond=None)
    centre = np.array([-d / 2, -e / 2])
    radius = math.sqrt(centre @ centre - f)
    return centre, radius, float(np.abs(np.hypot(x - centre[0], y - centre[1]) - radius).max())


@pytest.mark.parametrize("speed, lateral", [(10.0, 4.0), (20.0, 5.0)])
def test_a_steady_circles_lateral_acceleration_is_v_squared_over_r_of_its_own_path(config, speed, lateral):
    steering = math.atan(config.wheelbase_m * lateral / speed**2)
    lap_s = 2 * math.pi * speed / lateral
    run = steady_circle(config, speed, steering, duration_s=1.05 * lap_s)
    centre, radius, residual = fit_circle(run.com_xy)
    assert residual < 0.01 * radius  # a circle indeed
    assert np.ptp(run.speed_mps) < 0.01 * speed  # at a held speed
    centripetal = np.mean(run.speed_mps**2) / radius
    # The centre of mass's sideslip: its path's tangent against the heading.
    tangent = np.gradient(run.com_xy, axis=0)
    beta = np.angle(np.exp(1j * (np.arctan2(tangent[:, 1], tangent[:, 0]) - run.yaw_rad)))[5:-5].mean()
    assert np.mean(run.a_y_mps2) == pytest.approx(centripetal * math.cos(beta), rel=5e-3)
    assert np.mean(run.a_x_mps2) == pytest.approx(-centripetal * math.sin(beta), abs=5e-3 * centripetal)
    assert np.mean(run.speed_mps * run.yaw_rate_radps) == pytest.approx(centripetal, rel=5e-3)
    assert np.mean(run.a_y_mps2) == pytest.approx(lateral, rel=0.05)  # and near what the steering asked for


def test_the_rig_steps_the_car_as_the_cpu_reference_backend_does(config):
    """Reading the car after each step changes nothing MuJoCo integrates:
    the rig's trajectory is the one of `CpuReferencePhysics` stepped by hand
    with the env's mapping, bitwise."""
    actions = [(0.0, 4.0)] * 30 + [(0.2, 1.0)] * 30 + [(-0.3, -8.0)] * 30 + [(0.7, 9.0)] * 10  # the last clipped
    rig = Rig(config)
    rig.launch(0.3, 0.0)
    reference = CpuReferencePhysics(config, 1)
    reference.set_integration_state(rig.physics.integration_state())
    controls = jax.jit(lambda a, qvel: car.controls(config, a, qvel))
    low = np.array([-config.max_steering_rad, config.min_acceleration_mps2])
    high = np.array([config.max_steering_rad, config.max_acceleration_mps2])
    for action in actions:
        rig.step(*action)
        clipped = jnp.asarray(np.clip(action, low, high)[None], jnp.float32)
        _, qvel = reference.kinematics()
        reference.step(np.asarray(controls(clipped, jnp.asarray(qvel, jnp.float32)), np.float64))
    np.testing.assert_array_equal(rig.physics.integration_state(), reference.integration_state())
    assert reference.mj_model.opt.timestep == config.physics_dt_s and rig.dt == config.control_dt_s


# --------------------------------------------------------------------------- the measured envelope


def test_forward_acceleration_on_the_axis_is_the_commanded_maximum(config, measured):
    """On a world axis the tyres grip at full throttle: the car accelerates
    at the configured maximum (drive torque = effective mass x a x r)."""
    limit = config.max_acceleration_mps2
    np.testing.assert_allclose(measured.forward_by_heading_mps2[AXIS], limit, rtol=2e-3)
    np.testing.assert_allclose(measured.from_rest_by_heading_mps2[AXIS], limit, rtol=2e-3)
    # No heading does better than the command, and the envelope is the least over headings.
    assert np.all(measured.forward_by_heading_mps2 <= limit * 1.01)
    np.testing.assert_array_equal(measured.forward_mps2, measured.forward_by_heading_mps2.min(axis=0))
    assert np.all(measured.forward_mps2 > 0)


def test_braking_is_positive_and_on_the_axis_the_commanded_maximum(config, measured):
    limit = -config.min_acceleration_mps2
    assert np.all(np.isfinite(measured.braking_mps2)) and np.all(measured.braking_mps2 > 0)
    np.testing.assert_allclose(measured.braking_by_heading_mps2[AXIS], limit, rtol=2e-3)  # flat: monotone enough
    assert np.all(measured.braking_by_heading_mps2 <= limit * 1.01)
    np.testing.assert_array_equal(measured.braking_mps2, measured.braking_by_heading_mps2.min(axis=0))


def test_the_diagonal_grips_less_than_the_axis(measured):
    """MuJoCo's pyramidal cone has its edges on the world axes: on the
    diagonal the full brake locks the front wheels, and full throttle from
    rest lifts the rear axle off the ground (no band is finished)."""
    assert np.all(measured.braking_by_heading_mps2[DIAGONAL] < 0.95 * measured.braking_by_heading_mps2[AXIS])
    assert np.all(np.isnan(measured.from_rest_by_heading_mps2[DIAGONAL]))


def test_the_lateral_limit_is_the_friction_of_the_cones_weakest_direction(config, measured):
    mu, g, pyramidal = tyre_reference(config)
    assert pyramidal and mu == config.tyre_friction
    weakest = mu * g / math.sqrt(2)
    assert np.all(measured.lateral_mps2 >= 0.9 * weakest), measured.lateral_mps2
    assert np.all(measured.lateral_mps2 <= 1.02 * weakest), measured.lateral_mps2
    assert set(measured.lateral_limited_by) <= {"loss", "plateau"}
    # The steering the limit took: near the kinematic (bicycle) steering, a little more (the tyres slip).
    kinematic = np.arctan(config.wheelbase_m * measured.lateral_mps2 / measured.speeds_mps**2)
    assert np.all(measured.lateral_steering_rad >= 0.95 * kinematic)
    assert np.all(measured.lateral_steering_rad <= 1.5 * kinematic)


def test_the_gg_polygon_is_closed_combined_and_within_the_friction_of_the_cone(config, measured):
    mu, g, _ = tyre_reference(config)
    polygon = measured.gg_at(10.0)
    assert np.array_equal(polygon[0], polygon[-1])
    a_x, a_y = polygon[:-1, 0], polygon[:-1, 1]
    assert np.all(np.hypot(a_x, a_y) <= 1.03 * mu * g)  # a pyramid's edges: mu N at most
    assert np.all(a_x <= config.max_acceleration_mps2 * 1.01) and np.all(a_x >= config.min_acceleration_mps2 * 1.01)
    assert np.any((np.abs(a_x) > 1.0) & (np.abs(a_y) > 1.0))  # combined points
    assert np.max(np.abs(a_y)) == pytest.approx(measured.lateral_at(10.0), rel=0.1)
    # Mirrored to the right-hand turn, counter-clockwise about the origin.
    np.testing.assert_allclose(np.sort(a_y), np.sort(-a_y), atol=1e-6)  # straight points are not mirrored
    angles = np.unwrap(np.arctan2(a_y, a_x))
    assert np.all(np.diff(angles) >= 0) and angles[-1] - angles[0] < 2 * math.pi


def test_the_envelope_names_its_car(config, measured):
    assert measured.config_sha256 == config_hash(config)


# --------------------------------------------------------------------------- the Envelope object


def test_json_round_trip_keeps_every_field(measured):
    text = measured.to_json()
    assert json.loads(text)["format"] == FORMAT
    back = Envelope.from_json(text)
    for field in dataclasses.fields(Envelope):
        ours, theirs = getattr(measured, field.name), getattr(back, field.name)
        if field.name == "gg":
            assert len(ours) == len(theirs)
            for a, b in zip(ours, theirs):
                np.testing.assert_array_equal(a, b)
        elif isinstance(ours, np.ndarray):
            np.testing.assert_array_equal(ours, theirs)  # NaN == NaN here
        else:
            assert ours == theirs, field.name
    assert back.to_json() == text


def hand_envelope(**changes) -> Envelope:
    """A small envelope with round numbers, made by hand."""
    fields = dict(
        config_sha256="0" * 64,
        speeds_mps=[10.0, 20.0, 40.0],
        lateral_mps2=[6.0, 7.0, 9.0],
        forward_mps2=[4.0, 3.0, 1.0],
        braking_mps2=[8.0, 8.0, 6.0],
        headings_rad=[0.0],
        forward_by_heading_mps2=[[4.0, 3.0, 1.0]],
        braking_by_heading_mps2=[[8.0, 8.0, 6.0]],
        from_rest_by_heading_mps2=[[4.0, 3.0, math.nan]],
        lateral_steering_rad=[0.2, 0.05, 0.02],
        lateral_limited_by=("plateau", "loss", "loss"),
        gg_speeds_mps=[20.0],
        gg_heading_rad=0.0,
        gg=([[4.0, 0.0], [0.0, 7.0], [-8.0, 0.0], [0.0, -7.0], [4.0, 0.0]],),
    )
    return Envelope(**{**fields, **changes})


def test_interpolation_between_and_at_the_ends():
    env = hand_envelope()
    for i, v in enumerate([10.0, 20.0, 40.0]):
        assert env.lateral_at(v) == [6.0, 7.0, 9.0][i]
        assert env.forward_at(v) == [4.0, 3.0, 1.0][i]
        assert env.braking_at(v) == [8.0, 8.0, 6.0][i]
    assert env.lateral_at(15.0) == pytest.approx(6.5)
    assert env.lateral_at(25.0) == pytest.approx(7.0 + 2.0 * 5.0 / 20.0)
    assert env.forward_at(35.0) == pytest.approx(3.0 - 2.0 * 15.0 / 20.0)
    np.testing.assert_allclose(env.braking_at(np.array([10.0, 30.0, 40.0])), [8.0, 7.0, 6.0])
    assert isinstance(env.lateral_at(12.0), float)
    np.testing.assert_array_equal(env.gg_at(20.0), env.gg[0])


@pytest.mark.parametrize("speed", [9.99, 40.01, -1.0, math.nan, math.inf, [10.0, 41.0]])
def test_no_interpolation_outside_the_measured_speeds(speed):
    with pytest.raises(ValueError, match="speed_mps"):
        hand_envelope().lateral_at(speed)


def test_interpolation_refuses_what_is_not_a_speed():
    with pytest.raises(TypeError, match="speed_mps"):
        hand_envelope().forward_at("fast")
    with pytest.raises(ValueError, match="speed_mps"):
        hand_envelope().gg_at(10.0)  # not a g-g speed


@pytest.mark.parametrize("changes, name", [
    ({"speeds_mps": [20.0, 10.0, 40.0]}, "speeds_mps"),
    ({"lateral_mps2": [6.0, 7.0]}, "lateral_mps2"),
    ({"forward_by_heading_mps2": [[4.0, 3.0, 1.0], [4.0, 3.0, 1.0]]}, "forward_by_heading_mps2"),
    ({"lateral_limited_by": ("plateau", "loss", "spun")}, "lateral_limited_by"),
    ({"gg": ([[4.0, 0.0], [0.0, 7.0]],)}, r"gg\[0\]"),
    ({"gg": ()}, "gg"),
    ({"config_sha256": "abc"}, "config_sha256"),
])
def test_an_envelope_that_does_not_fit_is_refused(changes, name):
    with pytest.raises(ValueError, match=name):
        hand_envelope(**changes)


@pytest.mark.parametrize("text", ["not json", "[1, 2]", json.dumps({"format": "other/1"}),
                                  json.dumps({"format": FORMAT})])
def test_from_json_refuses_other_text(text):
    with pytest.raises(ValueError, match="text"):
        Envelope.from_json(text)


# --------------------------------------------------------------------------- the schedule and the hash


@pytest.mark.parametrize("speeds, name", [
    ((), "speeds_mps"),
    ((-5.0, 10.0), r"speeds_mps\[0\]"),
    ((0.0,), r"speeds_mps\[0\]"),
    ((10.0, math.nan), r"speeds_mps\[1\]"),
    ((10.0, math.inf), r"speeds_mps\[1\]"),
    ((20.0, 10.0), "speeds_mps"),
    ((10.0, 10.0), "speeds_mps"),
])
def test_a_bad_speed_grid_is_refused_by_name(speeds, name):
    with pytest.raises(ValueError, match=name):
        Schedule(speeds_mps=speeds, gg_speeds_mps=())


@pytest.mark.parametrize("changes, name", [
    ({"window_s": 0.0}, "window_s"),
    ({"settle_s": -1.0}, "settle_s"),
    ({"ramp_mps2_per_lap": math.nan}, "ramp_mps2_per_lap"),
    ({"gg_speeds_mps": (13.0,)}, "gg_speeds_mps"),
    ({"gg_fractions": (0.5, 1.5)}, r"gg_fractions\[1\]"),
    ({"gg_fractions": (0.5, 0.25)}, "gg_fractions"),
    ({"headings_rad": ()}, "headings_rad"),
    ({"gg_bisections": -1}, "gg_bisections"),
])
def test_a_bad_schedule_is_refused_by_name(changes, name):
    with pytest.raises(ValueError, match=name):
        Schedule(**changes)


def test_a_schedule_of_zero_steps_is_refused_before_driving(config):
    """Half a control step or less rounds to no step at all."""
    for name in ("window_s", "settle_s", "smoothing_s", "recovery_s", "max_run_s"):
        short = dataclasses.replace(SHORT_SCHEDULE, **{name: 0.4 * config.control_dt_s})
        with pytest.raises(ValueError, match=f"{name} must last at least one control step"):
            measure_envelope(config, short)


def test_measure_envelope_refuses_what_is_not_a_config_or_schedule(config):
    with pytest.raises(TypeError, match="config"):
        measure_envelope("car", SHORT_SCHEDULE)
    with pytest.raises(TypeError, match="schedule"):
        measure_envelope(config, {"speeds_mps": (10.0,)})
    with pytest.raises(TypeError, match="speeds_mps"):
        Schedule(speeds_mps="10 20")


def test_steady_circle_refuses_bad_arguments_by_name(config):
    for kwargs, name in (({"speed_mps": 0.0}, "speed_mps"), ({"steering_rad": 0.7}, "steering_rad"),
                         ({"duration_s": math.nan}, "duration_s"), ({"settle_s": -1.0}, "settle_s")):
        args = {"speed_mps": 10.0, "steering_rad": 0.1, "duration_s": 1.0, **kwargs}
        with pytest.raises(ValueError, match=name):
            steady_circle(config, **args)


def test_config_hash_is_sha256_of_every_field_as_documented():
    config = ProjectConfig()
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ProjectConfig)}
    fields["chassis_size_m"] = list(fields["chassis_size_m"])
    expected = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    assert config_hash(config) == expected
    assert config_hash(ProjectConfig()) == expected
    for name, value in (("tyre_friction", 0.9), ("substeps", 3), ("chassis_size_m", (4.2, 1.75, 0.6))):
        assert config_hash(dataclasses.replace(config, **{name: value})) != expected, name
    with pytest.raises(TypeError, match="config"):
        config_hash({"tyre_friction": 1.0})
