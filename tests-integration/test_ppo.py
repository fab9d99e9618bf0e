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

from racing_stack import checkpoints
from racing_stack.interop import to_jax, to_torch, tree_to_torch
from racing_stack.ppo import LOG_FIELDS, PRESETS, PPOConfig, Trainer, finish, make_env, make_validation_env

#: A tiny run: 4 worlds on the first 4 Train tracks, 24-step episodes,
#: validated every 2 updates on 2 Validation tracks.
TINY = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=8, updates=4, minibatches=2, tracks=4,
                           max_episode_steps=24, checkpoint_every=2, validate_every=2, validation_tracks=2)


@pytest.fixture(scope="module")
def env():
    return make_env(TINY)


@pytest.fixture(scope="module")
def validation():
    return make_validation_env(TINY)


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


def test_resume_continues_the_same_curve(env, validation, tmp_path):
    straight = Trainer(TINY, env, tmp_path / "straight", validation=validation)
    rows = straight.run()
    assert [r["update"] for r in rows] == [1, 2, 3, 4]
    # Cut by a time budget after update 1 (it checkpoints), then resumed by a fresh trainer.
    cut = Trainer(TINY, env, tmp_path / "resumed", validation=validation).run(seconds=0.0)
    resumed = Trainer(TINY, env, tmp_path / "resumed", validation=validation)  # the env overwritten by the restore
    later = resumed.run(resume=True)
    assert [r["update"] for r in later] == [2, 3, 4]
    for key, value in straight.policy.state_dict().items():
        torch.testing.assert_close(resumed.policy.state_dict()[key], value, rtol=0, atol=0)
    for mine, theirs in zip(cut + later, rows):
        for key in LOG_FIELDS[4:]:
            assert mine[key] == theirs[key] or (np.isnan(mine[key]) and np.isnan(theirs[key])), key
    assert [np.isfinite(r["validation_success_rate"]) for r in rows] == [False, True, False, True]
    # The same validations, so the same best policy.
    assert resumed.best["update"] == straight.best["update"]
    for key, value in straight.best["policy"].items():
        torch.testing.assert_close(resumed.best["policy"][key], value, rtol=0, atol=0)
    with open(tmp_path / "resumed" / "log.csv") as f:
        assert [int(r["update"]) for r in csv.DictReader(f)] == [1, 2, 3, 4]
    # A resume after a crash past its checkpoint keeps the log up to the checkpoint only.
    with open(tmp_path / "resumed" / "log.csv", "a") as f:
        f.write("5," + ",".join(["0"] * (len(LOG_FIELDS) - 1)) + "\n")
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
        want = trainer.policy.mean_action(x)[0].numpy()
    np.testing.assert_allclose(controller.compute_control(one), want, rtol=1e-5, atol=1e-6)


def test_the_learning_rate_falls_linearly_to_a_last_step_of_rate_over_updates(env, tmp_path):
    rows = Trainer(TINY, env, tmp_path / "logged").run()
    want = [TINY.learning_rate * (1 - k / TINY.updates) for k in range(TINY.updates)]
    np.testing.assert_allclose([r["learning_rate"] for r in rows], want, rtol=1e-12)
    annealed = Trainer(TINY, env, tmp_path / "annealed")
    annealed.run()
    assert annealed.optimizer.param_groups[0]["lr"] == pytest.approx(TINY.learning_rate / TINY.updates, rel=1e-12)
    flat = Trainer(dataclasses.replace(TINY, anneal_learning_rate=False), env, tmp_path / "flat")
    assert [r["learning_rate"] for r in flat.run()] == [TINY.learning_rate] * TINY.updates
    assert flat.optimizer.param_groups[0]["lr"] == TINY.learning_rate


def test_validation_drives_each_track_once_as_the_runner_does(env, validation, tmp_path):
    from racing_env.plugins import load_plugin
    from racing_env.runner import run

    from racing_stack.export import export_plugin

    trainer = Trainer(TINY, env, tmp_path, validation=validation)
    trainer.run()
    result = trainer.validate()
    np.testing.assert_equal(trainer.validate(), result)  # the same episodes every time
    # The reference: the Runner driving the exported policy on the same rows with the same seed.
    plugin = export_plugin(trainer.policy, TINY, tmp_path / "plugin")
    episodes = run(load_plugin(plugin), validation, seed=TINY.seed,
                   track_indices=list(range(TINY.validation_tracks))).episodes
    episodes = sorted(episodes, key=lambda e: e.world)
    assert [e.world for e in episodes] == list(range(TINY.validation_tracks))  # each track once
    reasons = np.array([e.termination_reason for e in episodes])
    assert result["validation_success_rate"] == np.mean(reasons == "success")
    assert result["validation_mean_progress"] > 0.0  # the trained policy moves the car forward
    np.testing.assert_allclose(result["validation_mean_progress"], np.mean([e.progress for e in episodes]),
                               atol=1e-4)
    with pytest.raises(ValueError, match="validation env has 2 worlds, config.validation_tracks is 3"):
        Trainer(dataclasses.replace(TINY, validation_tracks=3), env, tmp_path, validation=validation)


