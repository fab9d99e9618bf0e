"""The vector contract on the cpu_reference backend (batch one, MuJoCo C):
construction, observation and info, seeds, actions, termination and the
NEXT_STEP reset."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from worlds import SHORT_LEVEL, circle_track
from racing_env.pursuit import pursuit
from oracles import on_track, wheel_points
from racing_env import (
    BENCHMARK_VERSION,
    LEVEL0_TRACK_ID,
    LEVEL_0,
    TRACK_CAPACITY,
    Level,
    TerminationReason,
    TrackPool,
    VecCarRacingEnv,
    level0_track,
)
from racing_env.seeds import host_pool_row, host_seed_word
from racing_env.types import INFO_FIELDS, OBSERVATION_FIELDS

OBS_SPEC = {
    "position": ((1, 2), np.float32),
    "yaw": ((1,), np.float32),
    "velocity_body": ((1, 2), np.float32),
    "yaw_rate": ((1,), np.float32),
    "steering_angle": ((1,), np.float32),
    "track_progress": ((1,), np.float32),
    "centerline": ((1, TRACK_CAPACITY, 2), np.float32),
    "left_boundary": ((1, TRACK_CAPACITY, 2), np.float32),
    "right_boundary": ((1, TRACK_CAPACITY, 2), np.float32),
    "track_mask": ((1, TRACK_CAPACITY), np.int8),
    "track_length": ((1,), np.float32),
}


def numpy_obs(obs):
    return {key: np.asarray(value) for key, value in obs.items()}


def step(env, action):
    obs, reward, terminated, truncated, info = env.step(jnp.asarray(np.asarray(action, np.float32)))
    return numpy_obs(obs), float(reward[0]), bool(terminated[0]), bool(truncated[0]), info


# -- construction ---------------------------------------------------------------


def test_missing_arguments_are_named(config):
    with pytest.raises(TypeError, match="config, level, backend, track or track_pool"):
        VecCarRacingEnv(1)
    with pytest.raises(TypeError, match="backend"):
        VecCarRacingEnv(1, config=config, level=LEVEL_0, track=level0_track())
    with pytest.raises(TypeError, match="track or track_pool"):
        VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"backend": "gpu"}, ValueError, "backend"),
        ({"config": {"dt": 0.01}}, TypeError, "config"),
        ({"level": 0}, TypeError, "level"),
        ({"track": "oval"}, TypeError, "track"),
        ({"num_envs": 0}, ValueError, "num_envs"),
        ({"num_envs": 2}, ValueError, "num_envs"),
        ({"num_envs": True}, TypeError, "num_envs"),
        ({"num_envs": 1.0}, TypeError, "num_envs"),
    ],
)
def test_bad_constructor_arguments(config, kwargs, error, match):
    args = {"num_envs": 1, "config": config, "level": LEVEL_0, "backend": "cpu_reference", "track": level0_track()}
    args.update(kwargs)
    num_envs = args.pop("num_envs")
    with pytest.raises(error, match=match):
        VecCarRacingEnv(num_envs, **args)


@pytest.mark.parametrize("backend", ["cpu_reference", "mjx_warp"])
@pytest.mark.parametrize("num_envs", [3_000_000_000, 2**40])
def test_a_batch_that_cannot_fit_is_refused_before_any_allocation(config, backend, num_envs):
    """Before the check, 3e9 worlds were killed for memory while building
    the batched spaces."""
    with pytest.raises(ValueError, match=rf"num_envs={num_envs} needs at least .* GiB of host memory"):
        VecCarRacingEnv(num_envs, config=config, level=LEVEL_0, backend=backend, track=level0_track())


def test_the_footprint_bound_is_the_observation_bounds_in_host_memory(config):
    """One world more than the host could hold for the batched observation
    space's bounds (two observations a world) is refused; the physics data
    is measured from Warp's own arrays."""
    from racing_env.physics import MjxWarpPhysics
    from racing_env.spaces import observation_space

    obs = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in observation_space().spaces.values())
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with pytest.raises(ValueError, match="host memory"):
        VecCarRacingEnv(host // (2 * obs) + 1, config=config, level=LEVEL_0, backend="cpu_reference",
                        track=level0_track())
    per_world = MjxWarpPhysics.bytes_per_world(config)
    assert 1_000 < per_world < 1_000_000  # a car's MuJoCo data, not nothing and not the whole batch


