"""A lap at the car's limit: a racing line inside a track's boundaries and
the quasi-steady-state speed profile along it under the car's measured
`racing_env.envelope.Envelope`. Its lap time, T_lim, is the platform's
estimate of the fastest lap a controller can drive on that track.

Pure NumPy and SciPy on a track's arrays as the observation and `Track`
hold them (a centerline, its left and right boundaries and the mask of
the valid prefix, m); it knows nothing of where the track came from.

**The line** (`racing_line`). Knots are centerline points about
``knot_spacing_m`` apart in arc length; knot j may move by an offset
``alpha_j`` along its left normal ``n_j`` (the knot polygon's central
difference turned left, `racing_env.geometry`), as far as the boundaries
less the car's half-width and a margin allow: ``-(w_right_j - d) <=
alpha_j <= w_left_j - d`` with ``d = car_half_width_m + margin_m`` and
``w_left_j``, ``w_right_j`` the boundaries' offsets from the centerline
along ``n_j``. On the side the road turns towards, a knot keeps the
sagitta ``h^2 kappa / 8`` of the boundary's arc over a knot spacing
``h`` more (else the line between two knots on that bound would cut
inside the boundary's arc). The line's points ``p_j = c_j + alpha_j n_j``
minimise

    sum_j ds_j kappa_j^2  +  lambda * sum_j chord_j^2 / h_mean

(about ``integral kappa^2 ds + lambda * length``), where ``kappa_j`` is
the curvature of the circle through ``p_{j-1}, p_j, p_{j+1}`` (the closed
path: indices modulo M), ``ds_j`` half the two chords beside it and
``lambda`` the length's weight (0: the minimum-curvature line; as it
grows the line shortens towards the shortest path). ``kappa_j`` is a
second difference of the closed path normalised by its chords, so the
problem is nonlinear in ``alpha``: Gauss-Newton linearises it at the
current line (its Jacobian is sparse, cyclic tridiagonal, built as a
``scipy.sparse`` matrix) and solves each step as a box-constrained linear
least-squares problem with ``scipy.optimize.lsq_linear``; a backtracking
line search keeps the objective decreasing; re-linearised until no knot
moves by ``settle_m`` (a few times). A second difference at the
centerline's fixed spacing would be linear, but it ranks lines wrongly: on
a circle it shrinks with the radius, pulling the line inside, while the
curvature falls as the radius grows. The line through the knots is a
periodic cubic spline, sampled at as many points as the track has, evenly
in its parameter (the knots' chord length), its curvature from the
spline's derivatives.

**Towards minimum time** (`min_time_lap`): the minimum-curvature line is
not the fastest (on a circle it takes the outside: the speed grows as
the square root of the radius, the length as the radius). The lap is
driven on the line of each weight of ``length_weights_per_m2`` (and, with
``refine``, of the geometric means of the fastest weight and its
neighbours) and the fastest is kept. Every line tried is feasible, so
T_lim is the lap time of a line the car can drive under this model, an
upper bound on the model's minimum time.

**The speed profile** (`speed_profile`), quasi-steady-state on the
sampled line, closed lap (the speed at the end of the lap is the speed at
its start):

- the corner limit ``v_c = sqrt(a_lat(v_c) / |kappa|)``, a fixed point
  (the lateral limit depends on the speed), iterated from the top speed
  down, at most ``max_speed_mps`` (the envelope's top measured speed: the
  car was never measured faster);
- the friction ellipse: at speed v with curvature kappa the longitudinal
  acceleration available is ``a_x,max(v) * sqrt(1 - (v^2 |kappa| /
  a_lat(v))^2)``, with ``a_x,max`` the envelope's forward limit when
  speeding up and its braking limit when slowing down;
- a forward pass ``v_{i+1}^2 <= v_i^2 + 2 a_fwd,avail(v_i, kappa_i) s_i``
  and a backward pass ``v_i^2 <= v_{i+1}^2 + 2 a_brk,avail(v_{i+1},
  kappa_{i+1}) s_i`` (``s_i`` the segment from point i to i + 1), each
  swept around the loop from the slowest corner until the speed it
  carries around the loop is periodic;
- the lap time ``T = sum_i 2 s_i / (v_i + v_{i+1})`` (constant
  acceleration along each segment).

Below the envelope's lowest measured speed its limits at that speed hold
(only a standing start, or a corner tighter than any measured circle,
drives there). Beside the flying lap, the **standing lap** starts at rest
at point 0 and ends when it gets back there, as an episode's lap does
(every episode starts at rest at the centerline's start).

See docs/racing_env/limits.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse
from scipy.interpolate import CubicSpline
from scipy.optimize import lsq_linear
from threadpoolctl import threadpool_limits

from racing_env import checks, geometry
from racing_env.config import ProjectConfig
from racing_env.envelope import Envelope
from racing_env.tracks import Track
from racing_env.types import MIN_TRACK_POINTS

__all__ = ["TRACK_FIELDS", "LimitLap", "LineSettings", "RacingLine", "SpeedProfile", "min_time_lap",
           "racing_line", "speed_profile"]

#: The arrays of a track the line is built from (a `Track`'s fields, an observation's keys).
TRACK_FIELDS = ("centerline", "left_boundary", "right_boundary", "track_mask")
#: ``lsq_linear``'s ways of solving each step (`LineSettings.lsq_solver`).
LSQ_SOLVERS = ("exact", "lsmr")
#: The sharpest turn between two neighbouring centerline points that a track may take, rad.
_MAX_TURN_RAD = math.pi / 2
#: The smallest step of the Gauss-Newton line search (a fraction of the full step).
_SMALLEST_STEP = 1.0 / 1024
#: The corner-speed fixed point: its tolerance (m/s) and most iterations.
_FIXED_POINT_TOL_MPS = 1e-9
_FIXED_POINT_ITERATIONS = 200
#: Most sweeps of a pass around the loop before it must be periodic.
_MAX_SWEEPS = 8


@dataclass(frozen=True)
class LineSettings:
    """How the racing line is built and driven (units in the names).

    Attributes:
        car_half_width_m: half the car's width that must stay inside the
            boundaries, m (default: half `ProjectConfig`'s track width, the
            wheel centres the off-track rule checks).
        margin_m: clearance kept beyond the half-width on either side, m.
        knot_spacing_m: the arc length between the line's knots, m.
        max_linearisations: most Gauss-Newton steps (each one
            ``lsq_linear`` solve).
        settle_m: stop once a step moves no knot by this much, m.
        lsq_tol: ``lsq_linear``'s ``tol``.
        lsq_solver: ``"exact"``: ``lsq_linear`` gets the Jacobian as a dense
            array (an SVD per iteration; ~0.1 s a line of 130 knots on one
            core) or ``"lsmr"``: the sparse matrix itself (5 to 20 times
            slower on these ill-conditioned problems, and less accurate at
            the same ``lsq_tol``).
        length_weights_per_m2: the weights of the line's length that
            `min_time_lap` tries, 1/m^2 (each >= 0, increasing; 0 is the
            minimum-curvature line).
        refine: whether `min_time_lap` then tries the geometric means of
            the fastest weight and its neighbours.
        max_speed_mps: the fastest the profile drives, m/s (None: the
            envelope's top measured speed; it may not be above it).

    Raises:
        TypeError: a non-number, a non-int count, a solver not a str.
        ValueError: a value out of range, naming it.
    """

    car_half_width_m: float = ProjectConfig().track_width_m / 2
    margin_m: float = 0.5
    knot_spacing_m: float = 3.0
    max_linearisations: int = 12
    settle_m: float = 0.005
    lsq_tol: float = 1e-6
    lsq_solver: str = "exact"
    length_weights_per_m2: tuple[float, ...] = (0.0, 1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3)
    refine: bool = True
    max_speed_mps: float | None = None

    def __post_init__(self) -> None:
        for name in ("car_half_width_m", "margin_m"):
            object.__setattr__(self, name, checks.real_in(getattr(self, name), name, 0.0, math.inf, unit="m"))
        for name in ("knot_spacing_m", "settle_m", "lsq_tol"):
            object.__setattr__(self, name, checks.positive(getattr(self, name), name))
        object.__setattr__(self, "max_linearisations",
                           checks.integer_in(self.max_linearisations, "max_linearisations", 1))
        if not isinstance(self.lsq_solver, str):
            raise TypeError(f"lsq_solver must be a str, got {checks.shown(self.lsq_solver)}")
        if self.lsq_solver not in LSQ_SOLVERS:
            raise ValueError(f"lsq_solver must be one of {LSQ_SOLVERS}, got {self.lsq_solver!r}")
        weights = self.length_weights_per_m2
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
            raise TypeError(f"length_weights_per_m2 must be a sequence of numbers, got {checks.shown(weights)}")
        weights = tuple(checks.real_in(w, f"length_weights_per_m2[{i}]", 0.0, math.inf, unit="1/m^2")
                        for i, w in enumerate(weights))
        if not weights or any(b <= a for a, b in zip(weights, weights[1:])):
            raise ValueError(f"length_weights_per_m2 must be one or more increasing weights, got {weights}")
        object.__setattr__(self, "length_weights_per_m2", weights)
        if not isinstance(self.refine, bool):
            raise TypeError(f"refine must be a bool, got {checks.shown(self.refine)}")
        if self.max_speed_mps is not None:
            object.__setattr__(self, "max_speed_mps", checks.positive(self.max_speed_mps, "max_speed_mps"))

    def to_dict(self) -> dict[str, Any]:
        """The settings by name (JSON-ready)."""
        return {**dataclasses.asdict(self), "length_weights_per_m2": list(self.length_weights_per_m2)}


@dataclass(frozen=True, eq=False)
class RacingLine:
    """A closed racing line (`racing_line`); M knots, N sampled points.

    Attributes:
        points_m: float64 [N, 2], the line sampled evenly along it, m; a
            closed loop (the last point joins the first, not repeated),
            point 0 on the start's normal.
        curvature_per_m: float64 [N], signed (+ turning left), 1/m.
        arc_m: float64 [N], arc length from point 0 along the sampled
            line, m.
        length_m: the sampled line's closed perimeter, m.
        knot_index: int64 [M], the centerline points the knots are.
        knot_offset_m: float64 [M], each knot's offset along its left
            normal (+ left of the centerline), m.
        knot_normal: float64 [M, 2], the knots' unit left normals.
        lower_m, upper_m: float64 [M], the offsets the knots may take, m.
        length_weight_per_m2: the weight of the length in its objective, 1/m^2.
        linearisations: Gauss-Newton steps taken.
        settled: whether the last step moved no knot by ``settle_m``.
    """

    points_m: np.ndarray
    curvature_per_m: np.ndarray
    arc_m: np.ndarray
    length_m: float
    knot_index: np.ndarray
    knot_offset_m: np.ndarray
    knot_normal: np.ndarray
    lower_m: np.ndarray
    upper_m: np.ndarray
    length_weight_per_m2: float
    linearisations: int
    settled: bool


@dataclass(frozen=True, eq=False)
class SpeedProfile:
    """The speed along a closed line (`speed_profile`); N points.

    Attributes:
        corner_speed_mps: float64 [N], the corner limit at each point, m/s.
        speed_mps: float64 [N], the flying lap's speed, m/s (periodic).
        standing_speed_mps: float64 [N + 1], the standing lap's speed from
            rest at point 0; entry N is its speed back at point 0, m/s.
        segment_m: float64 [N], point i to point i + 1 (the last to the
            first), m.
        lap_time_s: the flying lap's time, s.
        standing_lap_time_s: the standing lap's time, s.
        max_speed_mps: the speed cap it was driven under, m/s.
    """

    corner_speed_mps: np.ndarray
    speed_mps: np.ndarray
    standing_speed_mps: np.ndarray
    segment_m: np.ndarray
    lap_time_s: float
    standing_lap_time_s: float
    max_speed_mps: float


@dataclass(frozen=True, eq=False)
class LimitLap:
    """A track's lap at the limit (`min_time_lap`).

    Attributes:
        line: the racing line, the fastest of those tried.
        profile: the speed profile along it.
        settings: what built them.
        envelope_sha256: the envelope's ``config_sha256`` (the car).
        tried: ((length weight 1/m^2, flying lap s), ...) of every line
            tried, in the order tried.
    """

    line: RacingLine
    profile: SpeedProfile
    settings: LineSettings
    envelope_sha256: str
    tried: tuple[tuple[float, float], ...]

    @property
    def lap_time_s(self) -> float:
        """T_lim: the flying lap along the line, s."""
        return self.profile.lap_time_s

    @property
    def standing_lap_time_s(self) -> float:
        """The lap from rest at the start, as an episode drives it, s."""
        return self.profile.standing_lap_time_s

    @property
    def length_m(self) -> float:
        """The line's length, m."""
        return self.line.length_m


# --------------------------------------------------------------------------- input


def _track_arrays(track: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The valid prefix of the centerline and boundaries (float64 [n, 2]),
    checked; names the argument in every refusal."""
    if isinstance(track, Track):
        source: Mapping[str, Any] = {name: getattr(track, name) for name in TRACK_FIELDS}
        label = "track.{}"
    elif isinstance(track, Mapping):
        missing = [name for name in TRACK_FIELDS if name not in track]
        if missing:
            raise ValueError(f"track must hold {TRACK_FIELDS}, it lacks {missing[0]!r}")
        source, label = track, "track[{!r}]"
    else:
        raise TypeError(f"track must be a Track or a mapping of {TRACK_FIELDS} (an observation of one world), "
                        f"got {type(track).__name__}")
    mask = checks.host_array(label.format("track_mask"), source["track_mask"])
    checks.check_int_kind(label.format("track_mask"), mask.dtype)
    if mask.ndim != 1:
        raise ValueError(f"{label.format('track_mask')} must have shape [C], got {mask.shape}")
    checks.check_host_mask_values(label.format("track_mask"), mask)
    count = int(mask.sum(dtype=np.int64))
    if not np.array_equal(mask != 0, np.arange(mask.size) < count):
        raise ValueError(f"{label.format('track_mask')} must be a prefix of ones followed by zeros")
    if count < MIN_TRACK_POINTS:
        raise ValueError(f"{label.format('track_mask')} has {count} valid points, needs at least "
                         f"MIN_TRACK_POINTS = {MIN_TRACK_POINTS}")
    arrays = []
    for name in TRACK_FIELDS[:3]:
        arr = checks.host_array(label.format(name), source[name])
        checks.check_float_kind(label.format(name), arr.dtype)
        checks.check_shape(label.format(name), arr.shape, (mask.size, 2), "[C, 2] with C from track_mask")
        valid = arr[:count].astype(np.float64)
        bad = np.flatnonzero(~np.all(np.isfinite(valid), axis=1))
        if bad.size:
            raise ValueError(f"{label.format(name)} is not finite at point {int(bad[0])}")
        arrays.append(valid)
    center = arrays[0]
    checks.loop_segment_lengths(label.format("centerline") + " points", center, ": a degenerate track")
    following = np.roll(center, -1, axis=0)
    before, after = center - np.roll(center, 1, axis=0), following - center
    turn = np.arctan2(before[:, 0] * after[:, 1] - before[:, 1] * after[:, 0], np.sum(before * after, axis=1))
    bad = np.flatnonzero(np.abs(turn) >= _MAX_TURN_RAD)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{label.format('centerline')} turns by {math.degrees(turn[i]):.1f} deg at point {i}: "
                         f"a degenerate track (no turn between neighbours may reach "
                         f"{math.degrees(_MAX_TURN_RAD):.0f} deg)")
    winding = float(turn.sum()) / (2 * math.pi)
    if abs(abs(winding) - 1) > 1e-6:
        raise ValueError(f"{label.format('centerline')} turns {winding:.3f} times around: a degenerate track "
                         "(a simple loop turns once)")
    return center, arrays[1], arrays[2]


def _envelope(envelope: object) -> Envelope:
    if not isinstance(envelope, Envelope):
        raise TypeError(f"envelope must be an Envelope, got {type(envelope).__name__}")
    for name in ("lateral_mps2", "forward_mps2", "braking_mps2"):
        table = getattr(envelope, name)
        if not (np.all(np.isfinite(table)) and np.all(table > 0)):
            raise ValueError(f"envelope.{name} must be finite and > 0 at every measured speed, "
                             f"got {checks.shown(table.tolist())}")
    return envelope


# --------------------------------------------------------------------------- the line


def _knots(center: np.ndarray, spacing_m: float) -> np.ndarray:
    """Indices of centerline points about ``spacing_m`` apart in arc length (point 0 first)."""
    count = len(center)
    _, segment = geometry.loop_segments(np, center, np.asarray(count))
    arc = np.concatenate([[0.0], np.cumsum(segment)[:-1]])
    knots = max(MIN_TRACK_POINTS, round(float(segment.sum()) / spacing_m))
    if knots >= count:
        return np.arange(count)
    targets = float(segment.sum()) * np.arange(knots) / knots
    index = np.clip(np.searchsorted(arc, targets), 0, count - 1)
    return np.unique(index)


def _circle_curvature(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each point's signed curvature (the circle through it and its two
    neighbours on the closed path), its gradients with respect to the
    three points, and half the two segments' length.

    Returns:
        (kappa [M] 1/m; grad [3, M, 2]: d kappa_j / d p_{j-1}, d p_j,
        d p_{j+1}, 1/m^2; ds [M] m).
    """
    a = points - np.roll(points, 1, axis=0)
    b = np.roll(points, -1, axis=0) - points
    c = a + b
    la, lb, lc = (np.linalg.norm(x, axis=1) for x in (a, b, c))
    cross = a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]
    scale = 2.0 / (la * lb * lc)
    kappa = cross * scale
    d_cross_a = np.stack([b[:, 1], -b[:, 0]], axis=1)
    d_cross_b = np.stack([-a[:, 1], a[:, 0]], axis=1)
    d_a = scale[:, None] * d_cross_a - kappa[:, None] * (a / (la**2)[:, None] + c / (lc**2)[:, None])
    d_b = scale[:, None] * d_cross_b - kappa[:, None] * (b / (lb**2)[:, None] + c / (lc**2)[:, None])
    return kappa, np.stack([-d_a, d_a - d_b, d_b]), 0.5 * (la + lb)


class _Road:
    """A track's knots, their left normals and the offsets they may take
    (checked), what every line on it is built from."""

    def __init__(self, track: object, settings: LineSettings) -> None:
        center, left, right = _track_arrays(track)
        label = "track.{}" if isinstance(track, Track) else "track[{!r}]"
        self.count = len(center)
        self.knot_index = _knots(center, settings.knot_spacing_m)
        self.knots = knots = center[self.knot_index]
        self.normal = normal = geometry.left_normals(np, geometry.loop_tangents(np, knots))
        width_left = np.sum((left[self.knot_index] - knots) * normal, axis=1)
        width_right = np.sum((knots - right[self.knot_index]) * normal, axis=1)
        for name, width in (("left_boundary", width_left), ("right_boundary", width_right)):
            bad = np.flatnonzero(width <= 0)
            if bad.size:
                side = "left" if name == "left_boundary" else "right"
                raise ValueError(f"{label.format(name)} must lie {side} of the centerline, it does not at point "
                                 f"{int(self.knot_index[bad[0]])}")
        need = settings.car_half_width_m + settings.margin_m
        room = width_left + width_right - 2 * need
        bad = np.flatnonzero(room <= 0)
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"margin_m = {settings.margin_m:g} m leaves no room at centerline point "
                             f"{int(self.knot_index[j])}: the road is {width_left[j] + width_right[j]:.3f} m wide "
                             f"there and the line needs 2 x (car_half_width_m + margin_m) = {2 * need:.3f} m")
        # On the side the road turns towards, a line through two knots on the
        # boundary's offset would cut inside the boundary's arc between them by
        # its sagitta, h^2 kappa / 8: the knots keep that much more from it
        # (at most a quarter of the room, so a tight, narrow road keeps a line).
        kappa = _circle_curvature(knots)[0]
        _, chord = geometry.loop_segments(np, knots, np.asarray(len(knots)))
        spacing = np.maximum(chord, np.roll(chord, 1))
        inner = np.where(kappa > 0, width_left, width_right) - need
        bend = np.abs(kappa) / np.maximum(1 - inner * np.abs(kappa), 0.1)
        guard = np.minimum(spacing**2 * bend / 8, room / 4)
        self.lower = -(width_right - need) + np.where(kappa < 0, guard, 0.0)
        self.upper = width_left - need - np.where(kappa > 0, guard, 0.0)
        #: The knots' mean spacing, m: the length term's sum of squared chords over it is about the length.
        self.spacing_m = float(chord.mean())

    def objective(self, offset: np.ndarray, weight: float) -> float:
        """``sum ds kappa^2 + weight * sum chord^2 / spacing_m`` of the line with these offsets."""
        points = self.knots + offset[:, None] * self.normal
        kappa, _, ds = _circle_curvature(points)
        _, chord = geometry.loop_segments(np, points, np.asarray(len(points)))
        return float(np.sum(ds * kappa**2) + weight * np.sum(chord**2) / self.spacing_m)

    def solve(self, weight: float, start: np.ndarray, settings: LineSettings) -> tuple[np.ndarray, int, bool]:
        """Gauss-Newton on `objective` from the offsets ``start``: (offsets [M], steps taken, settled)."""
        # The matrices are a few hundred wide: BLAS threads never pay for
        # themselves at that size, and on a busy machine they cost 10x.
        with threadpool_limits(limits=1, user_api="blas"):
            return self._solve(weight, start, settings)

    def _solve(self, weight: float, start: np.ndarray, settings: LineSettings) -> tuple[np.ndarray, int, bool]:
        count = len(self.knots)
        index = np.arange(count)
        ahead = (index + 1) % count
        rows = np.concatenate([np.tile(index, 3), count + index, count + index])
        cols = np.concatenate([(index - 1) % count, index, ahead, index, ahead])
        normal = self.normal
        neighbours = np.stack([np.roll(normal, 1, axis=0), normal, np.roll(normal, -1, axis=0)])
        scale = math.sqrt(weight / self.spacing_m)
        offset = np.clip(start, self.lower, self.upper)
        value = self.objective(offset, weight)
        steps, settled = 0, False
        while steps < settings.max_linearisations and not settled:
            steps += 1
            points = self.knots + offset[:, None] * normal
            kappa, grad, ds = _circle_curvature(points)
            root_ds = np.sqrt(ds)
            chord = np.roll(points, -1, axis=0) - points
            length = np.linalg.norm(chord, axis=1)
            direction = chord / length[:, None]
            # Rows 0..M-1: d kappa_j / d alpha_k = grad . n_k (k = j - 1, j, j + 1), cyclic tridiagonal.
            # Rows M..2M-1: d chord_j / d alpha_j = -u_j . n_j, d chord_j / d alpha_{j+1} = u_j . n_{j+1}.
            values = np.concatenate([(np.sum(grad * neighbours, axis=2) * root_ds).ravel(),
                                     -scale * np.sum(direction * normal, axis=1),
                                     scale * np.sum(direction * normal[ahead], axis=1)])
            jacobian = scipy.sparse.csr_matrix((values, (rows, cols)), shape=(2 * count, count))
            matrix = jacobian.toarray() if settings.lsq_solver == "exact" else jacobian
            target = -np.concatenate([root_ds * kappa, scale * length])
            solved = lsq_linear(matrix, target, bounds=(self.lower - offset, self.upper - offset), method="trf",
                                lsq_solver=settings.lsq_solver, tol=settings.lsq_tol)
            step = np.clip(offset + solved.x, self.lower, self.upper) - offset
            fraction = 1.0
            while True:
                trial = self.objective(offset + fraction * step, weight)
                if trial <= value or fraction <= _SMALLEST_STEP:
                    break
                fraction /= 2
            if trial > value:  # no descent along the step: as good as this linearisation makes it
                settled = True
                break
            offset, value = offset + fraction * step, trial
            settled = float(np.max(np.abs(fraction * step))) < settings.settle_m
        return offset, steps, settled

    def line(self, offset: np.ndarray, weight: float, steps: int, settled: bool) -> RacingLine:
        """The periodic cubic spline through the knots moved by ``offset``,
        sampled at as many points as the track has."""
        line = self.knots + offset[:, None] * self.normal
        _, chord = geometry.loop_segments(np, line, np.asarray(len(line)))
        spline = CubicSpline(np.concatenate([[0.0], np.cumsum(chord)]), np.vstack([line, line[:1]]),
                             bc_type="periodic")
        at = np.linspace(0.0, float(chord.sum()), self.count, endpoint=False)
        points, first, second = spline(at), spline(at, 1), spline(at, 2)
        curvature = (first[:, 0] * second[:, 1] - first[:, 1] * second[:, 0]) / np.linalg.norm(first, axis=1) ** 3
        _, segment = geometry.loop_segments(np, points, np.asarray(len(points)))
        return RacingLine(points_m=points, curvature_per_m=curvature,
                          arc_m=np.concatenate([[0.0], np.cumsum(segment)[:-1]]),
                          length_m=math.fsum(segment.tolist()), knot_index=self.knot_index, knot_offset_m=offset,
                          knot_normal=self.normal, lower_m=self.lower, upper_m=self.upper,
                          length_weight_per_m2=weight, linearisations=steps, settled=settled)


