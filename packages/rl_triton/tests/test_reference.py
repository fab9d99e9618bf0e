"""The NumPy references against hand-computed values and known identities."""

import numpy as np
import pytest

from rl_triton import reference as ref
from rollouts import rollout

G, L = 0.9, 0.5


def test_gae_by_hand():
    r = [[1.0, 2.0, 3.0]]
    v = [[0.5, 1.0, 1.5]]
    term = [[0, 1, 0]]
    # δ2 = 3 + .9*4 - 1.5 = 5.1 (last_value 4); δ1 = 2 - 1 = 1 (terminated);
    # δ0 = 1 + .9*1 - .5 = 1.4. A2 = 5.1, A1 = 1 (done), A0 = 1.4 + .45*1 = 1.85.
    adv = ref.gae(r, v, term, gamma=G, lambda_=L, last_value=[4.0])
    np.testing.assert_allclose(adv, [[1.85, 1.0, 5.1]])


def test_gae_truncation_bootstraps_and_cuts_the_trace():
    r, v = [[1.0, 1.0, 1.0]], [[0.0, 0.0, 0.0]]
    trunc, boot = [[0, 1, 0]], [[0.0, 10.0, 20.0]]
    # δ2 = 1 + 18 = 19; δ1 = 1 + 9 = 10 (truncated: trace cut); δ0 = 1 + 0 = 1 -> A0 = 1 + .45*10.
    adv = ref.gae(r, v, [[0, 0, 0]], trunc, G, L, bootstrap_values=boot)
    np.testing.assert_allclose(adv, [[5.5, 10.0, 19.0]])


def test_gae_with_lambda_one_is_return_minus_value():
    b = rollout(4, 30, seed=1, p_trunc=0.0)
    adv = ref.gae(b.rewards, b.values, b.terminateds, gamma=G, lambda_=1.0, last_value=b.last_value)
    boot = np.zeros_like(b.rewards)
    boot[:, -1] = b.last_value
    ret = ref.discounted_returns(b.rewards, b.terminateds, gamma=G, bootstrap_values=boot)
    np.testing.assert_allclose(adv, ret - b.values, atol=1e-9)


def test_vtrace_on_policy_equals_gae_lambda_one():
    b = rollout(4, 30, seed=2)
    vs, adv = ref.vtrace(b.log_pi_target, b.log_pi_target, b.values, b.rewards, b.terminateds,
                         b.truncateds, G, bootstrap_values=b.bootstrap_values)
    gae = ref.gae(b.rewards, b.values, b.terminateds, b.truncateds, G, 1.0, b.bootstrap_values)
    np.testing.assert_allclose(vs - b.values, gae, atol=1e-9)
    # On-policy, ρ = 1 and the advantage is the one-step error against vs[t+1].
    next_vs = np.where(b.truncateds != 0, b.bootstrap_values, np.roll(vs, -1, axis=1))
    next_vs[:, -1] = b.bootstrap_values[:, -1]
    np.testing.assert_allclose(adv, b.rewards + G * next_vs * (1 - b.terminateds) - b.values, atol=1e-9)


def test_vtrace_clips_ratios():
    one = [[0.0]]
    vs, adv = ref.vtrace([[np.log(4.0)]], one, [[0.0]], [[1.0]], [[1]], rho_bar=2.0, c_bar=1.0)
    np.testing.assert_allclose(vs, [[2.0]])  # ρ = min(2, 4)
    np.testing.assert_allclose(adv, [[2.0]])


def test_retrace_by_hand():
    probs = [[[0.5, 0.5], [0.25, 0.75]]]
    mu = [[0.5, 0.5]]
    q = [[1.0, 2.0]]
    next_q = [[[2.0, 4.0], [0.0, 8.0]]]
    actions = [[0, 1]]
    r = [[1.0, 1.0]]
    # E[Q'] = [3, 6]; δ1 = 1 + .9*6 - 2 = 4.4; c1 = λ min(1, .75/.5) = .5 (λ=.5);
    # δ0 = 1 + .9*3 - 1 = 2.7; Δ0 = 2.7 + .9*.5*4.4 = 4.68.
    q_ret, adv = ref.retrace(probs, mu, q, next_q, actions, r, [[0, 0]], None, G, L)
    np.testing.assert_allclose(q_ret, [[5.68, 6.4]])
    # ρ0 = min(1, .5/.5) = 1: A0 = 1 + .9*6.4 - 1; ρ1 = 1: A1 = 1 + .9*Q_ret[T]=0 - 2.
    np.testing.assert_allclose(adv, [[5.76, -1.0]])


def test_lambda_returns_limits():
    b = rollout(3, 25, seed=3)
    td = ref.lambda_returns(b.rewards, b.next_values, b.terminateds, b.truncateds, G, 0.0,
                            b.bootstrap_values)
    done = np.maximum(b.terminateds, b.truncateds)
    one_step = b.rewards + G * (1 - done) * b.next_values + G * b.truncateds * b.bootstrap_values
    # λ = 0 leaves G[T] out everywhere but t = T-1 (where (1-λ)V + λ G[T] keeps only V).
    np.testing.assert_allclose(td, one_step, atol=1e-6)
    mc = ref.lambda_returns(b.rewards, b.next_values, b.terminateds, b.truncateds, G, 1.0,
                            b.bootstrap_values)
    np.testing.assert_allclose(mc, ref.discounted_returns(b.rewards, b.terminateds, b.truncateds, G,
                                                          b.bootstrap_values), atol=1e-9)


def test_discounted_returns_by_hand():
    # G[T] = bootstrap[:, -1] = 10; G2 = 1 + .9*10 = 10; G1 = 1 (terminated); G0 = 1 + .9*1.
    out = ref.discounted_returns([[1.0, 1.0, 1.0]], [[0, 1, 0]], gamma=G,
                                 bootstrap_values=[[0.0, 0.0, 10.0]])
    np.testing.assert_allclose(out, [[1.9, 1.0, 10.0]])


def test_eligibility_traces_sever_after_the_done_step():
    z = ref.eligibility_traces([[1.0, 1.0, 1.0, 1.0]], [[0, 1, 0, 0]], 1.0, 0.5, seed_values=[2.0])
    # z0 = 1 + .5*2; z1 = 1 + .5*z0 (still the old episode); z2 = 1 (new episode); z3 = 1.5.
    np.testing.assert_allclose(z, [[2.0, 2.0, 1.0, 1.5]])


@pytest.mark.parametrize("boundary,want", [("ends_at", [[3.0, 5.0, 3.0, 7.0]]),
                                           ("starts_at", [[3.0, 2.0, 5.0, 4.0]])])
def test_prefix_sum_boundaries(boundary, want):
    out = ref.episodic_prefix_sum([[1.0, 2.0, 3.0, 4.0]], [[0, 1, 0, 1]], [2.0], boundary)
    np.testing.assert_allclose(out, want)


def test_prefix_sum_without_boundaries_is_cumsum():
    b = rollout(3, 40, seed=4)
    out = ref.episodic_prefix_sum(b.rewards, np.zeros_like(b.rewards), b.seeds)
    np.testing.assert_allclose(out, np.cumsum(b.rewards.astype(np.float64), 1) + b.seeds[:, None],
                               atol=1e-9)
