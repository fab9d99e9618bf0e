"""The pure-pursuit prior against the reference controller it stands for
(`racing_env`'s ``pursuit`` plugin, float64, one world at a time) on random
poses and speeds on random tracks; NumPy and JAX alike; its settings."""

import dataclasses
import tomllib

import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import ProjectConfig
from racing_env.plugins import PURSUIT, load_plugin
from racing_stack.prior import PursuitPrior
from test_wrappers import random_obs

CAR = ProjectConfig()


def reference_actions(obs, settings=None, targets=False):
    """The pursuit plugin's action in each world, one world at a time (and
    the speed it aimed at, with ``targets``)."""
    plugin = load_plugin(PURSUIT)
    cls = plugin.load_class()
    controller_settings = dict(plugin.settings) if settings is None else settings
    config = {"controller": controller_settings, "vehicle": dataclasses.asdict(CAR),
              "action": {"low": [-CAR.max_steering_rad, CAR.min_acceleration_mps2],
                         "high": [CAR.max_steering_rad, CAR.max_acceleration_mps2]}}
    out, aimed = [], []
    for e in range(len(obs["yaw"])):
        one = {k: v[e] for k, v in obs.items()}
        controller = cls(one, {}, config)
        out.append(controller.compute_control(one))
        aimed.append(controller.drawn[2])
    return (np.asarray(out), np.asarray(aimed, np.float32)) if targets else np.asarray(out)


def test_the_defaults_are_the_reference_controllers_gains():
    gains = tomllib.loads((PURSUIT / "config.toml").read_text())
    assert dataclasses.asdict(PursuitPrior()) == {k: v for k, v in gains.items() if k != "name"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_prior_drives_as_the_reference_controller(seed):
    rng = np.random.default_rng(seed)
    obs = random_obs(rng, 24)
    obs["velocity_body"][:, 0] = rng.uniform(-3.0, 30.0, 24)  # standing, slow, fast and over the top speed
    want = reference_actions(obs)
    prior = PursuitPrior()
    host = prior.host(obs)
    got = np.asarray(prior({k: jnp.asarray(v) for k, v in obs.items()}))
    assert host.shape == got.shape == (24, 2) and host.dtype == got.dtype == np.float32
    np.testing.assert_allclose(host, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, host, rtol=1e-5, atol=1e-5)
    # The draws reach every regime: braking, full drive, steering either way.
    assert (want[:, 1] < -1).any() and (want[:, 1] == 2.0).any()
    assert (want[:, 0] > 0.1).any() and (want[:, 0] < -0.1).any()


@pytest.mark.parametrize("preview", [120.0, 10.0])
def test_the_speed_profile_is_the_reference_controllers(preview):
    """At half a m/s under the reference's target speed the acceleration
    is 1 m/s^2 off the target: any difference in the profile (the corners
    within the preview, braking to them, the corner at the car) shows."""
    rng = np.random.default_rng(11)
    obs = random_obs(rng, 32)
    settings = {"name": "pursuit", **dataclasses.asdict(PursuitPrior(preview_m=preview))}
    _, target = reference_actions(obs, settings, targets=True)
    assert (target < 22.0).mean() > 0.5 and np.unique(np.round(target, 1)).size > 16  # corners decide, not the cap
    obs["velocity_body"][:, 0] = target - 0.5
    want = reference_actions(obs, settings)
    np.testing.assert_allclose(want[:, 1], 1.0, atol=1e-3)  # the target is the same at the new speed
    np.testing.assert_allclose(PursuitPrior(preview_m=preview).host(obs), want, rtol=1e-4, atol=1e-4)


def test_other_gains_drive_as_the_reference_with_them():
    rng = np.random.default_rng(7)
    obs = random_obs(rng, 12)
    obs["velocity_body"][:, 0] = rng.uniform(0.0, 25.0, 12)
    prior = PursuitPrior(max_speed_mps=30.0, lateral_accel_mps2=9.0, brake_accel_mps2=6.0, drive_accel_mps2=4.0,
                         preview_m=60.0, lookahead_min_m=5.0, lookahead_gain_s=0.0)
    want = reference_actions(obs, {"name": "pursuit", **dataclasses.asdict(prior)})
    np.testing.assert_allclose(prior.host(obs), want, rtol=1e-4, atol=1e-4)


def test_a_lookahead_beyond_the_lap_aims_at_the_last_point_ahead():
    rng = np.random.default_rng(3)
    obs = random_obs(rng, 6)
    angle = rng.uniform(0, 2 * np.pi, 6)  # 8 m from the line: the points around the nearest one steer apart
    obs["position"] = obs["position"] + (8 * np.stack([np.cos(angle), np.sin(angle)], 1)).astype(np.float32)
    prior = PursuitPrior(lookahead_min_m=5000.0)
    np.testing.assert_allclose(prior.host(obs), reference_actions(obs, {"name": "pursuit",
                                                                        **dataclasses.asdict(prior)}),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, value, error, match", [
    ("max_speed_mps", 0.0, ValueError, r"max_speed_mps must be in \(0, 10000\]"),
    ("lateral_accel_mps2", float("nan"), ValueError, "lateral_accel_mps2 must be in"),
    ("preview_m", float("inf"), ValueError, "preview_m must be in"),
    ("lookahead_gain_s", -0.1, ValueError, r"lookahead_gain_s must be in \[0, 100\]"),
    ("drive_accel_mps2", "2", TypeError, "drive_accel_mps2"),
])
def test_bad_gains_are_refused_by_name(name, value, error, match):
    with pytest.raises(error, match=match):
        PursuitPrior(**{name: value})


