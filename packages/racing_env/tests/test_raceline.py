"""Tests for racing_env.raceline: the racing line and the lap at the limit.

Held against what it does not compute itself:

- the speed profile against hand-built timelines on hand-built lines: a
  circle (v = sqrt(a_lat / kappa), the lateral limit a function of the
  speed, so a fixed point; the standing start along the friction
  ellipse in closed form) and a stadium (the forward and braking limits,
  a speed cap), the lap times summed by hand;
- the line on a circle track of radius R (the minimum-curvature line is
  the outermost circle the margin allows) and its lap against
  2 pi r / sqrt(a_lat r);
- the line's feasibility against the NumPy oracles of `oracles`
  (point-in-road, distance to the boundary polylines), its closure and
  smoothness against its own points' circle curvature;
- every refusal names its argument.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from oracles import distance_to_loop, on_track
from worlds import circle_track

from racing_env import ProjectConfig, Track, level0_track
from racing_env.envelope import Envelope
from racing_env.raceline import (
    LimitLap,
    LineSettings,
    min_time_lap,
    racing_line,
    speed_profile,
)

#: The minimum-curvature line alone (no search towards minimum time).
CURVATURE_ONLY = LineSettings(length_weights_per_m2=(0.0,))
#: int_0^(pi/2) sin(theta)^(-1/2) d theta = Gamma(1/4)^2 / (2 sqrt(2 pi)).
SIN_INTEGRAL = math.gamma(0.25) ** 2 / (2 * math.sqrt(2 * math.pi))


def envelope(lateral=(8.0, 8.0), forward=(3.0, 3.0), braking=(6.0, 6.0), speeds=(1.0, 60.0)) -> Envelope:
    """A hand-made envelope: limits linear between ``speeds`` (m/s^2)."""
    k = len(speeds)
    return Envelope(config_sha256="0" * 64, speeds_mps=np.array(speeds), lateral_mps2=np.array(lateral),
                    forward_mps2=np.array(forward), braking_mps2=np.array(braking), headings_rad=np.array([0.0]),
                    forward_by_heading_mps2=np.array([forward]), braking_by_heading_mps2=np.array([braking]),
                    from_rest_by_heading_mps2=np.array([forward]), lateral_steering_rad=np.full(k, 0.1),
                    lateral_limited_by=("plateau",) * k, gg_speeds_mps=np.array([]), gg_heading_rad=0.0, gg=())


def circle(radius: float, points: int) -> tuple[np.ndarray, np.ndarray]:
    """A counter-clockwise circle's points and curvature."""
    theta = 2 * np.pi * np.arange(points) / points
    return np.stack([radius * np.cos(theta), radius * np.sin(theta)], axis=1), np.full(points, 1 / radius)


