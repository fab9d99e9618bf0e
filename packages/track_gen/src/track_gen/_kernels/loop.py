"""Kernels of the seeded closed spline every course is built on: control
points, samples, arc lengths, and the resampled line.

Conventions: see ``track_gen._kernels``.
"""

import warp as wp

from track_gen._kernels.geometry import NAN, TWO_PI, cross2, point_at
from track_gen.seeds import effective_seed_wp


@wp.kernel
def advance_epochs(active: wp.array(dtype=wp.int32), advance: int, epochs: wp.array(dtype=wp.int32)):
    """Masked envs move to their next epoch (``advance`` != 0); ``epochs`` is
    in-out state."""
    e = wp.tid()
    if active[e] != 0 and advance != 0:
        epochs[e] = epochs[e] + 1


@wp.kernel
def control_points(
    active: wp.array(dtype=wp.int32),
    seeds: wp.array(dtype=wp.uint32),
    epochs: wp.array(dtype=wp.int32),
    radius: wp.array(dtype=wp.float32),
    radius_jitter: wp.array(dtype=wp.float32),
    angle_jitter: wp.array(dtype=wp.float32),
    ctrl: wp.array2d(dtype=wp.vec2),
):
    """``ctrl[e, k]``: control point ``k`` of env ``e``, at angle ``2πk/K``
    (jittered by ``angle_jitter`` of a step) and radius ``radius`` (scaled by
    up to ``1 ± radius_jitter``), from the env's ``(seed, epoch)``."""
    e, k = wp.tid()
    if active[e] == 0:
        return
    num = ctrl.shape[1]
    # RNG stream k: one per control point (``track_gen._kernels``: the streams never overlap).
    state = wp.rand_init(wp.int32(effective_seed_wp(seeds[e], epochs[e])), k)
    step = TWO_PI / float(num)
    angle = step * (float(k) + angle_jitter[e] * (wp.randf(state) - 0.5))
    r = radius[e] * (1.0 + radius_jitter[e] * (2.0 * wp.randf(state) - 1.0))
    ctrl[e, k] = wp.vec2(r * wp.cos(angle), r * wp.sin(angle))


@wp.kernel
def spline_samples(
    active: wp.array(dtype=wp.int32),
    ctrl: wp.array2d(dtype=wp.vec2),
    samples_per_segment: int,
    width: wp.array(dtype=wp.float32),
    tight: wp.array(dtype=wp.int32),  # in-out: a count added to
    dense: wp.array2d(dtype=wp.vec2),  # output
):
    """``dense[e, k*S + j]``: the closed uniform Catmull-Rom spline through the
    control points, sampled ``S`` times per segment. Counts, per env, the
    samples whose radius of curvature ``|r'|^3 / |r' x r''|`` is below the
    half-width (added to ``tight``, zeroed by ``reset_counts``)."""
    e, i = wp.tid()
    if active[e] == 0:
        return
    num = ctrl.shape[1]
    k = i // samples_per_segment
    u = float(i - k * samples_per_segment) / float(samples_per_segment)
    p0 = ctrl[e, (k + num - 1) % num]
    p1 = ctrl[e, k]
    p2 = ctrl[e, (k + 1) % num]
    p3 = ctrl[e, (k + 2) % num]
    # r(u) = (c0 + c1 u + c2 u^2 + c3 u^3) / 2
    c1 = p2 - p0
    c2 = 2.0 * p0 - 5.0 * p1 + 4.0 * p2 - p3
    c3 = 3.0 * p1 - p0 - 3.0 * p2 + p3
    dense[e, i] = 0.5 * (2.0 * p1 + u * (c1 + u * (c2 + u * c3)))
    d1 = 0.5 * (c1 + 2.0 * u * c2 + 3.0 * u * u * c3)
    d2 = 0.5 * (2.0 * c2 + 6.0 * u * c3)
    speed = wp.length(d1)
    if speed * speed * speed < 0.5 * width[e] * wp.abs(cross2(d1, d2)):
        wp.atomic_add(tight, e, 1)