class ScriptedEnds:
    """A validation env whose steps end episodes on a script: world 0 laps
    at its 3rd call (12.5 s), world 1 leaves the track at its 1st; each then
    resets (NEXT_STEP) and ends again later, which must not count."""

    def __init__(self, real):
        self.real, self.num_envs, self.calls = real, real.num_envs, 0

    def reset(self, *, seed=None, options=None):
        self.obs, info = self.real.reset(seed=seed, options=options)
        return self.obs, info

    def step(self, actions):
        self.calls += 1
        ends = {3: (0, 1, 12.5, 1.0), 1: (1, 2, 0.0, 0.2), 6: (0, 2, 0.0, 0.1), 5: (1, 1, 9.0, 1.0)}
        reason, lap, progress = np.zeros(2, np.int32), np.zeros(2, np.float32), np.full(2, 0.05, np.float32)
        terminated = np.zeros(2, bool)
        if self.calls in ends:
            w, why, seconds, done = ends[self.calls]
            reason[w], lap[w], progress[w], terminated[w] = why, seconds, done, True
        obs = {**self.obs, "track_progress": jnp.asarray(progress)}
        info = {"termination_reason": jnp.asarray(reason), "lap_time_s": jnp.asarray(lap)}
        return obs, jnp.zeros(2), jnp.asarray(terminated), jnp.zeros(2, bool), info


def test_validation_reads_each_world_first_ending_only(env, validation, tmp_path):
    trainer = Trainer(TINY, env, tmp_path)
    with pytest.raises(ValueError, match="no validation env"):
        trainer.validate()
    trainer.validation = ScriptedEnds(validation)
    result = trainer.validate()
    assert result == {"validation_success_rate": 0.5, "validation_median_lap_time_s": 12.5,
                      "validation_mean_progress": pytest.approx(0.6)}
    assert trainer.validation.calls == TINY.max_episode_steps  # no early stop before a check at 32 calls


def test_the_best_validated_policy_is_kept_and_exported(env, tmp_path):
    trainer = Trainer(TINY, env, tmp_path)
    trainer.run()  # no validation env: nothing validated, the current policy is the best
    assert trainer.best is None and trainer.best_policy() is trainer.policy

    def offer(rate, lap, progress):
        trainer._keep_if_best({"validation_success_rate": rate, "validation_median_lap_time_s": lap,
                               "validation_mean_progress": progress})
        return trainer.best["update"]

    trainer.update = 1
    assert offer(0.0, np.nan, 0.3) == 1
    trainer.update = 2
    assert offer(0.0, np.nan, 0.2) == 1  # less progress, no lap: not better
    trainer.update = 3
    assert offer(0.0, np.nan, 0.4) == 3  # more progress
    trainer.update = 4
    assert offer(0.5, 40.0, 0.1) == 4  # a lap beats any progress
    trainer.update = 5
    assert offer(0.5, 41.0, 0.9) == 4  # the same success rate, a slower lap
    kept = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    trainer.update = 6
    assert offer(0.5, 39.0, 0.1) == 6  # a faster lap
    with torch.no_grad():
        for p in trainer.policy.parameters():
            p.add_(1.0)  # training goes on: the kept copy must not follow
    trainer.update = 7
    assert offer(0.25, 30.0, 0.9) == 6  # a lower success rate loses whatever its lap
    best = trainer.best_policy()
    for key, value in kept.items():
        torch.testing.assert_close(best.state_dict()[key], value, rtol=0, atol=0)
    made = finish(trainer, video_steps=5)
    weights = checkpoints.load(made["plugin"] / "weights.pt", "weights")
    for key, value in kept.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=0)


def test_a_time_budget_stops_after_the_update_that_spends_it(env, tmp_path):
    rows = Trainer(dataclasses.replace(TINY, updates=50), env, tmp_path).run(seconds=0.0)
    assert [r["update"] for r in rows] == [1]  # one update, then the checkpoint
    assert (tmp_path / "checkpoint.pt").exists()


