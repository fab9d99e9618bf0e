"""Queries of a track's SDF bake: the signed distance to the track region,
its outward normal and the nearest point of the track boundary, at ``P``
points per env.

Rules, for env ``e`` and a point ``p = points[e, j]`` (metres; a vec3's z
is ignored), with ``R`` cells per side, ``h = sdf_cell[e]`` and
``o = sdf_origin[e]``:

- **distance**: the bilinear interpolation of ``sdf[e]`` between the four
  cell centres around ``p`` (``sdf[e, iy, ix]`` sits at ``o + h * (ix + 1/2,
  iy + 1/2)``); negative on the track, positive off it, in metres. It is
  within ``h / sqrt(2)`` of the exact signed distance wherever those four
  cells are exact (below the clamp).
- **normal**: the unit gradient of that interpolant (in the cell ``p`` lies
  in), pointing towards increasing distance: out of the track.
- **nearest**: ``p - distance * normal``, the nearest point of the track
  boundary (an estimate, exact for an exact field).
- **outside the grid** (``p`` beyond the square spanned by the cell centres,
  ``o + h/2`` to ``o + (R - 1/2) h`` in x and y, so the bake's outer
  half-cell rim counts as outside): distance ``+width / 2``, the clamp
  (exact whenever ``sdf_margin >= width + h / 2``, as at the defaults),
  normal and nearest NaN.
- **at the clamp**: where one of the four cells holds the clamp ``+width /
  2`` (about half a width or more off the track, where the bake stops being
  exact), the distance is still the interpolation (``+width / 2`` where all
  four do) but normal and nearest are NaN, as they are where the
  interpolant's gradient is zero.
- **invalid env** (``result.valid[e] == 0``), or a NaN or infinite x or y:
  NaN for all three.

Every function checks its arguments on the host before anything launches,
and with ``out=`` given it allocates nothing and writes in place (one
launch: recordable in a CUDA graph).
"""

from __future__ import annotations

import dataclasses

import warp as wp

from track_gen import _capture
from track_gen._kernels import queries as kq
from track_gen.result import GateResult, TrackResult


@dataclasses.dataclass
class QueryResult:
    """The three answers at ``[E, P]`` points (see the module's rules).

    Attributes:
        distance: ``[E, P]`` float32, signed distance to the track region (m), negative on it.
        normal: ``[E, P]`` vec2, unit outward normal (the direction of increasing distance).
        nearest: ``[E, P]`` vec2, the nearest point of the track boundary (m).
    """

    distance: wp.array2d(dtype=wp.float32)
    normal: wp.array2d(dtype=wp.vec2)
    nearest: wp.array2d(dtype=wp.vec2)


def distance(result: TrackResult, points: wp.array, out: wp.array | None = None,
             stream: wp.Stream | None = None) -> wp.array:
    """The signed distance to the track region at each point.

    Args:
        result: a ``TrackResult`` (``course.result`` of a track course).
        points: ``[E, P]`` vec2 or vec3 (z ignored) on the result's device, ``P >= 1`` (m).
        out: ``[E, P]`` float32 on the same device, written in place (else allocated).
        stream: the CUDA stream to launch on (default: torch's capturing
            stream inside ``torch.cuda.graph``, else Warp's current one).

    Returns:
        ``[E, P]`` float32 (m), negative on the track; ``out`` when given.

    Raises:
        TypeError, ValueError: a bad argument (named in the message); nothing runs.
    """
    points, stream = _check_inputs(result, points, stream)
    out = _output("out", out, wp.float32, points)
    _launch(result, points, out, None, None, stream)
    return out


def normal(result: TrackResult, points: wp.array, out: wp.array | None = None,
           stream: wp.Stream | None = None) -> wp.array:
    """The unit outward normal of the track region at each point (NaN
    outside the grid and at the clamp).

    Args:
        result: as for ``distance``.
        points: as for ``distance``.
        stream: as for ``distance``.
        out: ``[E, P]`` vec2 on the same device, written in place (else allocated).

    Returns:
        ``[E, P]`` vec2; ``out`` when given.
    """
    points, stream = _check_inputs(result, points, stream)
    out = _output("out", out, wp.vec2, points)
    _launch(result, points, None, out, None, stream)
    return out


