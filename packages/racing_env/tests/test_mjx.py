"""The mjx_warp backend on Warp's CPU device: the vector contract over
several worlds (a hand-built NEXT_STEP timeline, isolation of an invalid
world, seeds and track choice), parity with the MuJoCo C reference, stable
donated buffers and no host-to-device transfers in a step."""

from __future__ import annotations

import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from worlds import SHORT_LEVEL
from racing_env.pursuit import pursuit
from racing_env import TerminationReason, VecCarRacingEnv, level0_track
from racing_env.physics import MjxWarpPhysics, PhysicsState
from racing_env.seeds import host_pool_row, host_seed_word

ROOT = 2024


def run(env, actions):
    """Step through a list of [E, 2] host actions; the NumPy outcome of each call."""
    out = []
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(jnp.asarray(action))
        out.append(
            (
                {k: np.asarray(v) for k, v in obs.items()},
                np.asarray(reward),
                np.asarray(terminated),
                np.asarray(truncated),
                {k: v if isinstance(v, str) else np.asarray(v) for k, v in info.items()},
            )
        )
    return out


def expected_timeline(steps: int, invalid_at: dict[int, int], timeout: int):
    """Hand-built NEXT_STEP timeline of one world.

    Returns per call (1-based): (episode counter, reason, terminated,
    truncated, is reset transition).
    """
    rows = []
    episode, age, pending = 0, 0, False
    for call in range(1, steps + 1):
        if pending:
            episode, age, pending = episode + 1, 0, False
            rows.append((episode, 0, False, False, True))
            continue
        age += 1
        if invalid_at.get(call):
            reason = TerminationReason.INVALID_ACTION
        elif age >= timeout:
            reason = TerminationReason.TIMEOUT
        else:
            reason = TerminationReason.NONE
        terminated = reason == TerminationReason.INVALID_ACTION
        truncated = reason == TerminationReason.TIMEOUT
        pending = terminated or truncated
        rows.append((episode, reason, terminated, truncated, False))
    return rows


def test_next_step_timeline(mjx_pool_env, short_pool):
    env = mjx_pool_env
    worlds, steps = env.num_envs, 14
    invalid = {1: {2: 1, 9: 1}, 2: {5: 1}}  # world -> calls with a NaN action
    actions = []
    for call in range(1, steps + 1):
        a = np.tile(np.float32([[0.05, 1.0]]), (worlds, 1))
        for world, calls in invalid.items():
            if call in calls:
                a[world] = np.nan
        actions.append(a)
    obs0, info0 = env.reset(seed=ROOT)
    out = run(env, actions)
    ids = np.asarray(short_pool.track_id)
    centerlines = np.asarray(short_pool.centerline)
    for world in range(worlds):
        timeline = expected_timeline(steps, invalid.get(world, {}), SHORT_LEVEL.max_episode_steps)
        for call, (episode, reason, terminated, truncated, is_reset) in enumerate(timeline, start=1):
            obs, reward, term, trunc, info = out[call - 1]
            where = f"world {world}, call {call}"
            assert int(info["termination_reason"][world]) == reason, where
            assert bool(term[world]) == terminated and bool(trunc[world]) == truncated, where
            assert int(info["episode_seed"][world]) == host_seed_word(ROOT, 0, world, episode), where
            assert int(info["controller_seed"][world]) == host_seed_word(ROOT, 1, world, episode), where
            row = host_pool_row(host_seed_word(ROOT, 2, world, episode), len(short_pool))
            assert int(info["track_id"][world]) == ids[row], where
            np.testing.assert_array_equal(obs["centerline"][world], centerlines[row], err_msg=where)
            if is_reset:
                assert float(reward[world]) == 0.0, where
                np.testing.assert_array_equal(obs["velocity_body"][world], 0.0, err_msg=where)
                assert float(obs["track_progress"][world]) == 0.0, where
                np.testing.assert_allclose(obs["position"][world], centerlines[row][0], atol=1e-4, err_msg=where)
    assert out[0][4]["benchmark_version"] == short_pool.benchmark_version


