"""PPO on the vector env, on one device: the env in JAX, the policy in
Torch, advantages from rl_triton, nothing through the host.

    python -m racing_stack.ppo [--preset cpu|gpu] [--out DIR] [--updates N] [--resume]

One update: the step size set on its linear schedule (from
``learning_rate`` down to ``learning_rate / updates`` at the last update), a
rollout of ``steps`` calls of every world (features from
`racing_stack.wrappers.LocalTrack`, the reward from
`racing_stack.wrappers.ShapedReward`, the env's outputs seen by Torch as
DLPack views and the actions returned the same way), then GAE by
`rl_triton.compute_gae` and ``epochs`` x ``minibatches`` clipped policy and
value steps. Every ``validate_every`` updates (and at the last update) the
policy's mean action drives the first ``validation_tracks`` tracks of Level
1's Validation split once each, on the device; the best policy so far (the
highest success rate, then the faster median lap) is the one exported.

NEXT_STEP autoreset: the call after a terminal one only resets its world
(the env ignores its action, returns the new episode's first observation,
reward 0, no flags). That slot is masked out of GAE's result and of every
loss; the terminal transition before it is kept. A termination cuts the
return; a truncation (the Level's timeout) bootstraps from the value of
the terminal call's own observation, which is the reset slot's input.

Every update appends a row to ``DIR/log.csv`` and to TensorBoard event
files (``DIR/tensorboard``), and prints a progress line. ``DIR/checkpoint.pt``
(written every ``checkpoint_every`` updates and at the end) holds the
policy, the optimizer, the random generator and the env's snapshot:
``--resume`` continues the same curve, bitwise on the CPU. At the end the
best validated policy (the last one without validation) is exported as a
controller plugin (``DIR/plugin``), the learning curve drawn
(``DIR/learning_curve.png``) and one episode of the plugin recorded
(``DIR/policy.gif``). Importing this module stops JAX from preallocating
the GPU (`racing_stack.interop.share_gpu`), so that Torch has room.
"""

from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import io
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn

import rl_triton
from racing_env import TerminationReason
from racing_stack import checkpoints
from racing_stack.guard import GuardError, Violation, check, violations
from racing_stack.interop import Handover, share_gpu
from racing_stack.wrappers import LocalTrack, ShapedReward

# JAX and Torch train on one GPU: JAX must not take most of it up front.
share_gpu()

__all__ = ["PRESETS", "ActorCritic", "GuardError", "PPOConfig", "RunExists", "Trainer", "main", "make_env",
           "make_validation_env"]

#: What a run writes into its folder; a folder holding any of them holds a run.
RUN_FILES = ("checkpoint.pt", "log.csv", "tensorboard", "plugin", "learning_curve.png", "policy.gif")

#: The log's columns, in order.
LOG_FIELDS = ("update", "transitions", "seconds", "transitions_per_s", "episodes", "success_rate",
              "off_track_rate", "mean_progress", "median_lap_time_s", "mean_reward", "policy_loss",
              "value_loss", "entropy", "approx_kl", "learning_rate", "validation_success_rate",
              "validation_median_lap_time_s", "validation_mean_progress")
