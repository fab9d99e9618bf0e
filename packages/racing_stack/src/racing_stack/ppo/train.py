"""PPO's train loop on one device: the env in JAX, the policy in Torch,
advantages from rl_triton, nothing through the host.

One update: a rollout of ``steps`` calls of every world
(`racing_stack.ppo.rollout`), GAE by `rl_triton.compute_gae` (returns cut
at crashes and training endings, bootstrapped at timeouts and completed
laps), ``epochs`` x ``minibatches`` clipped policy and value steps
(`racing_stack.ppo.losses`, the actor's and the critic's gradients
clipped apart), the feature statistics updated, and the step size set for
the next update by its schedule. Every ``validate_every`` updates (and at
the last update) the policy's mean action drives the first
``validation_tracks`` Validation tracks on the device, with early exit
(`racing_stack.ppo.validation`); the best policy so far (among those that
reach ``select_success_rate``, the faster median lap; below it, the most
laps, then the faster lap) is the one exported.

Every update appends a row to ``DIR/log.csv`` and to TensorBoard event
files (``DIR/tensorboard``), and prints a progress line. ``DIR/checkpoint.pt``
(written every ``checkpoint_every`` updates and at the end) holds the
policy (with its feature statistics), the optimizer, the step size, the
random generator, the rollout's state and the env's snapshot: ``--resume``
continues the same curve, bitwise on the CPU. At the end the best
validated policy (the last one without validation) is exported as a
controller plugin (``DIR/plugin``), the learning curve drawn
(``DIR/learning_curve.png``) and one episode of the plugin recorded
(``DIR/policy.gif``). Importing this module stops JAX from preallocating
the GPU (`racing_stack.interop.share_gpu`), so that Torch has room.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import torch
from torch import nn

import rl_triton
from racing_stack import checkpoints
from racing_stack.guard import GuardError, Violation, check, violations
from racing_stack.interop import Handover, share_gpu
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.logs import LOG_FIELDS, NOT_VALIDATED, add_events, draw_curve, log_rows, tensorboard, write_log
from racing_stack.ppo.losses import LOSS_FIELDS, adapted_learning_rate, normalised_advantages, ppo_losses
from racing_stack.ppo.networks import ActorCritic
from racing_stack.ppo.rollout import Rollout
from racing_stack.ppo.validation import VALIDATION_FIELDS, result_row, validate

# JAX and Torch train on one GPU: JAX must not take most of it up front.
share_gpu()

__all__ = ["RUN_FILES", "GuardError", "RunExists", "Trainer", "finish", "make_env", "make_validation_env",
           "resume_problem", "whole_config"]

#: What a run writes into its folder; a folder holding any of them holds a run.
RUN_FILES = ("checkpoint.pt", "log.csv", "tensorboard", "plugin", "learning_curve.png", "policy.gif")
#: The fields of a checkpoint.
CHECKPOINT_FIELDS = {"config", "update", "policy", "best", "optimizer", "learning_rate", "crash_clock", "generator",
                     "rollout", "env", "obs"}


class RunExists(FileExistsError):
    """A run folder already holds a run, and neither resuming nor replacing it was asked for."""


class Trainer:
    """PPO on one env: `run` trains ``config.updates`` updates, logging,
    checkpointing and (with ``resume``) continuing from ``out/checkpoint.pt``.

    Every crossing between JAX and Torch goes through ``crossing`` (a
    `racing_stack.interop.Handover`: zero-copy, each buffer held until the
    device has read it; a `racing_stack.interop.HostCopy` is the slow
    reference). Every update is guarded (`racing_stack.guard`): features,
    values, advantages, returns, losses and parameters finite, rewards
    within `racing_stack.wrappers.ShapedReward.bounds`; a violation raises
    `GuardError` before anything of that update is logged or saved.

    Args:
        config: the run's settings.
        env: a `racing_env.VecCarRacingEnv` of ``config.worlds`` worlds
            (``mjx_warp``; JAX and Torch see the same device).
        out: the run's folder (created).
        progress: called with each update's log row (default: a progress line on stderr).
        validation: the validation env (`make_validation_env`:
            ``config.validation_tracks`` worlds on the Validation split's
            first 2 x ``config.validation_tracks`` rows); None: no
            validation, whatever ``config.validate_every`` says. The lead
            process's only.
        group: the processes training this policy together, one per GPU
            (`racing_stack.ppo.distributed.Group`; default: the current
            `torch.distributed` group, or this process alone). Each drives
            its share of the batch (``env``: `make_env(config, group)`),
            their sums are all-reduced so that an update is the update of
            one process over all their worlds, and the lead process (rank 0)
            alone validates, logs and writes checkpoints, which hold every
            process's worlds.
    """

    def __init__(self, config: PPOConfig, env, out: Path, progress: Callable[[dict], None] | None = None,
                 validation=None, group: Group | None = None) -> None:
        group = Group.current() if group is None else group
        if env.num_envs != config.worlds:
            raise ValueError(f"env has {env.num_envs} worlds, config.worlds is {config.worlds}")
        if env.first_world != group.first_world(config.worlds):
            raise ValueError(f"env's first_world is {env.first_world}; process {group.rank} of {group.size} drives "
                             f"the worlds from {group.first_world(config.worlds)} (make_env(config, group))")
        if validation is not None and not group.lead:
            raise ValueError(f"validation: only the lead process validates; process {group.rank} was given an env")
        #: The processes training this policy together (`racing_stack.ppo.distributed.Group`).
        self.group = group
        if validation is not None and validation.num_envs != config.validation_tracks:
            raise ValueError(f"validation env has {validation.num_envs} worlds, config.validation_tracks is "
                             f"{config.validation_tracks}")
        self.validation = validation
        #: The best validated policy: {"update", its `validate` result, "policy": a state dict}; None before one.
        self.best: dict[str, Any] | None = None
        self.config = config
        self.env = env
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = progress or self._print
        self.device = torch.device("cuda", 0) if jax.default_backend() == "gpu" else torch.device("cpu")
        torch.manual_seed(config.seed)
        self.policy = self._new_policy()
        self.optimizer = self._new_optimizer(self.policy)
        #: The step size of the next update.
        self.rate = config.learning_rate
        self.generator = torch.Generator(self.device)
        self.generator.manual_seed(config.seed)
        self.update = 0
        #: The updates counted towards the crash cost's warm-up (`PPOConfig.warms_up`).
        self.crash_clock = 0
        #: The update of the checkpoint last written or loaded (None: none yet).
        self.saved_update: int | None = None
        self.reward_bounds = config.reward.bounds(float(np.max(np.asarray(env.track_pool.track_length))))
        self.rollout = Rollout(config, env, self.device, Handover(self.device), self.generator, group)
        self.buf = self.rollout.buf
        #: Wall time (s) this Trainer spent validating and checkpointing, and how often.
        self.overhead = {"validation_s": 0.0, "validations": 0, "checkpoint_s": 0.0, "checkpoints": 0}

    @property
    def crossing(self) -> Handover:
        """The crossing every rollout and validation goes through (settable:
        `racing_stack.integrity` swaps in checked or host-copy ones)."""
        return self.rollout.crossing

    @crossing.setter
    def crossing(self, value: Handover) -> None:
        self.rollout.crossing = value

    # -- one update ------------------------------------------------------------

    def collect(self) -> None:
        """One rollout into the buffers (`racing_stack.ppo.rollout.Rollout.collect`),
        paying the crash and slide costs' share of `crash_weight`."""
        self.rollout.collect(self.policy, self.generator, self.crash_weight())

    def crash_weight(self) -> float:
        """The share of the crash and slide costs the next rollout pays: it rises
        linearly from 0 to 1 over ``config.crash_warmup_updates`` counted
        updates (`crash_clock`; 1 without a warm-up)."""
        warmup = self.config.crash_warmup_updates
        return min(1.0, self.crash_clock / warmup) if warmup else 1.0

    def advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns), [T, E]: GAE by rl_triton, cut where a
        return ends (`Rollout.returns_cut`), bootstrapped where it is
        truncated (`Rollout.returns_bootstrapped`) from V of the next slot's
        input (the terminal observation); the last slot from V of the
        observation after the rollout."""
        buf, cfg, rollout = self.buf, self.config, self.rollout
        value = buf["value"]
        cut, truncated = rollout.returns_cut(), rollout.returns_bootstrapped()
        next_value = torch.cat([value[1:], rollout.last_value[None]], dim=0)
        bootstrap = torch.where(truncated, next_value, torch.zeros_like(next_value))
        bootstrap[-1] = torch.where(cut[-1], 0.0, next_value[-1])
        advantage = rl_triton.compute_gae(
            buf["reward"].T.contiguous(), value.T.contiguous(), cut.T.contiguous(), truncated.T.contiguous(),
            gamma=cfg.gamma, lambda_=cfg.gae_lambda, bootstrap_values=bootstrap.T.contiguous()).T
        advantage = advantage * buf["valid"]  # reset and held slots carry nothing
        return advantage, advantage + value

    def optimise(self, advantage: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
        """``epochs`` x ``minibatches`` clipped PPO steps over the rollout,
        every loss a mean over the valid slots only, the actor's and the
        critic's gradients clipped apart to ``max_grad_norm``; then the
        feature statistics take in the rollout's valid features. Returns
        the mean `LOSS_FIELDS`, the explained variance of the values, the
        policy's standard deviations and the mean gradient norms (before
        clipping)."""
        cfg, buf, policy, group = self.config, self.buf, self.policy, self.group
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
        names = (*LOSS_FIELDS, "actor_grad_norm", "critic_grad_norm", "explained_variance", "std_steering",
                 "std_acceleration")
        return dict(zip(names, read))

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

    def guard(self, advantage: torch.Tensor, returns: torch.Tensor, losses: dict[str, float],
              acted: torch.Tensor | None = None) -> None:
        """Check the update just computed (``self.update`` done before it),
        causes before effects: the parameters that acted in the rollout
        (``acted``: `acting_parameters`, taken before the update; bad ones
        make bad actions, which the features carry as the previous action),
        the rollout's features, rewards (within the reward wrapper's
        bounds), values, advantages and returns, the losses, then the
        updated parameters (bad data or a bad loss makes them bad); the
        first bad field is named. One small read of the device.

        Raises:
            GuardError: naming the update, the first bad field and its worst value.
        """
        buf = self.buf
        low, high = self.reward_bounds
        # The wrapper computes in float32: its rounding may pass an exact bound by an ulp or two.
        low, high = low - 1e-5 * max(1.0, abs(low)), high + 1e-5 * max(1.0, abs(high))
        fields = [Violation("observation feature", buf["x"]), Violation("reward", buf["reward"], low, high),
                  Violation("value", [buf["value"], self.rollout.last_value]), Violation("advantage", advantage),
                  Violation("return", returns)]
        updated = self._parameters("updated parameter")
        read = violations([*fields, updated])
        if acted is not None:
            fields, read = [self._parameters("acting parameter"), *fields], torch.cat([acted, read])
        rows = _first_worst(self.group.gather(read)).tolist()  # the one host read
        rows[-1:-1] = [[0.0 if math.isfinite(v) else 1.0, v] for v in losses.values()]
        fields += [Violation(name, torch.zeros(1)) for name in losses] + [updated]
        check(fields, rows, self.update + 1, self.last_checkpoint(), self.group.size)

    def acting_parameters(self) -> torch.Tensor:
        """`racing_stack.guard.violations` of the parameters now (on the device, no wait)."""
        return violations([self._parameters("acting parameter")])

    def _parameters(self, name: str) -> Violation:
        return Violation(name, [*self.policy.parameters(), *self.policy.normalizer.buffers()])

    def last_checkpoint(self) -> str:
        """What a stopped run can resume from, said for a message."""
        if self.saved_update is None:
            return "no checkpoint was written yet"
        return f"the last checkpoint, {self.out / 'checkpoint.pt'} (update {self.saved_update}), is whole"

    def episodes(self) -> dict[str, float]:
        """The rollout's ended episodes (`Rollout.episodes`)."""
        return self.rollout.episodes()

    def validate(self, early_exit: bool = True) -> dict[str, float]:
        """The current policy on the validation env's "select" rows (the
        Validation split's first ``validation_tracks``;
        `racing_stack.ppo.validation.validate`).

        Returns:
            The `VALIDATION_FIELDS` of the episodes.
        """
        env, cfg = self.validation, self.config
        if env is None:
            raise ValueError("no validation env: give the Trainer one (validation=make_validation_env(config))")
        rows = list(range(cfg.validation_tracks))
        start = time.perf_counter()
        result = result_row(validate(self.policy, env, cfg, self.crossing, rows, early_exit))
        self.overhead["validation_s"] += time.perf_counter() - start
        self.overhead["validations"] += 1
        return result

    def compile_validation(self) -> None:
        """Compile the validation env's calls (a reset and one early-exit
        step; nothing is kept), so that a validation inside a timed run
        costs its driving alone, like an update after the first."""
        if self.validation is None:
            raise ValueError("no validation env: give the Trainer one (validation=make_validation_env(config))")
        once = dataclasses.replace(self.config, validation_steps=1)
        validate(self.policy, self.validation, once, self.crossing, list(range(once.validation_tracks)), True)

    def best_policy(self) -> ActorCritic:
        """The best validated policy (a copy), or the current one when no
        validation ran."""
        if self.best is None:
            return self.policy
        policy = self._new_policy()
        policy.load_state_dict(self.best["policy"])
        return policy

    def _new_optimizer(self, policy: ActorCritic) -> torch.optim.Adam:
        """Adam over ``policy``'s parameters; on CUDA its fused kernel (one
        launch a step instead of several per parameter tensor)."""
        return torch.optim.Adam(policy.parameters(), lr=self.config.learning_rate, eps=1e-5,
                                fused=self.device.type == "cuda")

    def _new_policy(self) -> ActorCritic:
        """A freshly initialised actor-critic for the config and the env's action bounds, on the device."""
        space, cfg = self.env.single_action_space, self.config
        return ActorCritic(cfg.features.size, cfg.hidden, cfg.init_log_std, space.low, space.high,
                           cfg.residual).to(self.device)

    def validate_and_keep(self) -> dict[str, float]:
        """`validate`, keeping the policy if it is the best so far; returns
        the validation's result."""
        result = self.validate()
        self._keep_if_best(result)
        return result

    def _keep_if_best(self, result: dict[str, float]) -> None:
        """Keep the policy if ``result`` beats the best: a higher success
        rate up to ``config.select_success_rate`` (rates at or above it are
        equal), then a faster median lap (no lap: more progress)."""
        enough = self.config.select_success_rate

        def score(r: dict[str, Any]) -> tuple[float, float]:
            rate = r["validation_success_rate"]
            return min(rate, enough), -r["validation_median_lap_time_s"] if rate > 0 else r["validation_mean_progress"]

        if self.best is None or score(result) > score(self.best):
            state = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
            self.best = {"update": self.update, **result, "policy": state}

    # -- the run ---------------------------------------------------------------

    def run(self, resume: bool = False, seconds: float | None = None, overwrite: bool = False) -> list[dict[str, Any]]:
        """Train until ``config.updates``, or until the update (with its
        validation, if one was due) during which ``seconds`` of this call
        ran out (then checkpoint); returns this call's log rows. A run cut
        by ``seconds`` validates only where an uninterrupted one would, so
        that its resume continues the same curve and the same best policy
        (`validate_and_keep` validates the cut policy, if wanted).

        ``resume`` continues from ``out/checkpoint.pt``: ``log.csv`` is
        rewritten (atomically) with its rows up to the checkpoint and the
        TensorBoard events are rewritten from them, so neither loses nor
        repeats an update. Without ``resume``, a folder that holds a run is
        refused unless ``overwrite`` (which deletes that run first).

        Raises:
            RunExists: ``out`` holds a run, and neither ``resume`` nor ``overwrite``.
            FileNotFoundError: ``resume`` without a checkpoint.
            racing_stack.checkpoints.CorruptFile: the checkpoint is damaged.
            ValueError: the checkpoint belongs to another configuration.
            GuardError: an update's data failed the guard (nothing of it saved).
            OSError: a checkpoint or log write failed (the last checkpoint stays whole).
        """
        log_path, lead = self.out / "log.csv", self.group.lead
        if resume:
            self.load(self.out / "checkpoint.pt")
        elif lead:
            self._claim(overwrite)
        writer = None
        if lead:  # the lead process alone writes the run's files
            for name in ("checkpoint.pt", "log.csv"):
                checkpoints.remove_stale(self.out, name)
            kept = log_rows(log_path, self.update) if resume else []
            write_log(log_path, kept)
            writer = tensorboard(self.out / "tensorboard", kept)
        began = time.perf_counter()
        rows = []
        try:
            with open(log_path, "a", newline="") if lead else contextlib.nullcontext() as f:
                log = csv.DictWriter(f, LOG_FIELDS) if lead else None
                while self.update < self.config.updates:
                    row = self._one_update()
                    # Every process stops after the same update.
                    out_of_time = seconds is not None and self.group.any(time.perf_counter() - began >= seconds)
                    if lead:
                        log.writerow(row)
                        f.flush()
                        add_events(writer, row)
                        self.progress(row)
                    rows.append(row)
                    last = self.update == self.config.updates
                    if self.update % self.config.checkpoint_every == 0 or last or out_of_time:
                        if lead:
                            os.fsync(f.fileno())  # the log holds every row up to the checkpoint, power loss or not
                        self.save(self.out / "checkpoint.pt")
                    if out_of_time:
                        break
        finally:
            if writer is not None:
                writer.close()
        return rows

    def _one_update(self) -> dict[str, Any]:
        """One update (with its validation, when due), guarded; its log row."""
        start = time.perf_counter()
        rate, crash_weight = self.rate, self.crash_weight()
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        self.collect()
        acted = self.acting_parameters()
        advantage, returns = self.advantages()
        losses = self.optimise(advantage, returns)
        self.guard(advantage, returns, losses, acted)
        stats = self.episodes()
        self.rate = adapted_learning_rate(self.config, rate, losses["approx_kl"], self.update)
        self.crash_clock += int(self.config.warms_up(stats["success_rate"]))
        self.update += 1
        took = time.perf_counter() - start
        validated = dict(NOT_VALIDATED)
        every = self.config.validate_every
        if self.validation is not None and every and (self.update % every == 0
                                                      or self.update == self.config.updates):
            validated = self.validate_and_keep()
        n = self.config.steps * self.config.worlds * self.group.size
        return {"update": self.update, "transitions": self.update * n, "seconds": took,
                "transitions_per_s": n / took, **stats, **losses, "learning_rate": rate,
                "crash_weight": crash_weight, **validated}

    def _claim(self, overwrite: bool) -> None:
        """Make ``out`` this run's: refuse one that holds a run unless
        ``overwrite``, which deletes that run's files."""
        found = [name for name in RUN_FILES if (self.out / name).exists()]
        if found and not overwrite:
            raise RunExists(f"{self.out} already holds a run ({', '.join(found)}): resume it or overwrite it")
        for name in found:
            path = self.out / name
            # A link is removed, never what it points to (rmtree refuses a link to a folder).
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def state_dict(self) -> dict[str, Any]:
        """Everything the run's next update depends on (tensors and plain
        data): config, update, policy, optimizer, step size, the crash
        cost's warm-up clock, generator, the rollout's state, the env's
        snapshot and observation, the best validated policy."""
        worlds = {"rollout": self.rollout.state(),
                  "env": {k: torch.from_numpy(v) for k, v in self.env.snapshot().items()},
                  "obs": {k: torch.from_numpy(np.array(v)) for k, v in self.rollout.obs.items()}}
        if self.group.size > 1:  # exchanged as NumPy arrays (pickled tensors do not cross every backend)
            parts = self.group.objects({kind: {k: v.numpy() for k, v in fields.items()}
                                        for kind, fields in worlds.items()})
            worlds = _union([{kind: {k: torch.from_numpy(v) for k, v in fields.items()}
                              for kind, fields in part.items()} for part in parts])
        return {
            "config": whole_config(self.config, self.group).to_json(), "update": self.update,
            "policy": self.policy.state_dict(), "best": self.best, "optimizer": self.optimizer.state_dict(),
            "learning_rate": self.rate, "crash_clock": self.crash_clock, "generator": self.generator.get_state(),
            **worlds,
        }

    def save(self, path: Path) -> None:
        """Write `state_dict` to ``path`` atomically as a checked
        `racing_stack.checkpoints` file: a kill or a full disk leaves the
        previous checkpoint whole.

        Raises:
            OSError: the write failed; the previous checkpoint is unchanged.
        """
        start = time.perf_counter()
        state, failed = self.state_dict(), None  # every process's worlds, gathered
        if self.group.lead:
            try:
                checkpoints.save(path, "checkpoint", state)
            except OSError as error:
                failed = error
        if self.group.any(failed is not None):  # every process stops on a failed write
            raise failed or OSError(f"the lead process could not write {path}")
        self.saved_update = self.update
        self.overhead["checkpoint_s"] += time.perf_counter() - start
        self.overhead["checkpoints"] += 1

    def load(self, path: Path) -> None:
        """Continue from a checkpoint of a run with the same settings (only
        ``updates`` may grow; a linear step size then follows the new
        count: the next update's is ``learning_rate x (1 - done / updates)``).
        Everything is checked before anything changes.

        Raises:
            FileNotFoundError: no file at ``path``.
            racing_stack.checkpoints.CorruptFile: the file is damaged, of
                another kind, or holds fields that do not fit this run,
                naming the file and the field.
            ValueError: the checkpoint's settings differ, lack some (written
                before they existed) or had more updates, naming them.
        """
        # On the CPU: Adam's step counts stay there (on a GPU each would cost a host wait per step).
        state = checkpoints.load(path, "checkpoint", map_location="cpu")
        if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
            raise checkpoints.CorruptFile(f"{path} holds no run configuration")
        resume_problem(whole_config(self.config, self.group), state["config"], path)
        if self.group.size > 1:
            state = {**state, **{k: _share(state[k], self.group) for k in ("rollout", "env", "obs")}}
        refused: checkpoints.CorruptFile | None = None
        try:
            policy, optimizer, generator, best, obs, env = self._checked_state(state, path)
            self._check_snapshot(env, path)
        except checkpoints.CorruptFile as error:
            refused = error
        if self.group.any(refused is not None):  # each process checked its own share: all refuse, or none
            raise refused or checkpoints.CorruptFile(f"{path}: another process refused its share of the run")
        self.env.restore(env)
        self.policy, self.optimizer, self.generator, self.best = policy, optimizer, generator, best
        self.rollout.restore(state["rollout"], obs)
        self.update = self.saved_update = state["update"]
        self.crash_clock = state["crash_clock"]
        self.rate = state["learning_rate"]
        if self.config.schedule == "linear":
            self.rate = self.config.learning_rate * (1.0 - self.update / self.config.updates)

    def _check_snapshot(self, snapshot: dict[str, Any], path: Path) -> None:
        """Refuse, as a `CorruptFile` naming ``path``, an env snapshot that
        the env would not restore (`VecCarRacingEnv.check_snapshot`; nothing
        changes)."""
        try:
            self.env.check_snapshot(snapshot)
        except (ValueError, TypeError) as error:
            raise checkpoints.CorruptFile(f"{path}: its env snapshot cannot be restored here: {error}") from None

    def _checked_state(self, state: dict[str, Any], path: Path):
        """The policy, optimizer, generator and best policy of a checkpoint's
        ``state``, built apart from the trainer's, after checking every
        field against this run."""
        def bad(field: str, what: str) -> checkpoints.CorruptFile:
            return checkpoints.CorruptFile(f"{path}: its {field} {what}")

        if set(state) != CHECKPOINT_FIELDS:
            raise bad("fields", f"are {sorted(state)}, expected {sorted(CHECKPOINT_FIELDS)}")
        update = state["update"]
        if isinstance(update, bool) or not isinstance(update, int) or not 0 <= update <= self.config.updates:
            raise bad("update", f"is {update!r}, not an int in [0, {self.config.updates}]")
        rate = state["learning_rate"]
        if not isinstance(rate, float) or not 0.0 <= rate <= 1.0:  # a linear schedule ends at 0
            raise bad("learning rate", f"is {rate!r}, not a float in [0, 1]")
        clock = state["crash_clock"]
        if isinstance(clock, bool) or not isinstance(clock, int) or not 0 <= clock <= update:
            raise bad("crash clock", f"is {clock!r}, not an int in [0, {update}]")
        policy = self._loaded_policy(state["policy"], "policy", path)
        optimizer = self._new_optimizer(policy)
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (ValueError, KeyError, TypeError, RuntimeError) as error:
            raise bad("optimizer state", f"does not fit the policy: {error}") from None
        for group in optimizer.param_groups:
            numbers = [group.get("lr"), group.get("eps"), *group.get("betas", ())]
            if not all(isinstance(v, float) and math.isfinite(v) for v in numbers):
                raise bad("optimizer settings", f"are not finite numbers: {numbers}")
        for p in policy.parameters():
            moments = optimizer.state.get(p, {})
            if any(not isinstance(v, torch.Tensor) or (v.dim() and v.shape != p.shape) or not v.isfinite().all()
                   for v in moments.values()):
                raise bad("optimizer state", "has a moment of the wrong shape or a non-finite one")
        generator = torch.Generator(self.device)
        try:
            generator.set_state(state["generator"].cpu())
        except (RuntimeError, TypeError, AttributeError) as error:
            raise bad("generator state", f"is not one: {error}") from None
        problem = self.rollout.check_state(state["rollout"])
        if problem:
            raise bad("rollout state", problem)
        obs, env = _numpy_fields(state["obs"]), _numpy_fields(state["env"])
        if obs is None or set(obs) != set(self.rollout.obs) or any(
                obs[k].shape != tuple(v.shape) or obs[k].dtype != v.dtype for k, v in self.rollout.obs.items()):
            raise bad("observation", "does not match the env's fields, shapes and types")
        if env is None:
            raise bad("env snapshot", "is not a dict of tensors of NumPy types")
        best = state["best"]
        if best is not None:
            keys = {"update", "policy", *VALIDATION_FIELDS}
            if not isinstance(best, dict) or set(best) != keys:
                raise bad("best policy", f"is not a dict of {sorted(keys)}")
            if not all(isinstance(best[k], float) for k in VALIDATION_FIELDS):
                raise bad("best policy", "has a validation result that is not a number")
            if isinstance(best["update"], bool) or not isinstance(best["update"], int) or \
                    not 0 <= best["update"] <= update:
                raise bad("best policy", f"has the update {best['update']!r}, not an int in [0, {update}]")
            self._loaded_policy(best["policy"], "best policy", path)
        return policy, optimizer, generator, best, obs, env

    def _loaded_policy(self, weights: Any, field: str, path: Path) -> ActorCritic:
        """A new policy holding ``weights`` (checked by `ActorCritic.load_checked`)."""
        policy = self._new_policy()
        policy.load_checked(weights, f"{path}: its {field}")
        return policy

    def _print(self, row: dict[str, Any]) -> None:
        done = self.update / self.config.updates
        bar = "#" * int(30 * done) + "." * (30 - int(30 * done))
        validated = ""
        if math.isfinite(row["validation_success_rate"]):
            validated = f"  validation success {row['validation_success_rate']:.3f}"
        print(f"ppo [{bar}] {self.update}/{self.config.updates}  {row['transitions_per_s']:,.0f} transitions/s  "
              f"episodes {row['episodes']}  success {row['success_rate']:.2f}  "
              f"progress {row['mean_progress']:.3f}  margin endings {row['margin_endings']}{validated}",
              file=sys.stderr, flush=True)


