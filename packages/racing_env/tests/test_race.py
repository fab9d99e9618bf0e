"""racing_env.race, the Race Core, held to the rules of its module docstring.

Every geometric expectation comes from an independent NumPy (float64) oracle
written in this file, never from the library's own routine:

- on the road = inside exactly one of the two closed boundary loops, by a
  winding-number test over each whole loop (not the Race Core's quads);
- projections = brute force over centerline segments.

Each jitted function is compiled once: one call of `points_on_track` for every
scattered point of every track, one `lax.scan` of `race_update` for every
trajectory, one fixed-size single step of `race_update` for the car
placements.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import car
from racing_env.config import ProjectConfig
from racing_env.race import (
    MIN_POINTS,
    WINDOW,
    min_segment_length,
    points_on_track,
    race_reset,
    race_update,
    track_arrays,
)
from racing_env.tracks import Track, TrackPool, level0_track
from racing_env.types import LEVEL0_TRACK_ID, TRACK_CAPACITY, RaceState

CONFIG = ProjectConfig()
#: Points closer than this to a boundary edge or a seam (left_i -> right_i) are not judged, m.
AMBIGUOUS_M = 1e-3
#: float32 arc lengths of a lap below ~1 km against float64 (measured ~6e-5 m on Level 0), m.
ARC_ATOL_M = 5e-4
#: Projections on two segments whose distances differ by less than this are a tie for float32, m.
TIE_M = 5e-5
#: No lap-completion check is made within this arc distance of the lap line (30x the
#: float32 arc error), m.
LAP_MARGIN_M = 2e-3
#: Steps of every trajectory (the scan length); shorter ones stand still at their end.
STEPS = 801
#: Worlds of the fixed-size single-step call.
SINGLE_STEP_WORLDS = 3001


# --------------------------------------------------------------------------- NumPy oracles


def _chunks(m: int, size: int = 384):
    for start in range(0, m, size):
        yield slice(start, min(m, start + size))


def oracle_winding_number(points: np.ndarray, loop: np.ndarray) -> np.ndarray:
    """Winding number [M] of the closed polygon loop [n, 2] around points [M, 2] (float64)."""
    a = loop
    b = np.roll(loop, -1, axis=0)
    out = np.empty(points.shape[0], np.int64)
    for sl in _chunks(points.shape[0]):
        px, py = points[sl, 0:1], points[sl, 1:2]
        cross = (b[:, 0] - a[:, 0]) * (py - a[:, 1]) - (px - a[:, 0]) * (b[:, 1] - a[:, 1])
        upward = (a[:, 1] <= py) & (b[:, 1] > py) & (cross > 0)
        downward = (a[:, 1] > py) & (b[:, 1] <= py) & (cross < 0)
        out[sl] = upward.sum(axis=1) - downward.sum(axis=1)
    return out


def oracle_on_road(points: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """bool [M]: inside exactly one of the two boundary loops."""
    return (oracle_winding_number(points, left) != 0) != (oracle_winding_number(points, right) != 0)


def _segment_distance2(points: np.ndarray, a: np.ndarray, b: np.ndarray):
    """Squared distance [M, K] and parameter t [M, K] of points [M, 2] to segments a_k -> b_k [K, 2]."""
    abx, aby = b[:, 0] - a[:, 0], b[:, 1] - a[:, 1]
    apx, apy = points[:, 0:1] - a[:, 0], points[:, 1:2] - a[:, 1]
    t = np.clip((apx * abx + apy * aby) / (abx * abx + aby * aby), 0.0, 1.0)
    dx, dy = apx - t * abx, apy - t * aby
    return dx * dx + dy * dy, t


def oracle_nearest_segment(points: np.ndarray, a: np.ndarray, b: np.ndarray):
    """Brute force over segments a_k -> b_k [K, 2]: (distance [M], index [M], t [M])."""
    dist = np.empty(points.shape[0])
    index = np.empty(points.shape[0], np.int64)
    t_best = np.empty(points.shape[0])
    for sl in _chunks(points.shape[0]):
        d2, t = _segment_distance2(points[sl], a, b)
        k = np.argmin(d2, axis=1)
        rows = np.arange(k.size)
        dist[sl], index[sl], t_best[sl] = np.sqrt(d2[rows, k]), k, t[rows, k]
    return dist, index, t_best


def oracle_min_distance(points: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance [M] from each point to the nearest of the segments a_k -> b_k [K, 2]."""
    out = np.empty(points.shape[0])
    for sl in _chunks(points.shape[0]):
        out[sl] = np.sqrt(_segment_distance2(points[sl], a, b)[0].min(axis=1))
    return out


@dataclasses.dataclass(frozen=True)
class Geometry:
    """One pool row on the host, in float64 from the stored float32 values."""

    row: int
    n: int
    centerline: np.ndarray  # [n, 2], m
    left: np.ndarray  # [n, 2], m
    right: np.ndarray  # [n, 2], m
    half_width: np.ndarray  # [n], m
    seg_len: np.ndarray  # [n], segment i = point i -> point (i + 1) mod n, m
    arc: np.ndarray  # [n], arc length from point 0 to point i, m
    perimeter: float  # m
    track_length: float  # the stored float32 value, m

    def half_width_at(self, s: np.ndarray) -> np.ndarray:
        """Half-width interpolated along the centerline at arc s (mod the perimeter), m."""
        return np.interp(np.mod(s, self.perimeter), np.append(self.arc, self.perimeter),
                         np.append(self.half_width, self.half_width[0]))

    @property
    def seg_end(self) -> np.ndarray:
        return np.roll(self.centerline, -1, axis=0)

    def on_road(self, points: np.ndarray) -> np.ndarray:
        return oracle_on_road(points, self.left, self.right)

    def clearance(self, points: np.ndarray) -> np.ndarray:
        """Distance [M] to the nearest boundary edge or seam edge, m."""
        edges_a = np.concatenate([self.left, self.right, self.left])
        edges_b = np.concatenate([np.roll(self.left, -1, axis=0), np.roll(self.right, -1, axis=0), self.right])
        return oracle_min_distance(points, edges_a, edges_b)

    def nearest(self, points: np.ndarray):
        """(distance, segment, arc of the projection) over every centerline segment."""
        dist, k, t = oracle_nearest_segment(points, self.centerline, self.seg_end)
        return dist, k, self.arc[k] + t * self.seg_len[k]

    def distance_to(self, points: np.ndarray, segment: np.ndarray) -> np.ndarray:
        """Distance [M] from each point to its own centerline segment `segment` [M], m."""
        a, b = self.centerline[segment], self.seg_end[segment]
        ab = b - a
        t = np.clip(np.sum((points - a) * ab, -1) / np.sum(ab * ab, -1), 0.0, 1.0)
        return np.linalg.norm(a + t[:, None] * ab - points, axis=-1)

    def at_arc(self, s: np.ndarray, lateral: np.ndarray | float = 0.0):
        """Points on the centerline polyline at arc s (mod the perimeter), moved
        `lateral` m along the segment's left normal; and the segment's heading."""
        s = np.mod(np.asarray(s, np.float64), self.perimeter)
        i = np.clip(np.searchsorted(self.arc, s, side="right") - 1, 0, self.n - 1)
        a, b = self.centerline[i], self.seg_end[i]
        u = (b - a) / self.seg_len[i][..., None]
        normal = np.stack([-u[..., 1], u[..., 0]], axis=-1)
        t = ((s - self.arc[i]) / self.seg_len[i])[..., None]
        points = a + t * (b - a) + np.asarray(lateral, np.float64)[..., None] * normal
        return points, np.arctan2(u[..., 1], u[..., 0]), i


