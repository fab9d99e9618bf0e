"""On-device validation: the policy's mean action drives each of a set of
Validation tracks once, all at the same time, and the episodes are
accounted for exactly as the Runner accounts for them
(`racing_env.episodes`: each world's first ending recorded on the device
by `FirstEndings`, turned into results by `EpisodeResult.ended` and
summarised by `summarize`).

Two modes. *Full* drives every episode to its end under the Level's own
timeout: the same episodes the Runner drives with the exported plugin.
*Early exit* (for choosing a policy inside a run) also ends a world as a
failure (``"timeout"``) once it has driven ``validation_steps`` calls or
made no progress for `STALL_S`: pessimistic, and much cheaper when one car
is stuck.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from racing_env.episodes import EpisodeResult, FirstEndings, summarize
from racing_stack.interop import Handover
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.networks import ActorCritic
from racing_stack.wrappers import LocalTrack

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
        One `racing_env.episodes.EpisodeResult` per world, in world order.
    """
    n = env.num_envs
    if len(rows) != n:
        raise ValueError(f"rows has {len(rows)} entries, the validation env {n} worlds")
    obs, info = env.reset(seed=config.seed, options={"track_indices": list(rows)})
    ids = {k: np.asarray(info[k]) for k in ("episode_seed", "controller_seed", "track_id")}  # before a step donates
    endings, still = FirstEndings.start(n), jnp.zeros(n, jnp.int32)
    stall = round(STALL_S / env.config.control_dt_s) if early_exit else None
    limit = min(config.validation_steps, env.level.max_episode_steps) if early_exit else env.level.max_episode_steps
    features = config.features(obs, jnp.zeros((n, 2), jnp.float32))
    with torch.no_grad():
        for step in range(limit):
            mean = policy.mean_action(crossing.to_torch(features))
            crossing.fence()  # Torch has read the last step's outputs, which came after JAX read its action
            action = crossing.to_jax(mean)
            obs, _, terminated, truncated, info = env.step(action)
            endings, still, features = _after_validation_step(
                config.features, stall, endings, still, obs, terminated, truncated, info["termination_reason"],
                info["lap_time_s"], action)
            if step % 32 == 31 and bool(endings.ended.all()):
                break
        crossing.to_torch(features)  # read after the last step's action: its crossing can be released
        crossing.fence()
    return endings.results(ids)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _after_validation_step(features: LocalTrack, stall: int | None, endings: FirstEndings, still: jax.Array, obs,
                           terminated, truncated, reason, lap_time,
                           action) -> tuple[FirstEndings, jax.Array, jax.Array]:
    """One step's record, in one dispatch: a world's outcome is the first
    one its episode reached; with ``stall`` (early exit) a world whose
    progress has not grown for ``stall`` calls (``still`` counts them) is
    given up (a timeout). Returns the record, the count and the next
    call's features (``action`` is the previous action they carry)."""
    reached = obs["track_progress"]
    still = jnp.where(reached > endings.progress, 0, still + 1).astype(jnp.int32)
    give_up = None if stall is None else still >= stall
    return endings.record(reached, terminated, truncated, reason, lap_time, give_up), still, features(obs, action)


def result_row(episodes: list[EpisodeResult]) -> dict[str, Any]:
    """A validation's log columns (`VALIDATION_FIELDS`) from its episodes."""
    summary = summarize(episodes)
    median = summary["lap_time_s"]["median"]
    return {"validation_success_rate": summary["success_rate"],
            "validation_median_lap_time_s": math.nan if median is None else median,
            "validation_mean_progress": float(np.mean([e.progress for e in episodes]))}