def racing_line(track: Track | Mapping[str, Any], settings: LineSettings = LineSettings(),
                length_weight_per_m2: float = 0.0) -> RacingLine:
    """The line of `track` that minimises ``integral kappa^2 ds +
    length_weight_per_m2 * length`` (see the module's docstring; 0: the
    minimum-curvature line).

    Args:
        track: a `Track`, or a mapping with its arrays ``centerline``,
            ``left_boundary``, ``right_boundary`` ([C, 2], m) and
            ``track_mask`` ([C], a prefix of ones): a world's observation
            does (other keys are ignored, as is the padding).
        settings: the car's half-width, the margin, the solver's settings.
        length_weight_per_m2: the weight of the line's length, 1/m^2 (>= 0).

    Raises:
        TypeError: a track that is neither, an array of the wrong kind,
            settings that are not `LineSettings`.
        ValueError: a mask that is not a prefix of at least
            ``MIN_TRACK_POINTS`` ones, a shape that does not fit, a
            non-finite point, a degenerate centerline (coinciding points,
            a turn of 90 degrees or more between neighbours, a loop that
            does not turn once), a boundary on the wrong side, or a margin
            that leaves no room between the boundaries; each names the
            argument.
    """
    if not isinstance(settings, LineSettings):
        raise TypeError(f"settings must be a LineSettings, got {type(settings).__name__}")
    weight = checks.real_in(length_weight_per_m2, "length_weight_per_m2", 0.0, math.inf, unit="1/m^2")
    road = _Road(track, settings)
    offset, steps, settled = road.solve(weight, np.zeros(len(road.knots)), settings)
    return road.line(offset, weight, steps, settled)


