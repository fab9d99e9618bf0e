"""The one place that builds the env of a Level: training, validation,
``sim``, ``evaluate`` and the benchmarks all call `level_env`.

Level 1's tracks come from its pools (`racing_stack.pools`: a split's
first rows, verified against the committed manifest); one fixed track
(Level 0's, ``sim``'s, a video's) is given as a `racing_env.Track`.
Every env here uses the project's car and control step
(`racing_env.ProjectConfig`'s defaults).
"""

from __future__ import annotations

from collections.abc import Callable

from racing_env import LEVEL_1, Level, ProjectConfig, Track, VecCarRacingEnv

__all__ = ["level_env", "timed"]


def level_env(worlds: int, level: Level = LEVEL_1, *, split: str | None = None, tracks: int | None = None,
              track: Track | None = None, backend: str = "mjx_warp", first_world: int = 0,
              on_build: Callable[[str], None] | None = None) -> VecCarRacingEnv:
    """A `racing_env.VecCarRacingEnv` of ``worlds`` worlds under ``level``.

    Args:
        worlds: the number of worlds (>= 1).
        level: the Level (its id must be the pool's; `timed` gives Level 1 another timeout).
        split: a Level 1 split (``"train"``, ``"validation"``, ``"test"``):
            the worlds draw from its first ``tracks`` rows (default: all of
            them), built or read from the cache and verified.
        track: one fixed track instead of a split.
        backend: ``"mjx_warp"`` (default) or ``"cpu_reference"``.
        first_world: the index of this env's first world in a run of
            several processes (the seeds' world index).
        on_build: called with one line before a split's pool is built
            (`racing_stack.pools.materialize_prefix`'s).

    Raises:
        ValueError: both or neither of ``split`` and ``track``; a split or
            ``tracks`` out of range; whatever the env refuses.
    """
    if (split is None) == (track is None):
        raise ValueError(f"give one of split and track, got split={split!r} and track={track!r}")
    if track is not None:
        source = {"track": track}
    else:
        from racing_stack.pools import materialize_prefix  # builds with Warp on first use

        source = {"track_pool": materialize_prefix(split, tracks, on_build=on_build)}
    return VecCarRacingEnv(worlds, config=ProjectConfig(), level=level, backend=backend, first_world=first_world,
                           **source)


def timed(name: str, max_episode_steps: int) -> Level:
    """Level 1 under another timeout (``max_episode_steps`` control steps), called ``name``."""
    return Level(level_id=LEVEL_1.level_id, name=name, max_episode_steps=max_episode_steps)