def test_settings_are_overridden_by_name_and_checked():
    config = TINY.override(["learning_rate=1e-4", "reward.off_track_penalty=5", "hidden=(32, 16)",
                            "tracks=None", "anneal_learning_rate=False"])
    assert (config.learning_rate, config.reward.off_track_penalty, config.hidden, config.tracks,
            config.anneal_learning_rate) == (1e-4, 5, (32, 16), None, False)
    assert dataclasses.replace(config, learning_rate=TINY.learning_rate, reward=TINY.reward, hidden=TINY.hidden,
                               tracks=TINY.tracks, anneal_learning_rate=True) == TINY  # nothing else moved
    for settings, match in ((["learning_rate"], "must be name=value"), (["lr=1"], "unknown setting 'lr'"),
                            (["reward.bonus=1"], "unknown setting 'reward.bonus'"),
                            (["reward=1"], "unknown setting 'reward'"),
                            (["learning_rate=fast"], "'fast' is not a Python literal"),
                            (["learning_rate=-1.0"], "learning_rate must be in"),
                            (["hidden=3"], "bad settings"), (["features.points=0"], "points must be an int")):
        with pytest.raises(ValueError, match=match):
            TINY.override(settings)


@pytest.mark.parametrize("kwargs, match", [
    ({"worlds": 0}, "worlds must be an int >= 1"),
    ({"minibatches": 3}, "minibatches \\(3\\) must divide"),
    ({"gamma": 1.5}, "gamma must be in"),
    ({"tracks": 0}, "tracks must be None or an int >= 1"),
    ({"learning_rate": float("nan")}, "learning_rate must be in \\(0.0, 1.0\\] and finite"),
    ({"learning_rate": 1e30}, "learning_rate must be in \\(0.0, 1.0\\]"),
    ({"learning_rate": 10**400}, "learning_rate must be in \\(0.0, 1.0\\]"),
    ({"init_log_std": 1e6}, "init_log_std must be in \\[-10.0, 2.0\\]"),
    ({"init_log_std": -200.0}, "init_log_std must be in \\[-10.0, 2.0\\]"),
    ({"value_coef": 1e300}, "value_coef must be in \\[0.0, 1000.0\\]"),
    ({"hidden": (1_000_000, 1_000_000)}, "hidden must be a non-empty tuple of ints in \\[1, 16384\\]"),
    ({"clip": 0.0}, "clip must be in \\(0.0"),
    ({"gamma": "0.9"}, "gamma must be a real number"),
    ({"entropy_coef": float("inf")}, "entropy_coef must be in \\[0.0, 1000.0\\] and finite"),
    ({"hidden": ()}, "hidden must be a non-empty tuple"),
    ({"hidden": (64, 0)}, "hidden must be a non-empty tuple"),
    ({"seed": -1}, "seed must be an int in"),
    ({"features": None}, "features must be a LocalTrack"),
    ({"validate_every": -1}, "validate_every must be an int >= 0"),
    ({"validation_tracks": 0}, "validation_tracks must be an int >= 1"),
    ({"anneal_learning_rate": 1}, "anneal_learning_rate must be a bool"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(PPOConfig(), **kwargs)


@pytest.mark.parametrize("step_cost, penalty", [(0.01, 0.2), (0.005, 0.1), (0.02, 0.3), (0.05, 0.3), (0.01, 5.0)])
def test_the_guard_passes_every_reward_the_wrapper_can_produce(env, tmp_path, step_cost, penalty):
    """Both bounds reached exactly (float32 rounding included) pass; a
    reward a little beyond either is stopped."""
    from racing_env import TerminationReason

    from racing_stack.guard import GuardError

    config = TINY.override([f"reward.step_cost={step_cost}", f"reward.off_track_penalty={penalty}"])
    trainer = Trainer(config, env, tmp_path)
    longest = float(np.max(np.asarray(env.track_pool.track_length)))
    extremes = np.asarray(config.reward(jnp.asarray([0.0, 1.0], jnp.float32),
                                        {"track_length": jnp.full(2, longest, jnp.float32)},
                                        {"termination_reason": jnp.asarray([TerminationReason.OFF_TRACK,
                                                                            TerminationReason.NONE], jnp.int32)}))
    zeros = torch.zeros(config.steps, config.worlds)
    trainer.last_value = torch.zeros(config.worlds)
    losses = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0}
    trainer.buf["reward"] = torch.from_numpy(np.resize(extremes, zeros.shape).astype(np.float32))
    trainer.guard(zeros, zeros, losses)  # nothing raised
    for beyond in (extremes[0] - 1e-3 * max(1.0, abs(extremes[0])), extremes[1] * 1.001):
        trainer.buf["reward"][3, 1] = float(beyond)
        with pytest.raises(GuardError, match="update 1: 1 of 32 reward values are not in"):
            trainer.guard(zeros, zeros, losses)
        trainer.buf["reward"][3, 1] = float(extremes[0])
