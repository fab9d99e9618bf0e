"""`racing_env.core`, the Challenge's pure functions: a ``jax.lax.scan`` of
`core.step` from the env's own state gives, bitwise, what the vector env
gives call by call (NEXT_STEP resets after timeouts and invalid actions
included), and the env's accessors for it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from worlds import SHORT_LEVEL, check_donated_buffers_keep_their_addresses

from racing_env import LEVEL_0, TerminationReason, VecCarRacingEnv, core, level0_track
from racing_env.types import INFO_FIELDS

ROOT = 77


def equal(a, b, where: str) -> None:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=where)


def test_a_scan_of_the_core_is_the_env_call_by_call(mjx_pool_env):
    env = mjx_pool_env
    steps, worlds = 14, env.num_envs
    rng = np.random.default_rng(5)
    actions = rng.uniform([-0.8, -10.0], [0.8, 6.0], (steps, worlds, 2)).astype(np.float32)  # some clipped
    actions[2, 1, 0] = np.nan  # invalid: ends world 1's episode
    actions[9, 1, 1] = np.inf
    actions[5, 2] = -np.inf
    env.reset(seed=ROOT)
    start = jax.tree.map(jnp.copy, env.core_state())  # the env's next step consumes its own arrays
    params, physics = env.params, env.physics

    def body(carry, action):
        state, data = carry
        state, data, *out = core.step(params, physics, state, data, action)
        return (state, data), out

    end, scanned = jax.jit(lambda carry, a: jax.lax.scan(body, carry, a))(start, jnp.asarray(actions))
    reasons = []
    for t in range(steps):
        obs, reward, terminated, truncated, info = env.step(jnp.asarray(actions[t]))
        want = [obs, reward, terminated, truncated, {k: v for k, v in info.items() if k != "benchmark_version"}]
        got = jax.tree.map(lambda x, t=t: x[t], scanned)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
            equal(a, b, f"call {t + 1}, {jax.tree_util.keystr(path)}")
        reasons.append(np.asarray(info["termination_reason"]))
    for a, b in zip(jax.tree.leaves(end), jax.tree.leaves(env.core_state())):
        equal(a, b, "the state after the scan")
    seen = set(np.concatenate(reasons).tolist())
    assert {TerminationReason.INVALID_ACTION, TerminationReason.TIMEOUT} <= seen  # both kinds of reset ran
    assert set(scanned[4]) == set(INFO_FIELDS) - {"benchmark_version"}


def test_an_env_continues_from_where_a_scan_of_its_core_ended(mjx_pool_env):
    """`VecCarRacingEnv.continue_from`: after a scan of `core.step` from its
    own state, the env steps on, and snapshots, bitwise as it would have
    after making those calls itself."""
    env = mjx_pool_env
    rng = np.random.default_rng(9)
    actions = jnp.asarray(rng.uniform([-0.8, -10.0], [0.8, 6.0], (9, env.num_envs, 2)).astype(np.float32))
    env.reset(seed=ROOT + 1)
    start = env.snapshot()
    params, physics = env.params, env.physics

    def body(carry, action):
        state, data, *_ = core.step(params, physics, *carry, action)
        return (state, data), None

    end, _ = jax.jit(lambda carry, a: jax.lax.scan(body, carry, a))(jax.tree.map(jnp.copy, env.core_state()),
                                                                    actions[:6])
    env.continue_from(*end)
    scanned = env.snapshot()
    after = [env.step(actions[t])[:4] for t in range(6, 9)]
    env.restore(start)
    for t in range(6):
        env.step(actions[t])
    assert scanned.keys() == env.snapshot().keys()
    for key, value in env.snapshot().items():
        equal(scanned[key], value, f"the snapshot's {key}")
    for t, got in zip(range(6, 9), after):
        for a, b in zip(got, env.step(actions[t])[:4]):
            jax.tree.map(lambda x, y, t=t: equal(x, y, f"call {t + 1}"), a, b)


def test_continue_from_refuses_another_layout_and_changes_nothing(config, mjx_pool_env, cpu_env):
    env = mjx_pool_env
    env.reset(seed=ROOT)
    state, data = jax.tree.map(jnp.copy, env.core_state())
    before = env.snapshot()
    with pytest.raises(ValueError, match=r"data\.qpos must be a JAX float32\[.*\] array, got float32\[3, 7\]"):
        env.continue_from(state, data._replace(qpos=jnp.zeros((3, 7), jnp.float32)))
    with pytest.raises(ValueError, match=r"state\.steps must be a JAX int32\[.*\] array, got float32"):
        env.continue_from(state._replace(steps=state.steps.astype(jnp.float32)), data)
    with pytest.raises(ValueError, match="state must have core_state's structure"):
        env.continue_from((state,), data)
    for key, value in env.snapshot().items():
        equal(before[key], value, f"the snapshot's {key}")
    cpu_env.reset(seed=ROOT)
    with pytest.raises(ValueError, match="continue_from needs the mjx_warp backend"):
        cpu_env.continue_from(state, data)
    fresh = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="mjx_warp", track=level0_track())
    with pytest.raises(RuntimeError, match="call reset\\(\\) before continue_from\\(\\)"):
        fresh.continue_from(state, data)


def test_the_params_are_a_pytree_of_the_pool_arrays(mjx_pool_env, short_pool):
    params = mjx_pool_env.params
    assert isinstance(params, core.EnvParams)
    assert params.level == SHORT_LEVEL and params.pool_size == len(short_pool)
    leaves = jax.tree.leaves(params)
    assert len(leaves) == len(jax.tree.leaves(params.tracks))  # the car and the Level are static
    equal(params.tracks.track_id, short_pool.track_id, "track ids")


def test_the_core_state_needs_the_mjx_backend_and_a_reset(config, cpu_env):
    with pytest.raises(ValueError, match="core_state needs the mjx_warp backend"):
        cpu_env.core_state()
    fresh = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="mjx_warp", track=level0_track())
    with pytest.raises(RuntimeError, match="call reset\\(\\) before core_state\\(\\)"):
        fresh.core_state()


def test_an_env_of_a_range_of_worlds_is_that_share_of_one_env_of_all(config, short_pool, mjx_pool_env):
    """``first_world``: two processes that each drive a share of one batch
    get, bitwise, the worlds of one env of all of them (seeds, TrackPool
    choices and autoresets included)."""
    whole = mjx_pool_env
    share = VecCarRacingEnv(2, config=config, level=SHORT_LEVEL, backend="mjx_warp", track_pool=short_pool,
                            first_world=1)
    assert share.first_world == 1 and whole.first_world == 0
    rng = np.random.default_rng(8)
    actions = rng.uniform([-0.5, -4.0], [0.5, 4.0], (10, 3, 2)).astype(np.float32)
    got, want = [share.reset(seed=ROOT)], [whole.reset(seed=ROOT)]
    for t in range(10):  # 4-step episodes: every world resets twice, on new seeds and rows
        got.append(share.step(actions[t, 1:]))
        want.append(whole.step(actions[t]))
    for t, (a, b) in enumerate(zip(got, want)):
        b = jax.tree.map(lambda x: x[1:] if getattr(x, "ndim", 0) else x, b)
        for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
            equal(x, y, f"call {t}, {jax.tree_util.keystr(path)}")
    assert len(set(np.asarray(got[-1][-1]["episode_seed"]).tolist())) == 2


@pytest.mark.parametrize(("first_world", "error"), [(-1, ValueError), (2**32 - 1, ValueError), (True, TypeError),
                                                    (1.0, TypeError)])
def test_first_world_is_checked_by_name(config, short_pool, first_world, error):
    with pytest.raises(error, match="first_world"):
        VecCarRacingEnv(2, config=config, level=SHORT_LEVEL, backend="mjx_warp", track_pool=short_pool,
                        first_world=first_world)


def test_donated_buffers_keep_their_addresses(mjx_pool_env):
    """On the CPU as on a GPU (test_gpu.py runs the same check there)."""
    check_donated_buffers_keep_their_addresses(mjx_pool_env)
