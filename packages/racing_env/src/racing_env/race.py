"""The Race Core: lap progress and track limits, in pure JAX.

A track of ``n`` valid points is a closed loop of ``n`` segments; segment
``i`` joins point ``i`` to point ``(i + 1) mod n``, and its quad
``(left_i, left_i+1, right_i+1, right_i)`` is the road beside it.

- The localizer follows each car: its segment is the one nearest the rear
  axle among the `WINDOW` segments on either side of the last one, so it
  follows the car both ways.
- Legal progress: the rear axle's projection on the localizer's segment
  counts when that segment lies within `WINDOW` segments ahead of the last
  legal projection, the car is on the road (not off track, below) and the
  car is *legal*: its localizer has stayed within `WINDOW` segments of the
  last legal projection (ahead or behind); once it leaves that band it earns
  nothing until it comes back into the band from behind. So progress never decreases, and
  driving backwards (even a whole lap round to the front of the progress
  point), across the grass, or more than `WINDOW` segments in one control
  step earns nothing. `track_progress` is the legal arc length over the
  centerline's perimeter; a lap is complete when it reaches the perimeter.
- Off track: a car is off track when the ground point under any of its four
  wheel centres (`car.wheel_points`) is outside every quad of the
  `WINDOW` segments on either side of the localizer's segment.

So a car may move at most `WINDOW` segments in one control step, the window
must reach every wheel, and ahead and behind must not overlap:
`VecCarRacingEnv` refuses tracks whose shortest segment is below
`min_segment_length` or which have fewer than `MIN_POINTS` points.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp

from racing_env import geometry
from racing_env.config import ProjectConfig
from racing_env.types import RaceState, TrackArrays

__all__ = [
    "WINDOW",
    "MIN_POINTS",
    "track_arrays",
    "min_segment_length",
    "race_reset",
    "race_update",
    "points_on_track",
]

#: Segments searched on each side of the last localizer segment, and ahead of
#: the last legal projection.
WINDOW = 16
#: Fewest points (= segments) a track needs so the windows ahead and behind
#: the progress point never overlap.
MIN_POINTS = 2 * WINDOW + 2
#: Points of a window of 2 WINDOW + 1 segments.
_SPAN = 2 * WINDOW + 2


def track_arrays(centerline, left_boundary, right_boundary, track_mask, track_length, track_id) -> TrackArrays:
    """Derive the Race Core's arrays from a pool's (on its device, in JAX).

    Args:
        centerline, left_boundary, right_boundary: float32 [P, C, 2], m.
        track_mask: int8 [P, C], a prefix of ones.
        track_length: float32 [P], m.
        track_id: uint32 [P].
    """
    num_points = jnp.sum(track_mask.astype(jnp.int32), axis=1)
    _, seg = geometry.loop_segments(jnp, centerline, num_points)  # the closing segment joins the last point to 0
    arc = jnp.concatenate([jnp.zeros_like(seg[:, :1]), jnp.cumsum(seg, axis=1)[:, :-1]], axis=1)
    d = centerline[:, 1] - centerline[:, 0]
    k = jnp.arange(centerline.shape[1] + _SPAN - 1)
    unrolled = jnp.mod(k[None, :] - WINDOW, num_points[:, None])
    points = jnp.stack([centerline, left_boundary, right_boundary], axis=2)
    windows = jnp.take_along_axis(points, unrolled[:, :, None, None], axis=1)
    start = jnp.stack([centerline[:, 0, 0], centerline[:, 0, 1], jnp.arctan2(d[:, 1], d[:, 0])], axis=1)
    return TrackArrays(
        centerline=centerline,
        left_boundary=left_boundary,
        right_boundary=right_boundary,
        arc=arc,
        num_points=num_points,
        track_length=track_length,
        lap_m=jnp.sum(seg, axis=1),
        start=start,
        track_mask=track_mask,
        track_id=track_id,
        windows=windows,
    )


def min_segment_length(config: ProjectConfig) -> float:
    """Shortest centerline segment the Race Core accepts, m: `WINDOW`
    segments on either side must reach the farthest wheel, with the same
    again to spare for the localizer's step."""
    reach = (config.wheelbase_m**2 + (config.track_width_m / 2) ** 2) ** 0.5
    return 2.0 * reach / WINDOW


def _window(tracks: TrackArrays, row: jax.Array, segment: jax.Array) -> jax.Array:
    """Points of the 2 WINDOW + 1 segments centred on `segment` [E] (taken
    modulo n): float32 [E, 2 WINDOW + 2, 3, 2] (centerline, left, right)."""
    start = jnp.mod(segment, tracks.num_points[row])

    def one(r, first):
        return jax.lax.dynamic_slice_in_dim(tracks.windows[r], first, _SPAN, axis=0)

    return jax.vmap(one)(row, start)