def stadium(straight: float, radius: float, spacing: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A counter-clockwise stadium: points, curvature (0 on the straights,
    their ends included; 1 / radius strictly inside the arcs) and which
    points lie on the first straight (from its start, the first arc's exit)."""
    n_straight = round(straight / spacing)
    n_arc = round(math.pi * radius / spacing)
    x = np.linspace(0.0, straight, n_straight + 1)[:-1]
    first = np.stack([x, np.full_like(x, -radius)], axis=1)
    phi = -np.pi / 2 + np.pi * np.arange(n_arc) / n_arc
    arc = np.stack([straight + radius * np.cos(phi), radius * np.sin(phi)], axis=1)
    points = np.vstack([first, arc, [straight, 0.0] - first, [straight, 0.0] - arc])
    curvature = np.concatenate([np.zeros(n_straight), [0.0], np.full(n_arc - 1, 1 / radius)] * 2)
    on_first = np.zeros(len(points), bool)
    on_first[:n_straight + 1] = True
    return points, curvature, on_first


def observation(track: Track) -> dict[str, np.ndarray]:
    return {name: np.array(getattr(track, name)) for name in ("centerline", "left_boundary", "right_boundary",
                                                              "track_mask")}


@pytest.fixture(scope="module")
def level0() -> Track:
    return level0_track()


# --------------------------------------------------------------------------- the speed profile


def test_a_circle_is_driven_at_its_corner_limit():
    points, curvature = circle(50.0, 400)
    profile = speed_profile(points, curvature, envelope())
    v = math.sqrt(8.0 * 50.0)
    np.testing.assert_allclose(profile.corner_speed_mps, v, rtol=1e-12)
    np.testing.assert_allclose(profile.speed_mps, v, rtol=1e-12)
    perimeter = 400 * 2 * 50.0 * math.sin(math.pi / 400)
    assert profile.lap_time_s == pytest.approx(perimeter / v, rel=1e-12)
    assert profile.lap_time_s == pytest.approx(2 * math.pi * 50.0 / v, rel=1e-4)


def test_the_corner_limit_is_a_fixed_point_of_a_speed_dependent_lateral_limit():
    # a_lat(v) = 4.5 + 0.1 v (5 m/s^2 at 5 m/s, 9 at 50): v^2 / R = 4.5 + 0.1 v.
    limits = envelope(lateral=(5.0, 9.0), forward=(3.0, 3.0), braking=(6.0, 6.0), speeds=(5.0, 45.0))
    for radius in (20.0, 60.0, 150.0):
        points, curvature = circle(radius, 300)
        expected = (0.1 * radius + math.sqrt((0.1 * radius) ** 2 + 4 * 4.5 * radius)) / 2
        profile = speed_profile(points, curvature, limits)
        np.testing.assert_allclose(profile.corner_speed_mps, expected, rtol=1e-9)


def test_the_stadium_follows_the_forward_and_braking_limits():
    straight, radius, forward, braking, lateral = 200.0, 30.0, 3.0, 6.0, 8.0
    points, curvature, first = stadium(straight, radius, 0.5)
    profile = speed_profile(points, curvature, envelope((lateral,) * 2, (forward,) * 2, (braking,) * 2))
    corner = math.sqrt(lateral * radius)
    x = points[first, 0]  # distance from the first straight's start
    hand = np.sqrt(np.minimum(corner**2 + 2 * forward * x, corner**2 + 2 * braking * (straight - x)))
    np.testing.assert_allclose(profile.speed_mps[first], hand, rtol=1e-9)
    np.testing.assert_allclose(profile.speed_mps[curvature > 0], corner, rtol=1e-12)
    peak = math.sqrt(corner**2 + 2 * forward * braking * straight / (forward + braking))
    on_straight = (peak - corner) / forward + (peak - corner) / braking
    assert profile.lap_time_s == pytest.approx(2 * (on_straight + math.pi * radius / corner), rel=2e-4)


def test_a_speed_cap_flattens_the_straight():
    straight, radius, cap = 200.0, 30.0, 20.0
    points, curvature, first = stadium(straight, radius, 0.5)
    profile = speed_profile(points, curvature, envelope(), max_speed_mps=cap)
    corner = math.sqrt(8.0 * radius)
    x = points[first, 0]
    hand = np.sqrt(np.minimum.reduce([corner**2 + 2 * 3.0 * x, corner**2 + 2 * 6.0 * (straight - x),
                                      np.full_like(x, cap**2)]))
    np.testing.assert_allclose(profile.speed_mps[first], hand, rtol=1e-9)
    assert profile.max_speed_mps == cap and profile.speed_mps.max() == pytest.approx(cap)
    flat = straight - (cap**2 - corner**2) / (2 * 3.0) - (cap**2 - corner**2) / (2 * 6.0)
    on_straight = (cap - corner) / 3.0 + (cap - corner) / 6.0 + flat / cap
    assert profile.lap_time_s == pytest.approx(2 * (on_straight + math.pi * radius / corner), rel=2e-4)


def test_the_standing_start_follows_the_friction_ellipse():
    # From rest on a circle: d(v^2)/ds = 2 a_f sqrt(1 - (v^2 / v_c^2)^2), so
    # v^2 = v_c^2 sin(k s) with k = 2 a_f / v_c^2, up to v_c at k s = pi / 2.
    radius, lateral, forward, points_on = 40.0, 8.0, 3.0, 1200
    points, curvature = circle(radius, points_on)
    profile = speed_profile(points, curvature, envelope((lateral,) * 2, (forward,) * 2))
    corner = math.sqrt(lateral * radius)
    k = 2 * forward / corner**2
    s = np.concatenate([[0.0], np.cumsum(profile.segment_m)])
    hand = corner * np.sqrt(np.sin(np.minimum(k * s, np.pi / 2)))
    assert profile.standing_speed_mps[0] == 0.0
    np.testing.assert_allclose(profile.standing_speed_mps, hand, atol=0.01 * corner)
    rising = math.pi / 2 / k
    lap = s[-1]
    hand_time = SIN_INTEGRAL / (corner * k) + (lap - rising) / corner
    assert profile.standing_lap_time_s == pytest.approx(hand_time, rel=2e-3)
    assert profile.lap_time_s == pytest.approx(lap / corner, rel=1e-12)


def test_every_segment_of_the_flying_lap_keeps_to_the_limits():
    """Around the closed loop, the last segment included: no speed-up beyond
    the forward limit, no slow-down beyond the braking limit, the ellipse
    taken at the segment's start (speeding up) or end (slowing down)."""
    limits = envelope(lateral=(6.0, 7.0), forward=(4.0, 3.0), braking=(5.0, 7.0), speeds=(5.0, 40.0))
    points, curvature, _ = stadium(120.0, 25.0, 0.7)
    profile = speed_profile(points, curvature, limits)
    v, s = profile.speed_mps, profile.segment_m
    following = np.roll(v, -1)
    lateral = np.interp(v, limits.speeds_mps, limits.lateral_mps2)
    ellipse = np.sqrt(np.maximum(0.0, 1 - (v**2 * np.abs(curvature) / lateral) ** 2))
    up = np.interp(v, limits.speeds_mps, limits.forward_mps2) * ellipse
    down = np.interp(v, limits.speeds_mps, limits.braking_mps2) * ellipse
    assert np.all(following**2 <= v**2 + 2 * up * s + 1e-9)
    assert np.all(v**2 <= following**2 + 2 * np.roll(down, -1) * s + 1e-9)
    assert np.all(v <= profile.corner_speed_mps + 1e-12)


# --------------------------------------------------------------------------- the line


def test_the_minimum_curvature_line_of_a_circle_is_its_outermost_circle():
    radius, half_width = 60.0, 6.0
    track = circle_track(radius, 400, half_width, 7)
    # Solved to 1e-8: at the default tol (1e-6) lsq_linear stops where the
    # BLAS kernels' rounding leads it, 0.7 mm off the circle with AVX-512
    # kernels and 2.2 mm with AVX2 ones; at 1e-8 both lie 0.38 mm off, the
    # spline's own ripple (below).
    settings = dataclasses.replace(CURVATURE_ONLY, lsq_tol=1e-8)
    line = racing_line(track, settings)
    outer = radius + half_width - settings.car_half_width_m - settings.margin_m
    np.testing.assert_allclose(np.linalg.norm(line.points_m, axis=1), outer, atol=1e-3)
    # 400 points do not split evenly into knots 3 m apart: the spline through
    # knots 3 and 4 points apart ripples by a few tenths of a percent.
    np.testing.assert_allclose(line.curvature_per_m, 1 / outer, rtol=5e-3)
    lap = min_time_lap(track, envelope(), settings)
    assert lap.lap_time_s == pytest.approx(2 * math.pi * outer / math.sqrt(8.0 * outer), rel=1e-3)
    assert lap.length_m == pytest.approx(2 * math.pi * outer, rel=1e-4)


def test_the_fastest_line_of_a_circle_is_further_in():
    """On a circle the lap takes 2 pi sqrt(r / a_lat): the shorter line wins."""
    radius, half_width = 60.0, 6.0
    track = circle_track(radius, 400, half_width, 7)
    slowest = min_time_lap(track, envelope(), CURVATURE_ONLY)
    lap = min_time_lap(track, envelope())
    assert isinstance(lap, LimitLap)
    r = np.linalg.norm(lap.line.points_m, axis=1)
    inner = radius - half_width + lap.settings.car_half_width_m + lap.settings.margin_m
    assert inner - 1e-3 <= r.min() and r.max() < inner + 0.05  # the inside, less the sagitta guard
    assert lap.lap_time_s == pytest.approx(2 * math.pi * math.sqrt(r.mean() / 8.0), rel=2e-3)
    assert lap.lap_time_s < 0.95 * slowest.lap_time_s
    assert len(lap.tried) == len(lap.settings.length_weights_per_m2) + 2  # the grid, then two in between
    assert (lap.line.length_weight_per_m2, lap.lap_time_s) in lap.tried
    assert lap.lap_time_s == min(t for _, t in lap.tried)


@pytest.mark.parametrize("weight", [0.0, 4e-4])
def test_the_line_stays_inside_the_boundaries_less_the_margin(level0, weight):
    settings = LineSettings()
    line = racing_line(level0, settings, length_weight_per_m2=weight)
    n = level0.num_points
    left, right = (np.asarray(b[:n], np.float64) for b in (level0.left_boundary, level0.right_boundary))
    assert np.all(on_track(line.points_m, left, right))
    clearance = np.minimum(distance_to_loop(line.points_m, left), distance_to_loop(line.points_m, right))
    # The boundaries are polylines through points 1.16 m apart: their chords
    # cut inside the curve the offsets describe by up to a few millimetres.
    assert clearance.min() >= settings.car_half_width_m + settings.margin_m - 0.005
    # Both boundaries are used (the line is not the centerline moved aside).
    assert np.any(line.knot_offset_m > line.upper_m - 1e-3) and np.any(line.knot_offset_m < line.lower_m + 1e-3)
    knots = np.asarray(level0.centerline[line.knot_index], np.float64)
    assert np.all((line.knot_offset_m >= line.lower_m - 1e-9) & (line.knot_offset_m <= line.upper_m + 1e-9))
    np.testing.assert_allclose(line.points_m[0], knots[0] + line.knot_offset_m[0] * line.knot_normal[0],
                               atol=1e-9)
    assert line.settled


def test_the_line_is_closed_and_smooth(level0):
    line = racing_line(level0)
    points = line.points_m
    step = np.linalg.norm(np.roll(points, -1, axis=0) - points, axis=1)
    assert step.max() < 1.001 * step.min()  # evenly spaced, the closing segment too
    assert line.length_m == pytest.approx(step.sum(), rel=1e-12)
    np.testing.assert_allclose(line.arc_m, np.concatenate([[0.0], np.cumsum(step)[:-1]]), rtol=1e-12)
    # Its curvature is that of its points (the circle through each and its neighbours) ...
    a, b = points - np.roll(points, 1, axis=0), np.roll(points, -1, axis=0) - points
    circle_curvature = 2 * (a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]) / (
        np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) * np.linalg.norm(a + b, axis=1))
    np.testing.assert_allclose(line.curvature_per_m, circle_curvature, atol=2e-4)
    # ... and changes slowly, across the start too: under 0.001 1/m a point.
    change = np.abs(np.diff(np.append(line.curvature_per_m, line.curvature_per_m[0])))
    assert change.max() < 1e-3
    heading = np.arctan2(b[:, 1], b[:, 0])
    turn = np.angle(np.exp(1j * (np.roll(heading, -1) - heading)))
    assert np.abs(turn).max() < math.radians(2.0) and abs(turn.sum() - 2 * np.pi) < 1e-9