def oracle_circumradius(points: np.ndarray) -> np.ndarray:
    """Radius of the circle through each point and its two neighbours (closed loop), m."""
    b = points
    a, c = np.roll(b, 1, axis=0), np.roll(b, -1, axis=0)
    ab, bc, ca = (np.linalg.norm(u - v, axis=1) for u, v in ((a, b), (b, c), (c, a)))
    twice_area = np.abs((b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0]))
    with np.errstate(divide="ignore"):
        return ab * bc * ca / (2.0 * twice_area)


def oracle_is_simple(loop: np.ndarray) -> bool:
    """No two non-adjacent edges of the closed polygon loop [n, 2] touch or cross."""
    a, b = loop, np.roll(loop, -1, axis=0)

    def orient(p, q, r):  # sign of the turn p -> q -> r, [n, n]
        return np.sign((q[:, None, 0] - p[:, None, 0]) * (r[None, :, 1] - p[:, None, 1])
                       - (q[:, None, 1] - p[:, None, 1]) * (r[None, :, 0] - p[:, None, 0]))

    crossing = (orient(a, b, a) * orient(a, b, b) <= 0) & (orient(a, b, a).T * orient(a, b, b).T <= 0)
    n = len(loop)
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    adjacent = (i == j) | ((i + 1) % n == j) | ((j + 1) % n == i)
    return not np.any(crossing & ~adjacent)


def oracle_wheels(position: np.ndarray, yaw: np.ndarray) -> np.ndarray:
    """[M, 4, 2] ground points under FL, FR, RL, RR: body x forward, y left, origin at the rear axle."""
    h = CONFIG.track_width_m / 2
    local = np.array([[CONFIG.wheelbase_m, h], [CONFIG.wheelbase_m, -h], [0.0, h], [0.0, -h]])
    c, s = np.cos(yaw)[:, None], np.sin(yaw)[:, None]
    x = position[:, None, 0] + c * local[:, 0] - s * local[:, 1]
    y = position[:, None, 1] + s * local[:, 0] + c * local[:, 1]
    return np.stack([x, y], axis=-1)


def oracle_progress(geoms, rows, segment0, progress0, positions, previous, wheels_on_road):
    """The legal-progress rule of race.py, one step at a time, by brute force:

    - the car's segment is the nearest of all the track's segments;
    - it is *ahead* when it lies 0..WINDOW segments past the last legal
      projection's, *behind* when 1..WINDOW before it; the car stays legal
      while ahead or behind, loses it otherwise, and regains it only from
      behind;
    - a legal car ahead with all four wheels on the road (the polygon
      oracle) moves progress to its projection's arc if that is larger,
      laps counted by the unwrapped segment index.

    Each step starts from `previous`, the progress the code under test held
    before it, so a float32 near-tie (two segments within TIE_M of the
    nearest, projecting to different arcs) admits either projection without
    the bounds drifting apart for the rest of the trajectory.

    Args: rows [E]; segment0 [E] int, progress0 [E] m; positions [T, E, 2];
    previous [T, E] m; wheels_on_road [T, E] bool.
    Returns: (low, high) bounds of progress_m after each step, [T, E], m.
    """
    e = len(rows)
    length = np.array([geoms[r].track_length for r in rows])
    seg = np.array(segment0, np.int64)
    best = np.array(progress0, np.float64)
    legal = np.ones(e, bool)
    low = np.empty(positions.shape[:2])
    high = np.empty(positions.shape[:2])
    for t in range(positions.shape[0]):
        for w, r in enumerate(rows):
            g = geoms[r]
            a, b = g.centerline, np.roll(g.centerline, -1, axis=0)
            ab = b - a
            p = positions[t, w]
            tt = np.clip(np.sum((p - a) * ab, -1) / np.sum(ab * ab, -1), 0.0, 1.0)
            dist = np.linalg.norm(a + tt[:, None] * ab - p, axis=-1)
            ahead = (np.arange(g.n) - seg[w]) % g.n
            unwrapped = seg[w] + ahead
            arcs = g.arc + tt * np.linalg.norm(ab, axis=-1) + (unwrapped // g.n) * length[w]
            is_ahead = ahead <= WINDOW
            is_behind = ahead >= g.n - WINDOW
            near = dist <= dist.min() + TIE_M
            stays = (is_ahead | is_behind) & (legal[w] | is_behind)
            credit = stays & is_ahead & wheels_on_road[t, w]
            options = [max(previous[t, w], arcs[k]) if credit[k] else previous[t, w] for k in np.flatnonzero(near)]
            low[t, w], high[t, w] = min(options), max(options)
            k = int(np.argmin(dist))
            legal[w] = bool(stays[k])
            if credit[k] and arcs[k] > best[w]:
                best[w], seg[w] = arcs[k], unwrapped[k]
    return low, high


# --------------------------------------------------------------------------- tracks


def polar_centerline(seed: int, n: int, r0: float, amplitude: float, clockwise: bool) -> np.ndarray:
    """A smooth closed polar curve r = r0 (1 + sum_k a_k cos(k theta + phi_k)), k = 2..5,
    resampled to n points equally spaced in arc length (float64)."""
    rng = np.random.default_rng(seed)
    ks = np.arange(2, 6)
    a = amplitude * rng.uniform(0.3, 1.0, ks.size) / ks**2
    phi = rng.uniform(0.0, 2 * np.pi, ks.size)
    theta = np.linspace(0.0, 2 * np.pi, 1 << 15, endpoint=False)
    r = r0 * (1.0 + np.sum(a[:, None] * np.cos(ks[:, None] * theta + phi[:, None]), axis=0))
    dense = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)
    closed = np.vstack([dense, dense[:1]])
    s = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(closed, axis=0), axis=1))])
    targets = s[-1] * np.arange(n) / n
    points = np.stack([np.interp(targets, s, closed[:, 0]), np.interp(targets, s, closed[:, 1])], axis=1)
    return points[::-1].copy() if clockwise else points