def test_an_invalid_world_leaves_the_others_bitwise_unchanged(mjx_pool_env):
    env = mjx_pool_env
    rng = np.random.default_rng(0)
    actions = [rng.uniform([-0.3, -2.0], [0.3, 4.0], size=(env.num_envs, 2)).astype(np.float32) for _ in range(9)]
    env.reset(seed=ROOT)
    clean = run(env, actions)
    spoiled = [a.copy() for a in actions]
    spoiled[2][1] = [np.inf, 0.0]
    env.reset(seed=ROOT)
    dirty = run(env, spoiled)
    assert int(dirty[2][4]["termination_reason"][1]) == TerminationReason.INVALID_ACTION
    for call, (a, b) in enumerate(zip(clean, dirty)):
        for world in (0, 2):
            for key in a[0]:
                np.testing.assert_array_equal(a[0][key][world], b[0][key][world], err_msg=f"{key} call {call}")
            assert a[1][world] == b[1][world]


def test_pending_reset_worlds_ignore_their_action(mjx_pool_env):
    env = mjx_pool_env
    nan = np.float32([[np.nan, np.nan]] * env.num_envs)
    calm = np.zeros((env.num_envs, 2), np.float32)
    results = []
    for reset_action in (calm, nan, np.float32([[9.0, -99.0]] * env.num_envs)):
        env.reset(seed=ROOT)
        results.append(run(env, [nan, reset_action, calm]))
    for other in results[1:]:
        for key in results[0][1][0]:
            np.testing.assert_array_equal(results[0][1][0][key], other[1][0][key])
            np.testing.assert_array_equal(results[0][2][0][key], other[2][0][key])
    assert not results[1][1][2].any() and not results[1][1][3].any()


def test_track_choice_for_many_worlds_and_episodes(mjx_pool_env, short_pool):
    env = mjx_pool_env
    ids = np.asarray(short_pool.track_id)
    for root in (0, 7, 2**32 - 1):
        _, info = env.reset(seed=root)
        for episode in range(3):
            for world in range(env.num_envs):
                row = host_pool_row(host_seed_word(root, 2, world, episode), len(short_pool))
                assert int(info["track_id"][world]) == ids[row]
            _, info = env.reset()
    _, info = env.reset(seed=5, options={"track_indices": [2, 0, 2]})
    np.testing.assert_array_equal(np.asarray(info["track_id"]), ids[[2, 0, 2]])


def test_donated_buffers_keep_their_addresses(mjx_pool_env):
    env = mjx_pool_env
    env.reset(seed=1)
    action = jnp.zeros((env.num_envs, 2), jnp.float32)
    def addresses():
        # Wait first: reading a pointer while Warp's callback runs would deadlock.
        jax.block_until_ready(env.core_state())
        leaves = jax.tree.leaves(env.core_state())
        return [leaf.unsafe_buffer_pointer() for leaf in leaves if leaf.size]

    env.step(action)
    before = addresses()
    for _ in range(3):
        env.step(action)
        assert addresses() == before


def test_no_host_transfers_in_active_and_mixed_reset_steps(mjx_pool_env):
    """On CPU the guard sees host-to-device transfers only (the GPU test
    covers both directions)."""
    env = mjx_pool_env
    env.reset(seed=ROOT)
    action = jnp.full((env.num_envs, 2), 0.1, jnp.float32)
    spoil = action.at[1].set(jnp.nan)
    env.step(action)  # warm-up
    with jax.transfer_guard("disallow_explicit"):
        env.step(action)
        out = env.step(spoil)  # world 1 terminal
        terminated = out[2]
        out = env.step(action)  # world 1 resets, the others advance
    assert bool(np.asarray(terminated)[1]) and not np.asarray(terminated)[[0, 2]].any()
    assert float(np.asarray(out[1])[1]) == 0.0


