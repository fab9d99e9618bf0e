"""Warp functions and constants of plane geometry shared by the kernels."""

import warp as wp

TWO_PI = wp.constant(6.283185307179586)
NAN = wp.constant(float("nan"))


@wp.func
def cross2(a: wp.vec2, b: wp.vec2) -> float:
    return a[0] * b[1] - a[1] * b[0]


@wp.func
def xy(v: wp.vec3) -> wp.vec2:
    return wp.vec2(v[0], v[1])


@wp.func
def segments_cross(p: wp.vec2, p2: wp.vec2, q: wp.vec2, q2: wp.vec2) -> bool:
    """Proper crossing of segments ``p p2`` and ``q q2`` (strict sign changes)."""
    r = p2 - p
    s = q2 - q
    d1 = cross2(r, q - p)
    d2 = cross2(r, q2 - p)
    d3 = cross2(s, p - q)
    d4 = cross2(s, p2 - q)
    return d1 * d2 < 0.0 and d3 * d4 < 0.0


@wp.func
def segment_t(p: wp.vec2, a: wp.vec2, ab: wp.vec2) -> float:
    """Where ``p`` projects on the segment from ``a`` along ``ab``, in [0, 1]
    (0 for a zero-length segment)."""
    denom = wp.dot(ab, ab)
    t = float(0.0)
    if denom > 0.0:
        t = wp.clamp(wp.dot(p - a, ab) / denom, 0.0, 1.0)
    return t


@wp.func
def segment_distance(p: wp.vec2, a: wp.vec2, b: wp.vec2) -> float:
    ab = b - a
    return wp.length(p - (a + segment_t(p, a, ab) * ab))


@wp.func
def box_gap(lo_a: wp.vec2, hi_a: wp.vec2, lo_b: wp.vec2, hi_b: wp.vec2) -> float:
    """Distance between two axis-aligned boxes (0 when they overlap)."""
    dx = wp.max(wp.max(lo_b[0] - hi_a[0], lo_a[0] - hi_b[0]), 0.0)
    dy = wp.max(wp.max(lo_b[1] - hi_a[1], lo_a[1] - hi_b[1]), 0.0)
    return wp.sqrt(dx * dx + dy * dy)


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