def test_degenerate_loops_and_far_cars_give_finite_actions_within_the_bounds():
    """No valid point, repeated points, three points, huge coordinates, a
    car far off its loop, speeds far out of range: finite actions in the
    command ranges, the same from NumPy and JAX."""
    from racing_env import TRACK_CAPACITY

    rng = np.random.default_rng(0)
    e = 6
    obs = {"position": np.zeros((e, 2), np.float32), "yaw": rng.uniform(-4, 4, e).astype(np.float32),
           "velocity_body": np.zeros((e, 2), np.float32),
           "centerline": np.zeros((e, TRACK_CAPACITY, 2), np.float32),
           "track_mask": np.zeros((e, TRACK_CAPACITY), np.int8)}
    obs["track_mask"][1, :10], obs["centerline"][1, :10] = 1, 5.0
    obs["track_mask"][2, :3], obs["centerline"][2, :3] = 1, [[0, 0], [10, 0], [0, 10]]
    obs["track_mask"][3, :50], obs["centerline"][3, :50] = 1, rng.uniform(-1e6, 1e6, (50, 2))
    obs["track_mask"][4], obs["centerline"][4, :, 0] = 1, np.arange(TRACK_CAPACITY)
    obs["track_mask"][5, :20], obs["centerline"][5, :20] = 1, rng.normal(0, 10, (20, 2))
    obs["position"][5] = [1e7, -1e7]
    obs["velocity_body"][:, 0] = [0, 100, -50, 1e6, 30, 5]
    prior = PursuitPrior()
    host = prior.host(obs)
    assert np.isfinite(host).all()
    assert (np.abs(host[:, 0]) <= CAR.max_steering_rad).all()
    assert (host[:, 1] >= CAR.min_acceleration_mps2).all() and (host[:, 1] <= CAR.max_acceleration_mps2).all()
    np.testing.assert_allclose(np.asarray(prior({k: jnp.asarray(v) for k, v in obs.items()})), host,
                               rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def level1_loops():
    """Level 1's first 16 Validation tracks (centerline, mask), float32."""
    from racing_stack.pools import materialize_prefix

    pool = materialize_prefix("validation", 16)
    return np.asarray(pool.centerline, np.float32), np.asarray(pool.track_mask).astype(np.int8)


def real_obs(rng, loops, worlds):
    """Cars near the centerlines of real tracks, heading along them, at
    half a m/s under pursuit's own target speed there (so the profile
    decides the acceleration)."""
    line, mask = loops
    rows = rng.integers(len(line), size=worlds)
    obs = {"centerline": line[rows], "track_mask": mask[rows], "velocity_body": np.zeros((worlds, 2), np.float32)}
    count = mask[rows].astype(int).sum(1)
    i = rng.integers(0, count)
    ahead = obs["centerline"][np.arange(worlds), (i + 1) % count] - obs["centerline"][np.arange(worlds), i]
    obs["position"] = (obs["centerline"][np.arange(worlds), i] + rng.normal(0.0, 1.5, (worlds, 2))).astype(np.float32)
    obs["yaw"] = (np.arctan2(ahead[:, 1], ahead[:, 0]) + rng.normal(0.0, 0.2, worlds)).astype(np.float32)
    return obs


@pytest.mark.parametrize("repeat", [False, True], ids=["as_built", "a_point_repeated"])
def test_the_prior_drives_as_the_reference_on_real_tracks(level1_loops, repeat):
    """Level 1's loops (600-odd points, the arc length summed over a whole
    lap) and the same loops with the point after the nearest one repeated
    (a zero-length step: that point is 0 m ahead, not a lap)."""
    rng = np.random.default_rng(4)
    obs = real_obs(rng, level1_loops, 48)
    if repeat:
        line, mask = obs["centerline"].copy(), obs["track_mask"].copy()
        for w in range(48):
            n = int(mask[w].sum())
            i = int(np.argmin(np.sum((line[w, :n] - obs["position"][w]) ** 2, axis=1)))
            repeated = np.insert(line[w, :n], i + 1, line[w, i], axis=0)[: line.shape[1]]  # a full loop loses its last
            line[w, : len(repeated)], mask[w, : len(repeated)] = repeated, 1
        obs["centerline"], obs["track_mask"] = line, mask
    _, target = reference_actions(obs, targets=True)
    obs["velocity_body"][:, 0] = target - 0.5
    want = reference_actions(obs)
    assert np.median(want[:, 1]) == pytest.approx(1.0, abs=1e-3) and (target < 22.0).mean() > 0.3
    prior = PursuitPrior()
    host = prior.host(obs)
    np.testing.assert_allclose(host, want, rtol=0, atol=3e-4)
    np.testing.assert_allclose(np.asarray(prior({k: jnp.asarray(v) for k, v in obs.items()})), host, rtol=0,
                               atol=3e-4)
