"""On-device validation: the policy's mean action drives each of a set of
Validation tracks once, all at the same time, and the episodes are
accounted for exactly as the Runner accounts for them
(`racing_env.runner.EpisodeResult.ended`, `racing_env.runner.summarize`).

Two modes. *Full* drives every episode to its end under the Level's own
timeout: the same episodes the Runner drives with the exported plugin.
*Early exit* (for choosing a policy inside a run) also ends a world as a
failure (``"timeout"``) once it has driven ``validation_steps`` calls or
made no progress for `STALL_S`: pessimistic, and much cheaper when one car
is stuck.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

from racing_env import TerminationReason
from racing_env.runner import EpisodeResult, summarize
from racing_stack.interop import Handover
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.networks import ActorCritic

__all__ = ["STALL_S", "VALIDATION_FIELDS", "result_row", "validate"]

#: Seconds without legal progress after which an early-exit validation gives a world up.
STALL_S = 5.0
#: The log columns of a validation.
VALIDATION_FIELDS = ("validation_success_rate", "validation_median_lap_time_s", "validation_mean_progress")


def validate(policy: ActorCritic, env, config: PPOConfig, crossing: Handover, rows: list[int],
             early_exit: bool) -> list[EpisodeResult]:
    """Drive world w of ``env`` on its pool row ``rows[w]`` once (reset
    with ``config.seed``: the same episodes every time), on the device.

    Args:
        policy: its mean action drives.
        env: a `racing_env.VecCarRacingEnv` of ``len(rows)`` worlds.
        crossing: every JAX-Torch crossing goes through it.
        rows: the pool row of each world.
        early_exit: give up on a world after ``config.validation_steps``
            calls or `STALL_S` without progress (a ``"timeout"``).

    Returns:
        One `racing_env.runner.EpisodeResult` per world, in world order.
    """
    n = env.num_envs
    if len(rows) != n:
        raise ValueError(f"rows has {len(rows)} entries, the validation env {n} worlds")
    device = policy.log_std.device
    obs, info = env.reset(seed=config.seed, options={"track_indices": list(rows)})
    ids = {k: np.asarray(info[k]) for k in ("episode_seed", "controller_seed", "track_id")}
    z = dict(device=device)
    ended = torch.zeros(n, dtype=torch.bool, **z)
    reason = torch.full((n,), TerminationReason.TIMEOUT, dtype=torch.int32, **z)
    lap = torch.zeros(n, **z)
    progress = torch.zeros(n, **z)
    steps = torch.zeros(n, dtype=torch.int32, **z)
    still = torch.zeros(n, dtype=torch.int32, **z)
    previous = jnp.zeros((n, 2), jnp.float32)
    stall = round(STALL_S / env.config.control_dt_s)
    limit = min(config.validation_steps, env.level.max_episode_steps) if early_exit else env.level.max_episode_steps
    with torch.no_grad():
        for step in range(limit):
            x = crossing.to_torch(config.features(obs, previous))
            previous = crossing.to_jax(policy.mean_action(x))
            obs, _, terminated, truncated, info = env.step(previous)
            now = (crossing.to_torch(terminated) | crossing.to_torch(truncated)) & ~ended
            reason = torch.where(now, crossing.to_torch(info["termination_reason"]), reason)
            lap = torch.where(now, crossing.to_torch(info["lap_time_s"]), lap)
            reached = crossing.to_torch(obs["track_progress"])
            still = torch.where(reached > progress, 0, still + 1)
            progress = torch.where(ended, progress, reached)
            steps += (~ended).int()
            crossing.fence()
            ended |= now
            if early_exit:
                ended |= still >= stall
            if step % 32 == 31 and bool(ended.all()):
                break
    reason, lap, progress, steps = (v.cpu().numpy() for v in (reason, lap, progress, steps))
    host = {**ids, "termination_reason": reason, "lap_completed": reason == TerminationReason.SUCCESS,
            "lap_time_s": np.where(reason == TerminationReason.SUCCESS, lap, 0.0)}
    return [EpisodeResult.ended(w, host, progress[w], steps[w]) for w in range(n)]


def result_row(episodes: list[EpisodeResult]) -> dict[str, Any]:
    """A validation's log columns (`VALIDATION_FIELDS`) from its episodes."""
    summary = summarize(episodes)
    median = summary["lap_time_s"]["median"]
    return {"validation_success_rate": summary["success_rate"],
            "validation_median_lap_time_s": math.nan if median is None else median,
            "validation_mean_progress": float(np.mean([e.progress for e in episodes]))}
