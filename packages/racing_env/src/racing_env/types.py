"""The contract's constants and types, in one place: the track capacity
and versions, the termination reasons, the state the env carries
(`EnvState`, `RaceState`), a pool's six arrays (`PoolArrays`, as
`TrackPool.from_arrays` takes them and a pool file holds them), the Race
Core's view of a pool (`TrackArrays`) and the names of the observation and
info fields. Every other module
imports them from here; this module imports nothing of the package.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import jax
import numpy as np

__all__ = ["BENCHMARK_VERSION", "INFO_FIELDS", "LEVEL0_TRACK_ID", "MIN_TRACK_POINTS", "OBSERVATION_FIELDS",
           "POOL_DTYPES", "TRACK_CAPACITY", "EnvState", "PoolArrays", "RaceState", "TerminationReason",
           "TrackArrays"]

TRACK_CAPACITY: int = 640
"""Fixed centerline capacity of the observation (points)."""

LEVEL0_TRACK_ID: int = 2**32 - 1
"""uint32 ``track_id`` reserved for Level 0's built-in track (UINT32_MAX)."""

BENCHMARK_VERSION: str = "0.1"
"""The benchmark version a pool carries unless told otherwise."""

MIN_TRACK_POINTS: int = 8
"""The fewest valid centerline points a Track may have."""

#: Observation fields in the order of the spec's table.
OBSERVATION_FIELDS = (
    "position",
    "yaw",
    "velocity_body",
    "yaw_rate",
    "steering_angle",
    "track_progress",
    "centerline",
    "left_boundary",
    "right_boundary",
    "track_mask",
    "track_length",
)

#: The seven info fields of every reset and step, in the spec's order.
INFO_FIELDS = (
    "episode_seed",
    "controller_seed",
    "track_id",
    "benchmark_version",
    "termination_reason",
    "lap_completed",
    "lap_time_s",
)


class TerminationReason(enum.IntEnum):
    """The values of ``info["termination_reason"]`` (int32 in the arrays;
    a member compares and converts as its int)."""

    NONE = 0
    SUCCESS = 1
    OFF_TRACK = 2
    INVALID_ACTION = 3
    TIMEOUT = 4


class PoolArrays(NamedTuple):
    """A pool's six arrays, named and ordered as ``TrackPool.from_arrays``
    takes them and a pool file holds them (``P`` rows, ``C`` = ``TRACK_CAPACITY``).

    Attributes:
        centerline: float32 [P, C, 2], m.
        left_boundary: float32 [P, C, 2], m.
        right_boundary: float32 [P, C, 2], m.
        track_mask: int8 [P, C], ones on each row's valid prefix.
        track_length: float32 [P], m.
        track_id: uint32 [P].
    """

    centerline: jax.Array
    left_boundary: jax.Array
    right_boundary: jax.Array
    track_mask: jax.Array
    track_length: jax.Array
    track_id: jax.Array


#: Each of ``PoolArrays``'s fields' dtype, in a pool and in its file.
POOL_DTYPES: dict[str, np.dtype] = {
    "centerline": np.dtype(np.float32),
    "left_boundary": np.dtype(np.float32),
    "right_boundary": np.dtype(np.float32),
    "track_mask": np.dtype(np.int8),
    "track_length": np.dtype(np.float32),
    "track_id": np.dtype(np.uint32),
}


class TrackArrays(NamedTuple):
    """A pool's geometry as the Race Core reads it (device arrays).

    Attributes:
        centerline: float32 [P, C, 2], m.
        left_boundary: float32 [P, C, 2], m.
        right_boundary: float32 [P, C, 2], m.
        arc: float32 [P, C], arc length from point 0 to point i along the
            centerline, m.
        num_points: int32 [P], valid points (= segments of the loop).
        track_length: float32 [P], m (the pool's, for the observation).
        lap_m: float32 [P], the centerline's perimeter as the Race Core
            measures it, m.
        start: float32 [P, 3], the start pose (x m, y m, yaw rad): point 0,
            heading along segment 0.
        track_mask: int8 [P, C], for the observation.
        track_id: uint32 [P], for the info.
        windows: float32 [P, C + 2 race.WINDOW + 1, 3, 2], the centerline, left
            and right boundary points unrolled around the loop: entry ``k``
            holds point ``(k - WINDOW) mod n``, so the points of any window
            of segments are one contiguous slice (one gather per world).
    """

    centerline: jax.Array
    left_boundary: jax.Array
    right_boundary: jax.Array
    arc: jax.Array
    num_points: jax.Array
    track_length: jax.Array
    lap_m: jax.Array
    start: jax.Array
    track_mask: jax.Array
    track_id: jax.Array
    windows: jax.Array


class RaceState(NamedTuple):
    """Per-world Race Core state.

    Attributes:
        row: int32 [E], the world's TrackPool row.
        local_segment: int32 [E], the localizer's segment, in [0, n).
        progress_segment: int32 [E], the segment of the last legal
            projection, counted from the start without wrapping, in [0, n]
            (up to n + `racing_env.race.WINDOW` on the call that completes
            the lap: the car may have passed the finish by a few segments).
        progress_m: float32 [E], legal arc length driven this lap, m.
        legal: bool [E], the localizer has stayed within `racing_env.race.WINDOW` segments
            of the last legal projection (or came back into them from behind).
    """

    row: jax.Array
    local_segment: jax.Array
    progress_segment: jax.Array
    progress_m: jax.Array
    legal: jax.Array


class EnvState(NamedTuple):
    """Every world's Challenge state (device arrays; E worlds).

    Attributes:
        race: the Race Core state.
        root_seed: uint32 [], the root of every seed.
        world: uint32 [E], world indices.
        episode: uint32 [E], episode counters (0 after a seeded reset).
        episode_seed: uint32 [E], SeedSequence domain 0 of the episode.
        controller_seed: uint32 [E], SeedSequence domain 1 of the episode.
        steps: int32 [E], control steps taken this episode.
        pending: bool [E], the last call was terminal: the next call resets.
        clipped: int32 [E], finite out-of-range actions clipped so far.
    """

    race: RaceState
    root_seed: jax.Array
    world: jax.Array
    episode: jax.Array
    episode_seed: jax.Array
    controller_seed: jax.Array
    steps: jax.Array
    pending: jax.Array
    clipped: jax.Array
