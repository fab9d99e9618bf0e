"""Warp kernels that generate, resample, check and bake closed-loop tracks.

Every kernel takes an ``active`` ``[E]`` int32 array and leaves the envs whose
entry is 0 untouched, so a masked regeneration rebuilds only the masked envs
and every other env keeps its arrays bit for bit. Inputs come first, outputs
last. Lengths are metres, angles radians.
"""

import warp as wp

from track_gen.checks import FAIL_THICKNESS, FAIL_TRUNCATION, FAIL_TURNING
from track_gen.seeds import effective_seed_wp

TWO_PI = wp.constant(6.283185307179586)
NAN = wp.constant(float("nan"))


@wp.func
def _cross2(a: wp.vec2, b: wp.vec2) -> float:
    return a[0] * b[1] - a[1] * b[0]


@wp.kernel
def advance_epochs(active: wp.array(dtype=wp.int32), advance: int, epochs: wp.array(dtype=wp.int32)):
    """Masked envs move to their next epoch (``advance`` != 0)."""
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
    dense: wp.array2d(dtype=wp.vec2),
    tight: wp.array(dtype=wp.int32),
):
    """``dense[e, k*S + j]``: the closed uniform Catmull-Rom spline through the
    control points, sampled ``S`` times per segment. Counts, per env, the
    samples whose radius of curvature ``|r'|^3 / |r' x r''|`` is below the
    half-width (into ``tight``, zeroed by ``reset_counts``)."""
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
    if speed * speed * speed < 0.5 * width[e] * wp.abs(_cross2(d1, d2)):
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
    truncated: wp.array(dtype=wp.int32),
):
    """Cumulative arc length along the closed polyline of the first
    ``points[e]`` points of ``dense`` (``cum[e, m]`` is the lap length ``L``)
    and the course line's point count ``ceil(L / ds)``; a course that needs
    more than ``n_max`` points keeps ``n_max`` and is flagged truncated."""
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
    n = int(wp.ceil(total / ds))
    truncated[e] = wp.where(n > n_max, 1, 0)
    count[e] = wp.min(n, n_max)


@wp.func
def point_at(dense: wp.array2d(dtype=wp.vec2), cum: wp.array2d(dtype=wp.float32), e: int, m: int,
             s: float) -> wp.vec2:
    """The point at arc length ``s`` along env ``e``'s closed polyline of ``m``
    points (``cum`` its cumulative lengths): a binary search, then a lerp."""
    lo = int(0)
    hi = m
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cum[e, mid] <= s:
            lo = mid
        else:
            hi = mid
    seg = cum[e, lo + 1] - cum[e, lo]
    t = float(0.0)
    if seg > 0.0:
        t = (s - cum[e, lo]) / seg
    return dense[e, lo] + t * (dense[e, (lo + 1) % m] - dense[e, lo])