def _numpy_fields(tree: Any) -> dict[str, np.ndarray] | None:
    """A checkpoint's dict of tensors as NumPy arrays; None when it is
    not one (or holds a type NumPy lacks, such as bfloat16)."""
    if not isinstance(tree, dict) or not all(isinstance(v, torch.Tensor) for v in tree.values()):
        return None
    try:
        return {k: v.cpu().numpy() for k, v in tree.items()}
    except TypeError:
        return None


def whole_config(config: PPOConfig, group: Group) -> PPOConfig:
    """The run as one process of all the worlds would see it (a
    checkpoint's settings): ``worlds`` is every process's together."""
    return dataclasses.replace(config, worlds=config.worlds * group.size)


def _union(parts: list[dict[str, dict[str, torch.Tensor]]]) -> dict[str, dict[str, torch.Tensor]]:
    """The processes' world states (rank order) as one process's of all
    their worlds: every field with an axis has a world axis first and is
    joined along it; a scalar (the env's root seed) is one value for all."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for kind, fields in parts[0].items():
        out[kind] = {}
        for name, value in fields.items():
            values = [part[kind][name] for part in parts]
            if value.dim():
                out[kind][name] = torch.cat(values)
            elif all(torch.equal(v, value) for v in values):
                out[kind][name] = value
            else:
                raise ValueError(f"the processes' {kind} field {name!r} differs: {[v.item() for v in values]}")
    return out


def _share(fields: Any, group: Group) -> Any:
    """This process's worlds of a checkpoint's world-state fields (as one
    process of all the worlds saved them); what is not a dict of
    tensors is left for the checks to refuse."""
    if not isinstance(fields, dict) or not all(isinstance(v, torch.Tensor) for v in fields.values()):
        return fields
    return {k: group.share(v) if v.dim() else v for k, v in fields.items()}


def _first_worst(reads: torch.Tensor) -> torch.Tensor:
    """The guard's `violations` rows [F, 2] of all processes ([P, F, 2]):
    the counts summed, the worst value of the first process with one."""
    counts = reads[..., 0]
    first = (counts > 0).int().argmax(0)
    return torch.stack([counts.sum(0), reads[first, torch.arange(reads.shape[1], device=reads.device), 1]], 1)


def resume_problem(config: PPOConfig, theirs: dict[str, Any], path: Path) -> None:
    """Refuse to continue the run of checkpoint ``path`` (its config as
    JSON) with ``config``: only ``updates`` may differ, and only grow.

    Raises:
        ValueError: naming the settings that are missing or differ, or the updates.
    """
    missing = sorted({f.name for f in dataclasses.fields(PPOConfig)} - set(theirs))
    if missing:
        raise ValueError(f"the checkpoint {path} was written by an older racing_stack: it lacks the settings "
                         f"{missing}; start a new run")
    try:
        their_config = PPOConfig.from_json(theirs)
    except (ValueError, TypeError, KeyError) as error:
        raise checkpoints.CorruptFile(f"{path}: its settings are not a valid configuration: {error}") from None
    differ = [f.name for f in dataclasses.fields(PPOConfig)
              if f.name != "updates" and getattr(their_config, f.name) != getattr(config, f.name)]
    if differ:
        raise ValueError(f"the checkpoint {path} was trained with other settings: {differ}")
    if config.updates < their_config.updates:
        raise ValueError(f"updates is {config.updates}, fewer than the {their_config.updates} of the run in {path}: "
                         f"a resumed run's updates may only grow (--updates {their_config.updates} continues it "
                         "to its end)")


def make_env(config: PPOConfig, group: Group | None = None):
    """The training env: ``config.worlds`` ``mjx_warp`` worlds on Level 1's
    Train pool (its first ``config.tracks`` rows, verified against the
    committed manifest), with ``config.max_episode_steps`` episodes; in a
    `Group` (default: the current one), this process's share of all the
    processes' worlds."""
    group = Group.current() if group is None else group
    return _level_env(config, "train", config.tracks, config.worlds, group.first_world(config.worlds))