def test_one_track_source_and_its_level(config, short_pool):
    with pytest.raises(ValueError, match="exactly one track source"):
        VecCarRacingEnv(1, config=config, level=SHORT_LEVEL, backend="cpu_reference", track=level0_track(),
                        track_pool=short_pool)
    with pytest.raises(ValueError, match="level"):
        VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track_pool=short_pool)
    with pytest.raises(TypeError, match="track_pool"):
        VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track_pool=[level0_track()])


def test_tracks_with_segments_too_short_are_refused(config):
    tiny = circle_track(10.0, 400, 3.0, 5)  # 0.16 m segments
    with pytest.raises(ValueError, match="segment"):
        VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=tiny)


def test_tracks_with_too_few_points_are_refused(config):
    from racing_env.race import MIN_POINTS

    few = circle_track(60.0, MIN_POINTS - 1, 6.0, 5)
    with pytest.raises(ValueError, match=f">= {MIN_POINTS}"):
        VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=few)
    VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference",
                    track=circle_track(60.0, MIN_POINTS, 6.0, 5))


def test_a_track_length_that_is_not_the_perimeter_is_refused(config):
    from racing_env import Track

    good = circle_track(60.0, 300, 6.0, 5)
    bad = Track(good.centerline, good.left_boundary, good.right_boundary, good.track_mask,
                np.float32(good.track_length * 1.01), good.track_id)
    with pytest.raises(ValueError, match="perimeter"):
        VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=bad)


def test_spaces_and_metadata(cpu_env):
    from gymnasium.vector import AutoresetMode

    assert cpu_env.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert set(cpu_env.single_observation_space.spaces) == set(OBSERVATION_FIELDS)
    np.testing.assert_array_equal(cpu_env.single_action_space.low, np.float32([-0.6, -8.0]))
    np.testing.assert_array_equal(cpu_env.single_action_space.high, np.float32([0.6, 4.0]))
    assert cpu_env.single_action_space.dtype == np.float32


# -- observation, info, seeds ------------------------------------------------------


def test_reset_observation_and_info(cpu_env):
    track = level0_track()
    obs, info = cpu_env.reset(seed=12345)
    obs = numpy_obs(obs)
    assert set(obs) == set(OBSERVATION_FIELDS)
    for key, (shape, dtype) in OBS_SPEC.items():
        assert obs[key].shape == shape and obs[key].dtype == dtype, key
    assert list(info) == list(INFO_FIELDS)
    assert info["benchmark_version"] == BENCHMARK_VERSION
    assert np.asarray(info["episode_seed"]).dtype == np.uint32
    assert int(info["episode_seed"][0]) == host_seed_word(12345, 0, 0, 0)
    assert int(info["controller_seed"][0]) == host_seed_word(12345, 1, 0, 0)
    assert int(info["track_id"][0]) == LEVEL0_TRACK_ID
    assert int(info["termination_reason"][0]) == 0
    assert not bool(info["lap_completed"][0])
    assert float(info["lap_time_s"][0]) == 0.0
    # At rest at the centerline's start, heading along its tangent.
    np.testing.assert_allclose(obs["position"][0], track.centerline[0], atol=1e-5)
    tangent = track.centerline[1] - track.centerline[0]
    np.testing.assert_allclose(obs["yaw"][0], np.arctan2(tangent[1], tangent[0]), atol=1e-6)
    np.testing.assert_array_equal(obs["velocity_body"], 0.0)
    assert obs["track_progress"][0] == 0.0
    np.testing.assert_array_equal(obs["centerline"][0], track.centerline)
    np.testing.assert_array_equal(obs["left_boundary"][0], track.left_boundary)
    np.testing.assert_array_equal(obs["right_boundary"][0], track.right_boundary)
    np.testing.assert_array_equal(obs["track_mask"][0], track.track_mask)
    assert obs["track_length"][0] == track.track_length


