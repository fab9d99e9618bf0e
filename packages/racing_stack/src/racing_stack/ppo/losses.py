"""PPO's losses on a minibatch and the step size's schedules."""

from __future__ import annotations

import torch

from racing_env import checks
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.networks import ActorCritic

__all__ = ["LOSS_FIELDS", "adapted_learning_rate", "explained_variance", "normalised_advantages", "ppo_losses"]

#: What `ppo_losses` returns, in order.
LOSS_FIELDS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


def normalised_advantages(advantage: torch.Tensor, mask: torch.Tensor, group: Group = Group()) -> torch.Tensor:
    """``advantage`` [N] less its mean, over its standard deviation, both
    over the rows where ``mask`` [N] is 1 in every process of ``group``.

    Raises:
        ValueError: ``advantage`` or ``mask`` is not [N] (a column would
            broadcast to [N, N]).
    """
    if advantage.dim() != 1 or mask.shape != advantage.shape:
        raise ValueError(f"advantage and mask must be [N] each, got {list(advantage.shape)} and {list(mask.shape)}")
    count, total = group.sum(torch.stack([mask.sum(), (advantage * mask).sum()]))
    count = count.clamp(min=1.0)
    mean = total / count
    std = (group.sum(((advantage - mean) ** 2 * mask).sum()) / count).sqrt()
    return (advantage - mean) / (std + 1e-8)


def explained_variance(returns: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                       group: Group = Group()) -> torch.Tensor:
    """1 - Var(returns - value) / Var(returns), a scalar, over the rows
    of ``returns``, ``value`` and ``mask`` [N] where ``mask`` is 1 in
    every process of ``group`` (the variance of the returns at least 1e-12)."""
    error = (returns - value) * mask
    count, total, wrong = group.sum(torch.stack([mask.sum(), (returns * mask).sum(), error.sum()]))
    count = count.clamp(min=1.0)
    spread, unexplained = group.sum(torch.stack([(((returns - total / count) * mask) ** 2).sum(),
                                                 ((error - wrong / count) ** 2 * mask).sum()])) / count
    return 1.0 - unexplained / spread.clamp(min=1e-12)


def ppo_losses(policy: ActorCritic, config: PPOConfig, x: torch.Tensor, u: torch.Tensor, old_logp: torch.Tensor,
               advantage: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               count: torch.Tensor | None = None,
               proximal_logp: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped PPO loss of one minibatch, every term a mean over the
    rows where ``mask`` is 1 (``count``: their number in the whole
    minibatch, when this is one process's part of it; the parts' losses
    and gradients then sum to the whole's).

    With ``proximal_logp`` (the log-probabilities of the policy the update
    started from, where the actions were taken by an older one:
    `PPOConfig.policy_lag`), the decoupled objective of Hilton, Cobbe and
    Schulman (2021, "Batch size-invariance for policy optimization"): the
    ratio, its clip, the KL and the clip fraction are taken against the
    proximal policy, r = pi / pi_prox, and each row's clipped surrogate is
    weighted by pi_prox / pi_old (importance sampling from the policy that
    acted, not clipped). The trust region stays around the policy being
    improved, whatever policy collected the data; with ``proximal_logp``
    equal to ``old_logp`` it is PPO's own loss.

    Args:
        x: features [B, D]. u: the normalised actions taken [B, 2].
        old_logp: their log-probability when taken [B]. advantage:
            normalised advantages [B]. returns: value targets [B]. mask: [B].
        proximal_logp: None, or their log-probability under the proximal policy [B].

    Returns:
        (the loss to minimise, a scalar; the detached `LOSS_FIELDS` [5]:
        the clipped surrogate, the value loss, the entropy, the approximate
        KL from the rollout's policy and the fraction of clipped ratios).

    Raises:
        ValueError: a shape other than these (a column [B, 1] among the
            [B] ones would broadcast to [B, B] and give a wrong loss).
    """
    if x.dim() != 2 or u.shape != (x.shape[0], 2):
        raise ValueError(f"x must be [B, D] and u [B, 2], got {list(x.shape)} and {list(u.shape)}")
    _check_rows(x.shape[0], old_logp=old_logp, advantage=advantage, returns=returns, mask=mask)
    if proximal_logp is not None:
        _check_rows(x.shape[0], proximal_logp=proximal_logp)
    w = (mask.sum() if count is None else count).clamp(min=1.0)
    z = policy.normalizer(x)
    mean = policy.actor(z)
    dist = torch.distributions.Normal(mean, policy.log_std.exp(), validate_args=False)
    logp = dist.log_prob(u).sum(-1)
    log_ratio = logp - (old_logp if proximal_logp is None else proximal_logp)
    ratio = log_ratio.exp()
    clipped = ratio.clamp(1 - config.clip, 1 + config.clip)
    surrogate = torch.min(ratio * advantage, clipped * advantage)
    if proximal_logp is not None:  # a left-out row's weight is 1, not whatever its junk gives (inf x 0 is NaN)
        surrogate = surrogate * torch.where(mask > 0, proximal_logp - old_logp, 0.0).exp()
    policy_loss = -(surrogate * mask).sum() / w
    entropy = (dist.entropy().sum(-1) * mask).sum() / w
    value_loss = (((policy.critic(z).squeeze(-1) - returns) ** 2) * mask).sum() / w
    loss = policy_loss + config.value_coef * value_loss - config.entropy_coef * entropy
    with torch.no_grad():
        kl = (((ratio - 1) - log_ratio) * mask).sum() / w
        clip_fraction = (((ratio - 1).abs() > config.clip).float() * mask).sum() / w
        stats = torch.stack([policy_loss, value_loss, entropy, kl, clip_fraction]).detach()
    return loss, stats


def adapted_learning_rate(config: PPOConfig, rate: float, kl: float, update: int) -> float:
    """The step size of update ``update + 1``, after update ``update``
    (0-based) ran at ``rate`` with mean KL ``kl``.

    ``adaptive``: ``rate`` / 1.5 when ``kl`` exceeds twice ``desired_kl``, x 1.5
    when it is below half, within [``min_learning_rate``, ``max_learning_rate``]
    (a non-finite KL lowers the rate); ``linear``: ``learning_rate x (1 -
    (update + 1) / updates)``; ``constant``: ``learning_rate``.

    Raises:
        TypeError: an ``update`` that is not an int, or on the adaptive
            schedule a ``rate`` that is not a real number.
        ValueError: ``update`` outside [0, ``config.updates``), or, on the
            adaptive schedule, a ``rate`` that is not finite and positive.
    """
    checks.integer_in(update, "update", 0, config.updates)
    if config.schedule == "adaptive":
        checks.positive(rate, "rate")
    if config.schedule == "constant":
        return config.learning_rate
    if config.schedule == "linear":
        return config.learning_rate * (1.0 - (update + 1) / config.updates)
    if not kl <= 2.0 * config.desired_kl:  # NaN too
        rate /= 1.5
    elif kl < 0.5 * config.desired_kl:
        rate *= 1.5
    return min(max(rate, config.min_learning_rate), config.max_learning_rate)


def _check_rows(rows: int, **tensors: torch.Tensor) -> None:
    """Each of ``tensors`` is one value per row: [``rows``]."""
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != (rows,):
            raise ValueError(f"{name} must hold one value per row, shape [{rows}], got {list(tensor.shape)}")
