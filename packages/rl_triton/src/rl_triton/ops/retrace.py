"""Retrace(λ) Q-value targets and advantages (discrete actions)."""

from __future__ import annotations

import torch
import triton

from rl_triton import _checks, reference
from rl_triton._kernels.retrace import retrace_kernel
from rl_triton._launch import (
    PATH_REFERENCE, float32_like, launch, on_reference, or_placeholder, select_path,
)


def compute_retrace(
    action_probs_target: torch.Tensor,
    action_probs_behavior: torch.Tensor,
    q_values: torch.Tensor,
    next_q_values_all: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None,
    gamma: float,
    lambda_: float = 1.0,
    c_bar: float = 1.0,
    rho_bar: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Retrace(λ) targets and advantages via a backward associative scan.

    Recurrence (Munos et al. 2016):

    ```text
    Δ[t] = δ[t] + γ c[t+1](1 - done[t]) Δ[t+1],   Δ[T] = 0,  c[T] = 0
    δ[t] = r[t] + γ E_π[Q(s_{t+1}, ·)](1 - terminated[t]) - Q(s_t, a_t)
    c[t] = λ min(c̄, π(a_t|s_t) / μ(a_t|s_t)),   ρ[t] = min(ρ̄, π(a_t|s_t) / μ(a_t|s_t))
    Q_ret[t] = Q(s_t, a_t) + Δ[t]
    A[t] = ρ[t] (r[t] + γ Q_ret[t+1](1 - terminated[t]) - Q(s_t, a_t)),  Q_ret[T] = 0
    ```

    ``action_probs_target[:, t]`` serves both as π(a_t|s_t) (gathered at
    ``actions[:, t]``) and as the policy of the expectation
    ``E_π[Q(s_{t+1}, ·)] = Σ_a action_probs_target[:, t, a] next_q_values_all[:, t, a]``.
    An action outside ``[0, A)`` has probability 0.

    Args:
        action_probs_target: target policy probabilities, ``[E, T, A]``.
        action_probs_behavior: μ(a_t|s_t) of the taken action, ``[E, T]``.
        q_values: ``Q(s_t, a_t)``, ``[E, T]``.
        next_q_values_all: ``Q(s_{t+1}, a)`` for every action, ``[E, T, A]``.
        actions: taken action indices, ``[E, T]``, integer.
        rewards: per-step rewards, ``[E, T]``.
        terminateds: true episode ends, ``[E, T]``; zero the bootstrap in δ.
        truncateds: time-limit truncations, ``[E, T]``; sever the trace only.
            ``None`` means none.
        gamma: discount factor in [0, 1].
        lambda_: trace parameter in [0, 1].
        c_bar: clip of the trace ratio, > 0.
        rho_bar: clip of the advantage ratio, > 0.

    Returns:
        ``(retrace_targets, advantages)``, each ``[E, T]`` float32.

    Raises:
        TypeError: an argument has the wrong type or dtype.
        ValueError: shapes, devices or hyper-parameters are inconsistent.
    """
    num_envs, seq_len = _checks.sequence("rewards", rewards)
    ref = rewards.contiguous()
    probs = _checks.tensor("action_probs_target", action_probs_target, "float")
    if probs.dim() != 3 or probs.shape[-1] < 1:
        raise ValueError("action_probs_target must have shape [num_envs, seq_len, num_actions], "
                         f"got {list(probs.shape)}")
    num_actions = probs.shape[-1]
    full = (num_envs, seq_len, num_actions)
    probs = _checks.like("action_probs_target", probs, ref, "rewards", "float", full)
    next_q = _checks.like("next_q_values_all", next_q_values_all, ref, "rewards", "float", full)
    behavior = _checks.like("action_probs_behavior", action_probs_behavior, ref, "rewards", "float")
    q_values = _checks.like("q_values", q_values, ref, "rewards", "float")
    actions = _checks.like("actions", actions, ref, "rewards", "index")
    terminateds = _checks.like("terminateds", terminateds, ref, "rewards", "flag")
    if truncateds is not None:
        truncateds = _checks.like("truncateds", truncateds, ref, "rewards", "flag")
    gamma = _checks.unit_interval("gamma", gamma)
    lambda_ = _checks.unit_interval("lambda_", lambda_)
    c_bar = _checks.positive("c_bar", c_bar)
    rho_bar = _checks.positive("rho_bar", rho_bar)
    if _checks.correctness_warnings_enabled():
        _checks.warn_data(terminateds=terminateds, truncateds=truncateds,
                          actions=(actions, num_actions))

    if select_path(ref.device) == PATH_REFERENCE:
        return on_reference(reference.retrace, ref.device, probs, behavior, q_values, next_q,
                            actions, ref, terminateds, truncateds, gamma, lambda_, c_bar, rho_bar)
    q_ret = float32_like(ref)
    advantages = torch.empty_like(q_ret)
    a_pad = triton.next_power_of_2(num_actions)
    launch(
        retrace_kernel,
        (probs, behavior, q_values, next_q, actions, ref, terminateds,
         or_placeholder(truncateds, terminateds), q_ret, advantages),
        num_envs, seq_len, ref.device, width=a_pad,
        A=num_actions, gamma=gamma, lam=lambda_, c_bar=c_bar, rho_bar=rho_bar,
        HAS_TRUNC=truncateds is not None, A_PAD=a_pad,
    )
    return q_ret, advantages