def test_seed_none_continues_with_the_next_episode(cpu_env):
    cpu_env.reset(seed=77)
    _, info = cpu_env.reset()
    assert int(info["episode_seed"][0]) == host_seed_word(77, 0, 0, 1)
    _, info = cpu_env.reset()
    assert int(info["controller_seed"][0]) == host_seed_word(77, 1, 0, 2)
    _, info = cpu_env.reset(seed=77)
    assert int(info["episode_seed"][0]) == host_seed_word(77, 0, 0, 0)


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (2**32, ValueError), (1.5, TypeError), (True, TypeError)])
def test_bad_seeds_raise_and_change_nothing(cpu_env, seed, error):
    cpu_env.reset(seed=5)
    before = numpy_obs(step(cpu_env, [[0.1, 1.0]])[0])
    with pytest.raises(error, match="seed"):
        cpu_env.reset(seed=seed)
    cpu_env.reset(seed=5)
    np.testing.assert_array_equal(step(cpu_env, [[0.1, 1.0]])[0]["position"], before["position"])


def test_track_choice_is_seedsequence_domain_two(config, short_pool):
    env = VecCarRacingEnv(1, config=config, level=SHORT_LEVEL, backend="cpu_reference", track_pool=short_pool)
    ids = np.asarray(short_pool.track_id)
    for root in [0, 1, 2, 99, 2**32 - 1, 123456789]:
        _, info = env.reset(seed=root)
        row = host_pool_row(host_seed_word(root, 2, 0, 0), len(short_pool))
        assert int(info["track_id"][0]) == ids[row]


def test_explicit_track_index_changes_only_the_row(config, short_pool):
    env = VecCarRacingEnv(1, config=config, level=SHORT_LEVEL, backend="cpu_reference", track_pool=short_pool)
    for row in range(3):
        obs, info = env.reset(seed=8, options={"track_indices": [row]})
        assert int(info["track_id"][0]) == int(short_pool.track_id[row])
        assert int(info["episode_seed"][0]) == host_seed_word(8, 0, 0, 0)
        np.testing.assert_array_equal(np.asarray(obs["centerline"][0]), np.asarray(short_pool.centerline[row]))


@pytest.mark.parametrize(
    "options, error",
    [
        ({"track_indices": [3]}, ValueError),
        ({"track_indices": [-1]}, ValueError),
        ({"track_indices": [0, 1]}, ValueError),
        ({"track_indices": [1.0]}, TypeError),
        ({"track_indices": [True]}, TypeError),
        ({"track_indices": 1}, TypeError),
        ({"track_index": 1}, ValueError),
        ("track_indices", TypeError),
    ],
)
def test_bad_reset_options(config, short_pool, options, error):
    env = VecCarRacingEnv(1, config=config, level=SHORT_LEVEL, backend="cpu_reference", track_pool=short_pool)
    with pytest.raises(error, match="options"):
        env.reset(seed=1, options=options)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros((1, 2), np.float32))


# -- actions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "action",
    [
        [[np.nan, 0.0]],
        [[0.0, np.inf]],
        [[-np.inf, 1.0]],
        np.zeros((1, 3), np.float32),
        np.zeros((2,), np.float32),
        [["left", "fast"]],
        [[0.0, 1.0, 2.0]],
        "steer",
        None,
        [object()],
    ],
    ids=["nan", "inf", "neg-inf", "shape-1x3", "shape-2", "strings", "long-row", "str", "none", "object"],
)
def test_invalid_actions_terminate_as_invalid_action(cpu_env, action):
    cpu_env.reset(seed=3)
    step(cpu_env, [[0.0, 2.0]])
    obs, reward, terminated, truncated, info = cpu_env.step(action)
    assert bool(terminated[0]) and not bool(truncated[0])
    assert int(info["termination_reason"][0]) == TerminationReason.INVALID_ACTION
    assert not bool(info["lap_completed"][0])
    # The next call is the NEXT_STEP reset, whatever action it is given.
    obs, reward, terminated, truncated, info = cpu_env.step([[np.nan, np.nan]])
    assert not bool(terminated[0]) and not bool(truncated[0]) and float(reward[0]) == 0.0
    assert int(info["episode_seed"][0]) == host_seed_word(3, 0, 0, 1)
    np.testing.assert_array_equal(np.asarray(obs["velocity_body"]), 0.0)


def test_out_of_range_actions_are_clipped_and_counted(config):
    a = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    b = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    a.reset(seed=1)
    b.reset(seed=1)
    wild = [[[2.0, 10.0]], [[-5.0, -30.0]], [[0.3, 1.0]], [[0.7, 4.5]]]
    tame = [[[0.6, 4.0]], [[-0.6, -8.0]], [[0.3, 1.0]], [[0.6, 4.0]]]
    for x, y in zip(wild, tame):
        oa, ra, *_ = step(a, x)
        ob, rb, *_ = step(b, y)
        for key in oa:
            np.testing.assert_array_equal(oa[key], ob[key])
        assert ra == rb
    assert int(a.clipped_action_count[0]) == 3
    assert int(b.clipped_action_count[0]) == 0


