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

import dataclasses
import functools
import math
import time
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from racing_env import checks
from racing_env.episodes import EpisodeResult, FirstEndings, summarize
from racing_stack.interop import Handover
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.networks import ActorCritic
from racing_stack.ppo.graphs import capture_stream, capturing, warm_up
from racing_stack.features import LocalTrack

__all__ = ["STALL_S", "VALIDATION_FIELDS", "Selection", "check_noise", "result_row", "score", "standing_starts",
           "validate"]

#: Seconds without legal progress after which an early-exit validation gives a world up.
STALL_S = 5.0
#: The log columns of a validation.
VALIDATION_FIELDS = ("validation_success_rate", "validation_median_lap_time_s", "validation_mean_progress")


class Selection:
    """A run's validations and the best policy they found: the policy's
    mean action on the validation env's "select" rows (the Validation
    split's first ``config.validation_tracks``), early exit, and the best
    by `score`.

    Args:
        env: the validation env (`racing_stack.ppo.envs.make_validation_env`); None: no validation.
        config: the run's settings.
    """

    def __init__(self, env, config: PPOConfig) -> None:
        self.env, self.config = env, config
        #: The best validated policy: {"update", its `validate` result, "policy": a state dict}; None before one.
        self.best: dict[str, Any] | None = None
        #: Wall time (s) spent validating, and how often.
        self.overhead = {"validation_s": 0.0, "validations": 0}

    def validate(self, policy: ActorCritic, crossing: Handover, early_exit: bool = True) -> dict[str, float]:
        """``policy`` on the select rows (`validate`); the `VALIDATION_FIELDS` of its episodes.

        Raises:
            ValueError: there is no validation env.
        """
        env, cfg = self._env(), self.config
        start = time.perf_counter()
        result = result_row(validate(policy, env, cfg, crossing, list(range(cfg.validation_tracks)), early_exit))
        self.overhead["validation_s"] += time.perf_counter() - start
        self.overhead["validations"] += 1
        return result

    def compile(self, policy: ActorCritic, crossing: Handover) -> None:
        """Compile the validation env's calls (a reset and one early-exit
        step; nothing is kept), so that a validation inside a timed run
        costs its driving alone, like an update after the first.

        Raises:
            ValueError: there is no validation env.
        """
        env = self._env()
        once = dataclasses.replace(self.config, validation_steps=1)
        validate(policy, env, once, crossing, list(range(once.validation_tracks)), True)

    def keep_if_best(self, policy: ActorCritic, update: int, result: dict[str, float]) -> None:
        """Keep (a copy of) ``policy``, validated after ``update`` updates with ``result``, if it beats the best."""
        enough = self.config.select_success_rate
        if self.best is None or score(result, enough) > score(self.best, enough):
            state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
            self.best = {"update": update, **result, "policy": state}

    def policy(self, current: ActorCritic, new_policy: Callable[[], ActorCritic]) -> ActorCritic:
        """The best validated policy (a copy into ``new_policy()``), or ``current`` when no validation ran."""
        if self.best is None:
            return current
        policy = new_policy()
        policy.load_state_dict(self.best["policy"])
        return policy

    def _env(self):
        if self.env is None:
            raise ValueError("no validation env: give the Trainer one (validation=make_validation_env(config))")
        return self.env


