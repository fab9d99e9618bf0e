"""The learning wrappers against NumPy references: the local-track
features of random poses on random tracks, and the shaped reward."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import TRACK_CAPACITY, TerminationReason
from racing_stack.wrappers import LocalTrack, ShapedReward


def random_obs(rng, worlds):
    """Worlds on ellipses of different sizes and point counts (padded to capacity)."""
    obs = {k: [] for k in ("position", "yaw", "velocity_body", "yaw_rate", "steering_angle", "centerline",
                           "left_boundary", "right_boundary", "track_mask", "track_length")}
    for _ in range(worlds):
        n = int(rng.integers(200, TRACK_CAPACITY + 1))
        a, b = rng.uniform(40, 120, 2)
        theta = np.linspace(0, 2 * np.pi, n, endpoint=False)
        line = np.stack([a * np.cos(theta), b * np.sin(theta)], 1)
        normal = np.stack([b * np.cos(theta), a * np.sin(theta)], 1)
        normal /= np.linalg.norm(normal, axis=1, keepdims=True)
        pad = np.zeros((TRACK_CAPACITY, 2))
        edges = (("centerline", line), ("left_boundary", line - 6 * normal), ("right_boundary", line + 6 * normal))
        for key, pts in edges:
            full = pad.copy()
            full[:n] = pts
            obs[key].append(full)
        obs["track_mask"].append(np.arange(TRACK_CAPACITY) < n)
        obs["track_length"].append(np.sum(np.linalg.norm(np.roll(line, -1, 0) - line, axis=1)))
        obs["position"].append(line[rng.integers(n)] + rng.normal(0, 2, 2))
        obs["yaw"].append(rng.uniform(-np.pi, np.pi))
        obs["velocity_body"].append(rng.normal(0, 10, 2))
        obs["yaw_rate"].append(rng.normal())
        obs["steering_angle"].append(rng.uniform(-0.6, 0.6))
    dtypes = {"track_mask": np.int8}
    return {k: np.asarray(v, dtypes.get(k, np.float32)) for k, v in obs.items()}


def reference_features(obs, points, spacing, scale):
    out = []
    for w in range(len(obs["yaw"])):
        n = int(obs["track_mask"][w].sum())
        line = obs["centerline"][w, :n].astype(np.float64)
        p = obs["position"][w].astype(np.float64)
        nearest = int(np.argmin(((line - p) ** 2).sum(1)))
        step = float(obs["track_length"][w]) / n
        c, s = math.cos(obs["yaw"][w]), math.sin(obs["yaw"][w])
        row = [obs["velocity_body"][w, 0] / 20, obs["velocity_body"][w, 1] / 20, obs["yaw_rate"][w] / 2,
               obs["steering_angle"][w] / 0.6]
        for key in ("centerline", "left_boundary", "right_boundary"):
            for k in range(points):
                q = obs[key][w, (nearest + round(k * spacing / step)) % n] - p
                row += [(c * q[0] + s * q[1]) / scale, (-s * q[0] + c * q[1]) / scale]
        out.append(row)
    return np.asarray(out)


@pytest.mark.parametrize("points, spacing", [(1, 3.0), (12, 5.0), (7, 17.5)])
def test_local_track_matches_the_reference(points, spacing):
    obs = random_obs(np.random.default_rng(points), 9)
    wrapper = LocalTrack(points=points, spacing_m=spacing)
    got = np.asarray(wrapper({k: jnp.asarray(v) for k, v in obs.items()}))
    assert got.shape == (9, wrapper.size) and got.dtype == np.float32
    want = reference_features(obs, points, spacing, 50.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    host = wrapper.host(obs)  # the NumPy path a controller takes
    assert host.dtype == np.float32
    np.testing.assert_allclose(host, want, rtol=1e-4, atol=1e-5)


def test_numpy_and_jax_round_half_way_points_alike():
    """Point spacings a hair from making k x spacing / step a half-integer:
    both paths compute in float32 and pick the same points."""
    rng = np.random.default_rng(5)
    wrapper = LocalTrack(points=9, spacing_m=5.0)
    for _ in range(20):
        obs = random_obs(rng, 8)
        counts = obs["track_mask"].astype(int).sum(1)
        hair = 1.0 + rng.uniform(-6e-8, 6e-8, counts.shape)
        obs["track_length"] = (2.0 * counts * hair).astype(np.float32)  # 5 m / ~2 m = ~2.5 points
        # The same points: a neighbouring one would move a coordinate by ~0.04.
        np.testing.assert_allclose(wrapper.host(obs), np.asarray(wrapper({k: jnp.asarray(v) for k, v in obs.items()})),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [({"points": 0}, "points must be an int >= 1"),
                                           ({"points": 2.0}, "points must be an int >= 1"),
                                           ({"points": 641}, "points must be <= TRACK_CAPACITY = 640"),
                                           ({"spacing_m": 0.0}, "spacing_m must be a number in \\(0, 10000\\] m"),
                                           ({"spacing_m": float("nan")}, "spacing_m must be a number in"),
                                           ({"spacing_m": float("inf")}, "spacing_m must be a number in"),
                                           ({"scale_m": 1e5}, "scale_m must be a number in"),
                                           ({"scale_m": True}, "scale_m must be a number in")])
def test_bad_feature_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LocalTrack(**kwargs)


def test_shaped_reward_is_metres_less_time_less_leaving_the_track():
    wrapper = ShapedReward(metres_scale=0.1, step_cost=0.01, off_track_penalty=2.0)
    reward = jnp.array([0.01, 0.0, 0.002, 0.0], jnp.float32)
    obs = {"track_length": jnp.array([400.0, 400.0, 300.0, 350.0], jnp.float32)}
    reason = jnp.array([TerminationReason.NONE, TerminationReason.NONE, TerminationReason.OFF_TRACK,
                        TerminationReason.TIMEOUT], jnp.int32)
    got = np.asarray(wrapper(reward, obs, {"termination_reason": reason}))
    np.testing.assert_allclose(got, [0.4 - 0.01, -0.01, 0.06 - 0.01 - 2.0, -0.01], rtol=1e-6)
    for bad in (-1.0, float("nan"), float("inf"), 1e400, 1e7, True, "1"):
        with pytest.raises(ValueError, match="step_cost must be a number in \\[0, 1e\\+06\\]"):
            ShapedReward(step_cost=bad)


def test_shaped_reward_stays_within_its_bounds():
    wrapper = ShapedReward(metres_scale=0.3, step_cost=0.02, off_track_penalty=4.0)
    rng = np.random.default_rng(3)
    length = rng.uniform(300.0, 450.0, 4096).astype(np.float32)
    reward = rng.uniform(0.0, 1.0, 4096).astype(np.float32)  # the Challenge reward: a lap fraction
    reward[:2] = [0.0, 1.0]
    length[:2] = 450.0
    reason = rng.choice([TerminationReason.NONE, TerminationReason.OFF_TRACK], 4096).astype(np.int32)
    reason[:2] = [TerminationReason.OFF_TRACK, TerminationReason.NONE]
    got = np.asarray(wrapper(jnp.asarray(reward), {"track_length": jnp.asarray(length)},
                             {"termination_reason": jnp.asarray(reason)}))
    low, high = wrapper.bounds(450.0)
    assert (low, high) == pytest.approx((-4.02, 0.3 * 450.0 - 0.02))
    assert got.min() >= low - 1e-5 and got.max() <= high + 1e-4
    np.testing.assert_allclose(got[:2], [low, high], rtol=1e-6)  # both bounds are reached