def tight_centerline() -> np.ndarray:
    """301 points whose segments all equal min_segment_length (to 1 %): the
    shortest the Race Core accepts, so WINDOW segments are the least reach."""
    shape = polar_centerline(41, 301, 1.0, 0.4, clockwise=False)
    chords = np.linalg.norm(np.roll(shape, -1, axis=0) - shape, axis=1)
    # float32 storage moves a chord by ~1e-5 relative: scale a hair above the minimum.
    return shape * (min_segment_length(CONFIG) * (1 + 1e-4) / chords.min())


#: The pool's rows, in order.
TRACK_NAMES = ("level0", "coarse64", "cw300-varied-width", "fine640", "tight301", "circle-min")


def _make_track(name: str, track_id: int) -> Track:
    if name == "level0":
        return level0_track()
    if name == "coarse64":
        return Track.from_centerline(polar_centerline(11, 64, 70.0, 0.5, clockwise=False), 7.0, track_id)
    if name == "cw300-varied-width":
        width = 6.0 + 2.0 * np.sin(2 * np.pi * 3 * np.arange(300) / 300 + 0.4)
        return Track.from_centerline(polar_centerline(23, 300, 90.0, 0.6, clockwise=True), width, track_id)
    if name == "fine640":
        return Track.from_centerline(polar_centerline(37, 640, 110.0, 0.6, clockwise=False), 5.0, track_id)
    if name == "tight301":
        return Track.from_centerline(tight_centerline(), 5.0, track_id)
    # The fewest points the Race Core accepts: the windows ahead and behind just miss each other.
    theta = 2 * np.pi * np.arange(MIN_POINTS) / MIN_POINTS
    return Track.from_centerline(np.stack([60 * np.cos(theta), 60 * np.sin(theta)], axis=1), 6.0, track_id)


ROW = {name: i for i, name in enumerate(TRACK_NAMES)}
#: The rows that meet the brief of a normal track (more points than the progress window).
DRIVE_ROWS = [ROW[name] for name in ("level0", "coarse64", "cw300-varied-width", "fine640", "tight301")]


@pytest.fixture(scope="module")
def tracks():
    """(list of Track, TrackArrays of their pool from one jitted track_arrays, list of Geometry)."""
    made = [_make_track(name, i) for i, name in enumerate(TRACK_NAMES)]
    pool = TrackPool.from_tracks(made, level_id=0, split="fixed")
    arrays = jax.jit(track_arrays)(pool.centerline, pool.left_boundary, pool.right_boundary,
                                   pool.track_mask, pool.track_length, pool.track_id)
    geoms = []
    for row, track in enumerate(made):
        n = track.num_points
        c = np.asarray(track.centerline[:n], np.float64)
        left = np.asarray(track.left_boundary[:n], np.float64)
        seg_len = np.linalg.norm(np.roll(c, -1, axis=0) - c, axis=1)
        geoms.append(Geometry(
            row=row, n=n, centerline=c, left=left,
            right=np.asarray(track.right_boundary[:n], np.float64),
            half_width=np.linalg.norm(left - c, axis=1), seg_len=seg_len,
            arc=np.concatenate([[0.0], np.cumsum(seg_len)[:-1]]),
            perimeter=float(np.sum(seg_len)), track_length=float(track.track_length)))
    return made, arrays, geoms


def test_test_tracks_are_smooth_closed_loops(tracks):
    """Precondition of every oracle comparison: the boundaries do not fold
    (radius of curvature above twice the half-width) and the loops are simple."""
    _, _, geoms = tracks
    for g in geoms:
        radius = oracle_circumradius(g.centerline)
        assert radius.min() > 2 * g.half_width.max(), TRACK_NAMES[g.row]
        for loop in (g.left, g.right, g.centerline):
            assert oracle_is_simple(loop), TRACK_NAMES[g.row]
        # Nested: the whole left loop on one side of the right one (inside exactly one of them).
        inside = oracle_winding_number(g.left, g.right) != 0
        outside = oracle_winding_number(g.right, g.left) != 0
        assert inside.all() != outside.all() and not (inside.any() and outside.any())
    tight = geoms[ROW["tight301"]]
    assert tight.seg_len.min() >= min_segment_length(CONFIG)
    assert tight.seg_len.max() <= 1.01 * min_segment_length(CONFIG)
    assert [g.n for g in geoms] == [640, 64, 300, 640, 301, MIN_POINTS]


# --------------------------------------------------------------------------- track_arrays, race_reset


def test_track_arrays_against_float64(tracks):
    made, arrays, geoms = tracks
    assert arrays.arc.dtype == jnp.float32 and arrays.arc.shape == (len(made), TRACK_CAPACITY)
    assert arrays.num_points.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(arrays.num_points), [g.n for g in geoms])
    for track, g in zip(made, geoms):
        r = g.row
        arc = np.asarray(arrays.arc[r], np.float64)
        np.testing.assert_allclose(arc[: g.n], g.arc, rtol=0, atol=ARC_ATOL_M)
        assert arc[0] == 0.0
        # The prefix ends with the segment into the last valid point, not into padding.
        np.testing.assert_allclose(arc[g.n - 1] + g.seg_len[-1], g.track_length, rtol=0, atol=ARC_ATOL_M)
        start = np.asarray(arrays.start[r], np.float64)
        assert start[0] == track.centerline[0, 0] and start[1] == track.centerline[0, 1]
        d = g.centerline[1] - g.centerline[0]
        assert abs(start[2] - math.atan2(d[1], d[0])) < 1e-6
        for name in ("centerline", "left_boundary", "right_boundary", "track_mask"):
            np.testing.assert_array_equal(np.asarray(getattr(arrays, name)[r]), getattr(track, name))
        assert np.asarray(arrays.track_length[r]) == track.track_length
        assert np.asarray(arrays.track_id[r]) == track.track_id
    assert int(arrays.track_id[ROW["level0"]]) == LEVEL0_TRACK_ID


