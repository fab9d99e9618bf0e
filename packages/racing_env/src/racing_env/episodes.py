"""Episode accounting, in one place: how an ended episode becomes a result
(`EpisodeResult.ended`), the reasons' names (`REASONS`), the summary of a
set of episodes (`summarize`), and on the device the first ending of each
world (`FirstEndings`, for evaluations that drive each world's first
episode only). The Runner, ``evaluate`` and PPO's on-device validation
all account for their episodes here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from racing_env.types import TerminationReason

__all__ = ["REASONS", "EpisodeResult", "FirstEndings", "summarize"]

#: The name of each `TerminationReason` code, as results write it.
REASONS = {int(reason): reason.name.lower() for reason in TerminationReason}


@dataclasses.dataclass(frozen=True)
class EpisodeResult:
    """One ended episode.

    Attributes:
        world: the env world that ran it.
        episode_seed, controller_seed: the episode's SeedSequence words (domains 0 and 1).
        track_id: the track it drove on.
        termination_reason: ``"success"``, ``"off_track"``, ``"invalid_action"`` or ``"timeout"``.
        lap_completed: a full lap of legal progress.
        lap_time_s: the lap time (s), 0 unless the lap was completed.
        progress: ``track_progress`` of the final observation (fraction of a lap).
        steps: control steps taken.
        error: the controller's traceback when it raised, else None.
    """

    world: int
    episode_seed: int
    controller_seed: int
    track_id: int
    termination_reason: str
    lap_completed: bool
    lap_time_s: float
    progress: float
    steps: int
    error: str | None

    @classmethod
    def ended(cls, world: int, info: Mapping[str, Any], progress: float, steps: int,
              error: str | None = None) -> EpisodeResult:
        """The episode that ended in ``world``, from the info of the step that
        ended it (host arrays with a leading world axis): the one place the
        Runner and on-device evaluations (``racing_stack.ppo``) turn an ending
        into a result."""
        return cls(
            world=world,
            episode_seed=int(info["episode_seed"][world]),
            controller_seed=int(info["controller_seed"][world]),
            track_id=int(info["track_id"][world]),
            termination_reason=REASONS[int(info["termination_reason"][world])],
            lap_completed=bool(info["lap_completed"][world]),
            lap_time_s=float(info["lap_time_s"][world]),
            progress=float(progress),
            steps=int(steps),
            error=error,
        )


def summarize(episodes: list[EpisodeResult]) -> dict[str, Any]:
    """Success, off-track, timeout and invalid-action rates; lap-time median,
    quartiles and range over the completed laps (None without any: the
    summary stays valid JSON); controller errors."""
    n = len(episodes)
    laps = np.array([e.lap_time_s for e in episodes if e.lap_completed], np.float64)

    def rate(reason: str) -> float:
        return sum(e.termination_reason == reason for e in episodes) / n if n else None

    lap: dict[str, float | None] = {"median": None, "p25": None, "p75": None, "min": None, "max": None}
    if laps.size:
        lap = {"median": float(np.median(laps)), "p25": float(np.percentile(laps, 25)),
               "p75": float(np.percentile(laps, 75)), "min": float(laps.min()), "max": float(laps.max())}
    return {
        "episodes": n,
        "success_rate": rate("success"),
        "off_track_rate": rate("off_track"),
        "timeout_rate": rate("timeout"),
        "invalid_action_rate": rate("invalid_action"),
        "lap_time_s": lap,
        "controller_errors": sum(e.error is not None for e in episodes),
    }


class FirstEndings(NamedTuple):
    """The first episode of each of ``n`` worlds, recorded on the device as
    the env steps (each field [n]; `start`, `record`, `results`).

    Attributes:
        ended: bool, the first episode ended.
        reason: int32, its `TerminationReason` (TIMEOUT until it ends).
        lap: float32, its lap time (s) where it lapped.
        progress: float32, its lap fraction: the latest until it ends, then
            the one it ended with.
        steps: int32, calls driven in it.
    """

    ended: jax.Array
    reason: jax.Array
    lap: jax.Array
    progress: jax.Array
    steps: jax.Array

    @classmethod
    def start(cls, n: int) -> FirstEndings:
        """Nothing ended yet, in ``n`` worlds."""
        return cls(ended=jnp.zeros(n, bool), reason=jnp.full(n, TerminationReason.TIMEOUT, jnp.int32),
                   lap=jnp.zeros(n, jnp.float32), progress=jnp.zeros(n, jnp.float32), steps=jnp.zeros(n, jnp.int32))

    def record(self, progress: jax.Array, terminated: jax.Array, truncated: jax.Array, reason: jax.Array,
               lap_time: jax.Array, give_up: jax.Array | None = None) -> FirstEndings:
        """After one call of the env (its ``track_progress``, terminated,
        truncated, ``termination_reason`` and ``lap_time_s``; jittable):
        a world whose first episode ends now keeps this outcome; one in
        ``give_up`` (bool [n]) ends now as a timeout."""
        now = (terminated | truncated) & ~self.ended
        ended = self.ended | now if give_up is None else self.ended | now | give_up
        return FirstEndings(ended=ended, reason=jnp.where(now, reason, self.reason).astype(jnp.int32),
                            lap=jnp.where(now, lap_time, self.lap).astype(jnp.float32),
                            progress=jnp.where(self.ended, self.progress, progress).astype(jnp.float32),
                            steps=self.steps + (~self.ended).astype(jnp.int32))

    def results(self, ids: Mapping[str, Any]) -> list[EpisodeResult]:
        """One `EpisodeResult` per world, in world order (a world not ended
        is a timeout); ``ids``: the episodes' ``episode_seed``,
        ``controller_seed`` and ``track_id`` (the reset's info). One read of
        the device."""
        reason, lap, progress, steps = (np.asarray(v) for v in (self.reason, self.lap, self.progress, self.steps))
        lapped = reason == TerminationReason.SUCCESS
        host = {**{k: np.asarray(ids[k]) for k in ("episode_seed", "controller_seed", "track_id")},
                "termination_reason": reason, "lap_completed": lapped, "lap_time_s": np.where(lapped, lap, 0.0)}
        return [EpisodeResult.ended(w, host, progress[w], steps[w]) for w in range(reason.size)]