#: The widest hidden layer a config accepts.
MAX_WIDTH = 16384
#: The validation columns of an update without validation.
_NOT_VALIDATED = {"validation_success_rate": math.nan, "validation_median_lap_time_s": math.nan,
                  "validation_mean_progress": math.nan}


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Everything a training run depends on.

    Attributes:
        worlds: env worlds, each one rollout row.
        steps: calls per world per rollout.
        updates: rollouts (and optimisation phases) in the run.
        epochs: passes over a rollout per update.
        minibatches: minibatches per pass.
        gamma, gae_lambda: the discount and the GAE trace parameter.
        clip: PPO's ratio clip.
        learning_rate: Adam's step size (at the first update).
        anneal_learning_rate: lower the step size linearly, update by
            update, to ``learning_rate / updates`` at the last one.
        value_coef, entropy_coef: loss weights.
        max_grad_norm: gradient clipping.
        hidden: hidden layer widths of both networks.
        init_log_std: the initial log standard deviation of the (normalised) action.
        seed: the env's root reset seed and Torch's generator seed.
        max_episode_steps: the training Level's timeout (control steps).
        tracks: Train pool rows trained on (its first N; None: all 10,000).
        checkpoint_every: updates between checkpoints.
        validate_every: updates between validations (0: none).
        validation_tracks: Validation split rows driven by a validation (its first N).
        features: the observation wrapper.
        reward: the reward wrapper.
    """

    worlds: int = 8192
    steps: int = 32
    updates: int = 200
    epochs: int = 4
    minibatches: int = 4
    gamma: float = 0.995
    gae_lambda: float = 0.95
    clip: float = 0.2
    learning_rate: float = 3e-4
    anneal_learning_rate: bool = True
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    max_grad_norm: float = 0.5
    hidden: tuple[int, ...] = (256, 256)
    init_log_std: float = -0.5
    seed: int = 0
    max_episode_steps: int = 3970
    tracks: int | None = None
    checkpoint_every: int = 20
    validate_every: int = 50
    validation_tracks: int = 100
    features: LocalTrack = LocalTrack()
    reward: ShapedReward = ShapedReward()

    def __post_init__(self) -> None:
        for name in ("worlds", "steps", "updates", "epochs", "minibatches", "max_episode_steps",
                     "checkpoint_every", "validation_tracks", "validate_every"):
            value, low = getattr(self, name), 0 if name == "validate_every" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(self.anneal_learning_rate, bool):
            raise ValueError(f"anneal_learning_rate must be a bool, got {self.anneal_learning_rate!r}")
        if (self.worlds * self.steps) % self.minibatches:
            raise ValueError(f"minibatches ({self.minibatches}) must divide worlds x steps "
                             f"({self.worlds * self.steps})")
        # Beyond these bounds training cannot work (a step size above 1, a
        # standard deviation that underflows or spans the action range many
        # times over): refused by name rather than stopped by the guard.
        for name, low, high, closed in (("gamma", 0.0, 1.0, True), ("gae_lambda", 0.0, 1.0, True),
                                        ("clip", 0.0, 10.0, False), ("learning_rate", 0.0, 1.0, False),
                                        ("max_grad_norm", 0.0, 1e6, False),
                                        ("value_coef", 0.0, 1e3, True), ("entropy_coef", 0.0, 1e3, True),
                                        ("init_log_std", -10.0, 2.0, True)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a real number, got {value!r}")
            try:
                value = float(value)  # an int beyond a float's range is out of range, not a crash
            except OverflowError:
                value = math.inf
            inside = (low <= value if closed else low < value) and value <= high and math.isfinite(value)
            if not inside:
                raise ValueError(f"{name} must be in {'[' if closed else '('}{low}, {high}] and finite, "
                                 f"got {value!r}")
        if (not isinstance(self.hidden, tuple) or not self.hidden
                or not all(isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= MAX_WIDTH
                           for h in self.hidden)):
            raise ValueError(f"hidden must be a non-empty tuple of ints in [1, {MAX_WIDTH}], got {self.hidden!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an int in [0, 2**32), got {self.seed!r}")
        if not isinstance(self.features, LocalTrack) or not isinstance(self.reward, ShapedReward):
            raise ValueError("features must be a LocalTrack and reward a ShapedReward")
        if self.tracks is not None and (isinstance(self.tracks, bool) or not isinstance(self.tracks, int)
                                        or self.tracks < 1):
            raise ValueError(f"tracks must be None or an int >= 1, got {self.tracks!r}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the wrappers as dicts)."""
        return dataclasses.asdict(self)

    def override(self, settings: list[str]) -> PPOConfig:
        """A copy with ``name=value`` settings replaced (``features.NAME`` and
        ``reward.NAME`` reach into the wrappers); a value is a Python literal
        (``3e-4``, ``True``, ``(128, 128)``, ``None``).

        Raises:
            ValueError: a setting that is not ``name=value``, an unknown
                name, a value that is not a literal, or one the config refuses.
        """
        data = self.to_json()
        for setting in settings:
            name, sep, text = setting.partition("=")
            path = name.strip().split(".")
            if not sep or not all(path):
                raise ValueError(f"a setting must be name=value, got {setting!r}")
            node = data
            for key in path[:-1]:
                if not isinstance(node.get(key), dict):
                    raise ValueError(f"unknown setting {name!r}")
                node = node[key]
            if path[-1] not in node or isinstance(node[path[-1]], dict):
                raise ValueError(f"unknown setting {name!r}; the settings are {sorted(_names(self.to_json()))}")
            try:
                node[path[-1]] = ast.literal_eval(text.strip())
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                raise ValueError(f"setting {name!r}: {text!r} is not a Python literal") from None
        try:
            return PPOConfig.from_json(data)
        except TypeError as error:  # e.g. hidden=3: not a sequence
            raise ValueError(f"bad settings {settings}: {error}") from None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PPOConfig:
        """The inverse of `to_json`."""
        data = dict(data)
        data["hidden"] = tuple(data["hidden"])
        data["features"] = LocalTrack(**data["features"])
        data["reward"] = ShapedReward(**data["reward"])
        return cls(**data)


#: The CPU preset finishes in minutes (16 worlds, the first 16 Train tracks,
#: 200-step episodes, 4 Validation tracks); the GPU preset is the full run
#: on an H200 (8,192 worlds, 600 updates: 157 M transitions), where leaving
#: the track costs 5.0: of 2.0, 5.0 and 10.0 on an H200 (the PPO page), 5.0
#: validated best; 10.0 taught the car to stand still.
PRESETS = {
    "cpu": PPOConfig(worlds=16, steps=32, updates=30, epochs=4, minibatches=2, hidden=(64, 64),
                     max_episode_steps=200, tracks=16, checkpoint_every=10, learning_rate=1e-3,
                     validate_every=10, validation_tracks=4),
    "gpu": PPOConfig(updates=600, validate_every=40, reward=ShapedReward(off_track_penalty=5.0)),
}


