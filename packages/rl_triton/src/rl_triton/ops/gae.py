"""Generalized Advantage Estimation."""

from __future__ import annotations

import torch

from rl_triton import _checks, reference
from rl_triton._kernels.gae import gae_kernel
from rl_triton._launch import (
    PATH_REFERENCE, float32_like, launch, on_reference, or_placeholder, select_path,
)


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None = None,
    gamma: float = 0.99,
    lambda_: float = 0.95,
    bootstrap_values: torch.Tensor | None = None,
    last_value: torch.Tensor | None = None,
) -> torch.Tensor:
    """Generalized Advantage Estimation via a backward associative scan.

    Recurrence:

    ```text
    A[t] = δ[t] + γλ(1 - done[t]) A[t+1],   A[T] = 0
    δ[t] = r[t] + γ(1 - terminated[t]) v_next[t] - V(s_t)
    v_next[t] = bootstrap[t] if truncated[t] or t = T-1 else V(s_{t+1})
    done[t] = terminated[t] | truncated[t]
    ```

    ``terminated[t]`` gates the one-step bootstrap; ``truncated[t]`` stops the
    trace and takes ``bootstrap_values[:, t] = V(s_{t+1}^true)`` as the next-state
    value. The final column ``bootstrap_values[:, -1]`` (or ``last_value``)
    enters only ``δ[T-1]``; the scan's carry ``A[T]`` is always 0.

    Args:
        rewards: per-step rewards, ``[E, T]``, floating point.
        values: ``V(s_t)``, ``[E, T]``, floating point.
        terminateds: true episode ends, ``[E, T]``, nonzero = terminated.
        truncateds: time-limit truncations, ``[E, T]``; ``None`` means none
            (every boundary is a termination).
        gamma: discount factor in [0, 1].
        lambda_: GAE trace parameter in [0, 1].
        bootstrap_values: ``V(s_{t+1}^true)`` at truncated steps and at
            ``t = T-1``, zero elsewhere, ``[E, T]``; ``None`` is all zeros.
        last_value: ``V(s_T)`` per env, ``[E]``: the common case with no
            interior truncations. Excludes ``bootstrap_values`` and ``truncateds``.

    Returns:
        Advantages ``A``, ``[E, T]``, float32, on the inputs' device.

    Raises:
        TypeError: an argument has the wrong type or dtype.
        ValueError: shapes, devices or hyper-parameters are inconsistent.
    """
    num_envs, seq_len = _checks.sequence("rewards", rewards)
    rewards = rewards.contiguous()
    values = _checks.like("values", values, rewards, "rewards", "float")
    gamma = _checks.unit_interval("gamma", gamma)
    lambda_ = _checks.unit_interval("lambda_", lambda_)
    terminateds, truncateds, bootstrap_values, last_value = _checks.episode_ends(
        rewards, "rewards", terminateds, truncateds, bootstrap_values, last_value)

    if select_path(rewards.device) == PATH_REFERENCE:
        return on_reference(reference.gae, rewards.device, rewards, values, terminateds, truncateds,
                            gamma, lambda_, bootstrap_values, last_value)
    advantages = float32_like(rewards)
    boot = last_value if last_value is not None else bootstrap_values
    launch(
        gae_kernel,
        (rewards, values, terminateds, or_placeholder(truncateds, terminateds), or_placeholder(boot, rewards),
         advantages),
        num_envs, seq_len, rewards.device,
        gamma=gamma, lam=lambda_, HAS_TRUNC=truncateds is not None,
        BOOT=2 if last_value is not None else int(bootstrap_values is not None),
    )
    return advantages