# --------------------------------------------------------------------------- the speed profile


class _Limits:
    """The envelope's tables as the passes read them: linear between the
    measured speeds, the lowest speed's values below them."""

    def __init__(self, envelope: Envelope) -> None:
        self.speeds = envelope.speeds_mps
        self.lateral = envelope.lateral_mps2
        self.forward = envelope.forward_mps2
        self.braking = envelope.braking_mps2

    def available(self, table: np.ndarray, speed: float, curvature: float) -> float:
        """The longitudinal acceleration left at ``speed`` on ``curvature``
        by the friction ellipse, m/s^2."""
        lateral = speed * speed * curvature / float(np.interp(speed, self.speeds, self.lateral))
        return float(np.interp(speed, self.speeds, table)) * math.sqrt(max(0.0, 1.0 - lateral * lateral))


def _corner_speeds(limits: _Limits, curvature: np.ndarray, top: float) -> np.ndarray:
    """The fixed point ``v = min(top, sqrt(a_lat(v) / |kappa|))``, from ``top`` down."""
    speed = np.full(len(curvature), top)
    bend = np.abs(curvature)
    for _ in range(_FIXED_POINT_ITERATIONS):
        lateral = np.interp(speed, limits.speeds, limits.lateral)
        with np.errstate(divide="ignore"):
            following = np.minimum(top, np.sqrt(lateral / bend))
        moved = float(np.max(np.abs(following - speed)))
        speed = following
        if moved < _FIXED_POINT_TOL_MPS:
            return speed
    raise RuntimeError(f"the corner speeds did not settle in {_FIXED_POINT_ITERATIONS} iterations "
                       f"(the last moved {moved:.3g} m/s): the envelope's lateral limit rises too fast with speed")