def test_an_observation_gives_the_tracks_line_whatever_its_padding():
    track = circle_track(40.0, 200, 6.0, 3)
    obs = observation(track)
    for name in ("centerline", "left_boundary", "right_boundary"):
        obs[name][200:] = np.nan  # padding is never read
    before = {k: v.copy() for k, v in obs.items()}
    a, b = racing_line(track, CURVATURE_ONLY), racing_line(obs, CURVATURE_ONLY)
    np.testing.assert_array_equal(a.points_m, b.points_m)
    for k, v in obs.items():
        np.testing.assert_array_equal(v, before[k])  # nothing written into the caller's arrays


def test_the_sparse_solver_finds_the_same_line():
    theta = 2 * np.pi * np.arange(240) / 240
    r = 70 + 12 * np.sin(2 * theta) + 6 * np.cos(3 * theta)
    track = Track.from_centerline(np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1), 5.0, 9)
    exact = racing_line(track, LineSettings(knot_spacing_m=6.0))
    sparse = racing_line(track, LineSettings(knot_spacing_m=6.0, lsq_solver="lsmr", lsq_tol=1e-8))
    np.testing.assert_allclose(sparse.knot_offset_m, exact.knot_offset_m, atol=0.05)


def test_the_default_half_width_is_the_wheel_centres():
    assert LineSettings().car_half_width_m == ProjectConfig().track_width_m / 2
    assert LineSettings().to_dict()["length_weights_per_m2"] == list(LineSettings().length_weights_per_m2)


