"""PPO from the env to a controller plugin, on the CPU: zero-copy interop,
the reset-slot mask against a hand-built rollout, rl_triton's GAE against
an independent reference on a real rollout, resume equal to an
uninterrupted run, a short run whose return improves, and the exported
plugin driving in the Runner."""

from __future__ import annotations

import csv
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from racing_stack.interop import to_jax, to_torch, tree_to_torch
from racing_stack.ppo import PRESETS, PPOConfig, Trainer, finish, make_env

#: A tiny run: 4 worlds on the first 4 Train tracks, 24-step episodes.
TINY = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=8, updates=4, minibatches=2, tracks=4,
                           max_episode_steps=24, checkpoint_every=2)


@pytest.fixture(scope="module")
def env():
    return make_env(TINY)


def test_jax_and_torch_share_the_buffers():
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    t = to_torch(x)
    assert t.data_ptr() == x.unsafe_buffer_pointer() and t.shape == (3, 4)
    back = to_jax(t)
    assert back.unsafe_buffer_pointer() == t.data_ptr()
    tree = tree_to_torch({"a": x, "benchmark_version": "0.1"}, benchmark_version="0.1")
    assert tree["benchmark_version"] == "0.1" and tree["a"].data_ptr() == x.unsafe_buffer_pointer()
    with pytest.raises(ValueError, match="benchmark_version is '0.2', expected '0.1'"):
        tree_to_torch({"benchmark_version": "0.2"}, benchmark_version="0.1")
    with pytest.raises(TypeError, match="array must be a jax.Array"):
        to_torch(np.zeros(3))
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor"):
        to_jax(np.zeros(3))


def reference_advantages(reward, value, terminated, truncated, valid, last_value, gamma, lam):
    """GAE slot by slot, world by world (NumPy, float64): a reset slot (its
    previous slot ended an episode) gets 0 and is skipped; a terminal slot
    cuts the trace; a truncation bootstraps from the next slot's value."""
    t_len, worlds = reward.shape
    out = np.zeros((t_len, worlds))
    for w in range(worlds):
        carry = 0.0
        for t in reversed(range(t_len)):
            if not valid[t, w]:
                carry = 0.0
                continue
            nxt = value[t + 1, w] if t + 1 < t_len else last_value[w]
            if terminated[t, w]:
                delta, carry = reward[t, w] - value[t, w], 0.0
            elif truncated[t, w]:
                delta, carry = reward[t, w] + gamma * nxt - value[t, w], 0.0
            else:
                delta = reward[t, w] + gamma * nxt - value[t, w]
            carry = delta + gamma * lam * carry
            out[t, w] = carry
    return out


def test_reset_slots_are_masked_on_a_hand_built_rollout(env, tmp_path):
    trainer = Trainer(TINY, env, tmp_path)
    rng = np.random.default_rng(0)
    t_len, worlds = TINY.steps, TINY.worlds
    # World 0 terminates at 2 (slot 3 resets), world 1 truncates at 4 (slot 5 resets),
    # world 2 truncates at the last slot, world 3 starts on a reset slot.
    terminated = np.zeros((t_len, worlds), bool)
    truncated = np.zeros((t_len, worlds), bool)
    terminated[2, 0] = truncated[4, 1] = truncated[7, 2] = True
    valid = np.ones((t_len, worlds), bool)
    valid[3, 0] = valid[5, 1] = valid[0, 3] = False
    reward = rng.normal(size=(t_len, worlds)).astype(np.float32)
    reward[~valid] = 0.0
    value = rng.normal(size=(t_len, worlds)).astype(np.float32)
    last = rng.normal(size=worlds).astype(np.float32)
    for key, arr in (("reward", reward), ("value", value), ("terminated", terminated),
                     ("truncated", truncated), ("valid", valid.astype(np.float32))):
        trainer.buf[key] = torch.as_tensor(arr)
    trainer.last_value = torch.as_tensor(last)
    advantage, returns = trainer.advantages()
    want = reference_advantages(reward, value, terminated, truncated, valid, last, TINY.gamma, TINY.gae_lambda)
    np.testing.assert_allclose(advantage.numpy(), want, rtol=1e-5, atol=1e-5)
    assert advantage[3, 0] == 0 and advantage[5, 1] == 0 and advantage[0, 3] == 0
    # The truncation at world 1's slot 4 bootstraps from slot 5's value (the terminal observation's).
    assert np.isclose(want[4, 1], reward[4, 1] + TINY.gamma * value[5, 1] - value[4, 1])
    np.testing.assert_allclose(returns.numpy(), advantage.numpy() + value, rtol=1e-6)


def test_gae_on_a_real_rollout_matches_the_reference(env, tmp_path):
    trainer = Trainer(dataclasses.replace(TINY, steps=40), env, tmp_path)
    trainer.collect()
    buf = {k: v.numpy() for k, v in trainer.buf.items()}
    ended = buf["terminated"] | buf["truncated"]
    assert ended.any() and (buf["valid"] == 0).any()  # episodes ended and reset inside the rollout
    # The reset slot follows each terminal slot, in the same world.
    np.testing.assert_array_equal(buf["valid"][1:] == 0, ended[:-1])
    advantage, _ = trainer.advantages()
    want = reference_advantages(buf["reward"], buf["value"], buf["terminated"], buf["truncated"],
                                buf["valid"] > 0, trainer.last_value.numpy(), TINY.gamma, TINY.gae_lambda)
    np.testing.assert_allclose(advantage.numpy(), want, rtol=1e-4, atol=1e-5)