def test_host_and_device_actions_agree(config):
    a = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    b = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    a.reset(seed=2)
    b.reset(seed=2)
    for action in ([0.2, 3.0], [0.1, -1.0]):
        oa = a.step([action])[0]
        ob = b.step(jnp.asarray([action], jnp.float64 if jax.config.jax_enable_x64 else jnp.float32))[0]
        np.testing.assert_array_equal(np.asarray(oa["position"]), np.asarray(ob["position"]))


# -- termination ---------------------------------------------------------------------------


def test_a_driven_lap_is_a_success(cpu_env, config):
    obs, _ = cpu_env.reset(seed=4)
    total = 0.0
    for n in range(1, 4000):
        obs, reward, terminated, truncated, info = step(cpu_env, pursuit(obs, speed_mps=15.0))
        total += reward
        assert not truncated
        if terminated:
            break
    assert int(info["termination_reason"][0]) == TerminationReason.SUCCESS
    assert bool(info["lap_completed"][0])
    assert obs["track_progress"][0] == 1.0
    np.testing.assert_allclose(float(info["lap_time_s"][0]), n * config.control_dt_s, rtol=1e-6)
    # The Challenge reward is the lap fraction gained: it sums to the progress.
    np.testing.assert_allclose(total, 1.0, rtol=1e-5)
    obs, reward, terminated, truncated, info = step(cpu_env, [[0.0, 0.0]])
    assert reward == 0.0 and not terminated and not truncated
    assert obs["track_progress"][0] == 0.0 and int(info["termination_reason"][0]) == 0
    assert float(info["lap_time_s"][0]) == 0.0 and not bool(info["lap_completed"][0])


def test_leaving_the_road_is_off_track(cpu_env, config):
    track = level0_track()
    n = track.num_points
    obs, _ = cpu_env.reset(seed=4)
    history = []
    for _ in range(400):
        obs, reward, terminated, truncated, info = step(cpu_env, [[0.5, 2.0]])
        wheels = wheel_points(obs["position"][0].astype(np.float64), float(obs["yaw"][0]),
                              config.wheelbase_m, config.track_width_m)
        inside = on_track(wheels, track.left_boundary[:n].astype(np.float64),
                          track.right_boundary[:n].astype(np.float64))
        history.append(inside.all())
        if terminated:
            break
    assert int(info["termination_reason"][0]) == TerminationReason.OFF_TRACK
    assert not history[-1] and all(history[:-1])


def test_timeout_truncates(config):
    level = Level(level_id=0, name="quick", max_episode_steps=5)
    env = VecCarRacingEnv(1, config=config, level=level, backend="cpu_reference", track=level0_track())
    env.reset(seed=0)
    flags = [step(env, [[0.0, 0.0]])[2:4] for _ in range(7)]
    assert flags == [(False, False)] * 4 + [(False, True)] + [(False, False)] * 2


def test_the_largest_timeout_the_step_counter_holds_steps(config):
    from racing_env.config import MAX_EPISODE_STEPS

    level = Level(level_id=0, name="endless", max_episode_steps=MAX_EPISODE_STEPS)
    env = VecCarRacingEnv(1, config=config, level=level, backend="cpu_reference", track=level0_track())
    env.reset(seed=0)
    assert [step(env, [[0.0, 0.0]])[2:4] for _ in range(2)] == [(False, False)] * 2


def test_neutral_action_reaches_the_timeout_at_rest(config):
    level = Level(level_id=0, name="quick", max_episode_steps=60)
    env = VecCarRacingEnv(1, config=config, level=level, backend="cpu_reference", track=level0_track())
    obs0, _ = env.reset(seed=0)
    for _ in range(60):
        obs, reward, terminated, truncated, info = step(env, [[0.0, 0.0]])
    assert truncated and not terminated and int(info["termination_reason"][0]) == TerminationReason.TIMEOUT
    np.testing.assert_allclose(obs["position"], np.asarray(obs0["position"]), atol=1e-3)
    assert obs["track_progress"][0] < 1e-4