def _sweep(cap: np.ndarray, segment: np.ndarray, curvature: np.ndarray, limits: _Limits, table: np.ndarray,
           start: int, backward: bool) -> np.ndarray:
    """One limit swept around the loop from ``start`` until the speed it
    carries back to ``start`` is the one it left with."""
    count = len(cap)
    speed = cap.copy()
    step = -1 if backward else 1
    for _ in range(_MAX_SWEEPS):
        entering = speed[start]
        for k in range(count):
            here = (start + step * k) % count
            there = (here + step) % count
            seg = segment[there] if backward else segment[here]
            v = speed[here]
            # Forward: speed up from here to the next point; backward: the previous point brakes into here.
            reach = math.sqrt(v * v + 2.0 * limits.available(table, v, abs(curvature[here])) * seg)
            speed[there] = min(cap[there], reach)
        if speed[start] >= entering - 1e-12:
            return speed
    raise RuntimeError(f"the speed profile did not become periodic in {_MAX_SWEEPS} sweeps")


def speed_profile(points_m: np.ndarray, curvature_per_m: np.ndarray, envelope: Envelope,
                  max_speed_mps: float | None = None) -> SpeedProfile:
    """The quasi-steady-state speed along a closed line under `envelope`
    (see the module's docstring: corner limits, friction ellipse, forward
    and backward passes until periodic, the flying and the standing lap).

    Args:
        points_m: float [N, 2], the line, m: a closed loop, the first point
            not repeated (N >= 3).
        curvature_per_m: float [N], its curvature at each point, 1/m (the
            sign is ignored).
        envelope: the car's measured limits.
        max_speed_mps: never faster, m/s (None: the envelope's top measured
            speed, which it may not exceed).

    Raises:
        TypeError: an envelope that is not an `Envelope`, arrays of the wrong kind.
        ValueError: shapes that do not fit, non-finite values, coinciding
            points, an envelope with a missing (NaN) limit, a speed cap
            above the envelope's top speed; each names the argument.
    """
    limits = _Limits(_envelope(envelope))
    points = checks.host_array("points_m", points_m)
    checks.check_float_kind("points_m", points.dtype)
    if points.ndim != 2 or points.shape[1] != 2 or len(points) < 3:
        raise ValueError(f"points_m must have shape [N, 2] with N >= 3, got {points.shape}")
    curvature = checks.host_array("curvature_per_m", curvature_per_m)
    checks.check_float_kind("curvature_per_m", curvature.dtype)
    checks.check_shape("curvature_per_m", curvature.shape, (len(points),), "[N] with N from points_m")
    points, curvature = points.astype(np.float64), curvature.astype(np.float64)
    for name, arr in (("points_m", points), ("curvature_per_m", curvature)):
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite")
    top = float(envelope.speeds_mps[-1])
    if max_speed_mps is not None:
        top = checks.real_in(max_speed_mps, "max_speed_mps", 0.0, top, low_open=True, unit="m/s")
    count = len(points)
    segment = checks.loop_segment_lengths("points_m", points)
    corner = _corner_speeds(limits, curvature, top)
    slowest = int(np.argmin(corner))
    speed = _sweep(corner, segment, curvature, limits, limits.forward, slowest, backward=False)
    speed = _sweep(speed, segment, curvature, limits, limits.braking, slowest, backward=True)
    standing = np.empty(count + 1)
    standing[0] = 0.0
    for i in range(count):
        v = standing[i]
        reach = math.sqrt(v * v + 2.0 * limits.available(limits.forward, v, abs(curvature[i])) * segment[i])
        standing[i + 1] = min(speed[(i + 1) % count], reach)
    ahead = np.roll(speed, -1)
    return SpeedProfile(corner_speed_mps=corner, speed_mps=speed, standing_speed_mps=standing, segment_m=segment,
                        lap_time_s=math.fsum((2 * segment / (speed + ahead)).tolist()),
                        standing_lap_time_s=math.fsum((2 * segment / (standing[:-1] + standing[1:])).tolist()),
                        max_speed_mps=top)