def _names(tree: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted setting names of a config's JSON."""
    out = []
    for key, value in tree.items():
        out += _names(value, f"{prefix}{key}.") if isinstance(value, dict) else [prefix + key]
    return out


class ActorCritic(nn.Module):
    """A Gaussian policy over the action normalised to [-1, 1] (a mean
    network and a learned log standard deviation) and a value network, each
    an MLP of ``hidden`` tanh layers. The initial mean action is the
    neutral one (zero steering and acceleration).

    Args:
        features: input features per world.
        hidden: hidden layer widths.
        init_log_std: the initial log standard deviation.
        low, high: the env's action bounds ([2] each), which [-1, 1] maps onto.
    """

    def __init__(self, features: int, hidden: tuple[int, ...], init_log_std: float,
                 low: np.ndarray, high: np.ndarray) -> None:
        super().__init__()

        def mlp(out: int, gain: float) -> nn.Sequential:
            layers: list[nn.Module] = []
            width = features
            for h in hidden:
                layers += [nn.Linear(width, h), nn.Tanh()]
                width = h
            layers.append(nn.Linear(width, out))
            for layer in layers:
                if isinstance(layer, nn.Linear):
                    nn.init.orthogonal_(layer.weight, gain=np.sqrt(2.0))
                    nn.init.zeros_(layer.bias)
            nn.init.orthogonal_(layers[-1].weight, gain=gain)
            return nn.Sequential(*layers)

        low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        middle, half = (low + high) / 2, (high - low) / 2
        self.actor = mlp(2, 0.01)
        with torch.no_grad():  # the initial mean action is the neutral one (no steering, no acceleration)
            self.actor[-1].bias.copy_(torch.as_tensor(np.clip(-middle / half, -1.0, 1.0)))
        self.critic = mlp(1, 1.0)
        self.log_std = nn.Parameter(torch.full((2,), float(init_log_std)))
        self.register_buffer("action_middle", torch.as_tensor(middle))
        self.register_buffer("action_half", torch.as_tensor(half))

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """V(x): [E]."""
        return self.critic(x).squeeze(-1)

    def distribution(self, x: torch.Tensor) -> torch.distributions.Normal:
        """The policy over the normalised action, [E, 2]."""
        # No argument validation: it would wait for the GPU at every step.
        return torch.distributions.Normal(self.actor(x), self.log_std.exp(), validate_args=False)

    def env_action(self, u: torch.Tensor) -> torch.Tensor:
        """The env's action (float32 [E, 2], physical units) of normalised ``u``."""
        return (self.action_middle + self.action_half * u.clamp(-1.0, 1.0)).float()

    def mean_action(self, x: torch.Tensor) -> torch.Tensor:
        """The env's action of the policy's mean (no sampling): float32 [E, 2]."""
        return self.env_action(self.actor(x))

    def load_checked(self, weights: Any, source: str) -> None:
        """Load a state dict that must fit this network exactly (its layers
        and shapes) and hold finite values only; nothing changes otherwise.

        Raises:
            racing_stack.checkpoints.CorruptFile: ``source`` (where the
                weights came from) does not fit or is not finite.
        """
        if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
            raise checkpoints.CorruptFile(f"{source} is not a dict of tensors")
        if not all(v.isfinite().all() for v in weights.values() if v.is_floating_point()):
            raise checkpoints.CorruptFile(f"{source} holds values that are not finite")
        mine = self.state_dict()
        if set(weights) != set(mine) or any(weights[k].shape != v.shape for k, v in mine.items()):
            raise checkpoints.CorruptFile(f"{source} does not fit the network: its layers or shapes differ")
        self.load_state_dict(weights)


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
            ``config.validation_tracks`` worlds on the Validation split);
            None: no validation, whatever ``config.validate_every`` says.
    """

    def __init__(self, config: PPOConfig, env, out: Path, progress: Callable[[dict], None] | None = None,
                 validation=None) -> None:
        if env.num_envs != config.worlds:
            raise ValueError(f"env has {env.num_envs} worlds, config.worlds is {config.worlds}")
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
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.learning_rate, eps=1e-5)
        self.generator = torch.Generator(self.device)
        self.generator.manual_seed(config.seed)
        self.update = 0
        #: The update of the checkpoint last written or loaded (None: none yet).
        self.saved_update: int | None = None
        self.crossing = Handover(self.device)
        self.reward_bounds = config.reward.bounds(float(np.max(np.asarray(env.track_pool.track_length))))
        t, e, d = config.steps, config.worlds, config.features.size
        z = dict(device=self.device)
        self.buf = {
            "x": torch.zeros((t, e, d), **z), "u": torch.zeros((t, e, 2), **z),
            "logp": torch.zeros((t, e), **z), "value": torch.zeros((t, e), **z),
            "reward": torch.zeros((t, e), **z), "terminated": torch.zeros((t, e), dtype=torch.bool, **z),
            "truncated": torch.zeros((t, e), dtype=torch.bool, **z), "valid": torch.zeros((t, e), **z),
            "progress": torch.zeros((t, e), **z), "reason": torch.zeros((t, e), dtype=torch.int32, **z),
            "lap_time": torch.zeros((t, e), **z),
        }
        obs, _ = env.reset(seed=config.seed)
        self.obs = obs
        self.pending = torch.zeros(e, dtype=torch.bool, device=self.device)  # the next call only resets

    # -- one update ------------------------------------------------------------

    def learning_rate(self) -> float:
        """The step size of the next update (``self.update`` done)."""
        cfg = self.config
        if not cfg.anneal_learning_rate:
            return cfg.learning_rate
        return cfg.learning_rate * (1.0 - self.update / cfg.updates)

    def collect(self) -> None:
        """One rollout into the buffers, on the device: each step crosses the
        features to Torch, the action to JAX and the step's outputs to Torch,
        then fences (`racing_stack.interop.Handover`)."""
        policy, env, buf, cfg, cross = self.policy, self.env, self.buf, self.config, self.crossing
        with torch.no_grad():
            for t in range(cfg.steps):
                x = cross.to_torch(cfg.features(self.obs))
                dist = policy.distribution(x)
                u = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=self.generator,
                                                          device=self.device)
                buf["x"][t] = x
                buf["u"][t] = u
                buf["logp"][t] = dist.log_prob(u).sum(-1)
                buf["value"][t] = policy.value(x)
                buf["valid"][t] = (~self.pending).float()
                obs, reward, terminated, truncated, info = env.step(cross.to_jax(policy.env_action(u)))
                buf["reward"][t] = cross.to_torch(cfg.reward(reward, obs, info))
                buf["terminated"][t] = cross.to_torch(terminated)
                buf["truncated"][t] = cross.to_torch(truncated)
                buf["progress"][t] = cross.to_torch(obs["track_progress"])
                buf["reason"][t] = cross.to_torch(info["termination_reason"])
                buf["lap_time"][t] = cross.to_torch(info["lap_time_s"])
                cross.fence()
                self.pending = buf["terminated"][t] | buf["truncated"][t]
                self.obs = obs
            self.last_value = policy.value(cross.to_torch(cfg.features(self.obs)))
            cross.fence()

    def advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns), [T, E]: GAE by rl_triton with terminations
        and truncations apart; a truncation bootstraps from V of the next
        slot's input (the terminal observation); the last slot from V of the
        observation after the rollout."""
        buf, cfg = self.buf, self.config
        value = buf["value"]
        next_value = torch.cat([value[1:], self.last_value[None]], dim=0)
        bootstrap = torch.where(buf["truncated"], next_value, torch.zeros_like(next_value))
        bootstrap[-1] = next_value[-1]
        advantage = rl_triton.compute_gae(
            buf["reward"].T.contiguous(), value.T.contiguous(), buf["terminated"].T.contiguous(),
            buf["truncated"].T.contiguous(), gamma=cfg.gamma, lambda_=cfg.gae_lambda,
            bootstrap_values=bootstrap.T.contiguous()).T
        advantage = advantage * buf["valid"]  # reset slots carry nothing
        return advantage, advantage + value

    def optimise(self, advantage: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
        """``epochs`` x ``minibatches`` clipped PPO steps over the rollout;
        every loss is a mean over the valid (non-reset) slots only."""
        cfg, buf, policy = self.config, self.buf, self.policy
        n = cfg.steps * cfg.worlds
        flat = {k: buf[k].reshape(n, *buf[k].shape[2:]) for k in ("x", "u", "logp", "value", "valid")}
        adv, ret = advantage.reshape(n), returns.reshape(n)
        mask = flat["valid"]
        count = mask.sum().clamp(min=1.0)
        mean = (adv * mask).sum() / count
        std = (((adv - mean) ** 2 * mask).sum() / count).sqrt()
        adv = (adv - mean) / (std + 1e-8)
        stats = torch.zeros(4, device=self.device)
        size = n // cfg.minibatches
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=self.generator, device=self.device)
            for k in range(cfg.minibatches):
                i = order[k * size:(k + 1) * size]
                m = mask[i]
                w = m.sum().clamp(min=1.0)
                dist = policy.distribution(flat["x"][i])
                logp = dist.log_prob(flat["u"][i]).sum(-1)
                ratio = (logp - flat["logp"][i]).exp()
                clipped = ratio.clamp(1 - cfg.clip, 1 + cfg.clip)
                policy_loss = -(torch.min(ratio * adv[i], clipped * adv[i]) * m).sum() / w
                value_loss = (((policy.value(flat["x"][i]) - ret[i]) ** 2) * m).sum() / w
                entropy = (dist.entropy().sum(-1) * m).sum() / w
                loss = policy_loss + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                kl = (((ratio - 1) - (logp - flat["logp"][i])) * m).sum() / w
                stats += torch.stack([policy_loss, value_loss, entropy, kl]).detach()
        stats /= cfg.epochs * cfg.minibatches
        return dict(zip(("policy_loss", "value_loss", "entropy", "approx_kl"), stats.tolist()))

    def guard(self, advantage: torch.Tensor, returns: torch.Tensor, losses: dict[str, float]) -> None:
        """Check the update just computed (``self.update`` done before it):
        the rollout's features, values, advantages and returns, the losses
        and the parameters finite, its rewards within the reward wrapper's
        bounds; one small read of the device.

        Raises:
            GuardError: naming the update, the field and its worst value.
        """
        buf = self.buf
        low, high = self.reward_bounds
        # The wrapper computes in float32: its rounding may pass an exact bound by an ulp or two.
        low, high = low - 1e-5 * max(1.0, abs(low)), high + 1e-5 * max(1.0, abs(high))
        fields = [Violation("observation feature", buf["x"]), Violation("reward", buf["reward"], low, high),
                  Violation("value", [buf["value"], self.last_value]), Violation("advantage", advantage),
                  Violation("return", returns), Violation("parameter", list(self.policy.parameters()))]
        read = violations(fields).tolist()
        read += [[0.0 if math.isfinite(v) else 1.0, v] for v in losses.values()]
        fields += [Violation(name, torch.zeros(1)) for name in losses]
        check(fields, read, self.update + 1, self.last_checkpoint())

    def last_checkpoint(self) -> str:
        """What a stopped run can resume from, said for a message."""
        if self.saved_update is None:
            return "no checkpoint was written yet"
        return f"the last checkpoint, {self.out / 'checkpoint.pt'} (update {self.saved_update}), is whole"

    def episodes(self) -> dict[str, float]:
        """The rollout's ended episodes (read once, after the rollout)."""
        buf = self.buf
        ended = (buf["terminated"] | buf["truncated"]) & (buf["valid"] > 0)
        reason = buf["reason"][ended].cpu().numpy()
        progress = buf["progress"][ended].cpu().numpy()
        laps = buf["lap_time"][ended & (buf["reason"] == TerminationReason.SUCCESS)].cpu().numpy()
        n = int(reason.size)
        return {
            "episodes": n,
            "success_rate": float(np.mean(reason == TerminationReason.SUCCESS)) if n else float("nan"),
            "off_track_rate": float(np.mean(reason == TerminationReason.OFF_TRACK)) if n else float("nan"),
            "mean_progress": float(progress.mean()) if n else float("nan"),
            "median_lap_time_s": float(np.median(laps)) if laps.size else float("nan"),
            "mean_reward": float((buf["reward"] * buf["valid"]).sum() / buf["valid"].sum().clamp(min=1)),
        }

    def validate(self) -> dict[str, float]:
        """The policy's mean action on each validation track once (the
        validation env's world w on its pool row w, reset with
        ``config.seed``: the same episodes every time), on the device.

        Returns:
            ``validation_success_rate``, ``validation_median_lap_time_s``
            (NaN without a completed lap) and ``validation_mean_progress``
            (laps) of the first episode of every world.
        """
        env, cfg, policy, cross = self.validation, self.config, self.policy, self.crossing
        if env is None:
            raise ValueError("no validation env: give the Trainer one (validation=make_validation_env(config))")
        n = env.num_envs
        obs, _ = env.reset(seed=cfg.seed, options={"track_indices": list(range(n))})
        ended = torch.zeros(n, dtype=torch.bool, device=self.device)
        reason = torch.zeros(n, dtype=torch.int32, device=self.device)
        lap = torch.zeros(n, device=self.device)
        progress = torch.zeros(n, device=self.device)
        with torch.no_grad():
            # Every episode ends by the Level's timeout; the check for all ended waits for the device.
            for step in range(cfg.max_episode_steps):
                x = cross.to_torch(cfg.features(obs))
                obs, _, terminated, truncated, info = env.step(cross.to_jax(policy.mean_action(x)))
                now = (cross.to_torch(terminated) | cross.to_torch(truncated)) & ~ended
                reason = torch.where(now, cross.to_torch(info["termination_reason"]), reason)
                lap = torch.where(now, cross.to_torch(info["lap_time_s"]), lap)
                progress = torch.where(now, cross.to_torch(obs["track_progress"]), progress)
                cross.fence()
                ended |= now
                if step % 32 == 31 and bool(ended.all()):
                    break
        success = (reason == TerminationReason.SUCCESS).cpu().numpy()
        laps = lap.cpu().numpy()[success]
        return {"validation_success_rate": float(success.mean()),
                "validation_median_lap_time_s": float(np.median(laps)) if laps.size else math.nan,
                "validation_mean_progress": float(progress.mean())}

    def best_policy(self) -> ActorCritic:
        """The best validated policy (a copy), or the current one when no
        validation ran."""
        if self.best is None:
            return self.policy
        policy = self._new_policy()
        policy.load_state_dict(self.best["policy"])
        return policy

    def _new_policy(self) -> ActorCritic:
        """A freshly initialised actor-critic for the config and the env's action bounds, on the device."""
        space, cfg = self.env.single_action_space, self.config
        return ActorCritic(cfg.features.size, cfg.hidden, cfg.init_log_std, space.low, space.high).to(self.device)

    def validate_and_keep(self) -> dict[str, float]:
        """`validate`, keeping the policy if it is the best so far; returns
        the validation's result."""
        result = self.validate()
        self._keep_if_best(result)
        return result

    def _keep_if_best(self, result: dict[str, float]) -> None:
        """Keep the policy if ``result`` beats the best: a higher success
        rate, then a faster median lap (no lap: more progress)."""
        def score(r: dict[str, Any]) -> tuple[float, float]:
            rate = r["validation_success_rate"]
            return rate, -r["validation_median_lap_time_s"] if rate > 0 else r["validation_mean_progress"]

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
        log_path = self.out / "log.csv"
        if resume:
            self.load(self.out / "checkpoint.pt")
        else:
            self._claim(overwrite)
        for name in ("checkpoint.pt", "log.csv"):
            checkpoints.remove_stale(self.out, name)
        kept = _log_rows(log_path, self.update) if resume else []
        _write_log(log_path, kept)
        writer = _tensorboard(self.out / "tensorboard", kept)
        began = time.perf_counter()
        rows = []
        try:
            with open(log_path, "a", newline="") as f:
                log = csv.DictWriter(f, LOG_FIELDS)
                while self.update < self.config.updates:
                    row = self._one_update()
                    out_of_time = seconds is not None and time.perf_counter() - began >= seconds
                    log.writerow(row)
                    f.flush()
                    _add_events(writer, row)
                    rows.append(row)
                    self.progress(row)
                    last = self.update == self.config.updates
                    if self.update % self.config.checkpoint_every == 0 or last or out_of_time:
                        os.fsync(f.fileno())  # the log holds every row up to the checkpoint, power loss or not
                        self.save(self.out / "checkpoint.pt")
                    if out_of_time:
                        break
        finally:
            writer.close()
        return rows

    def _one_update(self) -> dict[str, Any]:
        """One update (with its validation, when due), guarded; its log row."""
        start = time.perf_counter()
        rate = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        self.collect()
        advantage, returns = self.advantages()
        losses = self.optimise(advantage, returns)
        self.guard(advantage, returns, losses)
        stats = self.episodes()
        self.update += 1
        took = time.perf_counter() - start
        validated = dict(_NOT_VALIDATED)
        every = self.config.validate_every
        if self.validation is not None and every and (self.update % every == 0
                                                      or self.update == self.config.updates):
            validated = self.validate_and_keep()
        n = self.config.steps * self.config.worlds
        return {"update": self.update, "transitions": self.update * n, "seconds": took,
                "transitions_per_s": n / took, **stats, **losses, "learning_rate": rate, **validated}

    def _claim(self, overwrite: bool) -> None:
        """Make ``out`` this run's: refuse one that holds a run unless
        ``overwrite``, which deletes that run's files."""
        found = [name for name in RUN_FILES if (self.out / name).exists()]
        if found and not overwrite:
            raise RunExists(f"{self.out} already holds a run ({', '.join(found)}): resume it or overwrite it")
        for name in found:
            path = self.out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()

    def state_dict(self) -> dict[str, Any]:
        """Everything the run's next update depends on (tensors and plain
        data): config, update, policy, optimizer, generator, the env's
        snapshot and observation, the best validated policy."""
        return {
            "config": self.config.to_json(), "update": self.update, "policy": self.policy.state_dict(),
            "best": self.best, "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
            "pending": self.pending.cpu(), "env": {k: torch.from_numpy(v) for k, v in self.env.snapshot().items()},
            "obs": {k: torch.from_numpy(np.array(v)) for k, v in self.obs.items()},
        }

    def save(self, path: Path) -> None:
        """Write `state_dict` to ``path`` atomically as a checked
        `racing_stack.checkpoints` file: a kill or a full disk leaves the
        previous checkpoint whole.

        Raises:
            OSError: the write failed; the previous checkpoint is unchanged.
        """
        checkpoints.save(path, "checkpoint", self.state_dict())
        self.saved_update = self.update

    def load(self, path: Path) -> None:
        """Continue from a checkpoint of a run with the same settings (only
        ``updates`` may grow; an annealed step size then follows the new
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
        resume_problem(self.config, state["config"], path)
        policy, optimizer, generator, best, obs, env = self._checked_state(state, path)
        try:
            self.env.restore(env)  # checks every field; changes nothing on error
        except (ValueError, TypeError) as error:
            raise checkpoints.CorruptFile(f"{path}: its env snapshot does not fit this env: {error}") from None
        self.policy, self.optimizer, self.generator, self.best = policy, optimizer, generator, best
        self.pending = state["pending"].to(self.device)
        self.obs = {k: jnp.asarray(v) for k, v in obs.items()}
        self.update = self.saved_update = state["update"]

    def _checked_state(self, state: dict[str, Any], path: Path):
        """The policy, optimizer, generator and best policy of a checkpoint's
        ``state``, built apart from the trainer's, after checking every
        field against this run."""
        def bad(field: str, what: str) -> checkpoints.CorruptFile:
            return checkpoints.CorruptFile(f"{path}: its {field} {what}")

        want = {"config", "update", "policy", "best", "optimizer", "generator", "pending", "env", "obs"}
        if set(state) != want:
            raise bad("fields", f"are {sorted(state)}, expected {sorted(want)}")
        update = state["update"]
        if isinstance(update, bool) or not isinstance(update, int) or not 0 <= update <= self.config.updates:
            raise bad("update", f"is {update!r}, not an int in [0, {self.config.updates}]")
        policy = self._loaded_policy(state["policy"], "policy", path)
        optimizer = torch.optim.Adam(policy.parameters(), lr=self.config.learning_rate, eps=1e-5)
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
        pending = state["pending"]
        if not isinstance(pending, torch.Tensor) or pending.dtype != torch.bool or pending.shape != self.pending.shape:
            raise bad("pending resets", f"are not a bool tensor of shape {tuple(self.pending.shape)}")
        obs, env = _numpy_fields(state["obs"]), _numpy_fields(state["env"])
        if obs is None or set(obs) != set(self.obs) or any(
                obs[k].shape != tuple(v.shape) or obs[k].dtype != v.dtype for k, v in self.obs.items()):
            raise bad("observation", "does not match the env's fields, shapes and types")
        if env is None:
            raise bad("env snapshot", "is not a dict of tensors of NumPy types")
        best = state["best"]
        if best is not None:
            keys = {"update", "policy", *_NOT_VALIDATED}
            if not isinstance(best, dict) or set(best) != keys:
                raise bad("best policy", f"is not a dict of {sorted(keys)}")
            if not all(isinstance(best[k], float) for k in _NOT_VALIDATED):
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
            validated = f"  validation success {row['validation_success_rate']:.2f}"
        print(f"ppo [{bar}] {self.update}/{self.config.updates}  {row['transitions_per_s']:,.0f} transitions/s  "
              f"episodes {row['episodes']}  success {row['success_rate']:.2f}  "
              f"progress {row['mean_progress']:.3f}{validated}", file=sys.stderr, flush=True)


def _numpy_fields(tree: Any) -> dict[str, np.ndarray] | None:
    """A checkpoint's dict of tensors as NumPy arrays; None when it is
    not one (or holds a type NumPy lacks, such as bfloat16)."""
    if not isinstance(tree, dict) or not all(isinstance(v, torch.Tensor) for v in tree.values()):
        return None
    try:
        return {k: v.cpu().numpy() for k, v in tree.items()}
    except TypeError:
        return None


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
                         "a resumed run's updates may only grow")


def _log_rows(path: Path, update: int) -> list[dict[str, str]]:
    """The complete rows of a run's log up to ``update`` (none without a
    log); a row cut by a kill or a full disk, or otherwise unreadable, is
    dropped."""
    if not path.exists():
        return []
    kept = []
    with open(path, newline="", errors="replace") as f:
        for row in csv.DictReader(f):
            try:
                complete = None not in row and all(row.get(k) not in (None, "") for k in LOG_FIELDS) and \
                    all(math.isfinite(float(row[k])) or row[k] == "nan" for k in LOG_FIELDS)
                number = int(row["update"]) if complete else None
            except (ValueError, TypeError):
                number = None
            if number is not None and 1 <= number <= update:
                kept.append(row)
    return kept


def _write_log(path: Path, rows: list[dict[str, str]]) -> None:
    """``log.csv`` replaced, atomically, by its header and ``rows``."""
    text = io.StringIO()
    log = csv.DictWriter(text, LOG_FIELDS)
    log.writeheader()
    log.writerows(rows)
    checkpoints.write_atomic(path, text.getvalue().encode())


class _NoEvents:
    """Stands in for the event writer when tensorboardX is not installed."""

    def add_scalar(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _tensorboard(path: Path, rows: list[dict[str, Any]]):
    """A fresh TensorBoard event folder (tensorboardX, the ``train`` extra)
    holding ``rows`` (a resumed run's kept log rows): events written after
    the checkpoint by a killed run are gone, none is repeated. Without
    tensorboardX the run says so once and logs to the CSV only."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        print("ppo: no TensorBoard events (pip install 'racing-stack[train]' for them); log.csv has every row",
              file=sys.stderr)
        return _NoEvents()
    if path.exists():
        shutil.rmtree(path)
    writer = SummaryWriter(str(path))
    for row in rows:
        _add_events(writer, row)
    return writer


