"""Plain NumPy references for every op, written straight from the recurrences.

Each function is a Python loop over time, vectorised over environments, in
float64. They define what the Triton kernels must compute: the tests compare
the kernels against them, and CPU tensors (without ``TRITON_INTERPRET=1``) are
answered by them.

Notation (shapes ``[E, T]`` unless stated): ``done[t] = terminated[t] |
truncated[t]``; a missing ``truncateds`` means no truncations (every boundary
is a termination); a missing ``bootstrap_values`` is all zeros.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]


def _f64(x: ArrayLike) -> Array:
    return np.asarray(x, dtype=np.float64)


def _flag(x: ArrayLike | None, like: Array) -> Array:
    """A 0/1 float64 array: nonzero entries of ``x`` are set; ``None`` is all zero."""
    if x is None:
        return np.zeros_like(like)
    return (np.asarray(x) != 0).astype(np.float64)


def _bootstrap(
    bootstrap_values: ArrayLike | None, last_value: ArrayLike | None, like: Array
) -> Array:
    boot = np.zeros_like(like) if bootstrap_values is None else _f64(bootstrap_values).copy()
    if last_value is not None:
        boot[:, -1] = _f64(last_value)
    return boot


def _next_state_values(values: Array, boot: Array, trunc: Array) -> Array:
    """``v_next[t] = boot[t]`` where truncated or ``t = T-1``, else ``values[t+1]``."""
    v_next = np.empty_like(values)
    v_next[:, :-1] = np.where(trunc[:, :-1] != 0, boot[:, :-1], values[:, 1:])
    v_next[:, -1] = boot[:, -1]
    return v_next


def gae(
    rewards: ArrayLike,
    values: ArrayLike,
    terminateds: ArrayLike,
    truncateds: ArrayLike | None = None,
    gamma: float = 0.99,
    lambda_: float = 0.95,
    bootstrap_values: ArrayLike | None = None,
    last_value: ArrayLike | None = None,
) -> Array:
    """``A[t] = δ[t] + γλ(1-done[t]) A[t+1]``, ``A[T] = 0``;
    ``δ[t] = r[t] + γ(1-terminated[t]) v_next[t] - V(s_t)``."""
    r, v = _f64(rewards), _f64(values)
    term, trunc = _flag(terminateds, r), _flag(truncateds, r)
    v_next = _next_state_values(v, _bootstrap(bootstrap_values, last_value, r), trunc)
    done = np.maximum(term, trunc)
    adv = np.empty_like(r)
    carry = np.zeros(r.shape[0])
    for t in range(r.shape[1] - 1, -1, -1):
        delta = r[:, t] + gamma * (1.0 - term[:, t]) * v_next[:, t] - v[:, t]
        carry = delta + gamma * lambda_ * (1.0 - done[:, t]) * carry
        adv[:, t] = carry
    return adv


def vtrace(
    log_pi_target: ArrayLike,
    log_pi_behavior: ArrayLike,
    values: ArrayLike,
    rewards: ArrayLike,
    terminateds: ArrayLike,
    truncateds: ArrayLike | None = None,
    gamma: float = 0.99,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    bootstrap_values: ArrayLike | None = None,
    last_value: ArrayLike | None = None,
) -> tuple[Array, Array]:
    """V-trace targets ``vs`` and advantages ``A`` (IMPALA), see ``compute_vtrace``."""
    r, v = _f64(rewards), _f64(values)
    term, trunc = _flag(terminateds, r), _flag(truncateds, r)
    boot = _bootstrap(bootstrap_values, last_value, r)
    v_next = _next_state_values(v, boot, trunc)
    done = np.maximum(term, trunc)
    ratio = np.exp(_f64(log_pi_target) - _f64(log_pi_behavior))
    rho, c = np.minimum(rho_bar, ratio), np.minimum(c_bar, ratio)
    E, T = r.shape
    vs = np.empty_like(r)
    carry = np.zeros(E)
    for t in range(T - 1, -1, -1):
        delta = rho[:, t] * (r[:, t] + gamma * v_next[:, t] * (1.0 - term[:, t]) - v[:, t])
        carry = delta + gamma * c[:, t] * (1.0 - done[:, t]) * carry
        vs[:, t] = carry + v[:, t]
    next_vs = _next_state_values(vs, boot, trunc)
    adv = rho * (r + gamma * next_vs * (1.0 - term) - v)
    return vs, adv


def retrace(
    action_probs_target: ArrayLike,
    action_probs_behavior: ArrayLike,
    q_values: ArrayLike,
    next_q_values_all: ArrayLike,
    actions: ArrayLike,
    rewards: ArrayLike,
    terminateds: ArrayLike,
    truncateds: ArrayLike | None,
    gamma: float,
    lambda_: float = 1.0,
    c_bar: float = 1.0,
    rho_bar: float = 1.0,
) -> tuple[Array, Array]:
    """Retrace(λ) targets ``Q_ret`` and advantages, see ``compute_retrace``.

    ``action_probs_target[t]`` ([E, T, A]) gives both π(a_t|s_t) and the
    expectation against ``next_q_values_all[t]``; ``c[T] = 0`` and
    ``Q_ret[T] = 0``. An action outside ``[0, A)`` has probability 0.
    """
    r, q = _f64(rewards), _f64(q_values)
    probs, next_q = _f64(action_probs_target), _f64(next_q_values_all)
    a = np.asarray(actions).astype(np.int64)
    term, trunc = _flag(terminateds, r), _flag(truncateds, r)
    done = np.maximum(term, trunc)
    in_range = (a >= 0) & (a < probs.shape[2])
    taken = np.take_along_axis(probs, np.where(in_range, a, 0)[..., None], axis=2)[..., 0]
    pi_taken = np.where(in_range, taken, 0.0)
    ratio = pi_taken / _f64(action_probs_behavior)
    rho = np.minimum(rho_bar, ratio)
    c = lambda_ * np.minimum(c_bar, ratio)
    expected_next_q = (probs * next_q).sum(axis=2)
    E, T = r.shape
    q_ret = np.empty_like(r)
    carry = np.zeros(E)
    for t in range(T - 1, -1, -1):
        c_next = c[:, t + 1] if t + 1 < T else np.zeros(E)
        delta = r[:, t] + gamma * expected_next_q[:, t] * (1.0 - term[:, t]) - q[:, t]
        carry = delta + gamma * c_next * (1.0 - done[:, t]) * carry
        q_ret[:, t] = q[:, t] + carry
    q_ret_next = np.zeros_like(r)
    q_ret_next[:, :-1] = q_ret[:, 1:]
    adv = rho * (r + gamma * q_ret_next * (1.0 - term) - q)
    return q_ret, adv


def lambda_returns(
    rewards: ArrayLike,
    next_values: ArrayLike,
    terminateds: ArrayLike,
    truncateds: ArrayLike | None = None,
    gamma: float = 0.99,
    lambda_: float = 0.95,
    bootstrap_values: ArrayLike | None = None,
) -> Array:
    """``G[t] = r + γ(1-done)[(1-λ)V(s_{t+1}) + λG[t+1]] + γ truncated bootstrap``,
    with the carry ``G[T] = bootstrap_values[:, -1]``."""
    r, nv = _f64(rewards), _f64(next_values)
    term, trunc = _flag(terminateds, r), _flag(truncateds, r)
    boot = _bootstrap(bootstrap_values, None, r)
    done = np.maximum(term, trunc)
    out = np.empty_like(r)
    carry = boot[:, -1].copy()
    for t in range(r.shape[1] - 1, -1, -1):
        keep = gamma * (1.0 - done[:, t])
        carry = (
            r[:, t]
            + keep * ((1.0 - lambda_) * nv[:, t] + lambda_ * carry)
            + gamma * trunc[:, t] * boot[:, t]
        )
        out[:, t] = carry
    return out


def discounted_returns(
    rewards: ArrayLike,
    terminateds: ArrayLike,
    truncateds: ArrayLike | None = None,
    gamma: float = 0.99,
    bootstrap_values: ArrayLike | None = None,
) -> Array:
    """``G[t] = r + γ(1-done)G[t+1] + γ truncated bootstrap``, ``G[T] = bootstrap_values[:, -1]``."""
    r = _f64(rewards)
    term, trunc = _flag(terminateds, r), _flag(truncateds, r)
    boot = _bootstrap(bootstrap_values, None, r)
    done = np.maximum(term, trunc)
    out = np.empty_like(r)
    carry = boot[:, -1].copy()
    for t in range(r.shape[1] - 1, -1, -1):
        carry = r[:, t] + gamma * (1.0 - done[:, t]) * carry + gamma * trunc[:, t] * boot[:, t]
        out[:, t] = carry
    return out


def eligibility_traces(
    gradients: ArrayLike,
    dones: ArrayLike,
    gamma: float,
    lambda_: float,
    seed_values: ArrayLike | None = None,
) -> Array:
    """``z[t] = g[t] + γλ(1-done[t-1]) z[t-1]``, ``z[-1] = seed``, ``done[-1] = 0``."""
    g = _f64(gradients)
    done = _flag(dones, g)
    out = np.empty_like(g)
    carry = np.zeros(g.shape[0]) if seed_values is None else _f64(seed_values).copy()
    for t in range(g.shape[1]):
        keep = 1.0 if t == 0 else 1.0 - done[:, t - 1]
        carry = g[:, t] + gamma * lambda_ * keep * carry
        out[:, t] = carry
    return out


def episodic_prefix_sum(
    inputs: ArrayLike,
    dones: ArrayLike,
    seed_values: ArrayLike | None = None,
    boundary: str = "ends_at",
) -> Array:
    """``C[t] = x[t] + (1-done[t-1]) C[t-1]`` ("ends_at") or
    ``C[t] = x[t] + (1-done[t]) C[t-1]`` ("starts_at"); ``C[-1] = seed``."""
    x = _f64(inputs)
    done = _flag(dones, x)
    out = np.empty_like(x)
    carry = np.zeros(x.shape[0]) if seed_values is None else _f64(seed_values).copy()
    for t in range(x.shape[1]):
        if boundary == "starts_at":
            keep = 1.0 - done[:, t]
        else:
            keep = 1.0 if t == 0 else 1.0 - done[:, t - 1]
        carry = x[:, t] + keep * carry
        out[:, t] = carry
    return out
