"""Kernels of tracks: frames and boundaries, and the validity checks.

Conventions: see ``track_gen._kernels``.
"""

import warp as wp

from track_gen._kernels.geometry import NAN, TWO_PI, box_gap, cross2, segments_cross, xy
from track_gen.checks import FAIL_PARAMS, FAIL_THICKNESS, FAIL_TRUNCATION, FAIL_TURNING
from track_gen.seeds import effective_seed_wp


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


#: Boundary segments after each one that ``boundary_checks`` tests it against.
FOLD_WINDOW = wp.constant(8)


@wp.kernel
def boundary_checks(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    left: wp.array2d(dtype=wp.vec3),
    right: wp.array2d(dtype=wp.vec3),
    tight: wp.array(dtype=wp.int32),
):
    """Counts into ``tight`` (in-out) each boundary segment that does not run
    the way its course-line segment does, or that crosses one of the next
    ``FOLD_WINDOW`` segments of its boundary: the inner boundary folds where
    the course line turns by more than its spacing over the half-width (a
    corner of a coarsely sampled spline, the seam included). Crossings
    farther apart come with points closer than the width (``pair_checks``)."""
    e, i = wp.tid()
    if active[e] == 0:
        return
    n = count[e]
    if i >= n:
        return
    j = (i + 1) % n
    ahead = xy(center[e, j]) - xy(center[e, i])
    folds = int(0)
    for side in range(2):
        a = xy(left[e, i])
        b = xy(left[e, j])
        if side == 1:
            a = xy(right[e, i])
            b = xy(right[e, j])
        if not wp.dot(b - a, ahead) > 0.0:
            folds = folds + 1
        for k in range(2, wp.min(FOLD_WINDOW + 2, n - 1)):
            p = (i + k) % n
            q = (p + 1) % n
            c = xy(left[e, p])
            d = xy(left[e, q])
            if side == 1:
                c = xy(right[e, p])
                d = xy(right[e, q])
            if segments_cross(a, b, c, d):
                folds = folds + 1
    if folds > 0:
        wp.atomic_add(tight, e, folds)


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
            p = xy(center[e, (i + q) % n])
            box_lo = wp.min(box_lo, p)
            box_hi = wp.max(box_hi, p)
    lo[e, c] = box_lo
    hi[e, c] = box_hi


@wp.kernel
def pair_checks(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    width: wp.array(dtype=wp.float32),
    spacing: wp.array(dtype=wp.float32),
    lo: wp.array2d(dtype=wp.vec2),
    hi: wp.array2d(dtype=wp.vec2),
    crossings: wp.array(dtype=wp.int32),  # in-out, with too_close: counts added to
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
    h = spacing[e]
    window = 0.5 * 3.141592653589793 * w
    p = xy(center[e, i])
    p2 = xy(center[e, (i + 1) % n])
    seg_lo = wp.min(p, p2)
    seg_hi = wp.max(p, p2)
    hits = int(0)
    close = int(0)
    for c in range((n + CHUNK - 1) // CHUNK):
        if box_gap(seg_lo, seg_hi, lo[e, c], hi[e, c]) <= w:
            first = c * CHUNK
            q = xy(center[e, first])
            for j in range(first, wp.min(first + CHUNK, n)):
                q2 = xy(center[e, wp.where(j + 1 < n, j + 1, 0)])  # each point loaded once
                gap = wp.abs(j - i)
                gap = wp.min(gap, n - gap)
                if gap >= 2:
                    if segments_cross(p, p2, q, q2):
                        hits = hits + 1
                if float(gap) * h > window:
                    if wp.length(q - p) < w:
                        close = close + 1
                q = q2
    if hits > 0:
        wp.atomic_add(crossings, e, hits)
    if close > 0:
        wp.atomic_add(too_close, e, close)


@wp.kernel
def reset_counts(active: wp.array(dtype=wp.int32), a: wp.array(dtype=wp.int32),
                 b: wp.array(dtype=wp.int32), c: wp.array(dtype=wp.int32)):
    """Zero the counts ``a``, ``b``, ``c`` (outputs) of the active envs."""
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
    bad_params: wp.array(dtype=wp.int32),
    length: wp.array(dtype=wp.float32),
    seeds: wp.array(dtype=wp.uint32),
    epochs: wp.array(dtype=wp.int32),
    fail_mask: wp.array(dtype=wp.int32),
    valid: wp.array(dtype=wp.int32),
    generation: wp.array(dtype=wp.int32),
    track_id: wp.array(dtype=wp.uint32),
):
    """Fail bits per env: turning (the course line's total turning is not
    ±2π, or two non-adjacent segments cross), thickness (a radius of
    curvature below the half-width, a boundary segment running backwards, or
    non-neighbouring points closer than the width), truncation, params (a param out of range, or a course line
    of fewer than 3 points or no length). Records the epoch the course was
    built with and its track id."""
    e = wp.tid()
    if active[e] == 0:
        return
    n = count[e]
    total = float(0.0)
    for i in range(n):
        u = xy(center[e, i]) - xy(center[e, (i + n - 1) % n])
        v = xy(center[e, (i + 1) % n]) - xy(center[e, i])
        total = total + wp.atan2(cross2(u, v), wp.dot(u, v))
    bits = int(0)
    if n < 3 or wp.abs(wp.abs(total) - TWO_PI) > 0.1 or crossings[e] > 0:
        bits = bits | FAIL_TURNING
    if tight[e] > 0 or too_close[e] > 0:
        bits = bits | FAIL_THICKNESS
    if truncated[e] != 0:
        bits = bits | FAIL_TRUNCATION
    if bad_params[e] != 0 or n < 3 or not length[e] > 0.0:
        bits = bits | FAIL_PARAMS
    fail_mask[e] = bits
    valid[e] = wp.where(bits == 0, 1, 0)
    generation[e] = epochs[e]
    track_id[e] = effective_seed_wp(seeds[e], epochs[e])
