"""`racing_env.episodes`: each world's first ending recorded on the device
(`FirstEndings`) against a hand-built timeline, jitted and not; its results
are the Runner's `EpisodeResult`s; the names of the reasons."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import TerminationReason, runner
from racing_env.episodes import REASONS, EpisodeResult, FirstEndings, summarize

S, OFF, T, BAD = (int(r) for r in (TerminationReason.SUCCESS, TerminationReason.OFF_TRACK,
                                   TerminationReason.TIMEOUT, TerminationReason.INVALID_ACTION))
#: Four worlds, five calls: (progress, terminated, truncated, reason, lap time, given up) per call and world.
#: World 0 laps at call 2 and its later ending is ignored; world 1 leaves the track at call 4; world 2 never
#: ends; world 3 is given up at call 3 (then ends, ignored).
CALLS = [
    ([0.3, 0.1, 0.05, 0.2], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]),
    ([1.0, 0.2, 0.10, 0.2], [1, 0, 0, 0], [0, 0, 0, 0], [S, 0, 0, 0], [12.5, 0, 0, 0], [0, 0, 0, 0]),
    ([0.0, 0.3, 0.15, 0.2], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]),
    ([0.1, 0.4, 0.20, 0.0], [1, 1, 0, 1], [0, 0, 0, 0], [OFF, OFF, 0, BAD], [0, 0, 0, 0], [0, 0, 0, 0]),
    ([0.2, 0.0, 0.25, 0.1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]),
]
#: What each world's first episode was: (reason, lap time, progress, steps).
WANT = [("success", 12.5, 1.0, 2), ("off_track", 0.0, 0.4, 4), ("timeout", 0.0, 0.25, 5), ("timeout", 0.0, 0.2, 3)]
IDS = {"episode_seed": np.array([5, 6, 7, 8]), "controller_seed": np.array([9, 10, 11, 12]),
       "track_id": np.array([100, 101, 102, 103])}


@pytest.mark.parametrize("jit", [False, True])
def test_each_world_keeps_its_first_ending(jit):
    record = jax.jit(FirstEndings.record) if jit else FirstEndings.record
    endings = FirstEndings.start(4)
    for progress, terminated, truncated, reason, lap, give_up in CALLS:
        endings = record(endings, jnp.asarray(progress, jnp.float32), jnp.asarray(terminated, bool),
                         jnp.asarray(truncated, bool), jnp.asarray(reason, jnp.int32), jnp.asarray(lap, jnp.float32),
                         jnp.asarray(give_up, bool))
    assert np.asarray(endings.ended).tolist() == [True, True, False, True]
    results = endings.results(IDS)
    assert all(isinstance(r, EpisodeResult) for r in results)
    got = [(r.termination_reason, r.lap_time_s, pytest.approx(r.progress), r.steps) for r in results]
    assert got == [(reason, lap, pytest.approx(progress), steps) for reason, lap, progress, steps in WANT]
    assert [r.lap_completed for r in results] == [True, False, False, False]
    assert [(r.world, r.episode_seed, r.controller_seed, r.track_id) for r in results] == [
        (w, 5 + w, 9 + w, 100 + w) for w in range(4)]
    assert all(r.error is None for r in results)


def test_a_truncation_ends_the_first_episode_and_nothing_given_up_by_default():
    endings = FirstEndings.start(2).record(jnp.asarray([0.5, 0.6]), jnp.asarray([False, False]),
                                           jnp.asarray([True, False]), jnp.asarray([T, 0]), jnp.zeros(2))
    assert np.asarray(endings.ended).tolist() == [True, False]
    assert [r.termination_reason for r in endings.results(IDS | {k: v[:2] for k, v in IDS.items()})] == [
        "timeout", "timeout"]


def test_the_runner_accounts_with_the_same_code():
    assert runner.EpisodeResult is EpisodeResult and runner.summarize is summarize and runner.REASONS is REASONS
    assert {REASONS[S], REASONS[OFF], REASONS[BAD], REASONS[T]} == {"success", "off_track", "invalid_action",
                                                                    "timeout"}