def test_race_reset_stands_at_the_start(tracks):
    _, arrays, _ = tracks
    row = jnp.asarray([5, 0, 3, 3, 1], jnp.int32)
    race = race_reset(row)
    np.testing.assert_array_equal(np.asarray(race.row), np.asarray(row))
    for field in (race.local_segment, race.progress_segment, race.progress_m):
        assert field.shape == row.shape and not np.any(np.asarray(field))
    assert race.progress_m.dtype == jnp.float32


def test_wheel_points_follow_the_body_frame():
    """The off-track rule's points: FL, FR, RL, RR at (wheelbase, +-track/2) in the
    body frame (x forward, y left) of the rear axle."""
    rng = np.random.default_rng(5)
    position = rng.uniform(-300, 300, (37, 2)).astype(np.float32)
    yaw = rng.uniform(-np.pi, np.pi, 37).astype(np.float32)
    got = np.asarray(car.wheel_points(CONFIG, jnp.asarray(position), jnp.asarray(yaw)))
    expected = oracle_wheels(position.astype(np.float64), yaw.astype(np.float64))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


# --------------------------------------------------------------------------- points_on_track


def _scatter(g: Geometry, rng: np.random.Generator):
    """Points around one track: (points [M, 2], kind [M])."""
    lo, hi = g.right.min(axis=0), g.right.max(axis=0)
    lo, hi = np.minimum(lo, g.left.min(axis=0)) - 15.0, np.maximum(hi, g.left.max(axis=0)) + 15.0
    extent = float(np.max(hi - lo))
    parts = {}
    parts["box"] = rng.uniform(lo, hi, (1501, 2))
    angle = rng.uniform(0, 2 * np.pi, 101)
    parts["far"] = g.centerline.mean(axis=0) + rng.uniform(2, 10, 101)[:, None] * extent * np.stack(
        [np.cos(angle), np.sin(angle)], axis=1)
    parts["centerline"] = g.at_arc(rng.uniform(0, g.perimeter, 301))[0]
    s = rng.uniform(0, g.perimeter, 1201)
    width = g.half_width_at(s)
    parts["across"] = g.at_arc(s, rng.uniform(-1.3, 1.3, s.size) * width)[0]
    # 5 cm either side of each boundary, along each edge's normal.
    for side, loop in (("left", g.left), ("right", g.right)):
        k = rng.integers(0, g.n, 601)
        a, b = loop[k], np.roll(loop, -1, axis=0)[k]
        u = (b - a) / np.linalg.norm(b - a, axis=1, keepdims=True)
        normal = np.stack([-u[:, 1], u[:, 0]], axis=1)
        base = a + rng.uniform(0, 1, (k.size, 1)) * (b - a)
        parts[f"{side}+5cm"] = base + 0.05 * normal
        parts[f"{side}-5cm"] = base - 0.05 * normal
    points = np.concatenate(list(parts.values())).astype(np.float32).astype(np.float64)
    kind = np.concatenate([np.full(len(v), name) for name, v in parts.items()])
    return points, kind


@pytest.fixture(scope="module")
def scattered(tracks):
    """Every track's scattered points judged by one jitted points_on_track call,
    each point with its own world whose localizer segment is the point's nearest
    centerline segment (brute force). Per row: (points, kind, got, expected, judged)."""
    _, arrays, geoms = tracks
    rng = np.random.default_rng(20240611)
    per_row = [_scatter(g, rng) for g in geoms]
    rows = np.concatenate([np.full(len(p), g.row) for g, (p, _) in zip(geoms, per_row)])
    segment = np.concatenate([g.nearest(p)[1] for g, (p, _) in zip(geoms, per_row)])
    points = np.concatenate([p for p, _ in per_row])
    got = np.asarray(jax.jit(points_on_track)(
        arrays, jnp.asarray(rows, jnp.int32), jnp.asarray(segment, jnp.int32),
        jnp.asarray(points[:, None, :], jnp.float32)))
    assert got.shape == (points.shape[0], 1) and got.dtype == bool
    out, start = {}, 0
    for g, (p, kind) in zip(geoms, per_row):
        out[g.row] = (p, kind, got[start:start + len(p), 0], g.on_road(p), g.clearance(p) >= AMBIGUOUS_M)
        start += len(p)
    return out


@pytest.mark.parametrize("name", TRACK_NAMES)
def test_points_on_track_agrees_with_polygon_oracle(scattered, name):
    points, kind, got, expected, judged = scattered[ROW[name]]
    assert judged.mean() > 0.97  # the ambiguous band is thin
    assert 0.1 < expected[judged].mean() < 0.9  # both classes are well represented
    bad = np.flatnonzero(judged & (got != expected))
    assert bad.size == 0, (f"{bad.size} disagreements, e.g. point {points[bad[0]].tolist()} "
                           f"({kind[bad[0]]}): points_on_track {bool(got[bad[0]])}, oracle {bool(expected[bad[0]])}")
    # The named families land where they must.
    assert expected[kind == "centerline"].all() and got[kind == "centerline"].all()
    assert not expected[kind == "far"].any() and not got[kind == "far"].any()
    for side in ("left", "right"):
        near = judged & ((kind == f"{side}+5cm") | (kind == f"{side}-5cm"))
        assert 0.3 < expected[near].mean() < 0.7, side  # one of the two offsets is on the road


# --------------------------------------------------------------------------- trajectories through race_update


@dataclasses.dataclass
class Drive:
    """One world's trajectory of the rear axle (yaw along the motion)."""

    kind: str
    name: str
    row: int
    positions: np.ndarray  # [T_i, 2], m
    start: np.ndarray  # [2], where the car stood before step 0, m
    start_yaw: float
    reset: bool = True  # start from race_reset, else from the nearest segment of `start`
    arc_driven: np.ndarray | None = None  # [T_i], arc along the centerline driven so far, m
    within_window: bool = True  # never beyond the window ahead nor the localizer's reach


def _yaws(points: np.ndarray, start: np.ndarray, start_yaw: float) -> np.ndarray:
    d = np.diff(np.vstack([start[None], points]), axis=0)
    yaw = np.arctan2(d[:, 1], d[:, 0])
    moved = np.linalg.norm(d, axis=1) > 1e-9
    out = np.empty(len(points))
    last = start_yaw
    for i in range(len(points)):
        last = yaw[i] if moved[i] else last
        out[i] = last
    return out