def validate(policy: ActorCritic, env, config: PPOConfig, crossing: Handover, rows: list[int],
             early_exit: bool, action_noise: float = 0.0, noise_seed: int = 0) -> list[EpisodeResult]:
    """Drive world w of ``env`` on its pool row ``rows[w]`` once (reset
    with ``config.seed``: the same episodes every time), on the device.

    Args:
        policy: its mean action drives.
        env: a `racing_env.VecCarRacingEnv` of ``len(rows)`` worlds.
        crossing: every JAX-Torch crossing goes through it.
        rows: the pool row of each world.
        early_exit: give up on a world after ``config.validation_steps``
            calls or `STALL_S` without progress (a ``"timeout"``).
        action_noise: 0 (the default) drives the mean action itself; s > 0
            adds Gaussian noise of s x each action dimension's half range
            to every call's action (then clipped to the bounds), drawn from
            a Torch generator seeded with ``noise_seed``: a lap that noise
            of 1 % ends was driven at the edge (a robustness check, not
            the Runner's episodes).
        noise_seed: the noise's seed (>= 0): the same noise every time.

    Returns:
        One `racing_env.episodes.EpisodeResult` per world, in world order.

    Raises:
        TypeError: `check_noise` refuses the type of ``action_noise`` or ``noise_seed``.
        ValueError: ``rows`` does not have one row per world, or
            `check_noise` refuses ``action_noise`` or ``noise_seed``.
    """
    n = env.num_envs
    check_noise(action_noise, noise_seed)
    generator = torch.Generator(device=policy.action_half.device).manual_seed(noise_seed) if action_noise else None
    mean_action = _mean_action(policy, config, n)
    ids, features = _start(env, config, rows)
    endings, still = FirstEndings.start(n), jnp.zeros(n, jnp.int32)
    stall = round(STALL_S / env.config.control_dt_s) if early_exit else None
    limit = min(config.validation_steps, env.level.max_episode_steps) if early_exit else env.level.max_episode_steps
    with torch.no_grad():
        for step in range(limit):
            mean = mean_action(crossing.to_torch(features))
            if generator is not None:
                mean = _perturbed(policy, mean, float(action_noise), generator)
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


class CapturedMean:
    """``policy.mean_action`` on ``worlds`` rows captured as one CUDA graph
    over a static input: a call copies its features in and replays it,
    launching the eager call's kernels on the same data (the same numbers,
    a GPU test holds them), the parameters and feature statistics read
    where they are (updated in place by the optimizer and the normaliser).
    A validation call's host time is the env's (about 2.6 ms a call at 500
    worlds on an H100, eager), so the policy's launches are worth taking out.

    Args:
        policy: the policy, on a CUDA device.
        worlds: its rows a call.
        features: features a row.
    """

    def __init__(self, policy: ActorCritic, worlds: int, features: int) -> None:
        device = policy.action_half.device
        # No reference to the policy itself: `_CAPTURED` keeps this by a weak one to it.
        self.key = self._key(policy)
        self.x = torch.zeros((worlds, features), device=device)
        with torch.no_grad():
            warm_up(device, lambda: policy.mean_action(self.x))
            self.graph = torch.cuda.CUDAGraph()
            with capturing(self.graph, device, capture_stream(self, device)):
                #: The mean action [worlds, 2] the last call wrote (static: read it before the next call).
                self.mean = policy.mean_action(self.x)

    @staticmethod
    def _key(policy: ActorCritic) -> tuple:
        """What a capture of a policy depends on beside the input: where its
        tensors live, and the matmul precision it was captured under."""
        return (tuple(t.data_ptr() for t in (*policy.parameters(), *policy.buffers())),
                torch.get_float32_matmul_precision())

    def fits(self, policy: ActorCritic) -> bool:
        """Whether this capture (of ``policy``, as `_CAPTURED` files it) runs it as it is now."""
        return self._key(policy) == self.key

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        self.graph.replay()
        return self.mean


#: The captured mean action of each policy validated on the graph path, one a world count.
_CAPTURED: weakref.WeakKeyDictionary[ActorCritic, dict[int, CapturedMean]] = weakref.WeakKeyDictionary()