def _add_events(writer, row: dict[str, Any]) -> None:
    """One log row as TensorBoard scalars against transitions (NaN ones left out: no episode ended)."""
    step = int(float(row["transitions"]))
    for key in LOG_FIELDS[3:]:
        value = float(row[key])
        if math.isfinite(value):
            writer.add_scalar(key, value, step)


def make_env(config: PPOConfig):
    """The training env: ``config.worlds`` ``mjx_warp`` worlds on Level 1's
    Train pool (its first ``config.tracks`` rows, verified against the
    committed manifest), with ``config.max_episode_steps`` episodes."""
    return _level_env(config, "train", config.tracks, config.worlds)


def make_validation_env(config: PPOConfig):
    """The validation env: ``config.validation_tracks`` ``mjx_warp`` worlds
    on the first as many rows of Level 1's Validation split (verified
    against the committed manifest), with ``config.max_episode_steps``
    episodes."""
    return _level_env(config, "validation", config.validation_tracks, config.validation_tracks)


def _level_env(config: PPOConfig, split: str, tracks: int | None, worlds: int):
    from racing_env import LEVEL_1, Level, ProjectConfig, VecCarRacingEnv

    from racing_stack.pools import materialize_prefix

    level = Level(level_id=LEVEL_1.level_id, name=f"ppo-{split}", max_episode_steps=config.max_episode_steps)
    pool = materialize_prefix(split, tracks)
    return VecCarRacingEnv(worlds, config=ProjectConfig(), level=level, backend="mjx_warp", track_pool=pool)