def _project(a: jax.Array, b: jax.Array, p: jax.Array):
    """Projection of p [E, 1, 2] on segments a->b [E, K, 2]: (t in [0, 1], squared distance)."""
    ab = b - a
    denom = jnp.maximum(jnp.sum(ab * ab, axis=-1), 1e-12)
    t = jnp.clip(jnp.sum((p - a) * ab, axis=-1) / denom, 0.0, 1.0)
    q = a + t[..., None] * ab
    return t, jnp.sum((q - p) ** 2, axis=-1)


def race_reset(row: jax.Array) -> RaceState:
    """The Race Core state of cars standing at their tracks' start (row: int32 [E])."""
    zeros = jnp.zeros_like(row)
    return RaceState(
        row=row,
        local_segment=zeros,
        progress_segment=zeros,
        progress_m=jnp.zeros(row.shape, jnp.float32),
        legal=jnp.ones(row.shape, bool),
    )


def points_on_track(tracks: TrackArrays, row: jax.Array, segment: jax.Array, points: jax.Array) -> jax.Array:
    """Whether each point lies in one of the quads of the `WINDOW` segments
    on either side of `segment`.

    Args:
        row: int32 [E]. segment: int32 [E] (taken modulo n). points:
        float32 [E, M, 2], m.

    Returns:
        bool [E, M].
    """
    return _on_quads(_window(tracks, row, segment), points)


def _crossings(start: jax.Array, end: jax.Array, points: jax.Array) -> jax.Array:
    """int32 [E, M, K]: whether the ray from each point [E, M, 2] towards +x
    crosses each edge start -> end [E, K, 2] (half-open in y)."""
    p = points[:, :, None, :]
    a, b = start[:, None], end[:, None]
    straddles = (a[..., 1] > p[..., 1]) != (b[..., 1] > p[..., 1])
    dy = jnp.where(b[..., 1] == a[..., 1], 1.0, b[..., 1] - a[..., 1])
    x_cross = a[..., 0] + (p[..., 1] - a[..., 1]) * (b[..., 0] - a[..., 0]) / dy
    return (straddles & (p[..., 0] < x_cross)).astype(jnp.int32)


def _on_quads(window: jax.Array, points: jax.Array) -> jax.Array:
    """Even-odd test of points [E, M, 2] against each quad
    (left_i, left_i+1, right_i+1, right_i) of a window [E, K + 1, 3, 2];
    True where some quad holds the point. Neighbouring quads share their
    seam edge (left_i, right_i), so each edge is tested once."""
    left, right = window[:, :, 1], window[:, :, 2]
    along_left = _crossings(left[:, :-1], left[:, 1:], points)
    along_right = _crossings(right[:, :-1], right[:, 1:], points)
    seams = _crossings(left, right, points)
    crossings = along_left + along_right + seams[..., :-1] + seams[..., 1:]
    return jnp.any(crossings % 2 == 1, axis=-1)


def race_update(tracks: TrackArrays, race: RaceState, position: jax.Array, wheels: jax.Array):
    """Advance the Race Core after a control step.

    Args:
        tracks: the pool's arrays.
        race: the state before the step.
        position: float32 [E, 2], the rear axle after the step, m.
        wheels: float32 [E, 4, 2], the wheel ground points after the step, m.

    Returns:
        (race, track_progress float32 [E] in [0, 1], off_track bool [E],
        lap_done bool [E]).
    """
    row = race.row
    n = tracks.num_points[row]
    lap = tracks.lap_m[row]

    line = _window(tracks, row, race.local_segment)[:, :, 0]     # [E, 2 WINDOW + 2, 2]
    a, b = line[:, :-1], line[:, 1:]
    t, dist2 = _project(a, b, position[:, None, :])
    best = jnp.argmin(dist2, axis=1)
    local_segment = jnp.mod(race.local_segment + best - WINDOW, n)
    local_t = jnp.take_along_axis(t, best[:, None], axis=1)[:, 0]
    local_len = jnp.linalg.norm(jnp.take_along_axis(b - a, best[:, None, None], axis=1)[:, 0], axis=-1)

    off_track = ~jnp.all(points_on_track(tracks, row, local_segment, wheels), axis=1)
    ahead = jnp.mod(local_segment - race.progress_segment, n)
    is_ahead = ahead <= WINDOW
    is_behind = ahead >= n - WINDOW
    legal = (is_ahead | is_behind) & (race.legal | is_behind)
    segment = race.progress_segment + ahead
    laps = (segment // n).astype(jnp.float32)
    candidate = tracks.arc[row, local_segment] + local_t * local_len + laps * lap
    advanced = legal & is_ahead & ~off_track & (candidate > race.progress_m)
    progress_m = jnp.where(advanced, candidate, race.progress_m)
    progress_segment = jnp.where(advanced, segment, race.progress_segment)
    lap_done = progress_m >= lap
    track_progress = jnp.clip(progress_m / lap, 0.0, 1.0)
    race = RaceState(
        row=row, local_segment=local_segment, progress_segment=progress_segment, progress_m=progress_m, legal=legal
    )
    return race, track_progress, off_track, lap_done