def _mean_action(policy: ActorCritic, config: PPOConfig, worlds: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The policy's mean action as `validate` calls it: on the graph path
    (``config.update_path == "graph"``) on a CUDA device a `CapturedMean`
    (captured at the first call, again where the policy's tensors moved),
    else ``policy.mean_action`` itself. In a run of several processes too
    (a validation is one process's work, no collective inside); never
    under an autocast (whose cached casts of the weights a capture would
    keep)."""
    if (config.update_path != "graph" or policy.action_half.device.type != "cuda"
            or torch.is_autocast_enabled("cuda")):
        return policy.mean_action
    kept = _CAPTURED.setdefault(policy, {})
    if worlds not in kept or not kept[worlds].fits(policy):
        kept.pop(worlds, None)  # its memory goes before the next capture takes some
        kept[worlds] = CapturedMean(policy, worlds, config.features.size)
    return kept[worlds]


def standing_starts(policy: ActorCritic, env, config: PPOConfig, crossing: Handover,
                    rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """The action `validate` sends at the first call of each of its
    episodes (the same resets: the car at a standstill on the start line),
    without driving them. A start whose acceleration is not above 0 holds
    the car where it stands: a brake at a standstill holds, and there is
    no reverse.

    Args and Raises: as `validate`'s (``rows``: the pool row of each world).

    Returns:
        (track ids uint32 [n], the actions float32 [n, 2]: steering in
        rad, acceleration in m/s²), in world order.
    """
    ids, features = _start(env, config, rows)
    with torch.no_grad():
        action = policy.mean_action(crossing.to_torch(features)).cpu().numpy()
    crossing.fence()
    return ids["track_id"], action


def _start(env, config: PPOConfig, rows: list[int]) -> tuple[dict[str, np.ndarray], jax.Array]:
    """Reset ``env``'s world w on pool row ``rows[w]`` with ``config.seed``;
    returns the episodes' ids (episode and controller seeds, track ids)
    and the first call's features."""
    n = env.num_envs
    if len(rows) != n:
        raise ValueError(f"rows has {len(rows)} entries, the validation env {n} worlds")
    obs, info = env.reset(seed=config.seed, options={"track_indices": list(rows)})
    ids = {k: np.asarray(info[k]) for k in ("episode_seed", "controller_seed", "track_id")}  # before a step donates
    return ids, config.features(obs, jnp.zeros((n, 2), jnp.float32))


def check_noise(action_noise: float, noise_seed: int) -> None:
    """Refuse what `validate` cannot use as its action noise (a real number
    in [0, 1], a fraction of the half range) or noise seed (an int in
    [0, 2**64), a Torch generator's range): a TypeError for another type,
    a ValueError for a value out of range, each naming the argument."""
    checks.real_in(action_noise, "action_noise", 0.0, 1.0, unit="(a fraction of the half range)")
    checks.integer_in(noise_seed, "noise_seed", 0, 2**64, "2**64")


def _perturbed(policy: ActorCritic, action: torch.Tensor, scale: float,
               generator: torch.Generator) -> torch.Tensor:
    """``action`` [n, 2] plus Gaussian noise of ``scale`` x the half range of
    each dimension, clipped to the policy's action bounds."""
    draw = torch.randn(action.shape, generator=generator, device=action.device)
    noisy = action + scale * policy.action_half * draw
    return torch.minimum(torch.maximum(noisy, policy.action_low), policy.action_high)


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


def score(result: dict[str, Any], enough: float) -> tuple[float, float]:
    """How a validation ``result`` (`VALIDATION_FIELDS`) ranks when a run
    picks its best policy (higher is better): the success rate up to
    ``enough`` (rates at or above it are equal), then a faster median lap
    (no lap: more progress)."""
    rate = result["validation_success_rate"]
    faster = -result["validation_median_lap_time_s"] if rate > 0 else result["validation_mean_progress"]
    return min(rate, enough), faster


def result_row(episodes: list[EpisodeResult]) -> dict[str, Any]:
    """A validation's log columns (`VALIDATION_FIELDS`) from its episodes."""
    summary = summarize(episodes)
    median = summary["lap_time_s"]["median"]
    return {"validation_success_rate": summary["success_rate"],
            "validation_median_lap_time_s": math.nan if median is None else median,
            "validation_mean_progress": float(np.mean([e.progress for e in episodes]))}
