"""The controllers we ship: the pursuit reference completes a lap of
Level 0 on the MuJoCo C backend and acts bitwise as its independent oracle
(`oracles.PursuitOracle`) on that lap and on random poses on random loops,
at its gains and at others; its maths (`racing_env.pursuit`) agree in
NumPy and JAX, float32 and float64."""

import jax.numpy as jnp
import numpy as np
import pytest

from oracles import PursuitOracle
from racing_env import LEVEL_0, TRACK_CAPACITY, ProjectConfig, VecCarRacingEnv, level0_track
from racing_env.pursuit import FIELDS, Gains, pursue, pursue_jax
from racing_env.plugins import PURSUIT, load_plugin
from racing_env.runner import challenge_values, run

#: The steps of the reference's lap of Level 0 from ``reset(seed=0)`` on
#: ``cpu_reference`` (43.42 s), as its own code drove it before its maths moved.
LEVEL0_LAP_STEPS = 2171


@pytest.fixture(scope="module")
def level0():
    return VecCarRacingEnv(1, config=ProjectConfig(), level=LEVEL_0, backend="cpu_reference", track=level0_track())


def test_pursuit_completes_a_lap_of_level_0(level0):
    (episode,) = run(load_plugin(PURSUIT), level0, episodes=1, seed=0).episodes
    assert episode.termination_reason == "success" and episode.lap_completed and episode.error is None
    assert episode.progress == pytest.approx(1.0)
    # 742 m: a lap well under the 79.4 s timeout (measured 43.4 s).
    assert 20.0 < episode.lap_time_s < 60.0
    assert episode.lap_time_s == pytest.approx(episode.steps * ProjectConfig().control_dt_s)


def test_pursuit_actions_stay_in_the_action_space(level0):
    plugin = load_plugin(PURSUIT)
    obs, info = level0.reset(seed=1)
    one = {k: np.asarray(v)[0] for k, v in obs.items()}
    controller = plugin.load_class()(one, {}, plugin.config(challenge_values(level0)))
    action = controller.compute_control(one)
    space = level0.single_action_space
    assert action.dtype == np.float32 and action.shape == (2,)
    assert np.all(action >= space.low) and np.all(action <= space.high)


def same_as_the_oracle(controller, oracle, one):
    """The plugin's action, aim point and target speed against the oracle's:
    the action and the aim bitwise, the target to float64 rounding (it is
    only drawn)."""
    action = controller.compute_control(one)
    want, aim, target = oracle.act(one)
    assert action.dtype == np.float32 and action.shape == (2,)
    np.testing.assert_array_equal(action, want)
    np.testing.assert_array_equal(controller.drawn[1], aim)
    assert controller.drawn[2] == pytest.approx(target, rel=1e-12)
    return action


def test_pursuit_drives_a_lap_of_level_0_bitwise_as_its_oracle(level0):
    plugin = load_plugin(PURSUIT)
    config = plugin.config(challenge_values(level0))
    obs, info = level0.reset(seed=0)
    one = {k: np.asarray(v)[0] for k, v in obs.items()}
    controller, oracle = plugin.load_class()(one, {}, config), PursuitOracle(one, config)
    for steps in range(1, LEVEL_0.max_episode_steps + 1):
        action = same_as_the_oracle(controller, oracle, one)
        obs, _, terminated, truncated, info = level0.step(action[None])
        one = {k: np.asarray(v)[0] for k, v in obs.items()}
        if terminated[0] or truncated[0]:
            break
    assert bool(info["lap_completed"][0]) and steps == LEVEL0_LAP_STEPS


def random_world(rng):
    """One world on a random loop (a wobbly ellipse of 5 to 640 points,
    sometimes with a point repeated), near its centerline or far from it,
    heading anywhere, at a speed from backwards to beyond the top speed."""
    n = int(rng.choice([5, 40, int(rng.integers(200, TRACK_CAPACITY + 1))]))
    theta = np.sort(rng.uniform(0, 2 * np.pi, n))
    radius = rng.uniform(30, 120, 2)[:, None] * (1 + 0.1 * np.sin(rng.integers(2, 7) * theta))
    line = np.stack([radius[0] * np.cos(theta), radius[1] * np.sin(theta)], 1)
    if rng.random() < 0.3 and n < TRACK_CAPACITY:
        i = int(rng.integers(n))
        line, n = np.insert(line, i + 1, line[i], axis=0), n + 1
    centerline = np.zeros((TRACK_CAPACITY, 2), np.float32)
    centerline[:n] = line
    near = centerline[rng.integers(n)] + rng.normal(0, rng.choice([1.0, 20.0]), 2)
    return {"position": near.astype(np.float32), "yaw": np.float32(rng.uniform(-4, 4)),
            "velocity_body": np.array([rng.uniform(-3, 30), rng.normal()], np.float32),
            "centerline": centerline, "track_mask": (np.arange(TRACK_CAPACITY) < n).astype(np.int8)}


@pytest.mark.parametrize("gains", [{}, {"preview_m": 10.0}, {"lookahead_min_m": 5000.0},
                                   {"max_speed_mps": 30.0, "lateral_accel_mps2": 9.0, "brake_accel_mps2": 6.0,
                                    "drive_accel_mps2": 4.0, "preview_m": 60.0, "lookahead_min_m": 5.0,
                                    "lookahead_gain_s": 0.0}])
def test_pursuit_acts_bitwise_as_its_oracle_on_random_loops(level0, gains):
    plugin = load_plugin(PURSUIT)
    config = plugin.config(challenge_values(level0))
    config = {**config, "controller": {**config["controller"], **gains}}
    rng = np.random.default_rng(len(gains))
    for _ in range(200):
        one = random_world(rng)
        controller, oracle = plugin.load_class()(one, {}, config), PursuitOracle(one, config)
        for _ in range(3):  # one controller, the car moved along its loop
            same_as_the_oracle(controller, oracle, one)
            one = {**one, "position": (one["position"] + rng.normal(0, 3, 2)).astype(np.float32)}


def test_the_maths_agree_in_numpy_and_jax_and_in_both_dtypes():
    """`pursue` for a batch of random worlds: NumPy float32 against the
    jitted JAX float32 and against NumPy float64 (the reference's
    precision), each to 1e-4 (float32 rounding of the arc lengths and the
    speed profile); the aim point is one of the loop's."""
    rng = np.random.default_rng(5)
    worlds = [random_world(rng) for _ in range(64)]
    batch = {k: np.stack([w[k] for w in worlds]) for k in FIELDS}
    gains = Gains(22.0, 4.5, 3.0, 2.0, 120.0, 8.0, 0.6)
    car = ProjectConfig()
    bounds = {"wheelbase_m": car.wheelbase_m, "low": (-car.max_steering_rad, car.min_acceleration_mps2),
              "high": (car.max_steering_rad, car.max_acceleration_mps2)}
    single = pursue(np, gains, *(batch[k] for k in FIELDS), **bounds, dtype=np.float32)
    double = pursue(np, gains, *(batch[k] for k in FIELDS), **bounds, dtype=np.float64)
    device = pursue_jax(gains, *(jnp.asarray(batch[k]) for k in FIELDS), **bounds, dtype=jnp.float32)
    assert single.action.dtype == np.float32 and double.action.dtype == np.float64
    np.testing.assert_allclose(np.asarray(device.action), single.action, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(single.action, double.action, rtol=1e-4, atol=1e-4)
    assert (double.aim < batch["track_mask"].astype(int).sum(1)).all()
