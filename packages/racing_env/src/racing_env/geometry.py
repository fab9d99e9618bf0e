"""The geometry of a closed track loop, written once for NumPy and JAX
(``xp`` is ``numpy`` or ``jax.numpy``): a track's host `Track`
(`racing_env.tracks`, float64), the bridge's pool rows
(``racing_stack.bridge``, float32, on the device) and the Race Core's arrays
(`racing_env.race`, float32) all take their segments and normals from here.

A loop is the first ``count`` points of a polyline (the rest is padding):
segment i joins point i to point i + 1, and the last used point to point 0.
"""

from __future__ import annotations

from typing import Any

__all__ = ["left_normals", "loop_segments", "loop_tangents"]


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