def make_validation_env(config: PPOConfig, worlds: int | None = None):
    """The validation env: ``worlds`` (default ``config.validation_tracks``)
    ``mjx_warp`` worlds on Level 1's Validation split (its first 2 x
    ``worlds`` rows, at most the whole split; verified against the
    committed manifest), under Level 1 itself (its timeout: the episodes
    the Runner drives)."""
    from racing_env import LEVEL_1, ProjectConfig, VecCarRacingEnv

    from racing_stack.pools import SPLITS, materialize_prefix

    worlds = config.validation_tracks if worlds is None else worlds
    if worlds > SPLITS["validation"].size:
        raise ValueError(f"the Validation split has {SPLITS['validation'].size} tracks, fewer than {worlds} worlds")
    pool = materialize_prefix("validation", min(2 * worlds, SPLITS["validation"].size))
    return VecCarRacingEnv(worlds, config=ProjectConfig(), level=LEVEL_1, backend="mjx_warp", track_pool=pool)


def _level_env(config: PPOConfig, split: str, tracks: int | None, worlds: int, first_world: int):
    from racing_env import LEVEL_1, Level, ProjectConfig, VecCarRacingEnv

    from racing_stack.pools import materialize_prefix

    level = Level(level_id=LEVEL_1.level_id, name=f"ppo-{split}", max_episode_steps=config.max_episode_steps)
    pool = materialize_prefix(split, tracks)
    return VecCarRacingEnv(worlds, config=ProjectConfig(), level=level, backend="mjx_warp", track_pool=pool,
                           first_world=first_world)


