"""The mjx_warp backend on a CUDA GPU: no transfers in either direction,
stable donated buffers, no graph capture after warm-up, parity with MuJoCo C,
many worlds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from racing_env.pursuit import pursuit
from worlds import check_donated_buffers_keep_their_addresses
from racing_env import LEVEL_0, TerminationReason, VecCarRacingEnv, level0_track

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA device for JAX and Warp"),
]


@pytest.fixture(scope="module")
def gpu_env(config):
    return VecCarRacingEnv(64, config=config, level=LEVEL_0, backend="mjx_warp", track=level0_track())


def test_state_lives_on_the_gpu(gpu_env):
    obs, info = gpu_env.reset(seed=0)
    for value in [*obs.values(), info["episode_seed"], info["track_id"]]:
        assert value.devices() == {jax.devices("gpu")[0]}
    assert gpu_env.core_state()[1].qpos.devices() == {jax.devices("gpu")[0]}


def test_no_transfers_either_way_in_active_and_mixed_reset_steps(gpu_env):
    env = gpu_env
    env.reset(seed=1)
    action = jnp.full((env.num_envs, 2), 0.1, jnp.float32)
    spoiled = action.at[::3].set(jnp.nan)
    for a in (action, spoiled, action):  # warm-up, including a reset step
        jax.block_until_ready(env.step(a))
    env.reset(seed=1)
    with jax.transfer_guard("disallow"):
        out = env.step(action)
        jax.block_until_ready(out)
        out = env.step(spoiled)
        terminated = out[2]
        out = env.step(action)
        jax.block_until_ready(out)
    terminated = np.asarray(terminated)
    assert terminated[::3].all() and not np.delete(terminated, np.s_[::3]).any()
    reasons = np.asarray(out[4]["termination_reason"])
    assert (reasons == TerminationReason.NONE).all()
    assert (np.asarray(out[1])[::3] == 0.0).all()


def test_donated_buffers_keep_their_addresses(gpu_env):
    check_donated_buffers_keep_their_addresses(gpu_env)


def test_jax_work_between_steps_captures_no_new_graph(gpu_env, monkeypatch):
    """MJX-Warp's graphs are staged: JAX allocations between steps (arrays
    of varying size kept alive, as a policy or a metric would make) leave
    the captured graphs valid; unstaged, they made Warp capture again on
    nearly every step."""
    import warp as wp

    captures = [0]
    enter = wp.ScopedCapture.__enter__

    def counting(self):
        captures[0] += 1
        return enter(self)

    monkeypatch.setattr(wp.ScopedCapture, "__enter__", counting)
    env = gpu_env
    env.reset(seed=4)
    action = jnp.full((env.num_envs, 2), 0.1, jnp.float32)
    for _ in range(3):
        env.step(action)
    jax.block_until_ready(env.core_state())
    captures[0] = 0
    rng = np.random.default_rng(0)
    kept = []
    for k in range(30):
        env.step(action)
        kept = [*kept[-2:], jnp.ones(int(rng.integers(1, 1_000_000)), jnp.float32) * k]
    jax.block_until_ready((env.core_state(), kept))
    assert captures[0] == 0


def test_parity_with_the_cpu_reference_on_the_gpu(config):
    env = VecCarRacingEnv(4, config=config, level=LEVEL_0, backend="mjx_warp", track=level0_track())
    ref = VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    ref_obs, _ = ref.reset(seed=3)
    env.reset(seed=3)
    worst_position = worst_yaw = 0.0
    for _ in range(500):
        action = pursuit(ref_obs, speed_mps=11.0)
        ref_obs = ref.step(jnp.asarray(action))[0]
        obs = env.step(jnp.asarray(np.repeat(action, env.num_envs, axis=0)))[0]
        position = np.asarray(obs["position"])
        worst_position = max(worst_position, float(np.abs(position - np.asarray(ref_obs["position"])).max()))
        worst_yaw = max(worst_yaw, float(np.abs(np.asarray(obs["yaw"]) - np.asarray(ref_obs["yaw"])).max()))
        assert (position == position[0]).all()
    assert worst_position < 0.01 and worst_yaw < 1e-3, (worst_position, worst_yaw)
