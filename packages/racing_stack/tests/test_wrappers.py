"""The learning wrappers against NumPy references: the local-track
features (`racing_stack.features`) of random poses on random tracks (the
road geometry by brute force over every segment, in float64) and their
size, and the shaped reward's (`racing_stack.reward`) bounds."""

import dataclasses
import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import TRACK_CAPACITY, ProjectConfig, TerminationReason
from racing_stack.features import LocalTrack
from racing_stack.reward import Endings, ShapedReward

VEHICLE = ProjectConfig()


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


def signed_distance(line, q):
    """The distance of ``q`` to the closed polyline ``line`` (+ left of its
    direction), the direction of the nearest segment and where on the loop
    the projection lies (segment index + fraction): every segment tried."""
    a, b = line, np.roll(line, -1, 0)
    ab = b - a
    t = np.clip(((q - a) * ab).sum(1) / (ab * ab).sum(1), 0, 1)
    d = np.linalg.norm(a + t[:, None] * ab - q, axis=1)
    i = int(np.argmin(d))
    side = 1.0 if ab[i, 0] * (q - a[i])[1] - ab[i, 1] * (q - a[i])[0] >= 0 else -1.0
    return side * d[i], ab[i], i + t[i]


def reference_features(obs, previous, points, spacing, scale, interpolate=False):
    out = []
    for w in range(len(obs["yaw"])):
        n = int(obs["track_mask"][w].sum())
        line = obs["centerline"][w, :n].astype(np.float64)
        p = obs["position"][w].astype(np.float64)
        yaw = float(obs["yaw"][w])
        nearest = int(np.argmin(((line - p) ** 2).sum(1)))
        half = float(np.linalg.norm(obs["left_boundary"][w, nearest] - obs["centerline"][w, nearest]))
        lateral, direction, along = signed_distance(line, p)
        heading = yaw - math.atan2(direction[1], direction[0])
        c, s = math.cos(yaw), math.sin(yaw)
        margins = []
        for ahead, left in ((VEHICLE.wheelbase_m, 1), (VEHICLE.wheelbase_m, -1), (0.0, 1), (0.0, -1)):
            side = left * VEHICLE.track_width_m / 2
            wheel = p + [c * ahead - s * side, s * ahead + c * side]
            margins.append((half - abs(signed_distance(line, wheel)[0])) / 6.0)
        row = [obs["velocity_body"][w, 0] / 20, obs["velocity_body"][w, 1] / 20, obs["yaw_rate"][w] / 2,
               obs["steering_angle"][w] / 0.6, previous[w, 0] / 0.6, previous[w, 1] / 8.0, half / 6.0,
               lateral / half, math.sin(heading), math.cos(heading), *margins]
        step = float(obs["track_length"][w]) / n
        for key in ("centerline", "left_boundary", "right_boundary"):
            edge = obs[key][w, :n].astype(np.float64)
            for k in range(points):
                if interpolate:  # k x spacing along the loop from the projection, between two points
                    place = along + k * spacing / step
                    i, f = int(math.floor(place)) % n, place - math.floor(place)
                    q = edge[i] + f * (edge[(i + 1) % n] - edge[i]) - p
                else:
                    q = edge[(nearest + round(k * spacing / step)) % n] - p
                row += [(c * q[0] + s * q[1]) / scale, (-s * q[0] + c * q[1]) / scale]
        out.append(row)
    return np.asarray(out)