def nearest(result: TrackResult, points: wp.array, out: wp.array | None = None,
            stream: wp.Stream | None = None) -> wp.array:
    """The nearest point of the track boundary to each point,
    ``point - distance * normal`` (NaN outside the grid and at the clamp).

    Args:
        result: as for ``distance``.
        points: as for ``distance``.
        stream: as for ``distance``.
        out: ``[E, P]`` vec2 on the same device, written in place (else allocated).

    Returns:
        ``[E, P]`` vec2 (m); ``out`` when given.
    """
    points, stream = _check_inputs(result, points, stream)
    out = _output("out", out, wp.vec2, points)
    _launch(result, points, None, None, out, stream)
    return out


def query(result: TrackResult, points: wp.array, out: QueryResult | None = None,
          stream: wp.Stream | None = None) -> QueryResult:
    """The distance, normal and nearest boundary point at each point, in one launch.

    Args:
        result: as for ``distance``.
        points: as for ``distance``.
        stream: as for ``distance``.
        out: a ``QueryResult`` whose three arrays (distinct, ``[E, P]``, on
            the same device) are written in place (else allocated).

    Returns:
        A ``QueryResult``; ``out`` when given.
    """
    points, stream = _check_inputs(result, points, stream)
    if out is None:
        out = QueryResult(*(_output("out", None, dtype, points) for dtype in (wp.float32, wp.vec2, wp.vec2)))
    elif not isinstance(out, QueryResult):
        raise TypeError(f"out must be a QueryResult, got {type(out).__name__}")
    else:
        for name, dtype in (("distance", wp.float32), ("normal", wp.vec2), ("nearest", wp.vec2)):
            if getattr(out, name) is None:
                raise TypeError(f"out.{name} must be a warp array, got None")
            _output(f"out.{name}", getattr(out, name), dtype, points)
        if out.normal.ptr == out.nearest.ptr:
            raise ValueError("out.normal and out.nearest must be different arrays")
    _launch(result, points, out.distance, out.normal, out.nearest, stream)
    return out


def _check_inputs(result: object, points: object, stream: object) -> tuple[wp.array, wp.Stream | None]:
    """``points`` checked against ``result``, and the stream to launch on."""
    if isinstance(result, GateResult):
        raise TypeError("result must be a TrackResult, got a GateResult: gate courses bake no SDF")
    if not isinstance(result, TrackResult):
        raise TypeError(f"result must be a TrackResult, got {type(result).__name__}")
    num_envs, device = result.sdf.shape[0], result.sdf.device
    if not isinstance(points, wp.array):
        raise TypeError(f"points must be a warp array of [E, P] vec2 or vec3, got {type(points).__name__}")
    if points.dtype not in kq.SDF_QUERIES:
        raise TypeError(f"points must have dtype vec2f or vec3f, got {wp.types.type_repr(points.dtype)}")
    if points.ndim != 2 or points.shape[0] != num_envs or points.shape[1] < 1:
        raise ValueError(f"points must have shape [E, P] = [{num_envs}, P >= 1], got {list(points.shape)}")
    if points.device != device:
        raise ValueError(f"points must be on the result's device {device}, got {points.device}")
    if stream is None:
        return points, (_capture.torch_capture_stream(device) or device.stream) if device.is_cuda else None
    if not isinstance(stream, wp.Stream):
        raise TypeError(f"stream must be a wp.Stream, got {type(stream).__name__}")
    if stream.device != device:
        raise ValueError(f"stream must be on the result's device {device}, got {stream.device}")
    return points, stream


def _output(name: str, out: object, dtype: type, points: wp.array) -> wp.array:
    """``out`` checked against ``points`` (an ``[E, P]`` array of ``dtype`` on
    its device), or a new one when ``None``."""
    if out is None:
        return wp.empty(points.shape, dtype=dtype, device=points.device)
    if not isinstance(out, wp.array):
        raise TypeError(f"{name} must be a warp array, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {wp.types.type_repr(dtype)}, got {wp.types.type_repr(out.dtype)}")
    if out.shape != points.shape:
        raise ValueError(f"{name} must have the points' shape {list(points.shape)}, got {list(out.shape)}")
    if out.device != points.device:
        raise ValueError(f"{name} must be on the result's device {points.device}, got {out.device}")
    return out


def _launch(result: TrackResult, points: wp.array, distance: wp.array | None, normal: wp.array | None,
            nearest: wp.array | None, stream: wp.Stream | None) -> None:
    """One launch over ``[E, P]``; an output given as ``None`` is skipped."""
    r = result
    wp.launch(kq.SDF_QUERIES[points.dtype], points.shape,
              inputs=[r.valid, r.sdf, r.sdf_origin, r.sdf_cell, r.width, points],
              outputs=[distance, normal, nearest],
              device=points.device, stream=stream)