def _drives(geoms) -> list[Drive]:
    rng = np.random.default_rng(77)
    drives = []
    for r in DRIVE_ROWS:
        g = geoms[r]
        reach = WINDOW * g.seg_len.min()  # the most one step may cover
        start, start_yaw, _ = g.at_arc(0.0)

        def along(name, s, lateral=0.0, **kw):
            points = g.at_arc(s, lateral)[0]
            return Drive(name.split(":")[0], name, r, points, start, float(start_yaw), arc_driven=s, **kw)

        # Forward along the centerline past the lap line, then standing still.
        for name, steps in (("slow", None), ("fast", 0.93), ("varied", None)):
            if name == "slow":
                s = np.arange(1, STEPS + 1) * (g.perimeter / (0.87 * STEPS) + 1.37e-4)
            elif name == "fast":
                s = np.arange(1, STEPS + 1) * steps * reach
            else:
                s = np.cumsum(rng.uniform(0.02, 0.93, STEPS) * reach)
            s = s[: np.searchsorted(s, 1.2 * g.perimeter)]
            # Keep every step clear of the lap line, where float32 may call it either way.
            s = np.where(np.abs(s - g.perimeter) < LAP_MARGIN_M, g.perimeter + 1.5 * LAP_MARGIN_M, s)
            drives.append(along(f"forward:{name}", s))
        # Up to the line in ever shorter steps, across it by 4 mm.
        s = np.arange(1, int(g.perimeter / (0.5 * reach))) * 0.5 * reach
        near_line = np.array([-0.3, -0.03, -0.004, 0.004, 0.03, 0.3])
        s = np.concatenate([s, g.perimeter + near_line])
        drives.append(along("forward:line", s))
        # Backwards from the start for a quarter lap.
        s = -np.arange(1, 400) * 0.41 * reach
        drives.append(along("backwards", s[s > -0.25 * g.perimeter]))
        # Zig-zag across the width (wheels leave the road at the extremes).
        s = np.arange(1, STEPS + 1) * 0.31 * reach
        s = s[s < 1.1 * g.perimeter]
        width = g.half_width_at(s)
        side = np.where(np.arange(s.size) % 2 == 0, 1.0, -1.0)
        drives.append(along("zigzag", s, side * width * rng.uniform(0.3, 0.95, s.size)))
        # Back and forth: a slow drift with a larger oscillation, so it reverses every few steps.
        t = np.arange(1, 302)
        s = 0.012 * reach * t + 0.6 * reach * np.sin(2 * np.pi * t / 37) + 0.2 * reach * np.sin(2 * np.pi * t / 11)
        drives.append(along("back-and-forth", s))
        # Off the side: start mid-lap on the centerline, drift out sideways until 2 m beyond.
        for side, lateral_step, forward_step in (("left", 0.0437, 0.31), ("right", -0.0437, 0.31),
                                                 ("left-steep", 0.163, 0.21), ("right-steep", -0.171, 0.19)):
            s0 = rng.uniform(0, g.perimeter)
            k = np.arange(1, int((g.half_width.max() + 2.0) / abs(lateral_step)) + 2)
            points = g.at_arc(s0 + forward_step * k, lateral_step * k)[0]
            p0, yaw0, _ = g.at_arc(s0)
            drives.append(Drive("off", f"off:{side}", r, points, p0, float(yaw0), reset=False))
    # Shortcuts and reversing (see the tests that read these).
    def rule(kind, r, s):
        g = geoms[r]
        start, start_yaw, _ = g.at_arc(0.0)
        return Drive(kind, kind, r, g.at_arc(s)[0], start, float(start_yaw), arc_driven=s, within_window=False)

    # Across the interior to half a lap ahead: from the start, and after 40 m of driving.
    drives.append(rule("shortcut", ROW["level0"], np.full(6, 0.5 * geoms[ROW["level0"]].perimeter)))
    half_lap = 0.5 * geoms[ROW["fine640"]].perimeter
    s = np.concatenate([np.arange(1, 21) * 2.0, np.full(6, 40.0 + half_lap)])
    drives.append(rule("shortcut", ROW["fine640"], s))
    drives.append(rule("backwards-round", ROW["level0"], -np.arange(1, 250) * 3.0))
    drives.append(rule("backwards-few-points", ROW["circle-min"], -np.array([0.5, 1.0, 1.5, 2.0])))
    return drives


def _drive_scan(tracks_arrays, race, positions, yaws):
    def step(race, xs):
        position, yaw = xs
        wheels = car.wheel_points(CONFIG, position, yaw)
        race, progress, off, lap = race_update(tracks_arrays, race, position, wheels)
        return race, (progress, off, lap, race.local_segment, race.progress_m, wheels)

    return jax.lax.scan(step, race, (positions, yaws))[1]


@pytest.fixture(scope="module")
def driven(tracks):
    """Every Drive through one jitted scan of race_update, with the oracles' verdicts."""
    _, arrays, geoms = tracks
    drives = _drives(geoms)
    e = len(drives)
    positions = np.empty((STEPS, e, 2))
    yaws = np.empty((STEPS, e))
    lengths = np.empty(e, np.int64)
    rows = np.array([d.row for d in drives])
    segment0 = np.zeros(e, np.int64)
    progress0 = np.zeros(e)
    for w, d in enumerate(drives):
        t = len(d.positions)
        assert 0 < t <= STEPS, d.name
        lengths[w] = t
        positions[:t, w], positions[t:, w] = d.positions, d.positions[-1]
        yaw = _yaws(d.positions, d.start, d.start_yaw)
        yaws[:t, w], yaws[t:, w] = yaw, yaw[-1]
        if not d.reset:
            _, k, s = geoms[d.row].nearest(d.start[None].astype(np.float32).astype(np.float64))
            segment0[w], progress0[w] = k[0], s[0]
    positions = positions.astype(np.float32)
    yaws = yaws.astype(np.float32)
    race = race_reset(jnp.asarray(rows, jnp.int32))._replace(
        local_segment=jnp.asarray(segment0, jnp.int32),
        progress_segment=jnp.asarray(segment0, jnp.int32),
        progress_m=jnp.asarray(progress0, jnp.float32))
    out = jax.jit(_drive_scan)(arrays, race, jnp.asarray(positions), jnp.asarray(yaws))
    progress, off, lap, local, progress_m, wheels = (np.asarray(x) for x in out)
    positions = positions.astype(np.float64)
    previous = np.concatenate([progress0[None].astype(np.float32), progress_m[:-1]]).astype(np.float64)
    all_on_road = np.empty((STEPS, e), bool)
    for w, d in enumerate(drives):
        flat = wheels[:, w].reshape(-1, 2).astype(np.float64)
        all_on_road[:, w] = geoms[d.row].on_road(flat).reshape(STEPS, 4).all(axis=1)
    expected_low, expected_high = oracle_progress(geoms, rows, segment0, progress0, positions, previous,
                                                  all_on_road)

    # Per world: the geometric truth of the axle and the wheels.
    nearest_dist = np.empty((STEPS, e))
    local_dist = np.empty((STEPS, e))
    wheels_on = np.ones((STEPS, e, 4), bool)
    wheels_clear = np.full((STEPS, e, 4), np.inf)
    for w, d in enumerate(drives):
        g = geoms[d.row]
        p = positions[:, w]
        active = lengths[w]  # the steps after it stand still: the same verdicts
        nearest_dist[:active, w] = g.nearest(p[:active])[0]
        nearest_dist[active:, w] = nearest_dist[active - 1, w]
        local_dist[:, w] = g.distance_to(p, local[:, w])
        if d.kind in ("off", "zigzag"):
            flat = wheels[:active, w].reshape(-1, 2).astype(np.float64)
            wheels_on[:active, w] = g.on_road(flat).reshape(active, 4)
            wheels_clear[:active, w] = g.clearance(flat).reshape(active, 4)
            wheels_on[active:, w], wheels_clear[active:, w] = wheels_on[active - 1, w], wheels_clear[active - 1, w]
    return dict(drives=drives, geoms=geoms, lengths=lengths, positions=positions, progress=progress, off=off,
                lap=lap, local=local, progress_m=progress_m, wheels=wheels, expected_low=expected_low,
                expected_high=expected_high,
                nearest_dist=nearest_dist, local_dist=local_dist, wheels_on=wheels_on, wheels_clear=wheels_clear)