def test_parity_with_the_cpu_reference(mjx_level0_env, cpu_env):
    """Same actions from the same state: the float32 MJX-Warp trajectory
    stays within 1 cm and 1 mrad of MuJoCo C's over 10 s of driving."""
    env = mjx_level0_env
    ref_obs, _ = cpu_env.reset(seed=9)
    obs, _ = env.reset(seed=9)
    worst_position, worst_yaw = 0.0, 0.0
    for _ in range(500):
        action = pursuit(ref_obs, speed_mps=11.0)
        ref_obs = cpu_env.step(jnp.asarray(action))[0]
        obs = env.step(jnp.asarray(np.repeat(action, env.num_envs, axis=0)))[0]
        position = np.asarray(obs["position"])
        yaw = np.asarray(obs["yaw"])
        worst_position = max(worst_position, float(np.abs(position - np.asarray(ref_obs["position"])).max()))
        worst_yaw = max(worst_yaw, float(np.abs(yaw - np.asarray(ref_obs["yaw"])).max()))
        # Identical worlds in one batch are bitwise equal.
        np.testing.assert_array_equal(position[0], position[1])
    assert float(np.asarray(ref_obs["velocity_body"])[0, 0]) > 10.0
    assert worst_position < 0.01, worst_position
    assert worst_yaw < 1e-3, worst_yaw


def test_mjx_observation_dtypes(mjx_level0_env):
    obs, info = mjx_level0_env.reset(seed=0)
    assert obs["track_mask"].dtype == jnp.int8 and obs["centerline"].shape == (2, 640, 2)
    assert info["track_id"].dtype == jnp.uint32
    assert all(isinstance(v, jax.Array) for k, v in info.items() if k != "benchmark_version")


def test_cpu_reference_is_batch_one(config):
    with pytest.raises(ValueError, match="num_envs"):
        VecCarRacingEnv(2, config=config, level=SHORT_LEVEL, backend="cpu_reference", track=level0_track())



def _random_drive(mj_model, worlds: int, steps: int, seed: int):
    """Varied start states (positions, a drop, forward speeds) and random
    in-range controls (steering within its range, wheel torques within
    +-400 N m): (qpos [E, NQ], qvel [E, NV], ctrls [T, E, NU]), float32."""
    rng = np.random.default_rng(seed)
    qpos = np.tile(mj_model.qpos0.astype(np.float32), (worlds, 1))
    qpos[:, :2] = rng.uniform(-5.0, 5.0, (worlds, 2))
    qpos[:, 2] += 0.02
    qvel = np.zeros((worlds, mj_model.nv), np.float32)
    qvel[:, 0] = rng.uniform(0.0, 12.0, worlds)
    limited = mj_model.actuator_ctrllimited.astype(bool)
    low = np.where(limited, mj_model.actuator_ctrlrange[:, 0], -400.0)
    high = np.where(limited, mj_model.actuator_ctrlrange[:, 1], 400.0)
    return qpos, qvel, rng.uniform(low, high, (steps, worlds, mj_model.nu)).astype(np.float32)


def _start(physics, qpos, qvel, state=None):
    state = physics.initial() if state is None else state
    worlds = qpos.shape[0]
    return physics.reset(state, jnp.ones(worlds, bool), jnp.asarray(qpos))._replace(qvel=jnp.asarray(qvel))