@wp.kernel
def arc_lengths(
    active: wp.array(dtype=wp.int32),
    dense: wp.array2d(dtype=wp.vec2),
    points: wp.array(dtype=wp.int32),
    ds: float,
    n_max: int,
    cum: wp.array2d(dtype=wp.float32),
    length: wp.array(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    spacing: wp.array(dtype=wp.float32),
    truncated: wp.array(dtype=wp.int32),
):
    """Cumulative arc length along the closed polyline of the first
    ``points[e]`` points of ``dense`` (``cum[e, m]`` is the lap length ``L``),
    the course line's point count ``n = ceil(L / ds)`` and its spacing
    ``L / n`` (at most ``ds``, the same for every segment, the closing one
    included); a course that needs more than ``n_max`` points keeps
    ``n_max`` points ``ds`` apart and is flagged truncated."""
    e = wp.tid()
    if active[e] == 0:
        return
    m = points[e]
    total = float(0.0)
    cum[e, 0] = 0.0
    for i in range(m):
        total = total + wp.length(dense[e, (i + 1) % m] - dense[e, i])
        cum[e, i + 1] = total
    length[e] = total
    need = wp.ceil(total / ds)
    if need <= float(n_max):  # false for NaN: no int conversion out of range
        n = wp.max(int(need), 1)
        truncated[e] = 0
        count[e] = n
        spacing[e] = total / float(n)
    else:
        truncated[e] = 1
        count[e] = n_max
        spacing[e] = ds


@wp.kernel
def resample(
    active: wp.array(dtype=wp.int32),
    dense: wp.array2d(dtype=wp.vec2),
    points: wp.array(dtype=wp.int32),
    cum: wp.array2d(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    spacing: wp.array(dtype=wp.float32),
    center: wp.array2d(dtype=wp.vec3),
    arc: wp.array2d(dtype=wp.float32),
):
    """The course line: point ``i`` at arc length ``i * spacing[e]`` along the
    closed polyline of ``points[e]`` points of ``dense`` (NaN past the count)."""
    e, i = wp.tid()
    if active[e] == 0:
        return
    if i >= count[e]:
        center[e, i] = wp.vec3(NAN, NAN, NAN)
        arc[e, i] = NAN
        return
    s = float(i) * spacing[e]
    p = point_at(dense, cum, e, points[e], s)
    center[e, i] = wp.vec3(p[0], p[1], 0.0)
    arc[e, i] = s


@wp.kernel
def check_param(
    active: wp.array(dtype=wp.int32),
    values: wp.array(dtype=wp.float32),
    lowest: float,
    highest: float,
    lowest_allowed: int,
    bad: wp.array(dtype=wp.int32),
):
    """``bad[e] = 1`` where a param is outside ``(lowest, highest)``
    (``[lowest, highest)`` with ``lowest_allowed``); NaN is outside. ``bad``
    is an output, only ever set (``clear_where`` zeroes it first), so one
    flag gathers the checks of every param."""
    e = wp.tid()
    if active[e] == 0:
        return
    v = values[e]
    inside = v < highest and (v > lowest or (lowest_allowed != 0 and v == lowest))
    if not inside:
        bad[e] = 1


@wp.kernel
def clear_where(active: wp.array(dtype=wp.int32), flags: wp.array(dtype=wp.int32)):
    """``flags[e] = 0`` for the active envs."""
    e = wp.tid()
    if active[e] != 0:
        flags[e] = 0


@wp.kernel
def copy_where(active: wp.array(dtype=wp.int32), src: wp.array(dtype=wp.float32),
               dst: wp.array(dtype=wp.float32)):
    """``dst[e] = src[e]`` for the active envs (a param a course was built with)."""
    e = wp.tid()
    if active[e] != 0:
        dst[e] = src[e]