def _worlds(driven, kind: str):
    found = [w for w, d in enumerate(driven["drives"]) if d.kind == kind]
    assert found, kind
    return found


@pytest.mark.parametrize("kind", ["forward", "backwards", "zigzag", "back-and-forth", "off"])
def test_progress_matches_window_oracle(driven, kind):
    """Within the window, race_update's legal progress is the oracle's, step by step."""
    for w in _worlds(driven, kind):
        d = driven["drives"][w]
        g = driven["geoms"][d.row]
        assert d.within_window
        low, high = driven["expected_low"][:, w], driven["expected_high"][:, w]
        assert np.mean(high - low > ARC_ATOL_M) < 0.05  # near-ties are rare: this is an exact check
        got = driven["progress_m"][:, w]
        bad = np.flatnonzero((got < low - ARC_ATOL_M) | (got > high + ARC_ATOL_M))
        assert bad.size == 0, (f"{d.name} on {TRACK_NAMES[d.row]}, step {bad[0]}: progress_m {got[bad[0]]}, "
                               f"oracle [{low[bad[0]]}, {high[bad[0]]}]")
        progress = driven["progress"][:, w]
        tol = ARC_ATOL_M / g.track_length
        assert np.all(progress >= np.clip(low / g.track_length, 0, 1) - tol)
        assert np.all(progress <= np.clip(high / g.track_length, 0, 1) + tol)
        clear = (np.abs(low - g.track_length) > LAP_MARGIN_M) & (np.abs(high - g.track_length) > LAP_MARGIN_M)
        np.testing.assert_array_equal(driven["lap"][clear, w], low[clear] >= g.track_length)
        # Legal progress never decreases, and track_progress stays in [0, 1].
        assert np.all(np.diff(driven["progress_m"][:, w]) >= 0)
        assert np.all((driven["progress"][:, w] >= 0) & (driven["progress"][:, w] <= 1))


def test_forward_progress_is_the_arc_driven_and_the_lap_ends_on_the_start_line(driven):
    for w in _worlds(driven, "forward"):
        d = driven["drives"][w]
        g = driven["geoms"][d.row]
        t = driven["lengths"][w]
        s = d.arc_driven
        assert np.all(np.abs(s - g.perimeter) > LAP_MARGIN_M), "a step lands on the lap line"
        done = s >= g.perimeter
        assert done.any() and not done[0]
        first = int(np.argmax(done))
        progress = driven["progress"][:t, w]
        lap = driven["lap"][:t, w]
        np.testing.assert_allclose(progress[:first], s[:first] / g.track_length, rtol=0,
                                   atol=ARC_ATOL_M / g.track_length, err_msg=f"{d.name} on {TRACK_NAMES[d.row]}")
        assert np.all(progress[:first] < 1.0)
        assert not lap[:first].any(), f"{d.name}: lap_done before the start line"
        assert lap[first:].all() and np.all(progress[first:] == 1.0), f"{d.name}: lap_done late"
        # Past the line the second lap's arc keeps counting (laps by the unwrapped segment).
        np.testing.assert_allclose(driven["progress_m"][:t, w][first:], s[first:], rtol=0, atol=ARC_ATOL_M)


def test_backwards_progress_stays_zero(driven):
    for w in _worlds(driven, "backwards"):
        if driven["drives"][w].within_window:
            assert not np.any(driven["progress"][:, w]), driven["drives"][w].name
            assert not np.any(driven["lap"][:, w])


def test_back_and_forth_never_loses_progress(driven):
    for w in _worlds(driven, "back-and-forth"):
        d = driven["drives"][w]
        s = d.arc_driven
        assert np.any(np.diff(s) < 0) and np.any(np.diff(s) > 0)  # it does reverse
        best = np.maximum.accumulate(s)
        np.testing.assert_allclose(driven["progress_m"][: len(s), w], best, rtol=0, atol=ARC_ATOL_M)


@pytest.mark.parametrize("kind", ["forward", "backwards", "zigzag", "back-and-forth", "off"])
def test_localizer_finds_the_nearest_segment(driven, kind):
    """The localizer's segment is as near the rear axle as the nearest of all segments."""
    for w in _worlds(driven, kind):
        if driven["drives"][w].within_window:
            np.testing.assert_allclose(driven["local_dist"][:, w], driven["nearest_dist"][:, w], rtol=0, atol=2e-4,
                                       err_msg=driven["drives"][w].name)


