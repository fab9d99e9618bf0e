"""PPO's minibatch losses and advantage normalisation against NumPy, on
random minibatches with masked rows; shapes that would broadcast silently
and arguments out of range are refused."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from racing_stack.ppo import PRESETS
from racing_stack.ppo.losses import adapted_learning_rate, normalised_advantages, ppo_losses
from racing_stack.ppo.networks import ActorCritic

LOW = np.array([-0.6, -8.0], np.float32)
HIGH = np.array([0.6, 4.0], np.float32)
CONFIG = dataclasses.replace(PRESETS["cpu"], clip=0.2, value_coef=0.7, entropy_coef=0.01)


def minibatch(rng, rows=37, features=9):
    torch.manual_seed(int(rng.integers(1 << 30)))
    policy = ActorCritic(features, (16, 8), (-0.4, -1.2), LOW, HIGH)
    x = torch.from_numpy(rng.normal(0.0, 3.0, (rows, features)).astype(np.float32))
    u = torch.from_numpy(rng.normal(0.0, 0.5, (rows, 2)).astype(np.float32))
    old_logp = torch.from_numpy(rng.normal(-1.0, 0.6, rows).astype(np.float32))  # ratios well beyond the clip too
    advantage = torch.from_numpy(rng.normal(0.0, 1.0, rows).astype(np.float32))
    returns = torch.from_numpy(rng.normal(0.0, 2.0, rows).astype(np.float32))
    mask = torch.from_numpy((rng.random(rows) < 0.7).astype(np.float32))
    return policy, x, u, old_logp, advantage, returns, mask


def reference_losses(mean, log_std, value, u, old_logp, advantage, returns, mask, count, clip, proximal_logp=None):
    """The clipped surrogate, value loss, entropy, KL estimate and clip
    fraction, each a sum over unmasked rows over ``count``, in float64;
    with ``proximal_logp`` the decoupled surrogate (ratio and clip against
    the proximal policy, weighted by pi_prox / pi_old)."""
    std = np.exp(log_std)
    logp = (-0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    anchor = old_logp if proximal_logp is None else proximal_logp
    ratio = np.exp(logp - anchor)
    surrogate = np.minimum(ratio * advantage, np.clip(ratio, 1 - clip, 1 + clip) * advantage)
    surrogate = surrogate * np.exp(anchor - old_logp)
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum()
    return np.array([-(surrogate * mask).sum() / count, ((value - returns) ** 2 * mask).sum() / count,
                     entropy * mask.sum() / count, ((ratio - 1 - np.log(ratio)) * mask).sum() / count,
                     ((np.abs(ratio - 1) > clip) * mask).sum() / count])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("count", [None, 50.0])
def test_the_losses_are_numpys(seed, count):
    """``count`` None: means over the unmasked rows; a number: this
    process's share of a larger minibatch's means."""
    rng = np.random.default_rng(seed)
    policy, x, u, old_logp, advantage, returns, mask = minibatch(rng)
    loss, stats = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, mask,
                             None if count is None else torch.tensor(count))
    with torch.no_grad():
        mean = policy.distribution(x).mean.double().numpy()
        value = policy.value(x).double().numpy()
    f64 = [t.double().numpy() for t in (u, old_logp, advantage, returns, mask)]
    want = reference_losses(mean, policy.log_std.detach().double().numpy(), value, *f64,
                            count=f64[-1].sum() if count is None else count, clip=CONFIG.clip)
    np.testing.assert_allclose(stats.double().numpy(), want, rtol=2e-5, atol=1e-6)
    total = want[0] + CONFIG.value_coef * want[1] - CONFIG.entropy_coef * want[2]
    assert float(loss.detach()) == pytest.approx(total, rel=2e-5, abs=1e-6)
    assert 0 < want[4] < 1  # the minibatch has clipped and unclipped ratios


@pytest.mark.parametrize("seed", range(4))
def test_the_decoupled_losses_are_numpys(seed):
    """With a proximal policy's log-probabilities (a lagged rollout): the
    ratio, the clip and the KL against it, the surrogate weighted by
    pi_prox / pi_old, as the NumPy reference computes them."""
    rng = np.random.default_rng(100 + seed)
    policy, x, u, old_logp, advantage, returns, mask = minibatch(rng)
    with torch.no_grad():
        near = policy.distribution(x).log_prob(u).sum(-1)
    proximal = near + torch.from_numpy(rng.normal(0.0, 0.15, near.shape[0]).astype(np.float32))
    loss, stats = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, mask, proximal_logp=proximal)
    with torch.no_grad():
        mean = policy.distribution(x).mean.double().numpy()
        value = policy.value(x).double().numpy()
    f64 = [t.double().numpy() for t in (u, old_logp, advantage, returns, mask)]
    want = reference_losses(mean, policy.log_std.detach().double().numpy(), value, *f64, count=f64[-1].sum(),
                            clip=CONFIG.clip, proximal_logp=proximal.double().numpy())
    np.testing.assert_allclose(stats.double().numpy(), want, rtol=2e-5, atol=1e-6)
    total = want[0] + CONFIG.value_coef * want[1] - CONFIG.entropy_coef * want[2]
    assert float(loss.detach()) == pytest.approx(total, rel=2e-5, abs=1e-6)
    plain = reference_losses(mean, policy.log_std.detach().double().numpy(), value, *f64, count=f64[-1].sum(),
                             clip=CONFIG.clip)
    assert abs(plain[0] - want[0]) > 1e-3 and 0 < want[4] < 1  # another loss than PPO's against the old policy


def test_the_decoupled_loss_against_the_acting_policy_is_ppos_bit_for_bit():
    policy, x, u, old_logp, advantage, returns, mask = minibatch(np.random.default_rng(5))
    loss, stats = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, mask)
    loss.backward()
    grads = [p.grad.clone() for p in policy.parameters()]
    policy.zero_grad()
    again, stats_again = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, mask,
                                    proximal_logp=old_logp.clone())
    again.backward()
    assert torch.equal(loss, again) and torch.equal(stats, stats_again)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, policy.parameters()))


def test_masked_rows_change_nothing():
    rng = np.random.default_rng(7)
    policy, x, u, old_logp, advantage, returns, mask = minibatch(rng)
    loss, stats = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, mask)
    junk = mask == 0
    for t in (x, u, old_logp, advantage, returns):
        t[junk] = 50.0
    again, stats_again = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, mask)
    assert torch.equal(stats, stats_again) and torch.equal(loss, again)


def test_no_unmasked_row_gives_zero_losses():
    policy, x, u, old_logp, advantage, returns, mask = minibatch(np.random.default_rng(3))
    loss, stats = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, torch.zeros_like(mask))
    assert float(loss.detach()) == 0.0 and stats.tolist() == [0.0] * 5


@pytest.mark.parametrize("rows", [1, 2, 33])
def test_advantages_are_normalised_over_the_unmasked_rows(rows):
    rng = np.random.default_rng(rows)
    advantage = rng.normal(5.0, 3.0, rows)
    mask = (rng.random(rows) < 0.6).astype(np.float64)
    mask[0] = 1.0
    got = normalised_advantages(torch.from_numpy(advantage), torch.from_numpy(mask)).numpy()
    kept = advantage[mask == 1]
    np.testing.assert_allclose(got, (advantage - kept.mean()) / (kept.std() + 1e-8), rtol=1e-9, atol=1e-9)


def test_columns_that_would_broadcast_are_refused():
    policy, x, u, old_logp, advantage, returns, mask = minibatch(np.random.default_rng(1))
    args = dict(x=x, u=u, old_logp=old_logp, advantage=advantage, returns=returns, mask=mask)
    for name in ("old_logp", "advantage", "returns", "mask"):
        with pytest.raises(ValueError, match=f"{name} must hold one value per row, shape \\[37\\], got \\[37, 1\\]"):
            ppo_losses(policy, CONFIG, **{**args, name: args[name][:, None]})
    with pytest.raises(ValueError, match="x must be \\[B, D\\] and u \\[B, 2\\]"):
        ppo_losses(policy, CONFIG, **{**args, "u": u[:-1]})
    with pytest.raises(ValueError, match="returns must hold one value per row"):
        ppo_losses(policy, CONFIG, **{**args, "returns": returns[:-1]})
    with pytest.raises(ValueError, match="proximal_logp"):
        ppo_losses(policy, CONFIG, **args, proximal_logp=old_logp[:, None])
    with pytest.raises(ValueError, match=r"advantage and mask must be \[N\] each, got \[37\] and \[37, 1\]"):
        normalised_advantages(advantage, mask[:, None])
    with pytest.raises(ValueError, match="advantage and mask must be"):
        normalised_advantages(advantage[:, None], mask[:, None])


@pytest.mark.parametrize("schedule", ["adaptive", "linear", "constant"])
def test_the_schedules_refuse_an_update_out_of_the_run(schedule):
    config = dataclasses.replace(CONFIG, schedule=schedule, updates=10)
    assert adapted_learning_rate(config, 1e-3, 0.01, 9) >= 0  # the last update (linear: to 0)
    for update in (-1, 10, 11):
        with pytest.raises(ValueError, match=r"update must be in \[0, 9\]"):
            adapted_learning_rate(config, 1e-3, 0.01, update)
    for update in (2.0, True, None):
        with pytest.raises(TypeError, match="update must be an int"):
            adapted_learning_rate(config, 1e-3, 0.01, update)


@pytest.mark.parametrize("rate, error", [(0.0, ValueError), (-1e-3, ValueError), (float("nan"), ValueError),
                                         (float("inf"), ValueError), ("1e-3", TypeError), (None, TypeError),
                                         (True, TypeError)])
def test_the_adaptive_schedule_refuses_a_rate_that_is_not_a_positive_number(rate, error):
    with pytest.raises(error, match="rate must be"):
        adapted_learning_rate(CONFIG, rate, 0.01, 0)


def test_a_left_out_rows_junk_cannot_reach_the_decoupled_loss():
    policy, x, u, old_logp, advantage, returns, mask = minibatch(np.random.default_rng(9))
    proximal = old_logp.clone()
    loss, stats = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, mask, proximal_logp=proximal)
    junk = mask == 0
    proximal[junk], old_logp[junk] = 1e4, -1e4  # a weight of e^20000 where the row is left out
    again, stats_again = ppo_losses(policy, CONFIG, x, u, old_logp, advantage, returns, mask, proximal_logp=proximal)
    assert torch.isfinite(again) and torch.equal(loss, again) and torch.equal(stats[:3], stats_again[:3])