@pytest.mark.parametrize("interpolate", [False, True], ids=["rounded", "interpolated"])
@pytest.mark.parametrize("points, spacing, scale", [(1, 3.0, 50.0), (12, 5.0, 25.0), (7, 17.5, 10.0)])
def test_local_track_matches_the_reference(points, spacing, scale, interpolate):
    rng = np.random.default_rng(points)
    obs = random_obs(rng, 9)
    previous = rng.uniform([-0.6, -8.0], [0.6, 4.0], (9, 2)).astype(np.float32)
    wrapper = LocalTrack(points=points, spacing_m=spacing, scale_m=scale, interpolate=interpolate)
    got = np.asarray(wrapper({k: jnp.asarray(v) for k, v in obs.items()}, jnp.asarray(previous)))
    assert got.shape == (9, wrapper.size) and got.dtype == np.float32
    want = reference_features(obs, previous, points, spacing, scale, interpolate)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    host = wrapper.host(obs, previous)  # the NumPy path a controller takes
    assert host.dtype == np.float32
    np.testing.assert_allclose(host, want, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("points", [1, 3, 20, TRACK_CAPACITY])
@pytest.mark.parametrize("interpolate", [False, True], ids=["rounded", "interpolated"])
@pytest.mark.parametrize("prior", [None, {}], ids=["alone", "with_a_prior"])
def test_the_size_is_the_built_features_length(points, interpolate, prior):
    """`LocalTrack.size`, counted from its feature lists, is the length of
    the vector both paths build: 14 + 6 per place (+ 2 with a prior)."""
    rng = np.random.default_rng(points)
    obs = random_obs(rng, 3)
    previous = np.zeros((3, 2), np.float32)
    wrapper = LocalTrack(points=points, interpolate=interpolate, prior=prior)
    assert wrapper.size == 14 + 6 * points + (0 if prior is None else 2)
    assert wrapper.host(obs, previous).shape == (3, wrapper.size)
    assert wrapper({k: jnp.asarray(v) for k, v in obs.items()}, jnp.asarray(previous)).shape == (3, wrapper.size)


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
        previous = np.zeros((8, 2), np.float32)
        np.testing.assert_allclose(wrapper.host(obs, previous),
                                   np.asarray(wrapper({k: jnp.asarray(v) for k, v in obs.items()}, previous)),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"points": 0}, ValueError, r"points must be in \[1, 640\]"),
    ({"points": 2.0}, TypeError, "points must be an int"),
    ({"points": 641}, ValueError, r"points must be in \[1, 640\]"),
    ({"spacing_m": 0.0}, ValueError, r"spacing_m must be in \(0, 10000\] m"),
    ({"spacing_m": float("nan")}, ValueError, "spacing_m must be in"),
    ({"spacing_m": float("inf")}, ValueError, "spacing_m must be in"),
    ({"scale_m": 1e5}, ValueError, "scale_m must be in"),
    ({"scale_m": True}, TypeError, "scale_m must be a real number"),
    ({"interpolate": 1}, TypeError, "interpolate must be a bool"),
    ({"interpolate": "yes"}, TypeError, "interpolate must be a bool")])
def test_bad_feature_settings_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        LocalTrack(**kwargs)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"step_cost": -1.0}, ValueError, r"step_cost must be in \[0, 1e\+06\]"),
    ({"step_cost": float("nan")}, ValueError, "step_cost must be in"),
    ({"off_track_penalty": 1e400}, ValueError, "off_track_penalty must be in"),
    ({"crash_energy_cost": 1e7}, ValueError, "crash_energy_cost must be in"),
    ({"stall_penalty": True}, TypeError, "stall_penalty must be a real number"),
    ({"metres_scale": "1"}, TypeError, "metres_scale must be a real number"),
    ({"edge_margin_m": -0.1}, ValueError, "edge_margin_m must be in"),
    ({"edge_margin_m": float("inf")}, ValueError, "edge_margin_m must be in"),
    ({"stall_steps": 0}, ValueError, r"stall_steps must be in \[1, 2\*\*31\)"),
    ({"stall_steps": 150.0}, TypeError, "stall_steps must be an int"),
    ({"stall_steps": 2**31}, ValueError, "stall_steps must be in")])
def test_bad_reward_settings_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        ShapedReward(**kwargs)


def test_settings_are_stored_as_python_numbers():
    features, reward = LocalTrack(points=np.int64(12), spacing_m=np.float32(5.0)), ShapedReward(step_cost=1)
    assert type(features.points) is int and type(features.spacing_m) is float and type(reward.step_cost) is float
    json.dumps(dataclasses.asdict(features))


