"""The geometry of a closed track loop, written once for NumPy and JAX
(``xp`` is ``numpy`` or ``jax.numpy``): a track's host `Track`
(`racing_env.tracks`, float64), the bridge's pool rows
(``racing_stack.bridge``, float32, on the device) and the Race Core's arrays
(`racing_env.race`, float32) all take their segments and normals from here;
pure pursuit (`racing_env.pursuit`) its arc lengths and nearest point; the
learning features and reward (``racing_stack.features``,
``racing_stack.reward``) where the car sits on its road (`road_geometry`).

A loop is the first ``count`` points of a polyline (the rest is padding):
segment i joins point i to point i + 1, and the last used point to point 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from racing_env.car import wheel_layout

__all__ = ["left_normals", "loop_segments", "loop_tangents", "nearest_point", "road_geometry"]

#: Centerline segments `road_geometry` searches on either side of the
#: nearest point for each wheel (the Race Core's window: they reach every wheel).
_WINDOW = 16


def _pair_sum(xp: Any, v: Any) -> Any:
    """``v`` [..., 2] summed over its last axis: [...]. NumPy's reduction
    of two numbers is their one sum, ``v[..., 0] + v[..., 1]``, which NumPy
    computes about 3x faster (a reduction over an axis of two pays per
    output element): the same bits, but for two negative zeros, whose sum
    is -0.0 here and +0.0 from the reduction (which starts from 0). The
    geometry sums squares (never -0.0) and, for a segment's projection,
    products whose zero's sign no result keeps (it is clipped, then added
    to a point's index and scaled by a vector). JAX keeps its reduction
    (one fused kernel, its numbers as they were)."""
    return v[..., 0] + v[..., 1] if xp is np else xp.sum(v, axis=-1)


def loop_segments(xp: Any, points: Any, count: Any) -> tuple[Any, Any]:
    """The point each segment ends at, and the segments' lengths.

    Args:
        xp: ``numpy`` or ``jax.numpy``.
        points: [..., N, 2], m (the padding may hold anything finite).
        count: [...] ints, the points used (>= 1).

    Returns:
        (following [..., N, 2]: point i + 1, or point 0 for the last used
        point; lengths [..., N], m: 0 past ``count``).
    """
    index = xp.arange(points.shape[-2])
    closing = index == (count - 1)[..., None]
    following = xp.where(closing[..., None], points[..., :1, :], xp.roll(points, -1, axis=-2))
    used = index < count[..., None]
    return following, xp.where(used, xp.linalg.norm(following - points, axis=-1), 0.0)


def loop_tangents(xp: Any, points: Any) -> Any:
    """[..., N, 2]: the central difference at each point of a loop of all N
    points (point i + 1 less point i - 1, around the loop), m."""
    return xp.roll(points, -1, axis=-2) - xp.roll(points, 1, axis=-2)


def left_normals(xp: Any, tangents: Any) -> Any:
    """[..., N, 2]: the unit normals to the left of ``tangents`` [..., N, 2]
    (each a tangent turned a quarter anticlockwise, over its length; a
    zero tangent has none: the caller refuses it first)."""
    normal = xp.stack([-tangents[..., 1], tangents[..., 0]], axis=-1)
    return normal / xp.linalg.norm(normal, axis=-1, keepdims=True)


def nearest_point(xp: Any, points: Any, count: Any, position: Any) -> Any:
    """int [E]: the used point of each loop nearest ``position`` (the first
    of equally near ones).

    Args:
        xp: ``numpy`` or ``jax.numpy``.
        points: [E, N, 2], m. count: [E] ints, the points used (>= 1).
        position: [E, 2], m.
    """
    valid = xp.arange(points.shape[1])[None, :] < count[:, None]
    gap = _pair_sum(xp, (points - position[:, None, :]) ** 2)
    return xp.argmin(xp.where(valid, gap, xp.inf), axis=1)


def road_geometry(xp: Any, position: Any, yaw: Any, centerline: Any, left: Any, count: Any, wheelbase_m: float,
                  track_width_m: float) -> tuple[Any, Any, Any, Any, Any, Any]:
    """Where a car sits on its road.

    Args:
        xp: ``numpy`` or ``jax.numpy``.
        position: float32 [E, 2] rear axle, m. yaw: float32 [E], rad.
        centerline, left: float32 [E, C, 2], m. count: int32 [E] valid points.
        wheelbase_m, track_width_m: the car's wheel layout (`car.wheel_layout`).

    Returns:
        (nearest int32 [E] centerline point to the rear axle, half_width
        float32 [E] m, lateral float32 [E] m (rear axle, + left of the
        centerline), heading_error float32 [E] rad (yaw less the road's
        direction, in (-pi, pi]), margins float32 [E, 4] m (each wheel's
        distance inside the nearest edge; < 0 beyond it), in the order front
        left, front right, rear left, rear right), along float32 [E] (the
        rear axle's projection on the centerline as a point index with a
        fraction: i + t is the point t of the way from point i to i + 1; it
        moves continuously with the car)).
        Every wheel's margin takes the road's half width at the rear axle's
        nearest point: exact on roads of constant width (track_gen's), off
        by the width's change over a wheelbase elsewhere.
    """
    f32 = xp.float32
    # Gathers index the rows explicitly (NumPy's take_along_axis costs ~10x
    # more per call, which a controller's batch of one pays every step).
    rows = xp.arange(centerline.shape[0])
    nearest = nearest_point(xp, centerline, count, position)  # [E]
    k = xp.arange(-_WINDOW, _WINDOW)[None, :]
    first = (nearest[:, None] + k) % count[:, None]  # [E, S] segment starts
    a = centerline[rows[:, None], first]  # [E, S, 2]
    b = centerline[rows[:, None], (first + 1) % count[:, None]]
    layout = xp.asarray(((0.0, 0.0), *wheel_layout(wheelbase_m, track_width_m)), f32)  # the rear axle, the wheels
    c, s = xp.cos(yaw)[:, None], xp.sin(yaw)[:, None]
    q = xp.stack([position[:, None, 0] + c * layout[:, 0] - s * layout[:, 1],
                  position[:, None, 1] + s * layout[:, 0] + c * layout[:, 1]], axis=-1)  # [E, 5, 2]
    ab = (b - a)[:, None]  # [E, 1, S, 2]
    ap = q[:, :, None, :] - a[:, None]  # [E, 5, S, 2]
    length2 = xp.maximum(_pair_sum(xp, ab * ab), f32(1e-12))
    t = xp.clip(_pair_sum(xp, ap * ab) / length2, f32(0), f32(1))
    d = ap - t[..., None] * ab
    dist2 = _pair_sum(xp, d * d)  # [E, 5, S]
    best = xp.argmin(dist2, axis=-1)  # [E, 5]
    cross = ab[..., 0] * ap[..., 1] - ab[..., 1] * ap[..., 0]
    wheel = xp.arange(best.shape[1])[None, :]
    side = xp.where(cross[rows[:, None], wheel, best] >= 0, f32(1), f32(-1))
    offset = side * xp.sqrt(dist2[rows[:, None], wheel, best])  # [E, 5]
    half_width = xp.sqrt(_pair_sum(xp, (left[rows, nearest] - centerline[rows, nearest]) ** 2))
    direction = ab[:, 0][rows, best[:, 0]]  # [E, 2] the rear axle's segment
    heading = yaw - xp.arctan2(direction[:, 1], direction[:, 0])
    heading = xp.arctan2(xp.sin(heading), xp.cos(heading))
    margins = half_width[:, None] - xp.abs(offset[:, 1:])
    rear = best[:, 0]
    along = first[rows, rear].astype(f32) + t[rows, 0, rear]
    return (nearest, half_width.astype(f32), offset[:, 0].astype(f32), heading.astype(f32), margins.astype(f32),
            along.astype(f32))
