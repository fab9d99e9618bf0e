"""The rollout as one JAX program (`PPOConfig.act_in_jax`), on the CPU:
each rollout is the one a hand-built loop gives through the env's public
API and the Torch policy on the same noise (features, actions, log
probabilities, values, the env's actions, rewards, endings, holds and the
env's state after it, within float32's rounding of XLA's products against Torch's), across
start-up holds, timeouts and their reset slots; and a run cut and resumed
is the uninterrupted run, bit for bit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from racing_env import TerminationReason
from racing_stack.features import LocalTrack
from racing_stack.interop import to_torch
from racing_stack.ppo import LOG_FIELDS, PRESETS, Trainer, make_env
from racing_stack.ppo import jax_rollout
from racing_stack.ppo.env_step import after_step
from racing_stack.ppo.networks import ActorCritic
from racing_stack.reward import ShapedReward

#: 4 worlds on the first 4 Train tracks, 10-call episodes, up to 3 calls held at the start: four rollouts of
#: 8 calls hold worlds, time out and reset them.
SMALL = dataclasses.replace(PRESETS["cpu"], worlds=4, steps=8, updates=3, minibatches=2, tracks=4,
                            max_episode_steps=10, stagger_steps=3, checkpoint_every=1, validate_every=0,
                            act_in_jax=True)


@pytest.fixture(scope="module")
def env():
    return make_env(SMALL)


@pytest.mark.parametrize("residual", [0.0, 0.5])
@pytest.mark.parametrize("precision", ["highest", "high", "bf16"])
def test_the_jax_actor_acts_as_the_torch_policy(precision, residual):
    """`jax_rollout.act` against `ActorCritic.act` and `env_action` (under
    autocast at ``"bf16"``) on random weights, statistics, features near
    the bounds, noise and holds, with bounds that float32 cannot hold
    exactly: the normalised actions within float32's rounding (bfloat16's
    products rounded once, as autocast rounds them; a few rows within one
    bfloat16 rounding of a hidden unit; TF32's on a GPU at ``"high"``), the
    log probabilities and the held worlds' braking exactly, a residual's
    action within its bounds."""
    torch.manual_seed(3)
    d, low, high = 40, np.array([-0.6, -9.81], np.float32), np.array([0.6, 3.3], np.float32)
    policy = ActorCritic(d, (256, 256), -1.0, low, high, residual)
    with torch.no_grad():
        policy.normalizer.mean.copy_(torch.randn(d, dtype=torch.float64))
        policy.normalizer.var.copy_(torch.rand(d, dtype=torch.float64) + 0.5)
        for p in policy.actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    x, noise, held = torch.randn(4096, d), torch.randn(4096, 2), torch.rand(4096) < 0.2
    x[:, -2:] = torch.as_tensor(high) - 0.05 + 0.1 * torch.randn(4096, 2)  # a residual's prior near its bounds
    brake = torch.as_tensor([0.0, -9.81])
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        u, logp, _ = policy.act(x, noise)
        action = torch.where(held[:, None], brake, policy.env_action(u, x))
    spec = jax_rollout.spec_of(policy, LocalTrack(), ShapedReward(), precision, residual, 8)
    got = jax_rollout.act(spec, jnp.asarray(jax_rollout.acting_vector(policy).numpy()), jnp.asarray(x.numpy()),
                          jnp.asarray(noise.numpy()), jnp.asarray(held.numpy()), jnp.asarray(brake.numpy()))
    ju, jlogp, jaction = (np.asarray(a) for a in got)
    # On a GPU, XLA's default float32 products ("high") are TF32's: inputs rounded to 11 bits, about 1e-3 here
    # (Torch's CPU reference rounds none). At "bf16" the float32 sums, added in another order, round a hidden
    # unit that lies near a bfloat16 tie the other way in a few rows: one bfloat16 rounding there (about 2e-3),
    # float32's everywhere else; twice bfloat16's rounding everywhere would be about 1e-2.
    tolerance = 5e-3 if precision == "high" and jax.default_backend() == "gpu" else 1e-5
    for got_, want, scale in ((ju, u.float().numpy(), 1.0), (jaction, action.numpy(), 6.6)):  # half ranges <= 6.6
        error = np.abs(got_ - want)
        assert np.quantile(error, 0.99) <= tolerance * scale, np.quantile(error, 0.99)
        assert error.max() <= (5e-3 if precision == "bf16" else tolerance) * scale, error.max()
    np.testing.assert_allclose(jlogp, logp.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(jaction[held.numpy()], np.broadcast_to(brake.numpy(), (int(held.sum()), 2)))
    if residual:
        assert ((jaction >= low) & (jaction <= high)).all()


def reference_rollout(trainer: Trainer, noise: torch.Tensor) -> dict[str, np.ndarray]:
    """The trainer's next rollout built by hand: Torch's `ActorCritic.act` on
    ``noise`` [T, E, 2], the env's public ``step`` and the wrappers'
    `after_step`, call by call (the rollout's state is left as it was)."""
    rollout, cfg, policy = trainer.rollout, trainer.config, trainer.policy
    endings, clock, previous, obs = rollout.endings, rollout.clock, rollout.previous_action, rollout.obs
    weight = jnp.float32(trainer.crash_weight())
    x = cfg.features(obs, previous)
    out: dict[str, list] = {k: [] for k in ("x", "u", "logp", "value", "sent", "reward", "reason", "terminated",
                                            "truncated", "valid", "held")}
    with torch.no_grad():
        for t in range(cfg.steps):
            xt = to_torch(x).clone()
            u, logp, value = policy.act(xt, noise[t])
            held = torch.as_tensor(np.asarray(clock.hold) > 0)
            action = torch.where(held[:, None], rollout.brake, policy.env_action(u, xt))
            sent = jnp.asarray(action.numpy())
            obs, reward, terminated, truncated, info = rollout.env.step(sent)
            pack, endings, clock, previous = after_step(cfg.reward, cfg.features, endings, clock, reward, obs,
                                                        info["termination_reason"], info["lap_time_s"],
                                                        terminated, truncated, sent, weight)
            pack = np.asarray(pack)
            d = cfg.features.size
            columns = {"x": xt.numpy(), "u": u.numpy(), "logp": logp.numpy(), "value": value.numpy(),
                       "sent": action.numpy(), "reward": pack[:, d], "reason": pack[:, d + 5],
                       "terminated": pack[:, d + 6], "truncated": pack[:, d + 7], "valid": pack[:, d + 8],
                       "held": held.numpy()}
            for key, value_t in columns.items():
                out[key].append(value_t)
            x = jnp.asarray(pack[:, :d])
        out["last_value"] = [policy.value(to_torch(x).clone()).numpy()]
    return {k: np.stack(v) for k, v in out.items()}


def test_a_scanned_rollout_is_the_hand_built_one_on_the_same_noise(env, tmp_path):
    trainer = Trainer(SMALL, env, tmp_path)
    seen = set()
    for _ in range(4):
        start = env.snapshot()
        carried = jax.tree.map(jnp.copy, (trainer.rollout.endings, trainer.rollout.clock,
                                          trainer.rollout.previous_action, trainer.rollout.obs))  # the scan donates
        draws = torch.Generator().set_state(trainer.generator.get_state())
        noise = torch.randn((SMALL.worlds, SMALL.steps, 2), generator=draws).transpose(0, 1)
        held_before = trainer.rollout.held.clone()
        trainer.collect()
        got, scanned = trainer.rollout.batch(), env.snapshot()
        after = (trainer.rollout.endings, trainer.rollout.clock, trainer.rollout.previous_action)
        env.restore(start)
        kept = trainer.rollout.endings, trainer.rollout.clock, trainer.rollout.previous_action, trainer.rollout.obs
        (trainer.rollout.endings, trainer.rollout.clock, trainer.rollout.previous_action,
         trainer.rollout.obs) = carried
        want = reference_rollout(trainer, noise)
        (trainer.rollout.endings, trainer.rollout.clock, trainer.rollout.previous_action,
         trainer.rollout.obs) = kept
        close = dict(rtol=1e-4, atol=1e-4)
        for key in ("x", "u", "logp", "value", "reward"):
            np.testing.assert_allclose(got[key].numpy(), want[key], err_msg=key, **close)
        np.testing.assert_allclose(got["last_value"].numpy(), want["last_value"][0], **close)
        np.testing.assert_allclose(trainer.rollout.sent.numpy(), want["sent"], **close)
        for key in ("reason", "terminated", "truncated", "valid"):
            np.testing.assert_array_equal(got[key].numpy().astype(np.float32), want[key], err_msg=key)
        # The next call's holds, as the Torch rollout keeps them.
        np.testing.assert_array_equal(held_before.numpy(), want["held"][0])
        for a, b in zip(jax.tree.leaves(after), jax.tree.leaves((trainer.rollout.endings, trainer.rollout.clock,
                                                                   trainer.rollout.previous_action))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        for key, value in env.snapshot().items():  # the env continued from where the scan ended
            np.testing.assert_allclose(scanned[key], value, err_msg=key, **close)
        env.restore(scanned)
        seen |= set(want["reason"][want["terminated"] + want["truncated"] > 0].astype(int).tolist())
        seen |= {"held"} if want["held"].any() else set()
        seen |= {"reset slot"} if (want["valid"] == 0).any() and not want["held"].all() else set()
    assert {TerminationReason.TIMEOUT, "held", "reset slot"} <= seen  # the test can fail: each case ran


@pytest.mark.parametrize("lag", [0, 1])
def test_a_scanned_run_cut_and_resumed_is_the_uninterrupted_run(env, tmp_path, lag):
    """With and without a policy lag (the next rollout collected, as one
    JAX program, while the update optimises)."""
    config = dataclasses.replace(SMALL, policy_lag=lag)
    straight = Trainer(config, env, tmp_path / "straight")
    rows = straight.run()
    cut = Trainer(config, env, tmp_path / "resumed").run(seconds=0.0)
    resumed = Trainer(config, env, tmp_path / "resumed")
    later = resumed.run(resume=True)
    assert [r["update"] for r in cut + later] == [1, 2, 3]
    for key, value in straight.policy.state_dict().items():
        torch.testing.assert_close(resumed.policy.state_dict()[key], value, rtol=0, atol=0)
    for mine, theirs in zip(cut + later, rows):
        for key in LOG_FIELDS[4:]:
            assert mine[key] == theirs[key] or (np.isnan(mine[key]) and np.isnan(theirs[key])), key
    with pytest.raises(ValueError, match="other settings: \\['act_in_jax'\\]"):
        Trainer(dataclasses.replace(config, act_in_jax=False), env, tmp_path / "resumed").run(resume=True)


def test_the_integrity_check_collects_a_scanned_rollout_twice_alike(env, tmp_path):
    """`racing_stack.integrity.check_rollout` on the JAX rollout: rewound
    (the env's snapshot, the rollout's state and observation, which the scan
    does not consume), collected again through the host's copies, it is the
    same rollout bit for bit."""
    from racing_stack.integrity import check_rollout

    found = check_rollout(Trainer(SMALL, env, tmp_path))
    assert found["slots"] == 0, found["fields"]
    assert found["rollout"]["valid"].shape == (SMALL.steps, SMALL.worlds)
