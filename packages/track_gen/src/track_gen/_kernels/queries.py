"""Kernels of the SDF queries: the signed distance, the outward normal and the
nearest boundary point at any points, read from a track's SDF bake.

Conventions: see ``track_gen._kernels``, except that these kernels build
nothing: they run over every env, read ``valid`` and answer NaN for the envs
whose entry is 0. The rules they implement are ``track_gen.queries``'.
"""

from typing import Any

import warp as wp

from track_gen._kernels.geometry import NAN


@wp.func
def _sample(sdf: wp.array3d(dtype=wp.float32), e: int, p: wp.vec2, origin: wp.vec2, cell: float,
            clamp: float) -> wp.vec3:
    """(distance, unit normal) of env ``e``'s SDF at ``p``: bilinear between
    the four cell centres around ``p`` (centre ``(ix, iy)`` at ``origin +
    cell * (ix + 1/2, iy + 1/2)``), and the unit gradient of that
    interpolant. Outside the square spanned by the cell centres: ``(clamp,
    NaN, NaN)``. The normal is NaN where a corner holds ``clamp`` (the
    bake's clamp: the field is not exact there) or the gradient vanishes."""
    res = sdf.shape[1]
    g = (p - origin) / cell - wp.vec2(0.5, 0.5)
    top = float(res - 1)
    if g[0] < 0.0 or g[1] < 0.0 or g[0] > top or g[1] > top:
        return wp.vec3(clamp, NAN, NAN)
    x0 = wp.max(wp.min(int(wp.floor(g[0])), res - 2), 0)
    y0 = wp.max(wp.min(int(wp.floor(g[1])), res - 2), 0)
    x1 = wp.min(x0 + 1, res - 1)
    y1 = wp.min(y0 + 1, res - 1)
    fx = g[0] - float(x0)
    fy = g[1] - float(y0)
    v00 = sdf[e, y0, x0]
    v10 = sdf[e, y0, x1]
    v01 = sdf[e, y1, x0]
    v11 = sdf[e, y1, x1]
    low = v00 + fx * (v10 - v00)  # exact where the corners agree (the clamp stays +width / 2)
    high = v01 + fx * (v11 - v01)
    d = low + fy * (high - low)
    grad = wp.vec2((v10 - v00) * (1.0 - fy) + (v11 - v01) * fy,
                   (v01 - v00) * (1.0 - fx) + (v11 - v10) * fx) / cell
    length = wp.length(grad)
    if wp.max(wp.max(v00, v10), wp.max(v01, v11)) >= clamp or length == 0.0:
        return wp.vec3(d, NAN, NAN)
    return wp.vec3(d, grad[0] / length, grad[1] / length)


@wp.kernel
def sdf_queries(
    valid: wp.array(dtype=wp.int32),
    sdf: wp.array3d(dtype=wp.float32),
    origin: wp.array(dtype=wp.vec2),
    cell: wp.array(dtype=wp.float32),
    width: wp.array(dtype=wp.float32),
    points: wp.array2d(dtype=Any),
    distance: wp.array2d(dtype=wp.float32),
    normal: wp.array2d(dtype=wp.vec2),
    nearest: wp.array2d(dtype=wp.vec2),
):
    """Point ``j`` of env ``e`` (its x and y; a vec2 or vec3): the distance,
    the normal and ``point - distance * normal``, each written where its
    output is given (an output passed as ``None``, a null array, is skipped).
    NaN for all three in an invalid env or at a non-finite point."""
    e, j = wp.tid()
    q = points[e, j]
    p = wp.vec2(q[0], q[1])
    s = wp.vec3(NAN, NAN, NAN)
    if valid[e] != 0 and wp.isfinite(p):
        s = _sample(sdf, e, p, origin[e], cell[e], 0.5 * width[e])
    n = wp.vec2(s[1], s[2])
    if distance.shape[0] > 0:
        distance[e, j] = s[0]
    if normal.shape[0] > 0:
        normal[e, j] = n
    if nearest.shape[0] > 0:
        nearest[e, j] = p - s[0] * n


#: ``sdf_queries`` for vec2 and for vec3 points, by the points' dtype.
SDF_QUERIES = {dtype: wp.overload(sdf_queries, {"points": wp.array2d(dtype=dtype)}) for dtype in (wp.vec2, wp.vec3)}
