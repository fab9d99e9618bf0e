"""PPO's update of one policy, apart from the run around it (the role of
rsl_rl's ``algorithms/ppo.py`` and Brax's ``agents/ppo/train.py`` around
its ``losses.py``): advantages by `rl_triton.compute_gae`, then
``epochs`` x ``minibatches`` clipped steps (`racing_stack.ppo.losses`),
the actor's and the critic's gradients clipped apart, summed over the
processes of a `Group`; the guard's reads of what an update computed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

import rl_triton
from racing_stack.guard import Violation, check, violations
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.losses import LOSS_FIELDS, explained_variance, normalised_advantages, ppo_losses
from racing_stack.ppo.networks import ActorCritic
from racing_stack.ppo.captured import CapturedUpdate
from racing_stack.ppo.graphs import captured
from racing_stack.ppo.rollout import returns_bootstrapped, returns_cut

__all__ = ["UPDATE_FIELDS", "CapturedUpdate", "PPOUpdate", "advantages", "compiled_losses", "crash_weight",
           "first_worst", "matmul_precision", "read"]

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
        self._captured: CapturedUpdate | None = None
        self._losses = compiled_losses() if config.compiled else ppo_losses
        self._acting = copy.deepcopy(self.policy) if config.policy_lag else None
        #: On CUDA, the event `follow` last recorded.
        self.followed: torch.cuda.Event | None = None

    @property
    def acting(self) -> ActorCritic:
        """The policy that drives the rollouts: `policy`, or with
        ``config.policy_lag`` a copy of it as `follow` last took it."""
        return self.policy if self._acting is None else self._acting

    def follow(self) -> None:
        """Copy `policy` into `acting` (in place: a captured rollout reads
        its tensors) and, on CUDA, record `followed` on the current stream
        after the copy: a rollout that waits for that event, not for the
        stream, runs beside an update launched after it."""
        self._acting.load_state_dict(self.policy.state_dict())
        if self.device.type == "cuda":
            self.followed = torch.cuda.Event()
            self.followed.record(torch.cuda.current_stream(self.device))

    def new_policy(self) -> ActorCritic:
        """A freshly initialised actor-critic for the config and the action bounds, on the device."""
        cfg = self.config
        return ActorCritic(cfg.features.size, cfg.hidden, cfg.init_log_std, self.low, self.high,
                           cfg.residual).to(self.device)

    def new_optimizer(self, policy: ActorCritic) -> torch.optim.Adam:
        """Adam over ``policy``'s parameters; on CUDA its fused kernel (one
        launch a step instead of several per parameter tensor; `adopt`)."""
        optimizer = torch.optim.Adam(policy.parameters(), lr=self.config.learning_rate, eps=1e-5,
                                     fused=self.device.type == "cuda")
        self.adopt(optimizer)
        return optimizer

    def adopt(self, optimizer: torch.optim.Adam) -> None:
        """Fit a new or loaded ``optimizer`` to this device: on CUDA the fused
        kernel (a checkpoint written on the CPU holds unfused settings), its
        step counts float32 on the device (where the fused kernel keeps
        them) and its step size a float32 tensor there (`set_learning_rate`
        writes it in place, a `CapturedUpdate` reads it); not capturable
        (a `CapturedUpdate` makes it so for its capture: an eager step of a
        capturable optimizer draws Torch's warning)."""
        if self.device.type != "cuda":
            return
        for group in optimizer.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=self.device)
            group["fused"], group["capturable"] = True, False
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].to(self.device, torch.float32)

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state dict, its step size a number (as a checkpoint keeps it)."""
        state = self.optimizer.state_dict()
        state["param_groups"] = [{**g, "lr": float(g["lr"])} for g in state["param_groups"]]
        return state

    def set_learning_rate(self, rate: float) -> None:
        """The step size of the optimizer's next steps."""
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(rate)
            else:
                group["lr"] = rate

    def optimise(self, buf: dict[str, torch.Tensor], advantage: torch.Tensor,
                 returns: torch.Tensor) -> dict[str, float]:
        """`launch` and `read` in one."""
        return read(self.launch(buf, advantage, returns))

    def launch(self, buf: dict[str, torch.Tensor], advantage: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
        """``epochs`` x ``minibatches`` clipped PPO steps over a rollout's
        buffers (`Rollout.batch`, [T, E, ...]), every loss a mean over the
        valid slots only, the actor's and the critic's gradients clipped
        apart to ``max_grad_norm``; then the feature statistics take in the
        rollout's valid features; launched, not waited for (no host read).
        Returns float32 [len(`UPDATE_FIELDS`)] on the device (`read`): the
        mean `LOSS_FIELDS`, the mean gradient norms (before clipping), the
        explained variance of the values and the policy's standard
        deviations.

        On the ``"graph"`` path (`graphed`), once the optimizer holds its
        moments (after the first update), the whole optimisation replays
        one `CapturedUpdate`: one launch where the eager path launches some
        200 kernels a minibatch and the optimizer's step after each.
        """
        cfg = self.config
        n = cfg.steps * cfg.worlds
        flat = {k: buf[k].reshape(n, *buf[k].shape[2:]) for k in ("x", "u", "logp", "value", "valid")}
        parts = [self._minibatches() for _ in range(cfg.epochs)]
        with matmul_precision(cfg.matmul_precision, self.device):
            whole = self.graphed and all(p in self.optimizer.state for p in self.policy.parameters())
            if whole:
                return self._capture(flat).replay(advantage.reshape(n), returns.reshape(n), parts)
            return self.steps(flat, advantage.reshape(n), returns.reshape(n), parts)

    def steps(self, flat: dict[str, torch.Tensor], advantage: torch.Tensor, returns: torch.Tensor,
              parts: list[list[torch.Tensor]]) -> torch.Tensor:
        """The arithmetic of `launch` (what a `CapturedUpdate` captures):
        the rollout's ``flat`` buffers [N, ...], its ``advantage`` and
        ``returns`` [N], and each epoch's minibatches' rows ``parts``
        (`_minibatches`). No host read, no allocation kept between calls."""
        cfg, policy, group, optimizer = self.config, self.policy, self.group, self.optimizer
        mask = flat["valid"]
        adv = normalised_advantages(advantage, mask, group)
        stats = torch.zeros(len(LOSS_FIELDS) + 2, device=self.device)
        proximal = self.proximal_log_probs(flat) if cfg.policy_lag else None
        for epoch in parts:
            counts = group.sum(torch.stack([mask[i].sum() for i in epoch]))  # valid slots of each whole minibatch
            for i, count in zip(epoch, counts):
                optimizer.zero_grad(set_to_none=False)  # a captured update adds into the same gradients
                stats += self.gradients(flat["x"][i], flat["u"][i], flat["logp"][i], adv[i], returns[i], mask[i],
                                        count, None if proximal is None else proximal[i])
                optimizer.step()
        stats /= cfg.epochs * cfg.minibatches
        group.sum(stats[:len(LOSS_FIELDS)])  # each process's part of the minibatches' means
        explained = explained_variance(returns, flat["value"], mask, group)
        policy.normalizer.update(flat["x"], mask, group)
        return torch.cat([stats, explained[None], policy.log_std.detach().exp()])

    def proximal_log_probs(self, flat: dict[str, torch.Tensor]) -> torch.Tensor:
        """The log-probabilities [N] of the rollout's actions ``flat["u"]``
        under the policy as the update starts (the proximal policy of the
        decoupled loss, `racing_stack.ppo.losses.ppo_losses`), no gradient."""
        with torch.no_grad():
            return self.policy.distribution(flat["x"]).log_prob(flat["u"]).sum(-1)

    @property
    def graphed(self) -> bool:
        """Whether the optimisation replays a `CapturedUpdate`: ``config.update_path`` is
        ``"graph"``, on a CUDA device, in a process training alone (else the eager path)."""
        return captured(self.config, self.device, self.group)

    def gradients(self, x: torch.Tensor, u: torch.Tensor, logp: torch.Tensor, advantage: torch.Tensor,
                  returns: torch.Tensor, mask: torch.Tensor, count: torch.Tensor,
                  proximal_logp: torch.Tensor | None = None) -> torch.Tensor:
        """One minibatch's clipped PPO loss (`ppo_losses`; rows as there),
        its gradients added to the parameters' (summed over the processes)
        and clipped, the actor's and the critic's apart, to
        ``max_grad_norm``. Returns float32 [7]: the detached `LOSS_FIELDS`
        and the two gradient norms before clipping. No host read."""
        cfg, policy = self.config, self.policy
        loss, losses = self._losses(policy, cfg, x, u, logp, advantage, returns, mask, count, proximal_logp)
        loss.backward()
        self.group.sum_gradients(list(policy.parameters()))
        actor = nn.utils.clip_grad_norm_(policy.actor_parameters(), cfg.max_grad_norm)
        critic = nn.utils.clip_grad_norm_(list(policy.critic.parameters()), cfg.max_grad_norm)
        return torch.cat([losses, torch.stack([actor, critic]).detach()])

    def _capture(self, flat: dict[str, torch.Tensor]) -> CapturedUpdate:
        """This update's `CapturedUpdate`, captured anew when the policy, its optimizer or the buffers changed."""
        update = self._captured
        if update is None or not update.fits(self, flat):
            self._captured = None  # its memory pool goes before the next capture takes one
            update = self._captured = CapturedUpdate(self, flat)
        return update

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

    def guard(self, batch: dict[str, torch.Tensor], advantage: torch.Tensor, returns: torch.Tensor,
              losses: dict[str, float], reward_bounds: tuple[float, float], acted: torch.Tensor | None,
              update: int, last_good: str, checked: torch.Tensor | None = None) -> None:
        """Check update ``update`` (1-based) just computed, causes before
        effects: the parameters that acted in the rollout (``acted``:
        `acting_parameters`, taken before the update; bad ones make bad
        actions, which the features carry as the previous action), the
        rollout's (``batch``: `Rollout.batch`) features, rewards (within ``reward_bounds``), values,
        advantages and returns, the ``losses``, then the updated parameters
        (bad data or a bad loss makes them bad); the first bad field is
        named. One small read of the device (`racing_stack.guard`):
        ``checked``, `checks` of the same arguments taken earlier (before
        the next rollout writes the buffers again), or None: taken now; the
        updated parameters are always read now.

        Raises:
            GuardError: naming the update, the first bad field and its worst
                value, and ``last_good`` (what a stopped run resumes from).
        """
        fields, updated = self._guarded(batch, advantage, returns, reward_bounds)
        if checked is None:
            checked = self.checks(batch, advantage, returns, reward_bounds, acted)
        if acted is not None:
            fields = [self.parameters("acting parameter"), *fields]
        rows = torch.cat([checked, first_worst(self.group.gather(violations([updated])))]).tolist()  # the one read
        rows[-1:-1] = [[0.0 if math.isfinite(v) else 1.0, v] for v in losses.values()]
        fields += [Violation(name, torch.zeros(1)) for name in losses] + [updated]
        check(fields, rows, update, last_good, self.group.size)

    def checks(self, batch: dict[str, torch.Tensor], advantage: torch.Tensor, returns: torch.Tensor,
               reward_bounds: tuple[float, float], acted: torch.Tensor | None) -> torch.Tensor:
        """The device's part of `guard` (its arguments'): the violations of
        every field but the losses and the updated parameters, every
        process's first worst [F, 2]; on the device, no wait."""
        read = violations(self._guarded(batch, advantage, returns, reward_bounds)[0])
        if acted is not None:
            read = torch.cat([acted, read])
        return first_worst(self.group.gather(read))

    def _guarded(self, batch: dict[str, torch.Tensor], advantage: torch.Tensor, returns: torch.Tensor,
                 reward_bounds: tuple[float, float]) -> tuple[list[Violation], Violation]:
        """The guard's fields of the rollout and the update, and the updated parameters'."""
        low, high = reward_bounds
        # The wrapper computes in float32: its rounding may pass an exact bound by an ulp or two.
        low, high = low - 1e-5 * max(1.0, abs(low)), high + 1e-5 * max(1.0, abs(high))
        fields = [Violation("observation feature", batch["x"]), Violation("reward", batch["reward"], low, high),
                  Violation("value", [batch["value"], batch["last_value"]]), Violation("advantage", advantage),
                  Violation("return", returns)]
        return fields, self.parameters("updated parameter")

    def parameters(self, name: str, policy: ActorCritic | None = None) -> Violation:
        """The guard's field of the parameters and feature statistics of ``policy`` (default: the
        learner's), called ``name``."""
        policy = self.policy if policy is None else policy
        return Violation(name, [*policy.parameters(), *policy.normalizer.buffers()])

    def acting_parameters(self, policy: ActorCritic | None = None) -> torch.Tensor:
        """`racing_stack.guard.violations` of the parameters of ``policy`` (default: the learner's)
        now (on the device, no wait)."""
        return violations([self.parameters("acting parameter", policy)])


def advantages(batch: dict[str, torch.Tensor], config: PPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), [T, E], of a rollout's ``batch``
    (`Rollout.batch`): GAE by rl_triton (``config.gamma``,
    ``config.gae_lambda``), cut where a return ends
    (`racing_stack.ppo.rollout.returns_cut`), bootstrapped where it is
    truncated (`racing_stack.ppo.rollout.returns_bootstrapped`) from V
    of the next slot's input (the terminal observation); the last slot
    from V of the observation after the rollout. Reset and held slots
    carry nothing."""
    value = batch["value"]
    cut, truncated = returns_cut(batch), returns_bootstrapped(batch)
    next_value = torch.cat([value[1:], batch["last_value"][None]], dim=0)
    bootstrap = torch.where(truncated, next_value, torch.zeros_like(next_value))
    bootstrap[-1] = torch.where(cut[-1], 0.0, next_value[-1])
    advantage = rl_triton.compute_gae(
        batch["reward"].T.contiguous(), value.T.contiguous(), cut.T.contiguous(), truncated.T.contiguous(),
        gamma=config.gamma, lambda_=config.gae_lambda, bootstrap_values=bootstrap.T.contiguous()).T
    advantage = advantage * batch["valid"]
    return advantage, advantage + value


@functools.cache
def compiled_losses() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """`racing_stack.ppo.losses.ppo_losses` through ``torch.compile``
    (`PPOConfig.compiled`; one wrapper a process, compiled at its first
    call for each config and device, as Torch's guards decide). Shapes
    are Torch's automatic choice: static while a run's minibatches keep
    one size (one process), and made dynamic at the first other size
    (each process's share of a minibatch under ``torchrun``) rather than
    compiled again for each."""
    return torch.compile(ppo_losses)


@contextlib.contextmanager
def matmul_precision(precision: str, device: torch.device | str = "cpu") -> Iterator[None]:
    """The policy's matmuls on ``device`` at ``precision`` inside
    (`PPOConfig.matmul_precision`): Torch's float32 matmul precision
    ``"highest"`` or ``"high"`` (`torch.set_float32_matmul_precision`,
    back to what it was after), or ``"bf16"``: ``"high"`` under Torch's
    autocast to bfloat16 (its cache off, as a CUDA graph capture needs)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if precision == "bf16" else precision)
    try:
        with torch.autocast(torch.device(device).type, torch.bfloat16, enabled=precision == "bf16",
                            cache_enabled=False):
            yield
    finally:
        torch.set_float32_matmul_precision(before)


def read(stats: torch.Tensor) -> dict[str, float]:
    """An update's statistics (`PPOUpdate.launch`) read to the host: {`UPDATE_FIELDS`: value}."""
    return dict(zip(UPDATE_FIELDS, stats.tolist()))


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
