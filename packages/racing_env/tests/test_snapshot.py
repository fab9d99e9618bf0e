"""snapshot / restore: an env restored from a snapshot continues exactly as
the original did (every output, bitwise), on both backends; a snapshot
that does not fit, or holds values no run reaches, is refused by name and
changes nothing; every snapshot of a real lap is accepted."""

from __future__ import annotations

import warnings

import mujoco
import numpy as np
import pytest

from racing_env import LEVEL_0, Level, ProjectConfig, VecCarRacingEnv, level0_track
from racing_env.io import SNAPSHOT_MARGIN_M, SNAPSHOT_SPEED_FACTOR
from racing_env.pursuit import pursuit
from racing_env.race import WINDOW
from racing_env.types import TerminationReason

#: Level 0 with 30-step episodes, for the one-world cpu_reference env.
SHORT_CPU = Level(level_id=0, name="short", max_episode_steps=30)


def actions(env, count, seed):
    rng = np.random.default_rng(seed)
    low, high = env.single_action_space.low, env.single_action_space.high
    out = rng.uniform(low, high, (count, env.num_envs, 2)).astype(np.float32)
    out[count // 2, 0] = np.nan  # one world ends invalid mid-way: a NEXT_STEP reset follows
    return out


def outputs(env, batches):
    trace = []
    for a in batches:
        obs, reward, terminated, truncated, info = env.step(a)
        leaves = [np.asarray(v) for v in (*obs.values(), reward, terminated, truncated)]
        leaves += [np.asarray(v) for k, v in info.items() if k != "benchmark_version"]
        trace.append(leaves)
    return trace


def test_a_restored_mjx_env_continues_exactly(mjx_pool_env):
    env = mjx_pool_env
    env.reset(seed=5)
    outputs(env, actions(env, 6, 0))  # into the episodes, past a timeout
    snap = env.snapshot()
    later = actions(env, 9, 1)
    first = outputs(env, later)
    env.reset(seed=99)
    env.restore(snap)
    again = outputs(env, later)
    for a, b in zip(first, again):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_a_restored_cpu_env_continues_exactly_in_a_new_env():
    def make():
        return VecCarRacingEnv(1, config=ProjectConfig(), level=SHORT_CPU, backend="cpu_reference",
                               track=level0_track())

    one, two = make(), make()
    one.reset(seed=3)
    outputs(one, actions(one, 12, 2))
    snap = one.snapshot()
    later = actions(one, 25, 3)
    first = outputs(one, later)
    two.reset(seed=4)
    two.restore(snap)
    for a, b in zip(first, outputs(two, later)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_a_snapshot_that_does_not_fit_is_refused_and_changes_nothing(mjx_pool_env):
    env = mjx_pool_env
    env.reset(seed=1)
    snap = env.snapshot()
    before = env.snapshot()
    bad = dict(snap)
    bad["state.steps"] = snap["state.steps"][:2]
    with pytest.raises(ValueError, match=r"snapshot\['state.steps'\] is int32\[2\], expected int32\[3\]"):
        env.restore(bad)
    with pytest.raises(ValueError, match="missing \\['physics.qvel'\\]"):
        env.restore({k: v for k, v in snap.items() if k != "physics.qvel"})
    rows = dict(snap, **{"state.race.row": np.full(3, 7, np.int32)})
    with pytest.raises(ValueError, match="outside this env's 3 pool rows"):
        env.restore(rows)
    with pytest.raises(TypeError, match="snapshot must be a dict"):
        env.restore([1, 2])
    after = env.snapshot()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_snapshot_and_restore_need_a_reset_first():
    env = VecCarRacingEnv(1, config=ProjectConfig(), level=SHORT_CPU, backend="cpu_reference", track=level0_track())
    with pytest.raises(RuntimeError, match="reset"):
        env.snapshot()
    with pytest.raises(RuntimeError, match="reset"):
        env.restore({})


def crafted(snap, key, value, world=1):
    """``snap`` with world ``world``'s entry of ``key`` set to ``value``."""
    array = np.array(snap[key])
    array[world] = value
    return dict(snap, **{key: array})


@pytest.mark.parametrize(("key", "value", "match"), [
    ("state.world", 7, r"snapshot\['state.world'\] must be this env's world indices; world 1 \(entry 1, "
                    r"pool row \d of \d+ segments\) holds 7$"),
    ("state.race.local_segment", -1, r"'state.race.local_segment'\] must be in \[0, its row's segments\)"),
    ("state.race.local_segment", 10**6, r"'state.race.local_segment'\] must be in .* holds 1000000$"),
    ("state.race.progress_segment", -3, r"'state.race.progress_segment'\] must be in \[0, its row's segments \+ 16\]"),
    ("state.race.progress_segment", 10**6, r"'state.race.progress_segment'\]"),
    ("state.race.progress_m", np.nan, r"'state.race.progress_m'\] must be finite, in \[0, twice its row's lap\] m"),
    ("state.race.progress_m", -1.0, r"'state.race.progress_m'\]"),
    ("state.race.progress_m", 1e9, r"'state.race.progress_m'\]"),
    ("state.steps", -1, r"'state.steps'\] must be in \[0, 4\] \(the Level's timeout\); world 1 .* holds -1$"),
    ("state.steps", 5, r"'state.steps'\]"),
    ("state.clipped", -2, r"'state.clipped'\] must be >= 0"),
    ("physics.qvel", np.inf, r"'physics.qvel'\] must be finite and at most 1e\+10 in size \(past it MuJoCo takes "
                             r"a state for diverged\); world 1 .* holds a value that is not finite or is beyond "
                             r"1e\+10$"),
    ("physics.time", np.nan, r"'physics.time'\] must be finite"),
    ("physics.qacc_warmstart", -np.inf, r"'physics.qacc_warmstart'\] must be finite"),
    ("physics.qacc_warmstart", np.float32(-1.1e10), r"'physics.qacc_warmstart'\] must be finite and at most 1e\+10"),
    ("physics.qvel", [0.0] * 3 + [2e10] + [0.0] * 8, r"'physics.qvel'\] must be finite and at most 1e\+10"),
])
def test_a_snapshot_holding_values_no_run_reaches_is_refused_and_changes_nothing(mjx_pool_env, key, value, match):
    """A snapshot of the right layout whose values no run of the env
    reaches (crafted, or written by another env) is refused by field and
    world before anything changes."""
    env = mjx_pool_env
    env.reset(seed=2)
    outputs(env, actions(env, 3, 4))
    before = env.snapshot()
    with pytest.raises(ValueError, match=match):
        env.restore(crafted(before, key, value))
    after = env.snapshot()
    assert all(np.array_equal(before[k], after[k], equal_nan=True) for k in before)


def test_a_snapshot_whose_car_is_far_off_its_track_is_refused(mjx_pool_env, short_pool):
    """A car more than `SNAPSHOT_MARGIN_M` outside its track's bounding box
    is refused on both backends; one just inside that margin is accepted."""
    env = mjx_pool_env
    env.reset(seed=3)
    snap = env.snapshot()
    row = int(snap["state.race.row"][2])
    valid = np.asarray(short_pool.track_mask[row], bool)
    edges = np.concatenate([np.asarray(short_pool.left_boundary[row])[valid],
                            np.asarray(short_pool.right_boundary[row])[valid]])
    right = float(edges[:, 0].max())
    qpos = np.array(snap["physics.qpos"])
    qpos[2, 0] = right + SNAPSHOT_MARGIN_M + 1.0
    far = (r"snapshot\['physics.qpos'\] must be a car within 50 m of its track's bounding box \(at z = 0\); "
           r"world 2 \(entry 2, pool row \d of \d+ segments\) holds a car at \(")
    with pytest.raises(ValueError, match=far):
        env.restore(dict(snap, **{"physics.qpos": qpos}))
    assert np.array_equal(env.snapshot()["physics.qpos"], snap["physics.qpos"])
    qpos[2, 0] = right + SNAPSHOT_MARGIN_M - 1.0
    env.restore(dict(snap, **{"physics.qpos": qpos}))
    np.testing.assert_array_equal(env.snapshot()["physics.qpos"], qpos)
    for height in (SNAPSHOT_MARGIN_M + 1.0, -SNAPSHOT_MARGIN_M - 1.0):  # the track lies at z = 0
        high = qpos.copy()
        high[2, 2] = height
        with pytest.raises(ValueError, match=r"'physics.qpos'\] must be a car within 50 m .* holds a car at \(.*, "
                                             rf"{height}\) m$"):
            env.restore(dict(snap, **{"physics.qpos": high}))
        np.testing.assert_array_equal(env.snapshot()["physics.qpos"], qpos)
    qpos[2, 2] = SNAPSHOT_MARGIN_M - 1.0
    env.restore(dict(snap, **{"physics.qpos": qpos}))
    np.testing.assert_array_equal(env.snapshot()["physics.qpos"], qpos)

    cpu = VecCarRacingEnv(1, config=ProjectConfig(), level=SHORT_CPU, backend="cpu_reference", track=level0_track())
    cpu.reset(seed=0)
    state = cpu.snapshot()
    far = np.array(state["physics.mujoco_state"])
    far[1] = 1e9  # x: the integration state is the time, then qpos
    with pytest.raises(ValueError, match=r"'physics.mujoco_state'\] must be a car within 50 m .* at \(1000000000.0, "):
        cpu.restore(dict(state, **{"physics.mujoco_state": far}))
    far[1], far[5] = state["physics.mujoco_state"][1], np.nan
    with pytest.raises(ValueError, match=r"'physics.mujoco_state'\] must be finite and at most 1e\+10 .*; world 0 "):
        cpu.restore(dict(state, **{"physics.mujoco_state": far}))
    nq = cpu.physics.mj_model.nq
    far[5], far[1 + nq + 3] = state["physics.mujoco_state"][5], -2e10  # a body rotation rate past MuJoCo's bound
    with pytest.raises(ValueError, match=r"'physics.mujoco_state'\] must be finite and at most 1e\+10 .*; world 0 "):
        cpu.restore(dict(state, **{"physics.mujoco_state": far}))
    far[1 + nq + 3], far[3] = state["physics.mujoco_state"][1 + nq + 3], 51.0  # z, 51 m above the track
    with pytest.raises(ValueError, match=r"'physics.mujoco_state'\] must be a car within 50 m .* 51.0\) m$"):
        cpu.restore(dict(state, **{"physics.mujoco_state": far}))
    assert all(np.array_equal(state[k], cpu.snapshot()[k]) for k in state)


def test_a_physics_value_at_mujocos_bound_is_accepted_and_the_next_float_refused(mjx_pool_env):
    """MuJoCo takes a state with a value beyond ``mjMAXVAL`` (1e10) for
    diverged: a snapshot's value at it is restored, the next float32 past
    it is refused, with nothing changed."""
    assert mujoco.mjMAXVAL == 1e10
    env = mjx_pool_env
    env.reset(seed=6)
    snap = env.snapshot()
    warm = np.array(snap["physics.qacc_warmstart"])
    warm[1, 0] = np.float32(1e10)
    env.restore(dict(snap, **{"physics.qacc_warmstart": warm}))
    accepted = env.snapshot()
    np.testing.assert_array_equal(accepted["physics.qacc_warmstart"], warm)
    warm[1, 0] = np.nextafter(np.float32(1e10), np.float32(np.inf))
    with pytest.raises(ValueError, match=r"'physics.qacc_warmstart'\] must be finite and at most 1e\+10 in size"):
        env.restore(dict(snap, **{"physics.qacc_warmstart": warm}))
    assert all(np.array_equal(accepted[k], v, equal_nan=True) for k, v in env.snapshot().items())


def test_a_snapshot_whose_car_is_faster_than_a_run_allows_is_refused(mjx_pool_env):
    """A car faster than `SNAPSHOT_SPEED_FACTOR` times what the largest
    acceleration (4 m/s^2) gives over the Level's timeout (4 calls of
    0.02 s here: 0.64 m/s) is refused by field on both backends, one at
    that speed is accepted; a finite but absurd velocity (1e9 m/s) too,
    and one past float64's range (by MuJoCo's bound, without a warning)."""
    assert SNAPSHOT_SPEED_FACTOR == 2.0
    env = mjx_pool_env
    env.reset(seed=4)
    snap = env.snapshot()
    top = np.float32(2.0 * 4.0 * 4 * 0.02)
    qvel = np.array(snap["physics.qvel"])
    qvel[2, :3] = [0.0, -top, 0.0]
    env.restore(dict(snap, **{"physics.qvel": qvel}))
    accepted = env.snapshot()
    np.testing.assert_array_equal(accepted["physics.qvel"], qvel)
    qvel[2, 1] = -np.nextafter(top, np.float32(np.inf))
    fast = (r"snapshot\['physics.qvel'\] must be a car at most 0.64 m/s fast \(2 x its largest acceleration over "
            r"the Level's timeout\); world 2 \(entry 2, pool row \d of \d+ segments\) holds a car at 0.64\d* m/s$")
    with pytest.raises(ValueError, match=fast):
        env.restore(dict(snap, **{"physics.qvel": qvel}))
    assert all(np.array_equal(accepted[k], v, equal_nan=True) for k, v in env.snapshot().items())

    cpu = VecCarRacingEnv(1, config=ProjectConfig(), level=SHORT_CPU, backend="cpu_reference", track=level0_track())
    cpu.reset(seed=0)
    state = cpu.snapshot()
    nq = cpu.physics.mj_model.nq
    fast = np.array(state["physics.mujoco_state"])
    fast[1 + nq] = 1e9  # the integration state is the time, qpos, then qvel
    with pytest.raises(ValueError, match=r"'physics.mujoco_state'\] must be a car at most 4.8 m/s fast .* "
                                         r"holds a car at 1e\+09 m/s$"):
        cpu.restore(dict(state, **{"physics.mujoco_state": fast}))
    assert all(np.array_equal(state[k], cpu.snapshot()[k], equal_nan=True) for k in state)
    fast[1 + nq: 4 + nq] = [1e308, -1e308, 1e308]  # a speed past float64's range: refused, and without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"'physics.mujoco_state'\] must be finite and at most 1e\+10 "):
            cpu.restore(dict(state, **{"physics.mujoco_state": fast}))
    assert all(np.array_equal(state[k], cpu.snapshot()[k], equal_nan=True) for k in state)
    fast[1 + nq: 4 + nq] = [4.8, 0.0, 0.0]  # 2 x 4 m/s^2 x 30 calls of 0.02 s
    cpu.restore(dict(state, **{"physics.mujoco_state": fast}))
    assert cpu.snapshot()["physics.mujoco_state"][1 + nq] == 4.8


def overwritten(arrays):
    """Every array of ``arrays`` filled, in place, with values no run holds."""
    for value in arrays.values():
        value[...] = 7 if value.dtype.kind in "biu" else 12345.0


def test_restore_keeps_copies_of_the_arrays_it_is_given(mjx_pool_env):
    """Arrays overwritten after `restore` returns leave the env as restored,
    on both backends (JAX on a CPU can keep a host array as the device
    buffer itself: 20 restores, each of fresh arrays, give it many
    chances)."""
    cpu = VecCarRacingEnv(1, config=ProjectConfig(), level=SHORT_CPU, backend="cpu_reference", track=level0_track())
    for env in (mjx_pool_env, cpu):
        env.reset(seed=5)
        snap = env.snapshot()
        for _ in range(20):
            given = {k: np.array(v) for k, v in snap.items()}
            env.restore(given)
            overwritten(given)
            assert all(np.array_equal(snap[k], v, equal_nan=True) for k, v in env.snapshot().items())


def test_every_snapshot_of_a_real_lap_is_accepted():
    """Pure pursuit laps Level 0 on the CPU; a snapshot taken every 100
    calls, at the call that completes the lap (its progress past the
    finish) and at the reset after it restores, and the env goes on
    exactly as before."""
    env = VecCarRacingEnv(1, config=ProjectConfig(), level=LEVEL_0, backend="cpu_reference", track=level0_track())
    obs, _ = env.reset(seed=0)
    calls, ended = 0, None
    while ended is None or calls <= ended:
        obs, _, terminated, truncated, info = env.step(pursuit(obs, speed_mps=20.0))
        calls += 1
        if ended is None and (terminated[0] or truncated[0]):
            assert int(info["termination_reason"][0]) == TerminationReason.SUCCESS
            ended = calls
        if calls % 100 == 0 or calls >= (ended or calls + 1):
            snap = env.snapshot()
            env.restore(snap)
            assert all(np.array_equal(snap[k], v) for k, v in env.snapshot().items())
            if calls == ended:  # the lap's last call: progress at or past the finish, the next call resets
                assert snap["state.race.progress_m"][0] >= float(env.params.tracks.lap_m[0])
                assert snap["state.pending"][0]
    assert ended is not None and snap["state.race.progress_segment"][0] == 0  # the last one: after the reset


def bounds(env, snap, world=1):
    """Each checked field's edge for world ``world`` of ``snap``: (field,
    the last value a run reaches, the first it cannot)."""
    row = int(snap["state.race.row"][world])
    n, lap = int(env.params.tracks.num_points[row]), np.float32(env.params.tracks.lap_m[row])
    return [("state.race.local_segment", n - 1, n), ("state.race.local_segment", 0, -1),
            ("state.race.progress_segment", n + WINDOW, n + WINDOW + 1), ("state.race.progress_segment", 0, -1),
            ("state.race.progress_m", 2 * lap, np.nextafter(2 * lap, np.float32(np.inf))),
            ("state.race.progress_m", np.float32(0.0), np.float32(-1e-6)),
            ("state.steps", env.level.max_episode_steps, env.level.max_episode_steps + 1),
            ("state.steps", 0, -1), ("state.clipped", 0, -1)]


def test_each_bound_accepts_its_edge_and_refuses_one_past_it(mjx_pool_env):
    """At each checked field's edge the snapshot restores; one step past it
    (one segment, one call, the next float) is refused by name."""
    env = mjx_pool_env
    env.reset(seed=6)
    snap = env.snapshot()
    for key, edge, past in bounds(env, snap):
        env.restore(crafted(snap, key, edge))
        assert env.snapshot()[key][1] == edge
        with pytest.raises(ValueError, match=rf"snapshot\['{key}'\] must be .* holds {past}$"):
            env.restore(crafted(snap, key, past))


def test_a_snapshot_at_every_worlds_timeout_is_accepted(mjx_pool_env):
    """Every world at the Level's timeout (its step count at the limit, its
    next call a reset) restores and continues as before."""
    env = mjx_pool_env
    env.reset(seed=2)
    outputs(env, np.zeros((env.level.max_episode_steps, env.num_envs, 2), np.float32))
    snap = env.snapshot()
    assert (snap["state.steps"] == env.level.max_episode_steps).all() and snap["state.pending"].all()
    later = actions(env, 3, 5)
    first = outputs(env, later)
    env.restore(snap)
    for a, b in zip(first, outputs(env, later)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
