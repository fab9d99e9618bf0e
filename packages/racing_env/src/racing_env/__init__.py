"""``ControllerLearning/CarRacing-v0``: a JAX vector env of a physical
four-wheel MuJoCo car, with NEXT_STEP autoreset on device.

Importing the package registers ``ControllerLearning/CarRacing-v0`` with
Gymnasium (``gymnasium.make`` builds `CarRacingEnv`; ``gymnasium.make_vec``
with ``vectorization_mode="vector_entry_point"`` builds `VecCarRacingEnv`).
"""

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import gymnasium

#: Each public name's module: imported at the name's first use, so that a
#: light module of the package (`racing_env.backend_names`, what a command
#: line's ``--help`` reads) imports neither JAX nor MuJoCo.
_HOMES = {
    "core": "racing_env.core",
    **dict.fromkeys(("LEVEL_0", "LEVEL_1", "Level", "ProjectConfig"), "racing_env.config"),
    **dict.fromkeys(("BatchController", "Controller", "DebugDraw"), "racing_env.controller"),
    "CarRacingEnv": "racing_env.env",
    **dict.fromkeys(("Track", "TrackPool", "level0_track"), "racing_env.tracks"),
    **dict.fromkeys(("BENCHMARK_VERSION", "LEVEL0_TRACK_ID", "TRACK_CAPACITY", "TerminationReason"),
                    "racing_env.types"),
    "VecCarRacingEnv": "racing_env.vector",
}

try:  # the installed distribution's version: pyproject.toml is the one place it is written
    __version__ = version("racing-env")
except PackageNotFoundError:  # a source tree on the path, not installed
    __version__ = "0+unknown"

ENV_ID = "ControllerLearning/CarRacing-v0"

__all__ = [
    "BENCHMARK_VERSION",
    "BatchController",
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


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_HOMES[name])
    value = module if name == "core" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
