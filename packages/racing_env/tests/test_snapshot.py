"""snapshot / restore: an env restored from a snapshot continues exactly as
the original did (every output, bitwise), on both backends; a snapshot
that does not fit is refused by name and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from racing_env import Level, ProjectConfig, VecCarRacingEnv, level0_track

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
