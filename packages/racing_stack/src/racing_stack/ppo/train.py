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
continues the same curve, bitwise on the CPU. The update itself is
`racing_stack.ppo.algorithm`'s, the checkpoint's fields and checks
`racing_stack.ppo.checkpoint`'s; what a run leaves at its end (the
plugin, the curve, the video) is `racing_stack.ppo.cli.finish`'s.
Importing this module stops JAX from preallocating the GPU
(`racing_stack.interop.share_gpu`), so that Torch has room.
"""

from __future__ import annotations

import contextlib
import csv
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

from racing_env.moved import moved_names
from racing_stack.guard import GuardError
from racing_stack.interop import Handover, share_gpu
from racing_stack.ppo import checkpoint
from racing_stack.ppo.algorithm import PPOUpdate, advantages, crash_weight, matmul_precision, read
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.logs import LOG_FIELDS, NOT_VALIDATED, add_events, progress_line, start_log
from racing_stack.ppo.losses import adapted_learning_rate
from racing_stack.ppo.networks import ActorCritic
from racing_stack.ppo.rollout import Rollout, episodes
from racing_stack.ppo.validation import Selection

# JAX and Torch train on one GPU: JAX must not take most of it up front.
share_gpu()

__all__ = ["RUN_FILES", "GuardError", "RunExists", "Trainer", "claim", "collects_ahead"]

#: What a run writes into its folder; a folder holding any of them holds a run.
RUN_FILES = ("checkpoint.pt", "log.csv", "tensorboard", "plugin", "learning_curve.png", "policy.gif")


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
    within `racing_stack.reward.ShapedReward.bounds`; a violation raises
    `GuardError` before anything of that update is logged or saved.

    Args:
        config: the run's settings.
        env: a `racing_env.VecCarRacingEnv` of ``config.worlds`` worlds (``mjx_warp``; JAX and Torch see one device).
        out: the run's folder (created).
        progress: called with each update's log row (default: a progress line on stderr).
        validation: the validation env (`racing_stack.ppo.envs.make_validation_env`); None: no validation,
            whatever ``config.validate_every`` says. The lead process's only.
        group: the processes training this policy together, one per GPU (`racing_stack.ppo.distributed.Group`;
            default: the current `torch.distributed` group, or this process alone). Each drives its share of
            the batch (``env``: `make_env(config, group)`), their sums are all-reduced so that an update is the
            update of one process over all their worlds, and the lead process (rank 0) alone validates, logs
            and writes checkpoints, which hold every process's worlds.
    """

    def __init__(self, config: PPOConfig, env, out: Path, progress: Callable[[dict], None] | None = None,
                 validation=None, group: Group | None = None) -> None:
        group = Group.current() if group is None else group
        _check_envs(config, env, validation, group)
        #: The processes training this policy together (`racing_stack.ppo.distributed.Group`).
        self.group = group
        #: The validation env, the validations' cost and the best validated policy.
        self.selection = Selection(validation, config)
        self.config, self.env, self.out = config, env, Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.progress = progress or (lambda row: print(progress_line(row, config.updates), file=sys.stderr, flush=True))
        self.device = torch.device("cuda", 0) if jax.default_backend() == "gpu" else torch.device("cpu")
        space = env.single_action_space
        #: The policy, its optimizer and generator, and the update (`racing_stack.ppo.algorithm.PPOUpdate`).
        self.learner = PPOUpdate(config, space.low, space.high, self.device, group)
        #: The step size of the next update, the updates done, and those counted towards the crash
        #: cost's warm-up (`PPOConfig.warms_up`).
        self.rate, self.update, self.crash_clock = config.learning_rate, 0, 0
        #: The update of the checkpoint last written or loaded (None: none yet).
        self.saved_update: int | None = None
        self.reward_bounds = config.reward.bounds(float(np.max(np.asarray(env.track_pool.track_length))))
        self.rollout = Rollout(config, env, self.device, Handover(self.device), self.generator, group)
        self.buf = self.rollout.buf
        #: With ``config.policy_lag``, the crash clock the acting policy was copied with; whether the buffers
        #: hold the next update's rollout (collected during the last update); the crash weight the
        #: rollout in the buffers paid; whether the last update found `run`'s ``seconds`` spent; when
        #: (`time.perf_counter`) the collection of the rollout in the buffers began.
        self.acting_clock, self.ahead, self.weight, self.cut = 0, False, 0.0, False
        self._deadline, self._launched = None, 0.0
        #: Without a lag, in one process: whether the next rollout may be launched before the host reads
        #: an update's results (`collects_ahead`): the same numbers, no idle device between the two.
        self.pipelined = not config.policy_lag and group.size == 1
        #: Wall time (s) this Trainer spent checkpointing, and how often.
        self.checkpoints = {"checkpoint_s": 0.0, "checkpoints": 0}

    @property
    def overhead(self) -> dict[str, float]:
        """Wall time (s) this Trainer spent validating and checkpointing, and how often."""
        return {**self.selection.overhead, **self.checkpoints}

    @property
    def validation(self):
        """The validation env (None: no validation; `Selection.env`)."""
        return self.selection.env

    @property
    def best(self) -> dict[str, Any] | None:
        """The best validated policy: {"update", its `validate` result, "policy": a state dict}; None before one."""
        return self.selection.best

    @property
    def policy(self) -> ActorCritic:
        """The policy being trained (the learner's)."""
        return self.learner.policy

    @property
    def optimizer(self) -> torch.optim.Adam:
        """Its optimizer (the learner's)."""
        return self.learner.optimizer

    @property
    def generator(self) -> torch.Generator:
        """The generator of the rollouts' noise and holds and of the minibatches (the learner's)."""
        return self.learner.generator

    @property
    def crossing(self) -> Handover:
        """Every rollout's and validation's crossing (settable: `racing_stack.integrity` swaps in others)."""
        return self.rollout.crossing

    @crossing.setter
    def crossing(self, value: Handover) -> None:
        self.rollout.crossing = value

    def collect(self, after: torch.cuda.Event | None = None, weight: float | None = None) -> None:
        """One rollout of `PPOUpdate.acting` into the buffers (`racing_stack.ppo.rollout.Rollout.collect`,
        which says what ``after`` is), paying the crash and slide costs' share ``weight`` (None:
        `crash_weight`), at ``config.matmul_precision``."""
        weight = self.crash_weight() if weight is None else weight
        with matmul_precision(self.config.matmul_precision, self.device):
            self.rollout.collect(self.learner.acting, self.generator, weight, after)

    def crash_weight(self) -> float:
        """The share of the crash and slide costs the next rollout pays (`racing_stack.ppo.algorithm.crash_weight`
        of `crash_clock`, or with ``config.policy_lag`` of `acting_clock`)."""
        return crash_weight(self.config, self.acting_clock if self.config.policy_lag else self.crash_clock)

    def advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns), [T, E], of the last rollout (`racing_stack.ppo.algorithm.advantages`)."""
        return advantages(self.rollout.batch(), self.config)

    def optimise(self, advantage: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
        """The update's optimisation on the last rollout (`PPOUpdate.optimise`; with a lag on its kept copy)."""
        return self.learner.optimise(self.rollout.batch(keep=bool(self.config.policy_lag)), advantage, returns)

    def guard(self, advantage: torch.Tensor, returns: torch.Tensor, losses: dict[str, float],
              acted: torch.Tensor | None = None, batch: dict[str, torch.Tensor] | None = None,
              checked: torch.Tensor | None = None) -> None:
        """Check the update just computed on its rollout's ``batch`` (default: the last rollout's;
        `PPOUpdate.guard`, which says what ``checked`` is): ``acted`` is `acting_parameters`, taken before it.

        Raises:
            GuardError: naming the update, the first bad field and its worst value.
        """
        self.learner.guard(self.rollout.batch() if batch is None else batch, advantage, returns, losses,
                           self.reward_bounds, acted, self.update + 1, self.last_checkpoint(), checked)

    def acting_parameters(self) -> torch.Tensor:
        """`racing_stack.guard.violations` of `acting`'s parameters now (on the device, no wait)."""
        return self.learner.acting_parameters(self.learner.acting)

    def last_checkpoint(self) -> str:
        """What a stopped run can resume from, said for a message."""
        return ("no checkpoint was written yet" if self.saved_update is None else
                f"the last checkpoint, {self.out / 'checkpoint.pt'} (update {self.saved_update}), is whole")

    def episodes(self) -> dict[str, float]:
        """The last rollout's ended episodes (`racing_stack.ppo.rollout.episodes`)."""
        return episodes(self.rollout.batch(), self.group)

    def validate(self, early_exit: bool = True) -> dict[str, float]:
        """The current policy on the validation env's "select" rows (`Selection.validate`)."""
        return self.selection.validate(self.policy, self.crossing, early_exit)

    def compile_validation(self) -> None:
        """Compile the validation env's calls (`Selection.compile`)."""
        self.selection.compile(self.policy, self.crossing)

    def best_policy(self) -> ActorCritic:
        """The best validated policy (a copy), or the current one when no validation ran (`Selection.policy`)."""
        return self.selection.policy(self.policy, self.learner.new_policy)

    def validate_and_keep(self) -> dict[str, float]:
        """`validate`, keeping the policy if it is the best so far
        (`Selection.keep_if_best`); returns the validation's result."""
        result = self.validate()
        self.selection.keep_if_best(self.policy, self.update, result)
        return result

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
            claim(self.out, overwrite)
        # The lead process alone writes the run's files.
        writer = start_log(self.out, self.update if resume else 0) if lead else None
        self._deadline = None if seconds is None else time.perf_counter() + seconds
        rows = []
        try:
            with open(log_path, "a", newline="") if lead else contextlib.nullcontext() as f:
                log = csv.DictWriter(f, LOG_FIELDS) if lead else None
                while self.update < self.config.updates:
                    row = self._one_update()
                    out_of_time = self.cut
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
            self._deadline = None
            if writer is not None:
                writer.close()
        return rows

    def _one_update(self) -> dict[str, Any]:
        """One update (with its validation, when due), guarded; its log row.
        With ``config.policy_lag``, the acting policy takes the learner's and
        crash clock, then the next rollout is collected while the update
        runs on a kept copy of this one, unless a checkpoint follows (the
        last update, one of ``checkpoint_every``, ``seconds`` spent): that
        update collects it. Without one, `pipelined`: the next rollout is
        launched right after the optimisation (`collects_ahead`). Where it
        is collected changes none of its numbers, nor that a row's ``seconds``
        hold one rollout: from its collection's start to the next's, or to the update's end."""
        cfg = self.config
        rate = self.rate
        self.learner.set_learning_rate(rate)
        if not self.ahead:
            self._launched = time.perf_counter()
            self.weight = self.crash_weight()
            self.collect()
        weight, self.ahead = self.weight, False
        acted = self.acting_parameters()
        batch = self.rollout.batch(keep=bool(cfg.policy_lag))
        advantage, returns = advantages(batch, cfg)
        # Every process stops after the same update.
        self.cut = self._deadline is not None and self.group.any(time.perf_counter() >= self._deadline)
        done = self.update + 1
        # Pipelined, the next rollout's crash weight needs this one's laps: read before the update is launched.
        early = episodes(batch, self.group) if self.pipelined and collects_ahead(
            cfg, done, self.cut, self.validation is not None) else None
        if cfg.policy_lag:
            self.learner.follow()
            self.acting_clock = self.crash_clock
        stats, checked = self.learner.launch(batch, advantage, returns), None
        lagged = cfg.policy_lag and collects_ahead(cfg, done, self.cut, False)  # beside a validation too
        if lagged or early is not None:  # the next rollout now (pipelined: this one checked before it, read after)
            if early is not None:
                checked = self.learner.checks(batch, advantage, returns, self.reward_bounds, acted)
            self.weight = self.crash_weight() if lagged else crash_weight(
                cfg, self.crash_clock + int(cfg.warms_up(early["success_rate"])))
            start, self._launched, self.ahead = self._launched, time.perf_counter(), True
            self.collect(self.learner.followed if lagged else None, self.weight)
        losses = read(stats)
        self.guard(advantage, returns, losses, acted, batch, checked)
        stats = episodes(batch, self.group) if early is None else early
        self.rate = adapted_learning_rate(self.config, rate, losses["approx_kl"], self.update)
        self.crash_clock += int(self.config.warms_up(stats["success_rate"]))
        self.update += 1
        took = self._launched - start if self.ahead else time.perf_counter() - self._launched
        every, last = self.config.validate_every, self.update == self.config.updates
        due = self.validation is not None and every and (self.update % every == 0 or last)
        begun = time.perf_counter()  # a validation after a lagged rollout's start is not that rollout's row's
        validated = self.validate_and_keep() if due else dict(NOT_VALIDATED)
        self._launched += time.perf_counter() - begun
        n = self.config.steps * self.config.worlds * self.group.size
        return {"update": self.update, "transitions": self.update * n, "seconds": took,
                "transitions_per_s": n / took, **stats, **losses, "learning_rate": rate,
                "crash_weight": weight, **validated}

    def state_dict(self) -> dict[str, Any]:
        """Everything the run's next update depends on (`racing_stack.ppo.checkpoint.trainer_state`,
        which says what it raises)."""
        return checkpoint.trainer_state(self)

    def save(self, path: Path) -> None:
        """Write `state_dict` to ``path`` atomically as a checked
        `racing_stack.checkpoints` file: a kill or a full disk leaves the
        previous checkpoint whole.

        Raises:
            OSError: the write failed; the previous checkpoint is unchanged.
        """
        start = time.perf_counter()
        checkpoint.write(path, self.state_dict(), self.group)
        self.saved_update = self.update
        self.checkpoints["checkpoint_s"] += time.perf_counter() - start
        self.checkpoints["checkpoints"] += 1

    def load(self, path: Path) -> None:
        """Continue from the checkpoint at ``path`` of a run with the same settings
        (`racing_stack.ppo.checkpoint.restore`, which says what it raises)."""
        checkpoint.restore(self, path)


