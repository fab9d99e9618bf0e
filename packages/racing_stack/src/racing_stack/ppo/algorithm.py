"""PPO's update of one policy, apart from the run around it (the role of
rsl_rl's ``algorithms/ppo.py`` and Brax's ``agents/ppo/train.py`` around
its ``losses.py``): advantages by `rl_triton.compute_gae`, then
``epochs`` x ``minibatches`` clipped steps (`racing_stack.ppo.losses`),
the actor's and the critic's gradients clipped apart, summed over the
processes of a `Group`; the guard's reads of what an update computed.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

import rl_triton
from racing_stack.guard import Violation, check, violations
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.losses import LOSS_FIELDS, normalised_advantages, ppo_losses
from racing_stack.ppo.networks import ActorCritic
from racing_stack.ppo.rollout import Rollout

__all__ = ["UPDATE_FIELDS", "PPOUpdate", "crash_weight", "first_worst"]

#: What `PPOUpdate.optimise` returns, in order.
UPDATE_FIELDS = (*LOSS_FIELDS, "actor_grad_norm", "critic_grad_norm", "explained_variance", "std_steering",
                 "std_acceleration")


class PPOUpdate:
    """The policy, its optimizer and the generator that shuffles its
    minibatches, and the update that changes them.

    Made in this order, each from Torch's global seed set to
    ``config.seed`` first: the policy, its optimizer, then the generator
    (seeded with ``config.seed``); so two `PPOUpdate` of one config start
    bitwise equal.

    Args:
        config: the run's settings.
        low, high: the env's action bounds [2] (the policy's output range).
        device: where the policy lives (JAX's device too).
        group: the processes training this policy together.
    """

    def __init__(self, config: PPOConfig, low: np.ndarray, high: np.ndarray, device: torch.device,
                 group: Group = Group()) -> None:
        self.config, self.device, self.group = config, device, group
        self.low, self.high = np.asarray(low), np.asarray(high)
        torch.manual_seed(config.seed)
        self.policy = self.new_policy()
        self.optimizer = self.new_optimizer(self.policy)
        self.generator = torch.Generator(device)
        self.generator.manual_seed(config.seed)

    def new_policy(self) -> ActorCritic:
        """A freshly initialised actor-critic for the config and the action bounds, on the device."""
        cfg = self.config
        return ActorCritic(cfg.features.size, cfg.hidden, cfg.init_log_std, self.low, self.high,
                           cfg.residual).to(self.device)

    def new_optimizer(self, policy: ActorCritic) -> torch.optim.Adam:
        """Adam over ``policy``'s parameters; on CUDA its fused kernel (one
        launch a step instead of several per parameter tensor)."""
        return torch.optim.Adam(policy.parameters(), lr=self.config.learning_rate, eps=1e-5,
                                fused=self.device.type == "cuda")

    def set_learning_rate(self, rate: float) -> None:
        """The step size of the optimizer's next steps."""
        for group in self.optimizer.param_groups:
            group["lr"] = rate

    def advantages(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns), [T, E], of ``rollout``'s buffers: GAE by
        rl_triton, cut where a return ends (`Rollout.returns_cut`),
        bootstrapped where it is truncated (`Rollout.returns_bootstrapped`)
        from V of the next slot's input (the terminal observation); the
        last slot from V of the observation after the rollout. Reset and
        held slots carry nothing."""
        buf, cfg = rollout.buf, self.config
        value = buf["value"]
        cut, truncated = rollout.returns_cut(), rollout.returns_bootstrapped()
        next_value = torch.cat([value[1:], rollout.last_value[None]], dim=0)
        bootstrap = torch.where(truncated, next_value, torch.zeros_like(next_value))
        bootstrap[-1] = torch.where(cut[-1], 0.0, next_value[-1])
        advantage = rl_triton.compute_gae(
            buf["reward"].T.contiguous(), value.T.contiguous(), cut.T.contiguous(), truncated.T.contiguous(),
            gamma=cfg.gamma, lambda_=cfg.gae_lambda, bootstrap_values=bootstrap.T.contiguous()).T
        advantage = advantage * buf["valid"]
        return advantage, advantage + value

    def optimise(self, buf: dict[str, torch.Tensor], advantage: torch.Tensor,
                 returns: torch.Tensor) -> dict[str, float]:
        """``epochs`` x ``minibatches`` clipped PPO steps over a rollout's
        buffers (`Rollout.buf`, [T, E, ...]), every loss a mean over the
        valid slots only, the actor's and the critic's gradients clipped
        apart to ``max_grad_norm``; then the feature statistics take in the
        rollout's valid features. Returns the `UPDATE_FIELDS`: the mean
        `LOSS_FIELDS`, the mean gradient norms (before clipping), the
        explained variance of the values and the policy's standard
        deviations."""
        cfg, policy, group = self.config, self.policy, self.group
        n = cfg.steps * cfg.worlds
        flat = {k: buf[k].reshape(n, *buf[k].shape[2:]) for k in ("x", "u", "logp", "value", "valid")}
        mask = flat["valid"]
        adv, ret = normalised_advantages(advantage.reshape(n), mask, group), returns.reshape(n)
        stats = torch.zeros(len(LOSS_FIELDS) + 2, device=self.device)
        actor, critic = policy.actor_parameters(), list(policy.critic.parameters())
        for _ in range(cfg.epochs):
            parts = self._minibatches()
            counts = group.sum(torch.stack([mask[i].sum() for i in parts]))  # valid slots of each whole minibatch
            for i, count in zip(parts, counts):
                loss, losses = ppo_losses(policy, cfg, flat["x"][i], flat["u"][i], flat["logp"][i], adv[i],
                                          ret[i], mask[i], count)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self._sum_gradients()
                norms = torch.stack([nn.utils.clip_grad_norm_(actor, cfg.max_grad_norm),
                                     nn.utils.clip_grad_norm_(critic, cfg.max_grad_norm)])
                self.optimizer.step()
                stats += torch.cat([losses, norms.detach()])
        stats /= cfg.epochs * cfg.minibatches
        group.sum(stats[:len(LOSS_FIELDS)])  # each process's part of the minibatches' means
        error = (ret - flat["value"]) * mask
        count, total, wrong = group.sum(torch.stack([mask.sum(), (ret * mask).sum(), error.sum()]))
        count = count.clamp(min=1.0)
        spread, unexplained = group.sum(torch.stack([(((ret - total / count) * mask) ** 2).sum(),
                                                     ((error - wrong / count) ** 2 * mask).sum()])) / count
        explained = 1.0 - unexplained / spread.clamp(min=1e-12)
        policy.normalizer.update(flat["x"], mask, group)
        read = torch.cat([stats, explained[None], policy.log_std.detach().exp()]).tolist()
        return dict(zip(UPDATE_FIELDS, read))

    def _minibatches(self) -> list[torch.Tensor]:
        """This process's slots (flat indices into its [T x E] rollout) of
        each of an epoch's ``minibatches``: one random permutation of the
        whole batch's slots (as one process of all the worlds would draw
        it) cut into equal parts, each process keeping its own slots."""
        cfg, group = self.config, self.group
        whole = cfg.steps * cfg.worlds * group.size
        order = torch.randperm(whole, generator=self.generator, device=self.device)
        size = whole // cfg.minibatches
        if group.size > 1:
            t, world = order // (cfg.worlds * group.size), order % (cfg.worlds * group.size)
            mine = world // cfg.worlds == group.rank
            order = t * cfg.worlds + world % cfg.worlds
        cut = [order[k * size:(k + 1) * size] for k in range(cfg.minibatches)]
        return cut if group.size == 1 else [part[mine[k * size:(k + 1) * size]] for k, part in enumerate(cut)]

    def _sum_gradients(self) -> None:
        """Sum the gradients over the processes (each process's loss is its
        part of the whole minibatch's mean), in one all-reduce."""
        if self.group.size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.policy.parameters()]
        flat = self.group.sum(torch.cat([g.reshape(-1) for g in grads]))
        for p, part in zip(self.policy.parameters(), flat.split([g.numel() for g in grads])):
            p.grad = part.view_as(p)

    def guard(self, rollout: Rollout, advantage: torch.Tensor, returns: torch.Tensor, losses: dict[str, float],
              reward_bounds: tuple[float, float], acted: torch.Tensor | None, update: int, last_good: str) -> None:
        """Check update ``update`` (1-based) just computed, causes before
        effects: the parameters that acted in the rollout (``acted``:
        `acting_parameters`, taken before the update; bad ones make bad
        actions, which the features carry as the previous action), the
        rollout's features, rewards (within ``reward_bounds``), values,
        advantages and returns, the ``losses``, then the updated parameters
        (bad data or a bad loss makes them bad); the first bad field is
        named. One small read of the device (`racing_stack.guard`).

        Raises:
            GuardError: naming the update, the first bad field and its worst
                value, and ``last_good`` (what a stopped run resumes from).
        """
        buf = rollout.buf
        low, high = reward_bounds
        # The wrapper computes in float32: its rounding may pass an exact bound by an ulp or two.
        low, high = low - 1e-5 * max(1.0, abs(low)), high + 1e-5 * max(1.0, abs(high))
        fields = [Violation("observation feature", buf["x"]), Violation("reward", buf["reward"], low, high),
                  Violation("value", [buf["value"], rollout.last_value]), Violation("advantage", advantage),
                  Violation("return", returns)]
        updated = self.parameters("updated parameter")
        read = violations([*fields, updated])
        if acted is not None:
            fields, read = [self.parameters("acting parameter"), *fields], torch.cat([acted, read])
        rows = first_worst(self.group.gather(read)).tolist()  # the one host read
        rows[-1:-1] = [[0.0 if math.isfinite(v) else 1.0, v] for v in losses.values()]
        fields += [Violation(name, torch.zeros(1)) for name in losses] + [updated]
        check(fields, rows, update, last_good, self.group.size)

    def parameters(self, name: str) -> Violation:
        """The guard's field of the policy's parameters and feature statistics, called ``name``."""
        return Violation(name, [*self.policy.parameters(), *self.policy.normalizer.buffers()])

    def acting_parameters(self) -> torch.Tensor:
        """`racing_stack.guard.violations` of the parameters now (on the device, no wait)."""
        return violations([self.parameters("acting parameter")])


def crash_weight(config: PPOConfig, clock: int) -> float:
    """The share of the crash and slide costs a rollout pays after
    ``clock`` counted updates (`PPOConfig.warms_up`): it rises linearly
    from 0 to 1 over ``config.crash_warmup_updates`` (1 without a warm-up)."""
    warmup = config.crash_warmup_updates
    return min(1.0, clock / warmup) if warmup else 1.0


def first_worst(reads: torch.Tensor) -> torch.Tensor:
    """The guard's `violations` rows [F, 2] of all processes ([P, F, 2]):
    the counts summed, the worst value of the first process with one."""
    counts = reads[..., 0]
    first = (counts > 0).int().argmax(0)
    return torch.stack([counts.sum(0), reads[first, torch.arange(reads.shape[1], device=reads.device), 1]], 1)
