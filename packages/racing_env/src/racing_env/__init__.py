"""``ControllerLearning/CarRacing-v0``: a JAX vector env of a physical
four-wheel MuJoCo car, with NEXT_STEP autoreset on device.

Importing the package registers ``ControllerLearning/CarRacing-v0`` with
Gymnasium (``gymnasium.make`` builds `CarRacingEnv`; ``gymnasium.make_vec``
with ``vectorization_mode="vector_entry_point"`` builds `VecCarRacingEnv`).
"""

from importlib.metadata import PackageNotFoundError, version

import gymnasium

from racing_env import core
from racing_env.config import LEVEL_0, LEVEL_1, Level, ProjectConfig
from racing_env.controller import Controller, DebugDraw
from racing_env.env import CarRacingEnv
from racing_env.tracks import Track, TrackPool, level0_track
from racing_env.types import BENCHMARK_VERSION, LEVEL0_TRACK_ID, TRACK_CAPACITY, TerminationReason
from racing_env.vector import VecCarRacingEnv

try:  # the installed distribution's version: pyproject.toml is the one place it is written
    __version__ = version("racing-env")
except PackageNotFoundError:  # a source tree on the path, not installed
    __version__ = "0+unknown"

ENV_ID = "ControllerLearning/CarRacing-v0"

__all__ = [
    "BENCHMARK_VERSION",
    "CarRacingEnv",
    "Controller",
    "DebugDraw",
    "ENV_ID",
    "LEVEL0_TRACK_ID",
    "LEVEL_0",
    "LEVEL_1",
    "Level",
    "ProjectConfig",
    "TRACK_CAPACITY",
    "TerminationReason",
    "Track",
    "TrackPool",
    "VecCarRacingEnv",
    "core",
    "level0_track",
]

if ENV_ID not in gymnasium.registry:
    gymnasium.register(
        id=ENV_ID,
        entry_point="racing_env.env:CarRacingEnv",
        vector_entry_point="racing_env.vector:VecCarRacingEnv",
        disable_env_checker=True,
    )