def test_the_integration_state_steps_like_mjx_step(config):
    """The backend carries only (qpos, qvel, qacc_warmstart, time) between
    control steps; MJX's own `mjx.step` on its full data, from the same
    varied states under the same random controls, reaches the same states
    (bitwise while the contact set is unchanged, within float32 rounding
    once the solver's path differs)."""
    from mujoco import mjx

    worlds, steps = 3, 40
    physics = MjxWarpPhysics(config, worlds)
    mj_model = physics.mj_model
    qpos, qvel, ctrls = _random_drive(mj_model, worlds, steps, seed=7)
    state = _start(physics, qpos, qvel)
    model = mjx.put_model(mj_model, impl="warp")
    make = lambda _: mjx.make_data(mj_model, impl="warp", naconmax=8 * worlds, njmax=48)  # noqa: E731
    data = jax.jit(jax.vmap(make))(jnp.arange(worlds)).replace(qpos=jnp.asarray(qpos), qvel=jnp.asarray(qvel))
    mjx_step = jax.jit(jax.vmap(mjx.step, in_axes=(None, 0)))
    ours = jax.jit(physics.step)
    for call, ctrl in enumerate(ctrls):
        state = ours(state, jnp.asarray(ctrl))
        data = data.replace(ctrl=jnp.asarray(ctrl))
        for _ in range(config.substeps):
            data = mjx_step(model, data)
        if call < 10:
            for name in PhysicsState._fields:
                np.testing.assert_array_equal(np.asarray(getattr(state, name)), np.asarray(getattr(data, name)))
    np.testing.assert_array_equal(np.asarray(state.time), np.asarray(data.time))
    np.testing.assert_allclose(np.asarray(state.qpos), np.asarray(data.qpos), atol=1e-4)
    np.testing.assert_allclose(np.asarray(state.qvel), np.asarray(data.qvel), rtol=1e-3, atol=1e-3)
    assert float(np.abs(np.asarray(state.qvel)).max()) > 1.0  # the cars moved


def test_a_restarted_world_does_not_remember_its_past(config):
    """MuJoCo scratch persists between calls: a world reset to a state
    steps exactly as from a fresh backend, whatever it and the other worlds
    did before."""
    worlds, steps = 3, 30
    used = MjxWarpPhysics(config, worlds)
    qpos, qvel, ctrls = _random_drive(used.mj_model, worlds, steps, seed=11)
    step = jax.jit(used.step)
    state = _start(used, *_random_drive(used.mj_model, worlds, 1, seed=12)[:2])
    for ctrl in _random_drive(used.mj_model, worlds, steps, seed=13)[2]:
        state = step(state, jnp.asarray(ctrl))
    state = _start(used, qpos, qvel, state)
    fresh = MjxWarpPhysics(config, worlds)
    fresh_step = jax.jit(fresh.step)
    reference = _start(fresh, qpos, qvel)
    for ctrl in ctrls:
        state, reference = step(state, jnp.asarray(ctrl)), fresh_step(reference, jnp.asarray(ctrl))
        for name in PhysicsState._fields:
            np.testing.assert_array_equal(np.asarray(getattr(state, name)), np.asarray(getattr(reference, name)))


def _warp_loads(preload: bool = True) -> list[str]:
    """The Warp modules a fresh process loads on the CPU while it builds an
    ``mjx_warp`` backend, in order (with ``preload`` False, without
    compiling `ENGINE_MODULES` ahead: what the step alone loads)."""
    # Warp initialised at the info level first: its line per loaded module (racing_env lowers only a default level).
    code = ("import warp as wp\nwp.config.log_level = wp.LOG_INFO\nwp.init()\nfrom racing_env import ProjectConfig\n"
            "import racing_env.physics as physics\n"
            + ("" if preload else "physics._compile_engine = lambda device: None\n")
            + "physics.MjxWarpPhysics(ProjectConfig(), 1)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return re.findall(r"^Module (\S+) \w+ load on device 'cpu'", out.stdout, re.M)


def test_the_engine_modules_are_what_the_step_loads_and_are_compiled_before_it():
    """`ENGINE_MODULES` are exactly the MJX-Warp engine modules the car's
    step loads (none missing, none extra), and building the backend loads
    each of them before the first kernel the step builds as it runs."""
    from racing_env.physics import ENGINE_MODULES

    prefix = "mujoco.mjx.third_party.mujoco_warp._src."
    alone = [name.removeprefix(prefix) for name in _warp_loads(preload=False) if name.startswith(prefix)]
    assert sorted(alone) == sorted(ENGINE_MODULES)
    loaded = _warp_loads()
    built_as_it_runs = [i for i, name in enumerate(loaded) if "__locals__" in name]
    assert built_as_it_runs, "the step builds kernels as it runs"
    assert max(loaded.index(prefix + name) for name in ENGINE_MODULES) < built_as_it_runs[0]