# --------------------------------------------------------------------------- refusals


def broken(obs: dict, name: str, index, value) -> dict:
    obs = {k: v.copy() for k, v in obs.items()}
    obs[name][index] = value
    return obs


@pytest.fixture(scope="module")
def small() -> dict[str, np.ndarray]:
    return observation(circle_track(40.0, 120, 6.0, 3))


def test_a_masked_prefix_of_three_points_is_refused(small):
    obs = {k: v.copy() for k, v in small.items()}
    obs["track_mask"][3:] = 0
    with pytest.raises(ValueError, match=r"track\['track_mask'\] has 3 valid points, needs at least "
                                         r"MIN_TRACK_POINTS = 8"):
        min_time_lap(obs, envelope())


@pytest.mark.parametrize("points, match", [
    (np.zeros((12, 2)), r"track\['centerline'\] points 0 and 1 coincide: a degenerate track"),
    (np.stack([np.r_[0:6, 6:0:-1], np.zeros(12)], axis=1).astype(float),
     r"turns by -180.0 deg at point 0: a degenerate track"),
    (np.stack([np.sin(np.linspace(0, 2 * np.pi, 40, endpoint=False)) * 50,
               np.sin(np.linspace(0, 4 * np.pi, 40, endpoint=False)) * 20], axis=1), r"turns -?0.000 times around"),
])
def test_a_degenerate_track_is_refused(points, match):
    count = len(points)
    obs = {"centerline": points, "left_boundary": points + [0.0, 5.0], "right_boundary": points - [0.0, 5.0],
           "track_mask": np.ones(count, np.int8)}
    with pytest.raises(ValueError, match=match):
        racing_line(obs)