@pytest.mark.parametrize("kind", ["zigzag", "off"])
def test_off_track_matches_wheel_oracle_along_drives(driven, kind):
    checked = 0
    for w in _worlds(driven, kind):
        active = driven["lengths"][w]
        judged = np.all(driven["wheels_clear"][:active, w] >= AMBIGUOUS_M, axis=1)
        assert judged.mean() > 0.95
        expected = ~np.all(driven["wheels_on"][:active, w], axis=1)
        np.testing.assert_array_equal(driven["off"][:active, w][judged], expected[judged],
                                      err_msg=driven["drives"][w].name)
        checked += judged.sum()
        assert 0 < expected.mean() < 1
    assert checked > 300


def test_off_track_fires_on_the_first_step_a_wheel_leaves(driven):
    for w in _worlds(driven, "off"):
        d = driven["drives"][w]
        expected = ~np.all(driven["wheels_on"][:, w], axis=1)
        first = int(np.argmax(expected))
        assert expected.any() and first > 0
        # The decisive steps are clear of the ambiguous band.
        assert np.all(driven["wheels_clear"][first - 1: first + 1, w] >= AMBIGUOUS_M)
        off = driven["off"][:, w]
        assert not off[:first].any(), f"{d.name} on {TRACK_NAMES[d.row]}: off_track before any wheel left"
        assert off[first], f"{d.name} on {TRACK_NAMES[d.row]}: off_track missed the first wheel out"


# ----------------------------------------------------------------- shortcuts, reversing, the fewest points


def test_leaving_the_window_ahead_earns_nothing(driven):
    """race.py: "a car that leaves the window ahead in one control step earns
    nothing for that step" (spec: "no shortcut counts"). A jump across the
    interior to half a lap ahead must leave progress where it was."""
    failures = []
    for w in _worlds(driven, "shortcut"):
        d = driven["drives"][w]
        g = driven["geoms"][d.row]
        arc = np.concatenate([[0.0], d.arc_driven])
        progress_m = np.concatenate([[0.0], driven["progress_m"][: len(d.arc_driven), w]])
        jump = int(np.argmax(np.diff(arc) > WINDOW * g.seg_len.max())) + 1
        assert np.all(np.diff(arc[jump:]) == 0)  # it stays where it landed
        np.testing.assert_allclose(progress_m[jump - 1], arc[jump - 1], rtol=0, atol=ARC_ATOL_M)
        gained = progress_m[jump:] - progress_m[jump - 1]
        if np.any(gained != 0):
            failures.append(f"{TRACK_NAMES[d.row]}: a jump of {arc[jump] - arc[jump - 1]:.0f} m ahead "
                            f"earned {gained.max():.2f} m of legal progress")
    assert not failures, "; ".join(failures)


def test_driving_backwards_round_the_lap_earns_nothing(driven):
    """race.py: "driving backwards ... earns nothing". Driving backwards from the
    start in 3 m steps (always on the road, well inside the window's reach)."""
    (w,) = _worlds(driven, "backwards-round")
    d = driven["drives"][w]
    t = len(d.arc_driven)
    on_road = driven["nearest_dist"][:t, w] < 1e-3
    assert on_road.all()
    earned = driven["progress_m"][:t, w]
    assert not np.any(earned), (
        f"after {-d.arc_driven[int(np.argmax(earned > 0))]:.0f} m backwards the car is credited "
        f"{earned.max():.0f} m of legal progress (of {driven['geoms'][d.row].perimeter:.0f} m)")


def test_backwards_on_a_track_with_few_points_earns_nothing(driven):
    """On a track of MIN_POINTS points the windows ahead and behind the
    progress point just miss each other: backing off the start earns nothing."""
    (w,) = _worlds(driven, "backwards-few-points")
    d = driven["drives"][w]
    t = len(d.arc_driven)
    earned = driven["progress"][:t, w]
    assert not np.any(earned), (
        f"{-d.arc_driven[0]} m behind the start the car has track_progress {earned[0]:.4f}")
    assert not np.any(driven["lap"][:t, w])


# --------------------------------------------------------------------------- single steps from placed cars


def _single_step_fn(tracks_arrays, race, position, yaw):
    wheels = car.wheel_points(CONFIG, position, yaw)
    race, _, off, _ = race_update(tracks_arrays, race, position, wheels)
    return race.local_segment, off, wheels


_single_step = jax.jit(_single_step_fn)


def single_step(arrays, geoms, rows, local_segment, position, yaw):
    """race_update once for placed cars, padded to SINGLE_STEP_WORLDS (one compile).

    Returns (local_segment [M], off_track [M], wheels [M, 4, 2] float64)."""
    m = len(rows)
    assert m <= SINGLE_STEP_WORLDS
    pad = lambda x: np.concatenate([x, np.repeat(x[:1], SINGLE_STEP_WORLDS - m, axis=0)])  # noqa: E731
    progress_segment = np.empty(m, np.int64)
    progress_m = np.empty(m)
    for r in np.unique(rows):
        sel = rows == r
        _, progress_segment[sel], progress_m[sel] = geoms[r].nearest(position[sel])
    race = RaceState(row=jnp.asarray(pad(rows), jnp.int32), local_segment=jnp.asarray(pad(local_segment), jnp.int32),
                     progress_segment=jnp.asarray(pad(progress_segment), jnp.int32),
                     progress_m=jnp.asarray(pad(progress_m), jnp.float32),
                     legal=jnp.ones(SINGLE_STEP_WORLDS, bool))
    local, off, wheels = _single_step(arrays, race, jnp.asarray(pad(position), jnp.float32),
                                      jnp.asarray(pad(yaw), jnp.float32))
    return np.asarray(local)[:m], np.asarray(off)[:m], np.asarray(wheels, np.float64)[:m]


def _signed_outside(g: Geometry, points: np.ndarray) -> np.ndarray:
    """Distance beyond the road's edge (negative inside), m."""
    edge = oracle_min_distance(points, np.concatenate([g.left, g.right]),
                               np.concatenate([np.roll(g.left, -1, axis=0), np.roll(g.right, -1, axis=0)]))
    return np.where(g.on_road(points), -1.0, 1.0) * edge


#: (wheel index, side +1 left / -1 right, yaw off the tangent that makes it the outermost on that side).
STRADDLES = [(0, +1, 0.25), (2, +1, -0.25), (1, -1, -0.25), (3, -1, 0.25)]