def test_resume_continues_the_same_curve(env, tmp_path):
    straight = Trainer(TINY, env, tmp_path / "straight")
    rows = straight.run()
    assert [r["update"] for r in rows] == [1, 2, 3, 4]
    half = Trainer(dataclasses.replace(TINY, updates=2), env, tmp_path / "resumed")
    half.run()
    resumed = Trainer(TINY, env, tmp_path / "resumed")  # a fresh trainer, the env overwritten by the restore
    later = resumed.run(resume=True)
    assert [r["update"] for r in later] == [3, 4]
    for key, value in straight.policy.state_dict().items():
        torch.testing.assert_close(resumed.policy.state_dict()[key], value, rtol=0, atol=0)
    for mine, theirs in zip(later, rows[2:]):
        for key in ("mean_reward", "policy_loss", "value_loss", "episodes"):
            assert mine[key] == theirs[key], key
    with open(tmp_path / "resumed" / "log.csv") as f:
        assert [int(r["update"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    # A resume after a crash past its checkpoint keeps the log up to the checkpoint only.
    with open(tmp_path / "resumed" / "log.csv", "a") as f:
        f.write("5," + ",".join(["0"] * 13) + "\n")
    resumed.load(tmp_path / "resumed" / "checkpoint.pt")  # update 4
    again = Trainer(dataclasses.replace(TINY, updates=4), env, tmp_path / "resumed").run(resume=True)
    assert again == []
    with open(tmp_path / "resumed" / "log.csv") as f:
        assert [int(r["update"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    other = dataclasses.replace(TINY, learning_rate=1.0)
    with pytest.raises(ValueError, match="other settings: \\['learning_rate'\\]"):
        Trainer(other, env, tmp_path / "resumed").run(resume=True)


def test_a_short_run_improves_its_return_and_exports_a_plugin_that_drives(tmp_path):
    config = dataclasses.replace(PRESETS["cpu"], worlds=8, steps=32, updates=30, tracks=8, max_episode_steps=100,
                                 learning_rate=3e-3)
    trainer = Trainer(config, make_env(config), tmp_path)
    rows = trainer.run()
    first = np.mean([r["mean_reward"] for r in rows[:5]])
    last = np.mean([r["mean_reward"] for r in rows[-5:]])
    # Measured -0.0093 -> -0.0060 a step; the gate, +0.0015, is 0.75 m/s faster on average.
    assert last > first + 0.0015, (first, last)
    made = finish(trainer, video_steps=30)
    assert made["curve"].stat().st_size > 10_000 and made["video"].stat().st_size > 1_000
    assert sorted(p.name for p in made["plugin"].iterdir() if p.is_file()) == ["config.toml", "controller.py",
                                                                              "weights.pt"]
    assert list((tmp_path / "tensorboard").iterdir())  # event files

    from racing_env import LEVEL_1, Level, ProjectConfig, VecCarRacingEnv
    from racing_env.plugins import load_plugin
    from racing_env.runner import run

    level = Level(level_id=LEVEL_1.level_id, name="check", max_episode_steps=40)
    driven = VecCarRacingEnv(2, config=ProjectConfig(), level=level, backend="mjx_warp",
                             track_pool=trainer.env.track_pool)
    result = run(load_plugin(made["plugin"]), driven, episodes=2, seed=1)
    assert result.summary["controller_errors"] == 0
    assert all(e.progress > 0.0 for e in result.episodes)  # it moves the car forward
    # Acting is the policy's mean: the exported plugin's action equals the trainer's.
    obs, info = driven.reset(seed=2)
    one = {k: np.asarray(v)[0] for k, v in obs.items()}
    controller = load_plugin(made["plugin"]).load_class()(one, {}, result.challenge | {
        "controller": {"device": "cpu", "hidden": list(config.hidden),
                       "features": dataclasses.asdict(config.features)}})
    x = to_torch(config.features(jax.tree.map(lambda v: v[:1], obs)))
    with torch.no_grad():
        want = trainer.policy.env_action(trainer.policy.actor(x))[0].numpy()
    np.testing.assert_allclose(controller.compute_control(one), want, rtol=1e-5, atol=1e-6)


def test_a_time_budget_stops_after_the_update_that_spends_it(env, tmp_path):
    rows = Trainer(dataclasses.replace(TINY, updates=50), env, tmp_path).run(seconds=0.0)
    assert [r["update"] for r in rows] == [1]  # one update, then the checkpoint
    assert (tmp_path / "checkpoint.pt").exists()


@pytest.mark.parametrize("kwargs, match", [
    ({"worlds": 0}, "worlds must be an int >= 1"),
    ({"minibatches": 3}, "minibatches \\(3\\) must divide"),
    ({"gamma": 1.5}, "gamma must be in"),
    ({"tracks": 0}, "tracks must be None or an int >= 1"),
    ({"learning_rate": float("nan")}, "learning_rate must be in \\(0.0, inf\\] and finite"),
    ({"clip": 0.0}, "clip must be in \\(0.0"),
    ({"gamma": "0.9"}, "gamma must be a real number"),
    ({"entropy_coef": float("inf")}, "entropy_coef must be in \\[0.0, inf\\] and finite"),
    ({"hidden": ()}, "hidden must be a non-empty tuple"),
    ({"hidden": (64, 0)}, "hidden must be a non-empty tuple"),
    ({"seed": -1}, "seed must be an int in"),
    ({"features": None}, "features must be a LocalTrack"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PPOConfig(), **kwargs)
