"""Kernels of the bakes refreshed with every generation: checkpoints, the SDF
and the height field on a per-env grid, and the terrain.

Conventions: see ``track_gen._kernels``.
"""

import warp as wp

from track_gen._kernels import TERRAIN_PHASE_STREAM
from track_gen._kernels.geometry import TWO_PI, segment_distance, xy
from track_gen.seeds import effective_seed_wp


@wp.kernel
def checkpoint_indices(
    active: wp.array(dtype=wp.int32),
    length: wp.array(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    spacing: float,
    line_spacing: wp.array(dtype=wp.float32),
    index: wp.array2d(dtype=wp.int32),
    num: wp.array(dtype=wp.int32),
):
    """Checkpoint ``k`` at arc length ``k * spacing``, as a course-line index
    (points ``line_spacing[e]`` apart; ``-1`` past the env's checkpoints);
    ``num[e]`` is their count."""
    e, k = wp.tid()
    if active[e] == 0:
        return
    marks = wp.floor(length[e] / spacing)
    total = int(0)
    if marks >= 0.0:  # false for NaN (an invalid env: no checkpoints)
        total = int(wp.min(marks, float(index.shape[1])))
    # Checkpoint 0 is the start line; the others lie strictly after it and
    # no further than the last point (a spacing below the line's makes
    # several share a point).
    i = int(wp.round(float(k) * spacing / line_spacing[e]))
    i = wp.max(wp.min(i, count[e] - 1), wp.where(k > 0, 1, 0))
    index[e, k] = wp.where(k < total, i, -1)
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
        p = xy(center[e, i])
        lo = wp.min(lo, p)
        hi = wp.max(hi, p)
    extent = wp.max(hi[0] - lo[0], hi[1] - lo[1]) + 2.0 * margin
    mid = 0.5 * (lo + hi)
    origin[e] = mid - wp.vec2(0.5 * extent, 0.5 * extent)
    cell[e] = extent / float(resolution)


#: Splat distances are fixed point: ``q = floor(d * SDF_STEPS / width)`` for
#: ``d < width`` (a native integer atomic min; float atomics loop on a CAS).
#: One step is ``width / 2**24``, float32 precision at the clamp.
SDF_STEPS = wp.constant(16777216.0)


#: Course-line segments one thread of ``splat_sdf`` splats together (one
#: atomic per cell for all of them).
SPLAT_SEGMENTS = 4


@wp.func
def _point(center: wp.array2d(dtype=wp.vec3), e: int, n: int, i: int, previous: wp.vec2) -> wp.vec2:
    """The end of segment ``i - 1`` (point ``i``, wrapped), or ``previous``
    (a zero-length segment) when segment ``i - 1`` is past the course line."""
    return wp.where(i - 1 < n, xy(center[e, i % n]), previous)


@wp.kernel
def splat_sdf(
    active: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    count: wp.array(dtype=wp.int32),
    width: wp.array(dtype=wp.float32),
    origin: wp.array(dtype=wp.vec2),
    cell: wp.array(dtype=wp.float32),
    steps: wp.array3d(dtype=wp.int32),  # in-out: lowered by atomic min
):
    """Segments ``4c .. 4c + 3`` lower every cell within a width of them to
    their distance ``d`` (fixed point, one atomic min per cell; ``bake_grid``
    started the cells at the clamp, ``d = width``)."""
    e, c = wp.tid()
    if active[e] == 0:
        return
    n = count[e]
    i = c * SPLAT_SEGMENTS
    if i >= n:
        return
    p0 = xy(center[e, i])
    p1 = _point(center, e, n, i + 1, p0)
    p2 = _point(center, e, n, i + 2, p1)
    p3 = _point(center, e, n, i + 3, p2)
    p4 = _point(center, e, n, i + 4, p3)
    h = cell[e]
    o = origin[e]
    res = steps.shape[1]
    reach = width[e]
    scale = SDF_STEPS / reach
    lo = wp.min(wp.min(wp.min(p0, p1), wp.min(p2, p3)), p4) - wp.vec2(reach, reach) - o
    hi = wp.max(wp.max(wp.max(p0, p1), wp.max(p2, p3)), p4) + wp.vec2(reach, reach) - o
    x0 = wp.max(int(wp.floor(lo[0] / h)), 0)
    x1 = wp.min(int(wp.floor(hi[0] / h)), res - 1)
    y0 = wp.max(int(wp.floor(lo[1] / h)), 0)
    y1 = wp.min(int(wp.floor(hi[1] / h)), res - 1)
    for iy in range(y0, y1 + 1):
        for ix in range(x0, x1 + 1):
            q = o + h * wp.vec2(float(ix) + 0.5, float(iy) + 0.5)
            d = wp.min(wp.min(segment_distance(q, p0, p1), segment_distance(q, p1, p2)),
                       wp.min(segment_distance(q, p2, p3), segment_distance(q, p3, p4)))
            if d < reach:
                wp.atomic_min(steps, e, iy, ix, int(d * scale))


@wp.kernel
def finish_sdf(
    active: wp.array(dtype=wp.int32),
    resolution: int,
    width: wp.array(dtype=wp.float32),
    steps: wp.array(dtype=wp.int32),
    sdf: wp.array(dtype=wp.float32),
):
    """The SDF from the splat's distances: ``d - width / 2``, negative on the
    track, ``+width / 2`` (the clamp) a width or more from the course line.
    Flat ``[E * R * R]`` views of the same memory, one thread a cell: each
    thread reads its cell of ``steps`` (an input) before it writes the same
    cell of ``sdf`` (the output)."""
    t = wp.tid()
    e = t / (resolution * resolution)
    if active[e] == 0:
        return
    reach = width[e]
    sdf[t] = float(steps[t]) * (reach / SDF_STEPS) - 0.5 * reach


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
    state = wp.rand_init(wp.int32(effective_seed_wp(seeds[e], epochs[e])), TERRAIN_PHASE_STREAM)
    phase[e] = wp.vec2(TWO_PI * wp.randf(state), TWO_PI * wp.randf(state))


@wp.kernel
def lift_course_line(
    active: wp.array(dtype=wp.int32),
    count: wp.array(dtype=wp.int32),
    phase: wp.array(dtype=wp.vec2),
    amplitude: wp.array(dtype=wp.float32),
    wavelength: float,
    center: wp.array2d(dtype=wp.vec3),  # in-out: z written, x and y kept
):
    """The course line's z: the terrain under each point."""
    e, i = wp.tid()
    if active[e] == 0 or i >= count[e]:
        return
    c = center[e, i]
    center[e, i] = wp.vec3(c[0], c[1], terrain(xy(c), phase[e], amplitude[e], wavelength))


@wp.kernel
def bake_grid(
    active: wp.array(dtype=wp.int32),
    resolution: int,
    phase: wp.array(dtype=wp.vec2),
    amplitude: wp.array(dtype=wp.float32),
    wavelength: float,
    origin: wp.array(dtype=wp.vec2),
    cell: wp.array(dtype=wp.float32),
    height: wp.array(dtype=wp.float32),
    steps: wp.array(dtype=wp.int32),
):
    """The height field (the terrain at each cell centre) and the splat's
    start (every cell at the clamp, ``d = width``). Flat ``[E * R * R]`` views,
    one thread a cell (a 1-D launch: no 64-bit index decomposition)."""
    t = wp.tid()
    per_env = resolution * resolution
    e = t / per_env
    if active[e] == 0:
        return
    c = t - e * per_env
    iy = c / resolution
    ix = c - iy * resolution
    p = origin[e] + cell[e] * wp.vec2(float(ix) + 0.5, float(iy) + 0.5)
    height[t] = terrain(p, phase[e], amplitude[e], wavelength)
    steps[t] = int(SDF_STEPS)
