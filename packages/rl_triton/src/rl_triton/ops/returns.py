"""λ-returns, discounted returns and eligibility traces."""

from __future__ import annotations

import torch

from rl_triton import _checks, reference
from rl_triton._kernels.forward import forward_kernel
from rl_triton._kernels.returns import returns_kernel
from rl_triton._launch import (
    PATH_REFERENCE, float32_like, launch, on_reference, or_placeholder, select_path,
)


def compute_lambda_returns(
    rewards: torch.Tensor,
    next_values: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None = None,
    gamma: float = 0.99,
    lambda_: float = 0.95,
    bootstrap_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """TD(λ) targets via a backward associative scan.

    Recurrence:

    ```text
    G[t] = r[t] + γ(1 - done[t]) [(1-λ) V(s_{t+1}) + λ G[t+1]] + γ truncated[t] bootstrap[t]
    G[T] = bootstrap_values[:, -1]   (0 when absent)
    done[t] = terminated[t] | truncated[t]
    ```

    λ = 0 is one-step TD; λ = 1 is the discounted return. The caller zeroes
    ``next_values`` at truncated steps (``bootstrap_values`` carries the
    continuation value there).

    Args:
        rewards: per-step rewards, ``[E, T]``.
        next_values: ``V(s_{t+1})``, ``[E, T]``, zero at truncated steps.
        terminateds: true episode ends, ``[E, T]``.
        truncateds: time-limit truncations, ``[E, T]``; ``None`` means none.
        gamma: discount factor in [0, 1].
        lambda_: trace parameter in [0, 1].
        bootstrap_values: ``V(s_{t+1}^true)`` at truncated steps and ``t = T-1``, ``[E, T]``.

    Returns:
        λ-returns ``G``, ``[E, T]`` float32.

    Raises:
        TypeError: an argument has the wrong type or dtype.
        ValueError: shapes, devices or hyper-parameters are inconsistent.
    """
    _checks.sequence("rewards", rewards)
    rewards = rewards.contiguous()
    next_values = _checks.like("next_values", next_values, rewards, "rewards", "float")
    lambda_ = _checks.unit_interval("lambda_", lambda_)
    return _returns(rewards, next_values, terminateds, truncateds, gamma, lambda_, bootstrap_values)


def compute_discounted_returns(
    rewards: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None = None,
    gamma: float = 0.99,
    bootstrap_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Discounted returns (reward-to-go) via a backward associative scan.

    Recurrence:

    ```text
    G[t] = r[t] + γ(1 - done[t]) G[t+1] + γ truncated[t] bootstrap[t]
    G[T] = bootstrap_values[:, -1]   (0 when absent)
    ```

    Args:
        rewards: per-step rewards, ``[E, T]``.
        terminateds: true episode ends, ``[E, T]``.
        truncateds: time-limit truncations, ``[E, T]``; ``None`` means none.
        gamma: discount factor in [0, 1].
        bootstrap_values: ``V(s_{t+1}^true)`` at truncated steps and ``t = T-1``, ``[E, T]``.

    Returns:
        Returns ``G``, ``[E, T]`` float32.

    Raises:
        TypeError: an argument has the wrong type or dtype.
        ValueError: shapes, devices or hyper-parameters are inconsistent.
    """
    _checks.sequence("rewards", rewards)
    return _returns(rewards.contiguous(), None, terminateds, truncateds, gamma, 1.0, bootstrap_values)


def _returns(
    rewards: torch.Tensor,
    next_values: torch.Tensor | None,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None,
    gamma: float,
    lambda_: float,
    bootstrap_values: torch.Tensor | None,
) -> torch.Tensor:
    """λ-returns; ``next_values=None`` with λ = 1 is the discounted return."""
    num_envs, seq_len = rewards.shape
    gamma = _checks.unit_interval("gamma", gamma)
    terminateds, truncateds, bootstrap_values, _ = _checks.episode_ends(
        rewards, "rewards", terminateds, truncateds, bootstrap_values)
    if next_values is not None and truncateds is not None and _checks.correctness_warnings_enabled():
        _checks.warn_data(truncateds=truncateds, truncation_zeroed=("next_values", next_values))

    if select_path(rewards.device) == PATH_REFERENCE:
        if next_values is None:
            return on_reference(reference.discounted_returns, rewards.device, rewards, terminateds,
                                truncateds, gamma, bootstrap_values)
        return on_reference(reference.lambda_returns, rewards.device, rewards, next_values,
                            terminateds, truncateds, gamma, lambda_, bootstrap_values)
    out = float32_like(rewards)
    launch(
        returns_kernel,
        (rewards, or_placeholder(next_values, rewards), terminateds,
         or_placeholder(truncateds, terminateds), or_placeholder(bootstrap_values, rewards), out),
        num_envs, seq_len, rewards.device,
        gamma=gamma, lam=lambda_, HAS_NEXT_VALUES=next_values is not None,
        HAS_TRUNC=truncateds is not None, HAS_BOOT=bootstrap_values is not None,
    )
    return out


def compute_eligibility_traces(
    gradients: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lambda_: float,
    seed_values: torch.Tensor | None = None,
) -> torch.Tensor:
    """Accumulating eligibility traces via a forward associative scan.

    Recurrence:

    ```text
    z[t] = g[t] + γλ(1 - done[t-1]) z[t-1],   z[-1] = seed,  done[-1] := 0
    ```

    ``done[t] = 1`` means the episode ends at ``t`` (the convention of every
    op here; do not pre-shift it): the carry into the first step of the next
    episode is severed. No length limit.

    Args:
        gradients: ``g[t]`` (value gradients or feature vectors), ``[E, T]``.
        dones: episode ends, ``[E, T]``, nonzero = done.
        gamma: discount factor in [0, 1].
        lambda_: trace parameter in [0, 1].
        seed_values: initial trace ``z[-1]`` per env, ``[E]``; zeros when ``None``.

    Returns:
        Traces ``z``, ``[E, T]`` float32.

    Raises:
        TypeError: an argument has the wrong type or dtype.
        ValueError: shapes, devices or hyper-parameters are inconsistent.
    """
    _checks.sequence("gradients", gradients)
    gamma = _checks.unit_interval("gamma", gamma)
    lambda_ = _checks.unit_interval("lambda_", lambda_)
    gradients, dones, seed_values = forward_inputs("gradients", gradients, dones, seed_values)
    if select_path(gradients.device) == PATH_REFERENCE:
        return on_reference(reference.eligibility_traces, gradients.device, gradients, dones,
                            gamma, lambda_, seed_values)
    return forward_scan(gradients, dones, seed_values, gamma * lambda_, shift=1)


def forward_inputs(
    name: str, x: torch.Tensor, dones: torch.Tensor, seed_values: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Check the inputs of a forward scan: ``x`` ``[E, T]``, ``dones`` like it, seeds ``[E]``."""
    x = x.contiguous()
    dones = _checks.like("dones", dones, x, name, "flag")
    if seed_values is not None:
        seed_values = _checks.like("seed_values", seed_values, x, name, "float", (x.shape[0],))
    return x, dones, seed_values


def forward_scan(
    x: torch.Tensor, dones: torch.Tensor, seed_values: torch.Tensor | None, decay: float, shift: int,
) -> torch.Tensor:
    """``y[t] = x[t] + decay (1 - dones[t-shift]) y[t-1]`` on the Triton path."""
    num_envs, seq_len = x.shape
    out = float32_like(x)
    launch(
        forward_kernel,
        (x, dones, or_placeholder(seed_values, x), out),
        num_envs, seq_len, x.device,
        decay=decay, SHIFT=shift, HAS_SEED=seed_values is not None,
    )
    return out