def collects_ahead(config: PPOConfig, done: int, cut: bool, validates: bool) -> bool:
    """Whether update ``done`` (1-based) collects the next rollout before it
    reads its results (a `Trainer.pipelined` run's, or a lagged one's
    beside its optimisation): not before a checkpoint (the last update,
    one of ``checkpoint_every``, ``cut``: the run's ``seconds`` spent; a
    checkpoint holds no rollout in flight) nor, where ``validates`` (a
    pipelined run with a validation env, which would wait for the
    rollout), before a validation."""
    validating = validates and config.validate_every and done % config.validate_every == 0
    return done < config.updates and bool(done % config.checkpoint_every) and not cut and not validating


def _check_envs(config: PPOConfig, env, validation, group: Group) -> None:
    """Refuse a training env and a validation env that do not fit the run
    (`racing_stack.ppo.envs` builds ones that do)."""
    if env.num_envs != config.worlds:
        raise ValueError(f"env has {env.num_envs} worlds, config.worlds is {config.worlds}")
    if env.first_world != group.first_world(config.worlds):
        raise ValueError(f"env's first_world is {env.first_world}; process {group.rank} of {group.size} drives "
                         f"the worlds from {group.first_world(config.worlds)} (make_env(config, group))")
    if validation is not None and not group.lead:
        raise ValueError(f"validation: only the lead process validates; process {group.rank} was given an env")
    if validation is not None and validation.num_envs != config.validation_tracks:
        raise ValueError(f"validation env has {validation.num_envs} worlds, config.validation_tracks is "
                         f"{config.validation_tracks}")


def claim(out: Path, overwrite: bool) -> None:
    """Make ``out`` a new run's: refuse one that holds a run (`RUN_FILES`)
    unless ``overwrite``, which deletes that run's files.

    Raises:
        RunExists: ``out`` holds a run and not ``overwrite``.
    """
    found = [name for name in RUN_FILES if (out / name).exists()]
    if found and not overwrite:
        raise RunExists(f"{out} already holds a run ({', '.join(found)}): resume it or overwrite it")
    for name in found:
        path = out / name
        # A link is removed, never what it points to (rmtree refuses a link to a folder).
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


#: Names that moved out of this module, and their homes; importing them from here warns (one release).
_MOVED = {"finish": "racing_stack.ppo.cli.finish", "make_env": "racing_stack.ppo.envs.make_env",
          "make_validation_env": "racing_stack.ppo.envs.make_validation_env",
          "resume_problem": "racing_stack.ppo.checkpoint.resume_problem",
          "whole_config": "racing_stack.ppo.checkpoint.whole_config"}
__getattr__ = moved_names(__name__, _MOVED)