def test_shaped_reward_stays_within_its_bounds():
    """Random steps on random tracks (random progress, speeds up to 150 m/s,
    crashes, stalls about to end): every reward within `bounds`, both
    bounds reached."""
    wrapper = ShapedReward(metres_scale=0.3, step_cost=0.02, off_track_penalty=4.0, crash_energy_cost=0.2,
                           stall_steps=5, stall_penalty=3.0)
    rng = np.random.default_rng(3)
    worlds = 64
    obs = {k: jnp.asarray(v) for k, v in random_obs(rng, worlds).items()}
    length = rng.uniform(300.0, 450.0, worlds).astype(np.float32)
    reward = rng.uniform(0.0, 1.0, worlds).astype(np.float32)  # the Challenge reward: a lap fraction
    reward[rng.random(worlds) < 0.5] = 0.0
    speed = rng.uniform(0.0, 150.0, (worlds, 1)).astype(np.float32)
    reward[:2], length[:2], speed[:2] = [0.0, 1.0], 450.0, [[150.0], [0.0]]
    reason = rng.choice([TerminationReason.NONE, TerminationReason.OFF_TRACK], worlds).astype(np.int32)
    reason[:2] = [TerminationReason.OFF_TRACK, TerminationReason.NONE]
    obs["track_length"] = jnp.asarray(length)
    obs["velocity_body"] = jnp.asarray(np.concatenate([speed, np.zeros_like(speed)], 1))
    memory = Endings(jnp.asarray(rng.random(worlds) < 0.5), jnp.asarray(rng.integers(0, 5, worlds), jnp.int32),
                     jnp.zeros(worlds, jnp.float32))
    got, _, _ = wrapper(memory._replace(still=memory.still.at[0].set(4)), jnp.asarray(reward), obs,
                        {"termination_reason": jnp.asarray(reason)}, jnp.asarray(reason != 0), jnp.ones(worlds))
    got = np.asarray(got)
    low, high = wrapper.bounds(450.0)
    assert (low, high) == pytest.approx((-0.02 - 4.0 - 0.2 * 100.0**2 - 3.0, 0.3 * 450.0 - 0.02))
    assert got.min() >= low - 1e-5 * abs(low) and got.max() <= high + 1e-4
    np.testing.assert_allclose(got[:2], [low, high], rtol=1e-6)  # both bounds are reached


def test_the_crash_weight_scales_the_crash_cost_only():
    """A warm-up's share of the crash cost: the off-track and band costs
    scale with it, the progress and the stall penalty do not, and the
    endings are the same."""
    wrapper = ShapedReward(off_track_penalty=2.0, crash_energy_cost=0.1, stall_steps=3, stall_penalty=5.0)
    rng = np.random.default_rng(11)
    worlds = 32
    obs = {k: jnp.asarray(v) for k, v in random_obs(rng, worlds).items()}
    reward = jnp.asarray(np.where(rng.random(worlds) < 0.5, 0.0, 0.01), jnp.float32)
    reason = jnp.asarray(rng.choice([TerminationReason.NONE, TerminationReason.OFF_TRACK], worlds), jnp.int32)
    memory = Endings(jnp.asarray(rng.random(worlds) < 0.5), jnp.asarray(rng.integers(0, 3, worlds), jnp.int32),
                     jnp.zeros(worlds, jnp.float32))
    step = [memory, reward, obs, {"termination_reason": reason}, reason != 0, jnp.ones(worlds)]
    full, ending, kept = wrapper(*step)
    none, ending_0, kept_0 = wrapper(*step, crash_weight=0.0)
    half, _, _ = wrapper(*step, crash_weight=0.5)
    np.testing.assert_array_equal(ending, ending_0)
    np.testing.assert_array_equal(kept.still, kept_0.still)
    crash = np.asarray(none) - np.asarray(full)  # the crash cost paid in full
    speed = np.minimum(np.linalg.norm(np.asarray(obs["velocity_body"]), axis=1), 100.0)
    crashed = (np.asarray(reason) == TerminationReason.OFF_TRACK) | (np.asarray(ending) == 1)
    assert crashed.any() and (~crashed).any()
    np.testing.assert_allclose(crash, np.where(crashed, 2.0 + 0.1 * speed**2, 0.0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(half), np.asarray(full) + crash / 2, rtol=1e-5, atol=1e-4)


def test_a_crash_weight_or_track_length_out_of_range_is_refused():
    """A weight outside [0, 1] would pay a crash as a gain beyond `bounds`;
    a track length that is not a positive number gives no bounds."""
    wrapper = ShapedReward()
    rng = np.random.default_rng(2)
    obs = {k: jnp.asarray(v) for k, v in random_obs(rng, 4).items()}
    reason = jnp.full(4, TerminationReason.OFF_TRACK, jnp.int32)
    step = [wrapper.start(4), jnp.zeros(4, jnp.float32), obs, {"termination_reason": reason}, reason != 0,
            jnp.ones(4)]
    for weight in (-1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="crash_weight must be"):
            wrapper(*step, crash_weight=weight)
    with pytest.raises(TypeError, match="crash_weight"):
        wrapper(*step, crash_weight="1")
    for length in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="track_length_m must be finite and > 0"):
            wrapper.bounds(length)