def finish(trainer: Trainer, video_steps: int = 1500) -> dict[str, Path]:
    """After a run: the best validated policy's plugin (``out/plugin``), the learning curve
    (``out/learning_curve.png``) and one recorded episode of the plugin on
    Train row 0 (``out/policy.gif``, at most ``video_steps`` steps)."""
    from racing_env import LEVEL_1, Level, ProjectConfig, VecCarRacingEnv
    from racing_env.plugins import load_plugin
    from racing_env.render import EpisodeView
    from racing_env.runner import run

    from racing_stack.ppo.export import export_plugin

    out = trainer.out
    plugin = export_plugin(trainer.best_policy(), trainer.config, out / "plugin")
    draw_curve(out / "log.csv", out / "learning_curve.png")
    config = ProjectConfig()
    level = Level(level_id=LEVEL_1.level_id, name="ppo-video", max_episode_steps=video_steps)
    track = trainer.env.track_pool.track(0)
    env = VecCarRacingEnv(1, config=config, level=level, backend="cpu_reference", track=track)
    with EpisodeView(config.control_dt_s, record=out / "policy.gif", size=(480, 360)) as view:
        run(load_plugin(plugin), env, episodes=1, view=view)
    return {"plugin": plugin, "curve": out / "learning_curve.png", "video": out / "policy.gif"}

