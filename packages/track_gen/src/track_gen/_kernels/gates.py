"""Warp kernels that place gates along a closed centerline and check their bars.

Conventions: see ``track_gen._kernels``.
"""

import warp as wp

from track_gen._kernels import GATE_COUNT_STREAM
from track_gen.checks import FAIL_CROSSING_BARS, FAIL_PARAMS, FAIL_TRUNCATION
from track_gen._kernels.geometry import NAN, point_at, segments_cross
from track_gen.seeds import effective_seed_wp


@wp.kernel
def gate_counts(
    active: wp.array(dtype=wp.int32),
    seeds: wp.array(dtype=wp.uint32),
    epochs: wp.array(dtype=wp.int32),
    min_gates: int,
    max_gates: int,
    num_gates: wp.array(dtype=wp.int32),
):
    """Each env's number of gates, uniform in ``[min_gates, max_gates]``."""
    e = wp.tid()
    if active[e] == 0:
        return
    state = wp.rand_init(wp.int32(effective_seed_wp(seeds[e], epochs[e])), GATE_COUNT_STREAM)
    num_gates[e] = min_gates + int(wp.randf(state) * float(max_gates - min_gates + 1)) % (max_gates - min_gates + 1)


@wp.kernel
def place_gates(
    active: wp.array(dtype=wp.int32),
    dense: wp.array2d(dtype=wp.vec2),
    points: wp.array(dtype=wp.int32),
    cum: wp.array2d(dtype=wp.float32),
    num_gates: wp.array(dtype=wp.int32),
    gate_width: wp.array(dtype=wp.float32),
    gate_center: wp.array2d(dtype=wp.vec3),
    gate_normal: wp.array2d(dtype=wp.vec3),
    posts: wp.array3d(dtype=wp.vec3),
    gate_xy: wp.array2d(dtype=wp.vec2),
):
    """Gate ``g`` at arc length ``g L / G`` along the centerline, facing along
    it: its posts ``gate_width / 2`` to each side, the bar between them.
    ``gate_xy`` holds the centres as a polyline for the course line."""
    e, g = wp.tid()
    if active[e] == 0:
        return
    n = num_gates[e]
    if g >= n:
        nan3 = wp.vec3(NAN, NAN, NAN)
        gate_center[e, g] = nan3
        gate_normal[e, g] = nan3
        posts[e, g, 0] = nan3
        posts[e, g, 1] = nan3
        return
    m = points[e]
    length = cum[e, m]
    s = float(g) * length / float(n)
    c = point_at(dense, cum, e, m, s)
    ahead = point_at(dense, cum, e, m, wp.mod(s + 0.01 * length, length))
    t = wp.normalize(ahead - c)
    left = wp.vec2(-t[1], t[0])
    half = 0.5 * gate_width[e]
    gate_center[e, g] = wp.vec3(c[0], c[1], 0.0)
    gate_normal[e, g] = wp.vec3(left[0], left[1], 0.0)
    posts[e, g, 0] = wp.vec3(c[0] + half * left[0], c[1] + half * left[1], 0.0)
    posts[e, g, 1] = wp.vec3(c[0] - half * left[0], c[1] - half * left[1], 0.0)
    gate_xy[e, g] = c


@wp.kernel
def bar_checks(
    active: wp.array(dtype=wp.int32),
    posts: wp.array3d(dtype=wp.vec3),
    num_gates: wp.array(dtype=wp.int32),
    truncated: wp.array(dtype=wp.int32),
    bad_params: wp.array(dtype=wp.int32),
    count: wp.array(dtype=wp.int32),
    length: wp.array(dtype=wp.float32),
    seeds: wp.array(dtype=wp.uint32),
    epochs: wp.array(dtype=wp.int32),
    fail_mask: wp.array(dtype=wp.int32),
    valid: wp.array(dtype=wp.int32),
    generation: wp.array(dtype=wp.int32),
    track_id: wp.array(dtype=wp.uint32),
):
    """Crossing bars: two gates' bars intersect; truncation: the course line
    through the gate centres needs more than ``N_max`` points; params: a
    param out of range, or a course line of fewer than 3 points or no
    length. Records the epoch the course was built with and its track id."""
    e = wp.tid()
    if active[e] == 0:
        return
    n = num_gates[e]
    bits = int(0)
    for g in range(n):
        a0 = wp.vec2(posts[e, g, 0][0], posts[e, g, 0][1])
        a1 = wp.vec2(posts[e, g, 1][0], posts[e, g, 1][1])
        for h in range(g + 1, n):
            b0 = wp.vec2(posts[e, h, 0][0], posts[e, h, 0][1])
            b1 = wp.vec2(posts[e, h, 1][0], posts[e, h, 1][1])
            if segments_cross(a0, a1, b0, b1):
                bits = FAIL_CROSSING_BARS
    if truncated[e] != 0:
        bits = bits | FAIL_TRUNCATION
    if bad_params[e] != 0 or count[e] < 3 or not length[e] > 0.0:
        bits = bits | FAIL_PARAMS
    fail_mask[e] = bits
    valid[e] = wp.where(bits == 0, 1, 0)
    generation[e] = epochs[e]
    track_id[e] = effective_seed_wp(seeds[e], epochs[e])


@wp.kernel
def gate_arcs(
    active: wp.array(dtype=wp.int32),
    cum: wp.array2d(dtype=wp.float32),
    num_gates: wp.array(dtype=wp.int32),
    gate_arc: wp.array2d(dtype=wp.float32),
):
    """Arc length of each gate centre along the course line (NaN past the gates)."""
    e, g = wp.tid()
    if active[e] == 0:
        return
    gate_arc[e, g] = wp.where(g < num_gates[e], cum[e, g], NAN)