def test_pool_rows_reach_the_observation(config):
    pool = TrackPool.from_tracks([circle_track(70.0, 640, 6.0, 1), circle_track(90.0, 300, 6.0, 2)],
                                 level_id=0, split="train")
    env = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track_pool=pool)
    obs, info = env.reset(seed=0, options={"track_indices": [1]})
    assert int(np.asarray(obs["track_mask"]).sum()) == 300
    np.testing.assert_allclose(float(obs["position"][0, 0]), 90.0, atol=1e-4)


@pytest.mark.parametrize(
    "action",
    [np.zeros((1, 2), np.complex64), [[1j, 0.0]], np.array([[1.0, 2.0]], dtype=object).astype(str)],
    ids=["complex-array", "complex-row", "numeric-strings"],
)
def test_non_real_actions_are_invalid(cpu_env, action):
    cpu_env.reset(seed=3)
    _, _, terminated, _, info = cpu_env.step(action)
    assert bool(terminated[0]) and int(info["termination_reason"][0]) == TerminationReason.INVALID_ACTION


def test_finite_actions_beyond_float32_are_clipped_not_invalid(config):
    a = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    b = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    a.reset(seed=1)
    b.reset(seed=1)
    oa, _, terminated, _, info = a.step(np.array([[1e300, -1e300]], np.float64))
    ob, *_ = step(b, [[0.6, -8.0]])
    assert not bool(terminated[0]) and int(info["termination_reason"][0]) == TerminationReason.NONE
    assert int(a.clipped_action_count[0]) == 1
    np.testing.assert_array_equal(np.asarray(oa["position"]), ob["position"])


POOL_ELSEWHERE = """
import jax, numpy as np
from racing_env import LEVEL_0, ProjectConfig, TrackPool, VecCarRacingEnv, level0_track
other = jax.devices()[1]
track = level0_track()
pool = TrackPool.from_tracks([track], level_id=0, split="x")
moved = TrackPool.from_arrays(*(jax.device_put(getattr(pool, f), other) for f in (
    "centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")),
    level_id=0, split="x", check_values=False)
assert moved.centerline.devices() == {other}
env = VecCarRacingEnv(1, config=ProjectConfig(), level=LEVEL_0, backend=BACKEND, track_pool=moved)
obs, _ = env.reset(seed=0)
obs, *_ = env.step(np.zeros((1, 2), np.float32))
assert obs["centerline"].devices() == {jax.devices()[0]}
print("ok")
"""


def _on_two_host_devices(code: str):
    """``code`` run in a fresh Python with two host CPU devices, within 300 s."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


EXIT_WHILE_STEPPING = """
import numpy as np
from racing_env import LEVEL_0, ProjectConfig, VecCarRacingEnv, level0_track
envs = [VecCarRacingEnv(2, config=ProjectConfig(), level=LEVEL_0, backend="mjx_warp", track=level0_track())
        for _ in range(2)]
for env in envs:
    env.reset(seed=0)
    env.step(np.zeros((2, 2), np.float32))
for array in envs[0].core_state()[1]:  # as a call that failed after donating its inputs leaves them
    array.delete()
print("stepped")
"""


def test_a_process_exits_with_a_step_still_running_on_two_host_devices():
    """With two host devices JAX runs a CPU call on a worker thread; a step
    left running at exit (nothing waited for its outputs) once hung the
    interpreter's finalization forever (its Warp physics is a Python
    callback). An env whose buffers are gone does not stop the others
    being waited for, and prints nothing."""
    out = _on_two_host_devices(EXIT_WHILE_STEPPING)
    assert out.returncode == 0 and out.stdout.strip().endswith("stepped"), out.stderr[-3000:]
    assert "Exception ignored" not in out.stderr, out.stderr[-3000:]


@pytest.mark.parametrize("backend", ["cpu_reference", "mjx_warp"])
def test_a_pool_on_another_device_drives_the_envs_worlds(backend):
    """A pool built on one device (the CPU) serves an env on another (the GPU):
    two host devices stand in for them (the GPU tests build mjx_warp envs on
    the GPU from pools built on the CPU). Run with a time limit: two host
    devices must not make the env wait forever."""
    out = _on_two_host_devices(f"BACKEND = {backend!r}\n" + POOL_ELSEWHERE)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
