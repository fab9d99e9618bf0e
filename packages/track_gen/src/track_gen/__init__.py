"""Procedural race courses in NVIDIA Warp: generation, validity checks, bakes,
masked per-env regeneration and the runtime step.

The public API is re-exported here (``__all__``); the modules the docs name
(``track_gen.course``, ``track_gen.pipeline.presets``, ``track_gen.exec``,
``track_gen.checks``, ``track_gen.seeds``, ``track_gen.queries``, ...) stay
importable as they are. Importing ``track_gen`` never imports torch or JAX:
the interop lives in ``track_gen.interop.torch`` and ``track_gen.interop.jax``
and is imported only by those who use it.
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from track_gen import checks, exec, queries
from track_gen.checks import PARAM_RANGES, describe
from track_gen.course import Course
from track_gen.errors import CaptureError
from track_gen.generator import GateGenerator, TrackGenerator
from track_gen.pipeline import presets
from track_gen.queries import QueryResult, distance, nearest, normal, query
from track_gen.result import GateResult, TrackResult
from track_gen.runtime import DiscContact, Events, Frame, FrameContact, Runtime, StepResult, TrackContacts
from track_gen.seeds import PerEnvSeededRNG, effective_seed
from track_gen.spec import GateSpec, TrackSpec


def _version() -> str:
    """The installed distribution's version; in a source tree on the path
    (not installed), the one its pyproject.toml declares."""
    try:
        return version("track-gen")
    except PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


__version__ = _version()

__all__ = [
    "CaptureError",
    "Course",
    "DiscContact",
    "Events",
    "Frame",
    "FrameContact",
    "GateGenerator",
    "GateResult",
    "GateSpec",
    "PARAM_RANGES",
    "PerEnvSeededRNG",
    "QueryResult",
    "Runtime",
    "StepResult",
    "TrackContacts",
    "TrackGenerator",
    "TrackResult",
    "TrackSpec",
    "checks",
    "describe",
    "distance",
    "effective_seed",
    "exec",
    "nearest",
    "normal",
    "presets",
    "queries",
    "query",
]