def test_a_prior_ends_the_features_with_its_action():
    """With a prior the features are the same plus its action (env units),
    from JAX and from NumPy; a mapping of gains becomes the prior."""
    from racing_stack.prior import PursuitPrior

    rng = np.random.default_rng(9)
    obs = random_obs(rng, 7)
    previous = rng.uniform([-0.6, -8.0], [0.6, 4.0], (7, 2)).astype(np.float32)
    plain, prior = LocalTrack(points=4), PursuitPrior(preview_m=80.0)
    wrapper = LocalTrack(points=4, prior={"preview_m": 80.0})
    assert wrapper.prior == prior and wrapper.size == plain.size + 2
    assert LocalTrack(**json.loads(json.dumps(dataclasses.asdict(wrapper)))) == wrapper  # as a config's JSON holds it
    got = np.asarray(wrapper({k: jnp.asarray(v) for k, v in obs.items()}, jnp.asarray(previous)))
    np.testing.assert_array_equal(got[:, :-2], np.asarray(plain({k: jnp.asarray(v) for k, v in obs.items()},
                                                                  jnp.asarray(previous))))
    np.testing.assert_allclose(got[:, -2:], prior.host(obs), rtol=1e-5, atol=1e-5)
    host = wrapper.host(obs, previous)
    np.testing.assert_array_equal(host[:, :-2], plain.host(obs, previous))
    np.testing.assert_array_equal(host[:, -2:], prior.host(obs))
    with pytest.raises(TypeError, match="prior must be a PursuitPrior, a mapping of its gains or None"):
        LocalTrack(prior=1.0)


def test_the_old_module_gives_every_name_from_its_new_home_with_a_warning():
    """`racing_stack.wrappers` stays for one release: each of its names is
    the object of `racing_stack.features`, `racing_stack.reward` or
    `racing_env.geometry`, with a `DeprecationWarning` naming the new home."""
    from racing_env import geometry
    from racing_stack import features, reward, wrappers

    homes = {name: getattr(module, name) for module in (features, reward, geometry) for name in module.__all__}
    assert set(wrappers.MOVED) == {"LocalTrack", "MAX_LENGTH_M", "ShapedReward", "Endings", "NO_ENDING", "MARGIN",
                                   "STALL", "MAX_REWARD_TERM", "MAX_CRASH_SPEED_MPS", "road_geometry"}
    for name, home in wrappers.MOVED.items():
        with pytest.warns(DeprecationWarning, match=f"racing_stack.wrappers.{name} moved to {home}"):
            assert getattr(wrappers, name) is homes[name]
    with pytest.raises(AttributeError, match="has no attribute '_shaped'"):
        wrappers._shaped  # noqa: B018