@wp.kernel
def resample(
    active: wp.array(dtype=wp.int32),
    dense: wp.array2d(dtype=wp.vec2),
    points: wp.array(dtype=wp.int32),
    cum: wp.array2d(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    ds: float,
    center: wp.array2d(dtype=wp.vec3),
    arc: wp.array2d(dtype=wp.float32),
):
    """The course line: point ``i`` at arc length ``i * ds`` along the closed
    polyline of ``points[e]`` points of ``dense`` (NaN past the count)."""
    e, i = wp.tid()
    if active[e] == 0:
        return
    if i >= count[e]:
        center[e, i] = wp.vec3(NAN, NAN, NAN)
        arc[e, i] = NAN
        return
    s = float(i) * ds
    p = point_at(dense, cum, e, points[e], s)
    center[e, i] = wp.vec3(p[0], p[1], 0.0)
    arc[e, i] = s


@wp.kernel
def frames_and_boundaries(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    width: wp.array(dtype=wp.float32),
    tangent: wp.array2d(dtype=wp.vec3),
    normal: wp.array2d(dtype=wp.vec3),
    left: wp.array2d(dtype=wp.vec3),
    right: wp.array2d(dtype=wp.vec3),
):
    """Unit tangents (central differences around the loop), left normals, and
    the boundaries half a width to each side."""
    e, i = wp.tid()
    if active[e] == 0:
        return
    n = count[e]
    if i >= n:
        nan3 = wp.vec3(NAN, NAN, NAN)
        tangent[e, i] = nan3
        normal[e, i] = nan3
        left[e, i] = nan3
        right[e, i] = nan3
        return
    d = center[e, (i + 1) % n] - center[e, (i + n - 1) % n]
    t = wp.normalize(wp.vec3(d[0], d[1], 0.0))
    nl = wp.vec3(-t[1], t[0], 0.0)
    half = 0.5 * width[e]
    tangent[e, i] = t
    normal[e, i] = nl
    left[e, i] = center[e, i] + half * nl
    right[e, i] = center[e, i] - half * nl


@wp.func
def _segments_cross(p: wp.vec2, p2: wp.vec2, q: wp.vec2, q2: wp.vec2) -> bool:
    """Proper crossing of segments ``p p2`` and ``q q2`` (strict sign changes)."""
    r = p2 - p
    s = q2 - q
    d1 = _cross2(r, q - p)
    d2 = _cross2(r, q2 - p)
    d3 = _cross2(s, p - q)
    d4 = _cross2(s, p2 - q)
    return d1 * d2 < 0.0 and d3 * d4 < 0.0


@wp.func
def _xy(v: wp.vec3) -> wp.vec2:
    return wp.vec2(v[0], v[1])


CHUNK = wp.constant(16)


@wp.kernel
def chunk_bounds(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    lo: wp.array2d(dtype=wp.vec2),
    hi: wp.array2d(dtype=wp.vec2),
):
    """Bounding box of the segments of chunk ``c`` (points ``16c .. 16c+16``,
    each with the point after it): the broad phase of ``pair_checks``."""
    e, c = wp.tid()
    if active[e] == 0:
        return
    n = count[e]
    box_lo = wp.vec2(1.0e30, 1.0e30)
    box_hi = wp.vec2(-1.0e30, -1.0e30)
    first = c * CHUNK
    for i in range(first, wp.min(first + CHUNK, n)):
        for q in range(2):
            p = _xy(center[e, (i + q) % n])
            box_lo = wp.min(box_lo, p)
            box_hi = wp.max(box_hi, p)
    lo[e, c] = box_lo
    hi[e, c] = box_hi


@wp.func
def _box_gap(lo_a: wp.vec2, hi_a: wp.vec2, lo_b: wp.vec2, hi_b: wp.vec2) -> float:
    """Distance between two axis-aligned boxes (0 when they overlap)."""
    dx = wp.max(wp.max(lo_b[0] - hi_a[0], lo_a[0] - hi_b[0]), 0.0)
    dy = wp.max(wp.max(lo_b[1] - hi_a[1], lo_a[1] - hi_b[1]), 0.0)
    return wp.sqrt(dx * dx + dy * dy)


@wp.kernel
def pair_checks(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    width: wp.array(dtype=wp.float32),
    ds: float,
    lo: wp.array2d(dtype=wp.vec2),
    hi: wp.array2d(dtype=wp.vec2),
    crossings: wp.array(dtype=wp.int32),
    too_close: wp.array(dtype=wp.int32),
):
    """For course-line point ``i``: does its segment cross a non-adjacent
    segment, and is a non-neighbouring point (more than ``π w / 2`` of arc
    away) closer than the width ``w``? Counts go to ``crossings`` and
    ``too_close`` (zeroed by ``reset_counts``). Chunks whose box lies farther
    than ``w`` from the segment's box are skipped: neither can happen there."""
    e, i = wp.tid()
    if active[e] == 0:
        return
    n = count[e]
    if i >= n:
        return
    w = width[e]
    window = 0.5 * 3.141592653589793 * w
    p = _xy(center[e, i])
    p2 = _xy(center[e, (i + 1) % n])
    seg_lo = wp.min(p, p2)
    seg_hi = wp.max(p, p2)
    hits = int(0)
    close = int(0)
    for c in range((n + CHUNK - 1) // CHUNK):
        if _box_gap(seg_lo, seg_hi, lo[e, c], hi[e, c]) <= w:
            for j in range(c * CHUNK, wp.min(c * CHUNK + CHUNK, n)):
                gap = wp.abs(j - i)
                gap = wp.min(gap, n - gap)
                if gap >= 2:
                    if _segments_cross(p, p2, _xy(center[e, j]), _xy(center[e, (j + 1) % n])):
                        hits = hits + 1
                if float(gap) * ds > window:
                    if wp.length(_xy(center[e, j]) - p) < w:
                        close = close + 1
    if hits > 0:
        wp.atomic_add(crossings, e, hits)
    if close > 0:
        wp.atomic_add(too_close, e, close)


@wp.kernel
def reset_counts(active: wp.array(dtype=wp.int32), a: wp.array(dtype=wp.int32),
                 b: wp.array(dtype=wp.int32), c: wp.array(dtype=wp.int32)):
    e = wp.tid()
    if active[e] != 0:
        a[e] = 0
        b[e] = 0
        c[e] = 0


@wp.kernel
def loop_checks(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    truncated: wp.array(dtype=wp.int32),
    crossings: wp.array(dtype=wp.int32),
    too_close: wp.array(dtype=wp.int32),
    tight: wp.array(dtype=wp.int32),
    epochs: wp.array(dtype=wp.int32),
    fail_mask: wp.array(dtype=wp.int32),
    valid: wp.array(dtype=wp.int32),
    generation: wp.array(dtype=wp.int32),
):
    """Fail bits per env: turning (the course line's total turning is not
    ±2π, or two non-adjacent segments cross), thickness (a radius of
    curvature below the half-width, or non-neighbouring points closer than
    the width), truncation. Records the epoch the course was built with."""
    e = wp.tid()
    if active[e] == 0:
        return
    n = count[e]
    total = float(0.0)
    for i in range(n):
        u = _xy(center[e, i]) - _xy(center[e, (i + n - 1) % n])
        v = _xy(center[e, (i + 1) % n]) - _xy(center[e, i])
        total = total + wp.atan2(_cross2(u, v), wp.dot(u, v))
    bits = int(0)
    if n < 3 or wp.abs(wp.abs(total) - TWO_PI) > 0.1 or crossings[e] > 0:
        bits = bits | FAIL_TURNING
    if tight[e] > 0 or too_close[e] > 0:
        bits = bits | FAIL_THICKNESS
    if truncated[e] != 0:
        bits = bits | FAIL_TRUNCATION
    fail_mask[e] = bits
    valid[e] = wp.where(bits == 0, 1, 0)
    generation[e] = epochs[e]


@wp.kernel
def checkpoint_indices(
    active: wp.array(dtype=wp.int32),
    length: wp.array(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    spacing: float,
    ds: float,
    index: wp.array2d(dtype=wp.int32),
    num: wp.array(dtype=wp.int32),
):
    """Checkpoint ``k`` at arc length ``k * spacing``, as a course-line index
    (``-1`` past the env's checkpoints); ``num[e]`` is their count."""
    e, k = wp.tid()
    if active[e] == 0:
        return
    total = wp.min(int(wp.floor(length[e] / spacing)), index.shape[1])
    i = int(wp.round(float(k) * spacing / ds))
    index[e, k] = wp.where(k < total and i < count[e], i, -1)
    if k == 0:
        num[e] = total


@wp.kernel
def bake_bounds(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    margin: float,
    resolution: int,
    origin: wp.array(dtype=wp.vec2),
    cell: wp.array(dtype=wp.float32),
):
    """The bake grid: the course line's bounding square plus ``margin``, split
    into ``resolution`` x ``resolution`` cells."""
    e = wp.tid()
    if active[e] == 0:
        return
    lo = wp.vec2(1.0e30, 1.0e30)
    hi = wp.vec2(-1.0e30, -1.0e30)
    for i in range(count[e]):
        p = _xy(center[e, i])
        lo = wp.min(lo, p)
        hi = wp.max(hi, p)
    extent = wp.max(hi[0] - lo[0], hi[1] - lo[1]) + 2.0 * margin
    mid = 0.5 * (lo + hi)
    origin[e] = mid - wp.vec2(0.5 * extent, 0.5 * extent)
    cell[e] = extent / float(resolution)


@wp.func
def _segment_distance(p: wp.vec2, a: wp.vec2, b: wp.vec2) -> float:
    ab = b - a
    denom = wp.dot(ab, ab)
    t = float(0.0)
    if denom > 0.0:
        t = wp.clamp(wp.dot(p - a, ab) / denom, 0.0, 1.0)
    return wp.length(p - (a + t * ab))


@wp.kernel
def fill_sdf(active: wp.array(dtype=wp.int32), width: wp.array(dtype=wp.float32),
             sdf: wp.array3d(dtype=wp.float32)):
    """Start every cell of the active envs at the clamp, ``+width / 2``."""
    e, iy, ix = wp.tid()
    if active[e] != 0:
        sdf[e, iy, ix] = 0.5 * width[e]


@wp.kernel
def splat_sdf(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    width: wp.array(dtype=wp.float32),
    origin: wp.array(dtype=wp.vec2),
    cell: wp.array(dtype=wp.float32),
    sdf: wp.array3d(dtype=wp.float32),
):
    """Segment ``i`` lowers every cell within a width of it to its signed
    distance ``d - width / 2`` (an atomic min): the distance to the course
    line minus the half-width, negative on the track, exact up to the clamp."""
    e, i = wp.tid()
    if active[e] == 0:
        return
    n = count[e]
    if i >= n:
        return
    a = _xy(center[e, i])
    b = _xy(center[e, (i + 1) % n])
    h = cell[e]
    o = origin[e]
    res = sdf.shape[1]
    reach = width[e]
    half = 0.5 * reach
    lo = wp.min(a, b) - wp.vec2(reach, reach) - o
    hi = wp.max(a, b) + wp.vec2(reach, reach) - o
    x0 = wp.max(int(wp.floor(lo[0] / h)), 0)
    x1 = wp.min(int(wp.floor(hi[0] / h)), res - 1)
    y0 = wp.max(int(wp.floor(lo[1] / h)), 0)
    y1 = wp.min(int(wp.floor(hi[1] / h)), res - 1)
    for iy in range(y0, y1 + 1):
        for ix in range(x0, x1 + 1):
            d = _segment_distance(o + h * wp.vec2(float(ix) + 0.5, float(iy) + 0.5), a, b)
            if d < reach:
                wp.atomic_min(sdf, e, iy, ix, d - half)


@wp.func
def terrain(p: wp.vec2, phase: wp.vec2, amplitude: float, wavelength: float) -> float:
    """Ground height (m) at ``p``: ``A sin(2πx/λ + φx) sin(2πy/λ + φy)``."""
    k = TWO_PI / wavelength
    return amplitude * wp.sin(k * p[0] + phase[0]) * wp.sin(k * p[1] + phase[1])


@wp.kernel
def terrain_phases(
    active: wp.array(dtype=wp.int32),
    seeds: wp.array(dtype=wp.uint32),
    epochs: wp.array(dtype=wp.int32),
    phase: wp.array(dtype=wp.vec2),
):
    """Each env's terrain phases, from its (seed, epoch)."""
    e = wp.tid()
    if active[e] == 0:
        return
    state = wp.rand_init(wp.int32(effective_seed_wp(seeds[e], epochs[e])), 1 << 21)
    phase[e] = wp.vec2(TWO_PI * wp.randf(state), TWO_PI * wp.randf(state))


@wp.kernel
def lift_course_line(
    active: wp.array(dtype=wp.int32),
    count: wp.array(dtype=wp.int32),
    phase: wp.array(dtype=wp.vec2),
    amplitude: wp.array(dtype=wp.float32),
    wavelength: float,
    center: wp.array2d(dtype=wp.vec3),
):
    """The course line's z: the terrain under each point."""
    e, i = wp.tid()
    if active[e] == 0 or i >= count[e]:
        return
    c = center[e, i]
    center[e, i] = wp.vec3(c[0], c[1], terrain(_xy(c), phase[e], amplitude[e], wavelength))


@wp.kernel
def bake_height(
    active: wp.array(dtype=wp.int32),
    phase: wp.array(dtype=wp.vec2),
    amplitude: wp.array(dtype=wp.float32),
    wavelength: float,
    origin: wp.array(dtype=wp.vec2),
    cell: wp.array(dtype=wp.float32),
    height: wp.array3d(dtype=wp.float32),
):
    """The height field: the terrain at each cell centre of the bake grid."""
    e, iy, ix = wp.tid()
    if active[e] == 0:
        return
    p = origin[e] + cell[e] * wp.vec2(float(ix) + 0.5, float(iy) + 0.5)
    height[e, iy, ix] = terrain(p, phase[e], amplitude[e], wavelength)


@wp.kernel
def copy_where(active: wp.array(dtype=wp.int32), src: wp.array(dtype=wp.float32),
               dst: wp.array(dtype=wp.float32)):
    """``dst[e] = src[e]`` for the active envs (a param a course was built with)."""
    e = wp.tid()
    if active[e] != 0:
        dst[e] = src[e]
