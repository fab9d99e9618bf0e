"""Shared fixtures: the compiled MJX-Warp environments are built once per
test session (Warp's first compile of the car costs ~40 s on a CPU)."""

from __future__ import annotations

import pytest
import warp as wp

from worlds import SHORT_LEVEL, circle_track

from racing_env import LEVEL_0, ProjectConfig, TrackPool, VecCarRacingEnv, level0_track

wp.config.quiet = True


@pytest.fixture(scope="session")
def config() -> ProjectConfig:
    return ProjectConfig()


@pytest.fixture(scope="session")
def short_pool() -> TrackPool:
    """Three circles of different size and resolution, distinct ids."""
    tracks = [
        circle_track(60.0, 300, 6.0, 11),
        circle_track(80.0, 640, 5.0, 22),
        circle_track(100.0, 500, 7.0, 33),
    ]
    return TrackPool.from_tracks(tracks, level_id=SHORT_LEVEL.level_id, split="test")


@pytest.fixture(scope="session")
def mjx_pool_env(config, short_pool) -> VecCarRacingEnv:
    """Three MJX-Warp worlds on the three-circle pool, 4-step episodes."""
    return VecCarRacingEnv(3, config=config, level=SHORT_LEVEL, backend="mjx_warp", track_pool=short_pool)


@pytest.fixture(scope="session")
def mjx_level0_env(config) -> VecCarRacingEnv:
    """Two MJX-Warp worlds on Level 0's track."""
    return VecCarRacingEnv(2, config=config, level=LEVEL_0, backend="mjx_warp", track=level0_track())


@pytest.fixture()
def cpu_env(config) -> VecCarRacingEnv:
    return VecCarRacingEnv(1, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