def test_straddling_the_edge_with_one_wheel_out_is_off(tracks):
    """One wheel 5 cm beyond the edge, the other three on the road: off. The
    same wheel 5 cm inside: on."""
    _, arrays, geoms = tracks
    rng = np.random.default_rng(303)
    rows, local_segment, positions, yaws, wanted, depth = [], [], [], [], [], []
    for g in geoms:
        for wheel, side, tilt in STRADDLES:
            for target in (0.05, -0.05):
                s = rng.uniform(0, g.perimeter, 7)
                base, heading, seg = g.at_arc(s)
                normal = np.stack([-np.sin(heading), np.cos(heading)], axis=1)
                yaw = heading + tilt
                lo, hi = np.zeros(s.size), np.full(s.size, g.half_width.max() + 1.0)
                for _ in range(45):  # bisect the lateral offset on the oracle's signed distance
                    mid = 0.5 * (lo + hi)
                    point = oracle_wheels(base + side * mid[:, None] * normal, yaw)[:, wheel]
                    beyond = _signed_outside(g, point) > target
                    hi, lo = np.where(beyond, mid, hi), np.where(beyond, lo, mid)
                rows += [g.row] * s.size
                local_segment.append(seg)
                positions.append(base + side * lo[:, None] * normal)
                yaws.append(yaw)
                wanted += [wheel] * s.size
                depth += [target] * s.size
    rows, wanted, depth = np.array(rows), np.array(wanted), np.array(depth)
    positions = np.concatenate(positions).astype(np.float32).astype(np.float64)
    local, off, wheels = single_step(arrays, geoms, rows, np.concatenate(local_segment), positions,
                                     np.concatenate(yaws))
    for r in np.unique(rows):
        sel = np.flatnonzero(rows == r)
        g = geoms[r]
        flat = wheels[sel].reshape(-1, 2)
        outside = _signed_outside(g, flat).reshape(-1, 4)
        # Construction: the chosen wheel sits 5 cm out (or in); the others are on the road, clear of the edge.
        np.testing.assert_allclose(outside[np.arange(sel.size), wanted[sel]], depth[sel], atol=1e-3)
        others = np.ones((sel.size, 4), bool)
        others[np.arange(sel.size), wanted[sel]] = False
        assert np.all(outside[others] < -0.02)
        expected = np.any(outside > 0, axis=1)
        np.testing.assert_array_equal(expected, depth[sel] > 0)
        # A wheel may lie on a seam (the edge between two quads): such cars are not judged.
        judged = np.all(g.clearance(flat).reshape(-1, 4) >= AMBIGUOUS_M, axis=1)
        assert judged.mean() > 0.9
        np.testing.assert_array_equal(off[sel][judged], expected[judged], err_msg=TRACK_NAMES[r])


def test_min_segment_length_lets_the_window_reach_every_wheel():
    """WINDOW segments of min_segment_length reach the farthest wheel twice over
    (the reach and the same again to spare)."""
    rng = np.random.default_rng(9)
    position = rng.uniform(-50, 50, (31, 2)).astype(np.float32)
    yaw = rng.uniform(-np.pi, np.pi, 31).astype(np.float32)
    wheels = np.asarray(car.wheel_points(CONFIG, jnp.asarray(position), jnp.asarray(yaw)), np.float64)
    farthest = np.linalg.norm(wheels - position[:, None, :], axis=-1).max()
    np.testing.assert_allclose(farthest, math.hypot(CONFIG.wheelbase_m, CONFIG.track_width_m / 2), rtol=1e-5)
    assert WINDOW * min_segment_length(CONFIG) >= 2 * farthest * (1 - 1e-6)
    longer = ProjectConfig(wheelbase_m=3.4, track_width_m=2.0, com_ahead_of_rear_axle_m=1.5)
    assert WINDOW * min_segment_length(longer) >= 2 * math.hypot(3.4, 1.0) * (1 - 1e-6)


def test_cars_anywhere_on_the_shortest_segments_are_classified_right(tracks):
    """On a track whose segments are all min_segment_length, a car anywhere on
    (or just off) the road, at any yaw, with the localizer lagging up to WINDOW
    segments behind or ahead, is off exactly when the oracle puts a wheel off."""
    _, arrays, geoms = tracks
    g = geoms[ROW["tight301"]]
    rng = np.random.default_rng(8)
    m_random, m_inner = 2201, 799
    s = rng.uniform(0, g.perimeter, m_random)
    lateral = rng.uniform(-1.0, 1.0, m_random) * (g.half_width.max() + 1.0)
    yaw_offset = rng.uniform(-np.pi, np.pi, m_random)
    # The tightest bend, on its inside, yawed along it: the farthest a wheel gets in segments.
    radius = oracle_circumradius(g.centerline)
    bend = int(np.argmin(radius))
    prev, nxt = g.centerline[bend - 1], g.centerline[(bend + 1) % g.n]
    u, v = g.centerline[bend] - prev, nxt - g.centerline[bend]
    turn = u[0] * v[1] - u[1] * v[0]
    inner = 1.0 if turn > 0 else -1.0  # left normal points inwards on a left-hand bend
    s = np.concatenate([s, g.arc[bend] + rng.uniform(-4.0, 4.0, m_inner)])
    lateral = np.concatenate([lateral, inner * rng.uniform(g.half_width.max() - 2.0, g.half_width.max() + 0.5,
                                                           m_inner)])
    yaw_offset = np.concatenate([yaw_offset, rng.choice([0.0, np.pi], m_inner) + rng.normal(0, 0.3, m_inner)])
    base, heading, _ = g.at_arc(s, lateral)
    position = base.astype(np.float32).astype(np.float64)
    _, nearest_seg, _ = g.nearest(position)
    lag = rng.integers(-WINDOW, WINDOW + 1, s.size)
    rows = np.full(s.size, g.row)
    yaw = heading + yaw_offset
    local, off, wheels = single_step(arrays, geoms, rows, np.mod(nearest_seg + lag, g.n), position, yaw)

    flat = wheels.reshape(-1, 2)
    on = g.on_road(flat).reshape(-1, 4)
    judged = np.all(g.clearance(flat).reshape(-1, 4) >= AMBIGUOUS_M, axis=1)
    expected = ~np.all(on, axis=1)
    assert judged.mean() > 0.97 and 0.2 < expected[judged].mean() < 0.8
    assert not expected[s.size - m_inner:][judged[s.size - m_inner:]].all()  # the bend has cars on the road
    bad = np.flatnonzero(judged & (off != expected))
    assert bad.size == 0, (f"{bad.size} of {judged.sum()} cars misclassified, e.g. axle {position[bad[0]].tolist()} "
                           f"yaw {yaw[bad[0]]:.3f}: off_track {bool(off[bad[0]])}")
    # The localizer found the nearest segment despite the lag.
    np.testing.assert_allclose(g.distance_to(position, local), g.nearest(position)[0], rtol=0, atol=2e-4)