def finish(trainer: Trainer, video_steps: int = 1500) -> dict[str, Path]:
    """After a run: the best validated policy's plugin (``out/plugin``), the learning curve
    (``out/learning_curve.png``) and one recorded episode of the plugin on
    Train row 0 (``out/policy.gif``, at most ``video_steps`` steps)."""
    from racing_env import LEVEL_1, Level, ProjectConfig, VecCarRacingEnv
    from racing_env.plugins import load_plugin
    from racing_env.render import EpisodeView
    from racing_env.runner import run

    from racing_stack.export import export_plugin

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


def draw_curve(log: Path, path: Path) -> None:
    """The learning curve of a run's ``log.csv`` against transitions: the
    success rate and mean progress of the Train rollouts' ended episodes
    and their median lap time, with the validations' where they ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(log, newline="") as f:
        rows = list(csv.DictReader(f))
    x = np.array([float(r["transitions"]) for r in rows])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("success_rate", "success rate"), ("mean_progress", "mean progress (laps)")):
        left.plot(x, [float(r[key]) for r in rows], label=f"Train rollouts: {label}")
    right.plot(x, [float(r["median_lap_time_s"]) for r in rows], label="Train rollouts")
    validated = np.array([math.isfinite(float(r.get("validation_success_rate") or "nan")) for r in rows])
    if validated.any():
        picked = [r for r, v in zip(rows, validated) if v]
        left.plot(x[validated], [float(r["validation_success_rate"]) for r in picked], "o-", color="tab:green",
                  label="Validation: success rate")
        right.plot(x[validated], [float(r["validation_median_lap_time_s"]) for r in picked], "o-",
                   color="tab:green", label="Validation")
    left.set(xlabel="transitions", ylim=(0, 1.05), title="ended episodes")
    left.legend()
    right.set(xlabel="transitions", ylabel="s", title="median lap time of the completed laps")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="train-ppo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--out", type=Path, default=Path("runs/ppo"), help="the run's folder (default runs/ppo)")
    parser.add_argument("--updates", type=int, default=None, help="override the preset's number of updates")
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    parser.add_argument("--overwrite", action="store_true", help="delete the run already in OUT and start anew")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="override a preset's setting, e.g. --set learning_rate=1e-4 "
                             "--set reward.off_track_penalty=4.0 (repeatable)")
    args = parser.parse_args(argv)
    config = _config(parser, args)
    _check_out(parser, args, config)
    trainer = None
    try:
        try:
            validation = make_validation_env(config) if config.validate_every else None
            trainer = Trainer(config, make_env(config), args.out, validation=validation)
        except ValueError as error:  # a Train or Validation size beyond its split
            parser.error(f"--set tracks or validation_tracks: {error}")
        try:
            trainer.run(resume=args.resume, overwrite=args.overwrite)
        except ValueError as error:  # CorruptFile too
            if not args.resume or trainer.saved_update is not None:
                raise
            parser.error(f"--resume: {error}")  # the checkpoint's fields, checked against the env
        except GuardError as error:
            print(f"train-ppo: {error}", file=sys.stderr)
            return 1
        except OSError as error:
            print(f"train-ppo: {error}; {trainer.last_checkpoint()}", file=sys.stderr)
            return 1
        if trainer.best is not None:
            print(f"train-ppo: exporting update {trainer.best['update']}'s policy (validation success "
                  f"{trainer.best['validation_success_rate']:.2f})", file=sys.stderr)
        for name, path in finish(trainer).items():
            print(f"train-ppo: {name} {path}", file=sys.stderr)
    except KeyboardInterrupt:
        where = "before training" if trainer is None else f"at update {trainer.update}"
        print(f"train-ppo: interrupted {where}; --resume continues from the last checkpoint "
              f"(update {None if trainer is None else trainer.saved_update})", file=sys.stderr)
        return 130
    return 0


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> PPOConfig:
    """The preset with ``--updates`` and ``--set`` applied; a bad one is a usage error naming its flag."""
    config = PRESETS[args.preset]
    if args.updates is not None:
        try:
            config = dataclasses.replace(config, updates=args.updates)
        except ValueError as error:
            parser.error(f"--updates: {error}")
    try:
        return config.override(args.set)
    except ValueError as error:
        parser.error(f"--set: {error}")


def _check_out(parser: argparse.ArgumentParser, args: argparse.Namespace, config: PPOConfig) -> None:
    """Refuse, before any work, an ``--out`` that cannot hold the run, a run
    there that would be overwritten, and a ``--resume`` that cannot resume."""
    out: Path = args.out
    if args.resume and args.overwrite:
        parser.error("--resume and --overwrite exclude each other")
    if args.resume and not (out / "checkpoint.pt").is_file():
        parser.error(f"--resume: {out} holds no checkpoint.pt to continue from")
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out {out} cannot be created: {error.strerror}")
    if not os.access(out, os.W_OK | os.X_OK):
        parser.error(f"--out {out} is not writable")
    found = [name for name in RUN_FILES if (out / name).exists()]
    if args.resume:
        try:
            state = checkpoints.load(out / "checkpoint.pt", "checkpoint", map_location="cpu")
            if not isinstance(state, dict) or not isinstance(state.get("config"), dict):
                raise checkpoints.CorruptFile(f"{out / 'checkpoint.pt'} holds no run configuration")
            resume_problem(config, state["config"], out / "checkpoint.pt")
        except ValueError as error:  # CorruptFile too
            parser.error(f"--resume: {error}")
        except OSError as error:
            parser.error(f"--resume: {out / 'checkpoint.pt'} cannot be read: {error.strerror}")
    elif found and not args.overwrite:
        resumable = "pass --resume to continue it or " if "checkpoint.pt" in found else "it has no checkpoint; pass "
        parser.error(f"--out {out} already holds a run ({', '.join(found)}): {resumable}--overwrite to replace it")


if __name__ == "__main__":
    sys.exit(main())