def min_time_lap(track: Track | Mapping[str, Any], envelope: Envelope,
                 settings: LineSettings = LineSettings()) -> LimitLap:
    """`track`'s lap at the limit of `envelope`: the fastest of the lines
    `racing_line` builds with ``settings.length_weights_per_m2`` (and,
    with ``settings.refine``, the geometric means of the fastest one's
    weight and its neighbours'), each driven by `speed_profile`.
    ``.lap_time_s`` is T_lim.

    Each weight's line starts from the previous one's (the weights in
    increasing order), so the later ones take fewer steps.

    Raises:
        TypeError, ValueError: as `racing_line` and `speed_profile`, each
            naming the argument.
    """
    _envelope(envelope)
    if not isinstance(settings, LineSettings):
        raise TypeError(f"settings must be a LineSettings, got {type(settings).__name__}")
    road = _Road(track, settings)
    laps: dict[float, tuple[RacingLine, SpeedProfile]] = {}

    def drive(weight: float, start: np.ndarray) -> None:
        offset, steps, settled = road.solve(weight, start, settings)
        line = road.line(offset, weight, steps, settled)
        laps[weight] = (line, speed_profile(line.points_m, line.curvature_per_m, envelope, settings.max_speed_mps))

    offset = np.zeros(len(road.knots))
    for weight in settings.length_weights_per_m2:
        drive(weight, offset)
        offset = laps[weight][0].knot_offset_m
    weights = list(settings.length_weights_per_m2)
    best = min(weights, key=lambda w: laps[w][1].lap_time_s)
    if settings.refine and len(weights) > 1:
        k = weights.index(best)
        for neighbour in (weights[k - 1] if k else None, weights[k + 1] if k + 1 < len(weights) else None):
            if neighbour is None:
                continue
            # Geometric means in a grid of ratios; the arithmetic one beside a zero weight.
            middle = math.sqrt(best * neighbour) if best * neighbour > 0 else 0.5 * (best + neighbour)
            drive(middle, laps[best][0].knot_offset_m)
        best = min(laps, key=lambda w: laps[w][1].lap_time_s)
    line, profile = laps[best]
    return LimitLap(line=line, profile=profile, settings=settings, envelope_sha256=envelope.config_sha256,
                    tried=tuple((w, p.lap_time_s) for w, (_, p) in laps.items()))