@pytest.mark.parametrize("name", ["centerline", "left_boundary", "right_boundary"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_non_finite_point_is_refused(small, name, value):
    with pytest.raises(ValueError, match=rf"track\['{name}'\] is not finite at point 5"):
        racing_line(broken(small, name, (5, 1), value))


def test_a_margin_too_large_for_the_width_is_refused(small):
    with pytest.raises(ValueError, match=r"margin_m = 5.5 m leaves no room at centerline point 0: the road is "
                                         r"11.99\d m wide there and the line needs 2 x \(car_half_width_m \+ "
                                         r"margin_m\) = 12.600 m"):
        racing_line(small, LineSettings(margin_m=5.5))


def test_boundaries_on_the_wrong_side_are_refused(small):
    swapped = dict(small, left_boundary=small["right_boundary"], right_boundary=small["left_boundary"])
    with pytest.raises(ValueError, match=r"track\['left_boundary'\] must lie left of the centerline, it does not "
                                         r"at point 0"):
        racing_line(swapped)


def test_wrong_kinds_are_refused(small):
    with pytest.raises(TypeError, match="track must be a Track or a mapping"):
        racing_line([small["centerline"]])
    with pytest.raises(ValueError, match=r"track must hold .* it lacks 'left_boundary'"):
        racing_line({"centerline": small["centerline"]})
    with pytest.raises(TypeError, match=r"track\['centerline'\] must have a real floating dtype"):
        racing_line(dict(small, centerline=small["centerline"].astype(np.int64)))
    with pytest.raises(ValueError, match=r"track\['left_boundary'\] must have shape \[C, 2\]"):
        racing_line(dict(small, left_boundary=small["left_boundary"][:100]))
    with pytest.raises(ValueError, match=r"track\['track_mask'\] must be a prefix of ones"):
        racing_line(broken(small, "track_mask", 3, 0))
    with pytest.raises(TypeError, match="envelope must be an Envelope, got dict"):
        min_time_lap(small, {})
    with pytest.raises(TypeError, match="settings must be a LineSettings, got dict"):
        racing_line(small, {})
    with pytest.raises(TypeError, match="settings must be a LineSettings"):
        min_time_lap(small, envelope(), {})


@pytest.mark.parametrize("kwargs, error, match", [
    ({"margin_m": -0.1}, ValueError, "margin_m must be in"),
    ({"car_half_width_m": math.nan}, ValueError, "car_half_width_m must be in"),
    ({"knot_spacing_m": 0.0}, ValueError, "knot_spacing_m must be finite and > 0"),
    ({"max_linearisations": 0}, ValueError, "max_linearisations must be >= 1"),
    ({"max_linearisations": 2.0}, TypeError, "max_linearisations must be an int"),
    ({"lsq_solver": "bvls"}, ValueError, "lsq_solver must be one of"),
    ({"length_weights_per_m2": (1e-4, 0.0)}, ValueError, "length_weights_per_m2 must be one or more increasing"),
    ({"length_weights_per_m2": ()}, ValueError, "length_weights_per_m2 must be one or more increasing"),
    ({"length_weights_per_m2": (0.0, -1.0)}, ValueError, r"length_weights_per_m2\[1\] must be in"),
    ({"length_weights_per_m2": 0.0}, TypeError, "length_weights_per_m2 must be a sequence"),
    ({"refine": 1}, TypeError, "refine must be a bool"),
    ({"max_speed_mps": 0.0}, ValueError, "max_speed_mps must be finite and > 0"),
])
def test_bad_settings_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        LineSettings(**kwargs)


def test_bad_profile_inputs_are_refused():
    points, curvature = circle(30.0, 50)
    with pytest.raises(ValueError, match=r"max_speed_mps must be in \(0, 60\]"):
        speed_profile(points, curvature, envelope(), max_speed_mps=61.0)
    with pytest.raises(ValueError, match="curvature_per_m must be finite"):
        speed_profile(points, np.where(np.arange(50) == 3, np.nan, curvature), envelope())
    with pytest.raises(ValueError, match=r"curvature_per_m must have shape \[N\] with N from points_m"):
        speed_profile(points, curvature[:-1], envelope())
    with pytest.raises(ValueError, match="points_m 3 and 4 coincide"):
        speed_profile(np.delete(np.insert(points, 4, points[3], axis=0), -1, axis=0), curvature, envelope())
    with pytest.raises(ValueError, match=r"envelope.lateral_mps2 must be finite and > 0"):
        speed_profile(points, curvature, envelope(lateral=(8.0, math.nan)))
    with pytest.raises(TypeError, match="points_m must have a real floating dtype"):
        speed_profile(points.astype(int), curvature, envelope())
