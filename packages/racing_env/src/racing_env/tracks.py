"""Tracks as data: one ``Track`` on the host, a ``TrackPool`` of them on a JAX device.

A Track is what the observation shows: a fixed-capacity centerline, its left
and right boundaries, a mask of the valid prefix and the lap length, all in
SI units (m). The valid prefix of ``N`` points (``MIN_TRACK_POINTS <= N <=
TRACK_CAPACITY``) is a closed loop: the last valid point joins the first, and
the first point is not repeated. "Left" is left of the driving direction
(the order of the points). Every float row past the prefix is exactly zero.

Identity. ``track_id`` is the uint32 seed of the course that produced the
Track (``LEVEL0_TRACK_ID`` = ``2**32 - 1`` for Level 0's built-in track); the
stable identity is ``(benchmark_version, level_id, track_id)``. The geometry
hash binds an id to exact bytes: sha256, hex digest, over

1. ``centerline``     float32 ``[640, 2]``, C order, little-endian (5,120 bytes)
2. ``left_boundary``  the same
3. ``right_boundary`` the same
4. ``track_mask``     int8 ``[640]`` (640 bytes)
5. ``track_length``   float32 scalar, little-endian (4 bytes)

concatenated in that order, padding included (16,004 bytes in all).

A TrackPool file is two files side by side: ``<name>.npz`` holds the six
arrays (keys ``centerline``, ``left_boundary``, ``right_boundary``,
``track_mask``, ``track_length``, ``track_id``, leading dimension ``P``) and
``<name>.json`` is the manifest:

```text
{"format": 1, "benchmark_version": "0.1", "level_id": 1, "split": "train",
 "capacity": 640, "tracks": [{"track_id": 7, "geometry_hash": "ab12..."}, ...]}
```

with one ``tracks`` entry per row, in row order. Loading recomputes every
row's hash from the loaded bytes and rejects the pool on any mismatch.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import operator
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from racing_env import geometry
from racing_env._checks import integer_in
from racing_env.types import BENCHMARK_VERSION, LEVEL0_TRACK_ID, MIN_TRACK_POINTS, TRACK_CAPACITY

__all__ = [
    "Track",
    "TrackPool",
    "geometry_hash",
    "level0_track",
]

_UINT32_LIMIT = 2**32
_NAME_PATTERN = re.compile(r"[0-9A-Za-z._-]{1,32}")
_HASH_PATTERN = re.compile(r"[0-9a-f]{64}")
_MANIFEST_FORMAT = 1
_MANIFEST_KEYS = ("format", "benchmark_version", "level_id", "split", "capacity", "tracks")
_FLOAT_FIELDS = ("centerline", "left_boundary", "right_boundary")
_ARRAY_FIELDS = (*_FLOAT_FIELDS, "track_mask", "track_length", "track_id")
_FIELD_DTYPES = {
    "centerline": np.dtype(np.float32),
    "left_boundary": np.dtype(np.float32),
    "right_boundary": np.dtype(np.float32),
    "track_mask": np.dtype(np.int8),
    "track_length": np.dtype(np.float32),
    "track_id": np.dtype(np.uint32),
}

# Level 0's closed-form track (float64): the polar curve
# r(theta) = R0 + A sin(2 theta) + B cos(3 theta), m. Lap ~742 m, minimum
# radius of curvature ~46 m, counter-clockwise (theta increases, r > 0).
_LEVEL0_R0 = 110.0
_LEVEL0_A = 25.0
_LEVEL0_B = 12.0
_LEVEL0_HALF_WIDTH = 6.0
_LEVEL0_DENSE_SAMPLES = 1 << 16
# The start is the first point of the straightest stretch of this length (m).
_LEVEL0_STRAIGHT_WINDOW_M = 60.0


# --------------------------------------------------------------------------- checks


def _is_floating(dtype: Any) -> bool:
    # jnp.issubdtype knows the ml_dtypes floats (bfloat16, ...), np.issubdtype does not.
    return bool(jnp.issubdtype(dtype, jnp.floating))


def _is_integer_or_bool(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.bool_))


def _host_array(name: str, value: Any) -> np.ndarray:
    """``np.asarray(value)``, with errors that name the argument."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{name} must be a rectangular numeric array: {err}") from None


def _to_float32(arr: np.ndarray) -> np.ndarray:
    """A fresh float32 copy; values beyond float32's range become inf (callers check finiteness)."""
    with np.errstate(over="ignore"):
        return arr.astype(np.float32, copy=True)


def _check_shape(name: str, shape: tuple[int, ...], expected: tuple[int, ...], how: str) -> None:
    if tuple(shape) != expected:
        raise ValueError(f"{name} must have shape {how} = {expected}, got {tuple(shape)}")


def _check_float_kind(name: str, dtype: Any) -> None:
    if not _is_floating(dtype):
        raise TypeError(f"{name} must have a real floating dtype (converted to float32), "
                        f"got {str(dtype)}")


def _check_int_kind(name: str, dtype: Any) -> None:
    if not _is_integer_or_bool(dtype):
        raise TypeError(f"{name} must have an integer dtype, got {str(dtype)}")


def _check_id_kind(name: str, dtype: Any) -> None:
    if jnp.issubdtype(dtype, jnp.bool_) or not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"{name} must have an integer dtype (converted to uint32), got {str(dtype)}")


def _scalar_int(name: str, value: Any) -> int:
    """A Python int from an int, NumPy integer or 0-d integer array; bools are refused."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


def _track_id(name: str, value: Any) -> np.uint32:
    index = _scalar_int(name, value)
    if not 0 <= index < _UINT32_LIMIT:
        raise ValueError(f"{name} must be in [0, 2**32), got {index}")
    return np.uint32(index)


def _positive_length(name: str, value: Any) -> np.float32:
    """A float32 scalar, finite and > 0, from a real number (bools refused)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a real number, got a bool")
    arr = _host_array(name, value)
    if arr.shape != ():
        raise ValueError(f"{name} must be a scalar, got shape {arr.shape}")
    if not (_is_floating(arr.dtype) or jnp.issubdtype(arr.dtype, jnp.integer)):
        raise TypeError(f"{name} must be a real number, got {str(arr.dtype)}")
    length = np.float32(_to_float32(arr))
    if not (np.isfinite(length) and length > 0):
        raise ValueError(f"{name} must be finite and > 0 (m, as float32), got {arr.item()!r}")
    return length


def _check_name(name: str, value: Any) -> str:
    """A short identifier: a str of 1-32 characters from ``[0-9A-Za-z._-]``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not _NAME_PATTERN.fullmatch(value):
        raise ValueError(f"{name} must be 1-32 characters from [0-9A-Za-z._-], got {value!r}")
    return value


def _check_items(name: str, items: Any, kind: type) -> None:
    """Refuse anything but a non-empty sequence of ``kind``, naming the item."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"{name} must be a sequence of {kind.__name__}, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, kind):
            raise TypeError(f"{name}[{i}] must be a {kind.__name__}, got {type(item).__name__}")
    if len(items) == 0:
        raise ValueError(f"{name} must hold at least one {kind.__name__}")


def _check_level_id(value: Any) -> int:
    level_id = _scalar_int("level_id", value)
    if level_id < 0:
        raise ValueError(f"level_id must be >= 0, got {level_id}")
    return level_id


def _check_values(arrays: dict[str, np.ndarray], rows: bool = True) -> None:
    """Value checks on host arrays of a pool (leading ``[P]``), already in their final dtypes.

    Mask values other than 0/1 are refused before the int8 cast by the caller (a cast could
    hide them). ``rows=False`` drops the row from messages (a single Track).
    """
    ids = arrays["track_id"]

    def _row(index: int, ids: np.ndarray) -> str:
        return f"row {index} (track_id {int(ids[index])})" if rows else "(a Track)"

    mask = arrays["track_mask"]
    counts = mask.sum(axis=1, dtype=np.int64)
    prefix = np.arange(TRACK_CAPACITY)[None, :] < counts[:, None]
    bad = np.flatnonzero(~np.all(mask == prefix, axis=1))
    if bad.size:
        raise ValueError(f"track_mask {_row(int(bad[0]), ids)} must be a prefix of ones followed by zeros")
    bad = np.flatnonzero(counts < MIN_TRACK_POINTS)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"track_mask {_row(i, ids)} has {int(counts[i])} valid points, "
                         f"needs at least MIN_TRACK_POINTS = {MIN_TRACK_POINTS}")
    for name in _FLOAT_FIELDS:
        values = arrays[name]
        bad = np.flatnonzero(~np.all(np.isfinite(values), axis=(1, 2)))
        if bad.size:
            raise ValueError(f"{name} {_row(int(bad[0]), ids)} is not finite")
        bad = np.flatnonzero(np.any((values != 0) & ~prefix[:, :, None], axis=(1, 2)))
        if bad.size:
            raise ValueError(f"{name} {_row(int(bad[0]), ids)} must be zero beyond the valid prefix")
    lengths = arrays["track_length"]
    bad = np.flatnonzero(~(np.isfinite(lengths) & (lengths > 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"track_length {_row(i, ids)} must be finite and > 0, got {float(lengths[i])!r}")
    unique, counts_id = np.unique(ids, return_counts=True)
    if np.any(counts_id > 1):
        dup = int(unique[np.argmax(counts_id > 1)])
        where = np.flatnonzero(ids == dup).tolist()
        raise ValueError(f"track_id {dup} appears in rows {where}; ids must be unique within a pool")


def _check_host_mask_values(name: str, mask: np.ndarray) -> None:
    """Refuse mask values other than 0 and 1 before any cast to int8."""
    bad = ~((mask == 0) | (mask == 1))
    if np.any(bad):
        where = np.argwhere(bad)[0]
        raise ValueError(f"{name} must hold only 0 and 1, got {mask[tuple(where)]!r} at index {tuple(where.tolist())}")


def _check_host_id_values(name: str, ids: np.ndarray) -> None:
    """Refuse ids outside [0, 2**32) before any cast to uint32."""
    if ids.dtype == np.uint32 or ids.size == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= _UINT32_LIMIT:
        bad = lo if lo < 0 else hi
        row = int(np.flatnonzero(ids == bad)[0])
        raise ValueError(f"{name} must be in [0, 2**32), got {bad} at row {row}")


# --------------------------------------------------------------------------- hashing


def _hash_row(centerline: np.ndarray, left: np.ndarray, right: np.ndarray,
              mask: np.ndarray, length: Any) -> str:
    digest = hashlib.sha256()
    for values in (centerline, left, right):
        digest.update(np.ascontiguousarray(values, dtype="<f4").tobytes(order="C"))
    digest.update(np.ascontiguousarray(mask, dtype=np.int8).tobytes(order="C"))
    digest.update(np.asarray(length, dtype="<f4").tobytes())
    return digest.hexdigest()


def _hash_rows(arrays: dict[str, np.ndarray]) -> tuple[str, ...]:
    return tuple(
        _hash_row(arrays["centerline"][i], arrays["left_boundary"][i], arrays["right_boundary"][i],
                  arrays["track_mask"][i], arrays["track_length"][i])
        for i in range(arrays["centerline"].shape[0]))


def geometry_hash(centerline: ArrayLike, left_boundary: ArrayLike, right_boundary: ArrayLike,
                  track_mask: ArrayLike, track_length: Any) -> str:
    """The sha256 hex digest that binds a track id to exact geometry bytes.

    Hashes, in this order: ``centerline``, ``left_boundary``, ``right_boundary``
    (each float32 ``[640, 2]``, C order, little-endian), ``track_mask`` (int8
    ``[640]``) and ``track_length`` (float32, 4 bytes, little-endian).

    Args:
        centerline: ``[640, 2]`` any real floating dtype (m), converted to float32.
        left_boundary: ``[640, 2]`` as ``centerline``.
        right_boundary: ``[640, 2]`` as ``centerline``.
        track_mask: ``[640]`` integer or bool, values 0 or 1, converted to int8.
        track_length: a real scalar (m), converted to float32.

    The hash is over bytes only: it does not check that the arrays form a
    valid Track (``Track`` does).

    Raises:
        TypeError: a wrong dtype.
        ValueError: a wrong shape or a mask value other than 0 and 1.
    """
    floats = []
    for name, value in zip(_FLOAT_FIELDS, (centerline, left_boundary, right_boundary)):
        arr = _host_array(name, value)
        _check_float_kind(name, arr.dtype)
        _check_shape(name, arr.shape, (TRACK_CAPACITY, 2), "[TRACK_CAPACITY, 2]")
        floats.append(_to_float32(arr))
    mask = _host_array("track_mask", track_mask)
    _check_int_kind("track_mask", mask.dtype)
    _check_shape("track_mask", mask.shape, (TRACK_CAPACITY,), "[TRACK_CAPACITY]")
    _check_host_mask_values("track_mask", mask)
    if isinstance(track_length, (bool, np.bool_)):
        raise TypeError("track_length must be a real number, got a bool")
    length = _host_array("track_length", track_length)
    if length.shape != ():
        raise ValueError(f"track_length must be a scalar, got shape {length.shape}")
    if not (_is_floating(length.dtype) or jnp.issubdtype(length.dtype, jnp.integer)):
        raise TypeError(f"track_length must be a real number, got {str(length.dtype)}")
    return _hash_row(*floats, mask.astype(np.int8), _to_float32(length))


# --------------------------------------------------------------------------- Track


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False, repr=False)
class Track:
    """One track on the host, as the observation shows it (SI units, m).

    Construction validates every field and keeps fresh read-only copies, so a
    Track never changes and never shares memory with its caller's arrays.

    Attributes:
        centerline: ``[TRACK_CAPACITY, 2]`` float32 (m): world (x, y); the
            valid prefix is a closed loop (the last point joins the first,
            which is not repeated); exact zeros beyond it.
        left_boundary: ``[TRACK_CAPACITY, 2]`` float32 (m): the boundary left
            of the driving direction; exact zeros beyond the prefix.
        right_boundary: ``[TRACK_CAPACITY, 2]`` float32 (m): the right one.
        track_mask: ``[TRACK_CAPACITY]`` int8: 1 on the valid prefix of
            ``num_points >= MIN_TRACK_POINTS`` points, 0 after.
        track_length: float32 scalar (m): the closed-loop length of the valid
            centerline, finite and > 0. (Not re-derived here: producers own it;
            ``from_centerline`` computes it as the polyline perimeter.)
        track_id: uint32: the generating course's seed (``LEVEL0_TRACK_ID``
            for Level 0's built-in track).

    Args:
        Float arrays take any array-like of a real floating dtype (converted
        to float32, then checked finite); the mask any integer or bool dtype
        with values 0 and 1; ``track_length`` a real scalar; ``track_id`` an
        integer in ``[0, 2**32)``.

    Raises:
        TypeError: a wrong dtype or type, naming the argument.
        ValueError: a wrong shape, a non-finite value, a mask that is not a
            prefix of at least ``MIN_TRACK_POINTS`` ones, non-zero padding, a
            length that is not > 0, or an id out of range.
    """

    centerline: np.ndarray  # [640, 2] float32, m
    left_boundary: np.ndarray  # [640, 2] float32, m
    right_boundary: np.ndarray  # [640, 2] float32, m
    track_mask: np.ndarray  # [640] int8
    track_length: np.float32  # (), m
    track_id: np.uint32  # ()

    def __post_init__(self) -> None:
        arrays: dict[str, np.ndarray] = {}
        for name in _FLOAT_FIELDS:
            arr = _host_array(name, getattr(self, name))
            _check_float_kind(name, arr.dtype)
            _check_shape(name, arr.shape, (TRACK_CAPACITY, 2), "[TRACK_CAPACITY, 2]")
            arrays[name] = _to_float32(arr)
        mask = _host_array("track_mask", self.track_mask)
        _check_int_kind("track_mask", mask.dtype)
        _check_shape("track_mask", mask.shape, (TRACK_CAPACITY,), "[TRACK_CAPACITY]")
        _check_host_mask_values("track_mask", mask)
        arrays["track_mask"] = mask.astype(np.int8, copy=True)
        length = _positive_length("track_length", self.track_length)
        track_id = _track_id("track_id", self.track_id)
        # The pool's row checks with P = 1 (the length was checked above).
        _check_values({name: arr[None] for name, arr in arrays.items()}
                      | {"track_length": np.array([length]), "track_id": np.array([track_id])}, rows=False)
        # Everything is valid: only now replace the fields.
        for name, arr in arrays.items():
            object.__setattr__(self, name, _readonly(arr))
        object.__setattr__(self, "track_length", length)
        object.__setattr__(self, "track_id", track_id)

    def __repr__(self) -> str:
        return (f"Track(track_id={int(self.track_id)}, num_points={self.num_points}, "
                f"track_length={float(self.track_length):.3f} m)")

    @property
    def num_points(self) -> int:
        """The number of valid centerline points ``N`` (the mask's prefix)."""
        return int(self.track_mask.sum(dtype=np.int64))

    @functools.cached_property
    def geometry_hash(self) -> str:
        """sha256 hex digest of the geometry bytes (see ``geometry_hash()``), cached."""
        return _hash_row(self.centerline, self.left_boundary, self.right_boundary,
                         self.track_mask, self.track_length)

    @classmethod
    def from_centerline(cls, centerline: ArrayLike, half_width: float | ArrayLike, track_id: int) -> Track:
        """A Track from a closed centerline and a half-width.

        The centerline is first rounded to float32 (what the Track stores);
        the geometry is then computed from it in float64. With ``p_i`` the
        points (indices modulo ``N``), the tangent is the central difference
        ``t_i = p_{i+1} - p_{i-1}``, the unit left normal ``n_i`` is ``t_i``
        rotated by +90 degrees and normalised, and the boundaries are
        ``left_i = p_i + w_i n_i`` and ``right_i = p_i - w_i n_i``.
        ``track_length`` is the closed polyline perimeter
        ``sum_i |p_{i+1} - p_i|`` (float64, stored as float32). Every array is
        zero-padded to ``TRACK_CAPACITY``.

        This does not check that the boundaries stay simple (a half-width
        above the local radius of curvature folds them); admission is the
        producer's job.

        Args:
            centerline: ``[N, 2]`` real floating dtype (m), ``MIN_TRACK_POINTS
                <= N <= TRACK_CAPACITY``, a closed loop in driving order whose
                first point is not repeated at the end; no two consecutive
                points may coincide.
            half_width: a positive finite scalar or an ``[N]`` array of them (m).
            track_id: an integer in ``[0, 2**32)``.

        Raises:
            TypeError: a wrong dtype or type.
            ValueError: a wrong shape or count, a non-finite value, coinciding
                consecutive points (or ``p_{i-1} == p_{i+1}``), a half-width
                that is not > 0, or an id out of range.
        """
        points = _host_array("centerline", centerline)
        _check_float_kind("centerline", points.dtype)
        if points.ndim != 2 or points.shape[1] != 2:
            raise ValueError(f"centerline must have shape [N, 2], got {points.shape}")
        n = points.shape[0]
        if not MIN_TRACK_POINTS <= n <= TRACK_CAPACITY:
            raise ValueError(f"centerline must have N in [MIN_TRACK_POINTS, TRACK_CAPACITY] = "
                             f"[{MIN_TRACK_POINTS}, {TRACK_CAPACITY}] points, got {n}")
        stored = _to_float32(points)
        if not np.all(np.isfinite(stored)):
            raise ValueError("centerline must be finite (after conversion to float32)")
        p = stored.astype(np.float64)

        if isinstance(half_width, (bool, np.bool_)):
            raise TypeError("half_width must be a real number or array, got a bool")
        width = _host_array("half_width", half_width)
        if not (_is_floating(width.dtype) or jnp.issubdtype(width.dtype, jnp.integer)):
            raise TypeError(f"half_width must be real, got {str(width.dtype)}")
        if width.shape not in ((), (n,)):
            raise ValueError(f"half_width must be a scalar or have shape [N] = ({n},), got {width.shape}")
        width = np.broadcast_to(width.astype(np.float64), (n,))
        if not np.all(np.isfinite(width) & (width > 0)):
            raise ValueError("half_width must be finite and > 0 (m)")

        _, segment_length = geometry.loop_segments(np, p, np.asarray(n))
        bad = np.flatnonzero(segment_length == 0)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"centerline points {i} and {(i + 1) % n} coincide (as float32); "
                             "do not repeat the first point at the end")
        tangent = geometry.loop_tangents(np, p)
        bad = np.flatnonzero(np.linalg.norm(tangent, axis=-1) == 0)
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"centerline doubles back at point {i}: points {(i - 1) % n} and "
                             f"{(i + 1) % n} coincide, so the tangent is undefined")
        offset = width[:, None] * geometry.left_normals(np, tangent)

        def padded(values: np.ndarray) -> np.ndarray:
            out = np.zeros((TRACK_CAPACITY, 2), np.float32)
            out[:n] = values
            return out

        mask = np.zeros(TRACK_CAPACITY, np.int8)
        mask[:n] = 1
        return cls(
            centerline=padded(stored),
            left_boundary=padded(p + offset),
            right_boundary=padded(p - offset),
            track_mask=mask,
            track_length=np.float32(math.fsum(segment_length.tolist())),
            track_id=track_id,
        )


def _level0_polar(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """r, dr/dtheta, d2r/dtheta2 of Level 0's curve (float64, m)."""
    r = _LEVEL0_R0 + _LEVEL0_A * np.sin(2 * theta) + _LEVEL0_B * np.cos(3 * theta)
    dr = 2 * _LEVEL0_A * np.cos(2 * theta) - 3 * _LEVEL0_B * np.sin(3 * theta)
    ddr = -4 * _LEVEL0_A * np.sin(2 * theta) - 9 * _LEVEL0_B * np.cos(3 * theta)
    return r, dr, ddr


def level0_track() -> Track:
    """Level 0's built-in development track (``track_id = LEVEL0_TRACK_ID``).

    The closed polar curve ``r(theta) = 110 + 25 sin(2 theta) + 12 cos(3 theta)``
    (m), traced counter-clockwise, resampled to ``TRACK_CAPACITY`` points equally
    spaced in arc length (on a dense ``2**16``-point polyline, float64), with a
    constant half-width of 6 m (12 m wide). The lap is about 742 m and the radius
    of curvature stays above about 45 m. The first point is the start of the
    straightest 60 m of the lap (least mean absolute curvature ahead), so an
    episode starts heading into a straight-ish section.

    Deterministic: the same bytes (and ``geometry_hash``) on every call.
    """
    theta = np.linspace(0.0, 2.0 * np.pi, _LEVEL0_DENSE_SAMPLES, endpoint=False)
    r, dr, ddr = _level0_polar(theta)
    dense = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1)
    step = np.roll(dense, -1, axis=0) - dense
    arc = np.concatenate([[0.0], np.cumsum(np.hypot(step[:, 0], step[:, 1]))])  # [S + 1], m
    lap = arc[-1]

    # Signed curvature of a polar curve; mean |kappa| over the window ahead of each sample.
    curvature = (r**2 + 2 * dr**2 - r * ddr) / (r**2 + dr**2) ** 1.5
    ds = np.diff(arc)
    window = int(np.searchsorted(arc, _LEVEL0_STRAIGHT_WINDOW_M))
    weighted = np.abs(curvature) * ds
    cumulative = np.concatenate([[0.0], np.cumsum(np.concatenate([weighted, weighted[:window]]))])
    ahead = cumulative[window:window + theta.size] - cumulative[:theta.size]
    start_arc = arc[int(np.argmin(ahead))]

    targets = np.mod(start_arc + lap * np.arange(TRACK_CAPACITY) / TRACK_CAPACITY, lap)
    theta_at = np.interp(targets, arc, np.concatenate([theta, [2.0 * np.pi]]))
    r_at, _, _ = _level0_polar(theta_at)
    points = np.stack([r_at * np.cos(theta_at), r_at * np.sin(theta_at)], axis=1)
    return Track.from_centerline(points, _LEVEL0_HALF_WIDTH, LEVEL0_TRACK_ID)


# --------------------------------------------------------------------------- TrackPool


def _single_device(values: list[jax.Array]) -> Any:
    """The one device all these JAX arrays live on, or None."""
    devices: set[Any] = set()
    for value in values:
        devices |= set(value.devices())
    return next(iter(devices)) if len(devices) == 1 else None


def _check_path(path: Any) -> tuple[Path, Path]:
    try:
        npz = Path(os.fspath(path))
    except TypeError:
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}") from None
    if npz.suffix != ".npz":
        raise ValueError(f"path must name the .npz file (the manifest is the same name with .json), got {str(npz)!r}")
    return npz, npz.with_suffix(".json")


@dataclass(frozen=True, eq=False, repr=False)
class TrackPool:
    """An immutable pool of ``P >= 1`` tracks held as JAX arrays.

    The arrays stay on whatever device they came from (``from_arrays`` never
    moves a JAX array; ``load`` and NumPy input go to the default device, or to
    the one device the other JAX inputs share). Direct construction checks
    types, dtypes, shapes, devices and metadata only; ``from_arrays`` and
    ``from_tracks`` also convert and check values.

    Attributes:
        centerline: ``[P, TRACK_CAPACITY, 2]`` float32 (m), rows as ``Track``.
        left_boundary: ``[P, TRACK_CAPACITY, 2]`` float32 (m).
        right_boundary: ``[P, TRACK_CAPACITY, 2]`` float32 (m).
        track_mask: ``[P, TRACK_CAPACITY]`` int8.
        track_length: ``[P]`` float32 (m).
        track_id: ``[P]`` uint32, unique within a pool (when values are checked).
        level_id: the Level (int >= 0).
        split: the split name, e.g. ``"train"``, ``"validation"``, ``"test"``,
            ``"fixed"`` (1-32 characters from ``[0-9A-Za-z._-]``).
        benchmark_version: e.g. ``"0.1"`` (1-32 characters from ``[0-9A-Za-z._-]``).
    """

    centerline: jax.Array  # [P, 640, 2] float32, m
    left_boundary: jax.Array  # [P, 640, 2] float32, m
    right_boundary: jax.Array  # [P, 640, 2] float32, m
    track_mask: jax.Array  # [P, 640] int8
    track_length: jax.Array  # [P] float32, m
    track_id: jax.Array  # [P] uint32
    level_id: int
    split: str
    benchmark_version: str

    def __post_init__(self) -> None:
        level_id = _check_level_id(self.level_id)
        _check_name("split", self.split)
        _check_name("benchmark_version", self.benchmark_version)
        values = [getattr(self, name) for name in _ARRAY_FIELDS]
        for name, value in zip(_ARRAY_FIELDS, values):
            if not isinstance(value, jax.Array):
                raise TypeError(f"{name} must be a jax.Array (TrackPool.from_arrays takes NumPy), "
                                f"got {type(value).__name__}")
            if value.dtype != _FIELD_DTYPES[name]:
                raise TypeError(f"{name} must have dtype {_FIELD_DTYPES[name]}, got {value.dtype}")
        _check_pool_shapes({name: value.shape for name, value in zip(_ARRAY_FIELDS, values)})
        devices = [frozenset(value.devices()) for value in values]
        if len(set(devices)) != 1:
            raise ValueError("every TrackPool array must live on the same device(s), got "
                             + ", ".join(f"{name}: {sorted(map(str, d))}" for name, d in zip(_ARRAY_FIELDS, devices)))
        object.__setattr__(self, "level_id", level_id)

    def __repr__(self) -> str:
        return (f"TrackPool(P={len(self)}, level_id={self.level_id}, split={self.split!r}, "
                f"benchmark_version={self.benchmark_version!r})")

    def __len__(self) -> int:
        """The number of tracks ``P``."""
        return int(self.track_id.shape[0])

    # ----------------------------------------------------------------- builders

    @classmethod
    def from_tracks(cls, tracks: Sequence[Track], *, level_id: int, split: str,
                    benchmark_version: str = BENCHMARK_VERSION) -> TrackPool:
        """A pool of these Tracks, in this order, on the default JAX device.

        Raises:
            TypeError: ``tracks`` is not a sequence of Track, or bad metadata types.
            ValueError: no tracks, a repeated ``track_id``, or bad metadata values.
        """
        _check_items("tracks", tracks, Track)
        stacked = {name: np.stack([np.asarray(getattr(t, name)) for t in tracks]) for name in _ARRAY_FIELDS}
        return cls.from_arrays(**stacked, level_id=level_id, split=split, benchmark_version=benchmark_version)

    @classmethod
    def from_arrays(cls, centerline: ArrayLike | jax.Array, left_boundary: ArrayLike | jax.Array,
                    right_boundary: ArrayLike | jax.Array, track_mask: ArrayLike | jax.Array,
                    track_length: ArrayLike | jax.Array, track_id: ArrayLike | jax.Array, *,
                    level_id: int, split: str, benchmark_version: str = BENCHMARK_VERSION,
                    check_values: bool = True) -> TrackPool:
        """A pool from stacked arrays, NumPy (or array-likes) or JAX.

        Shapes as the attributes (``[P, 640, 2]``, ``[P, 640]``, ``[P]``).
        Float arrays take any real floating dtype (converted to float32); the
        mask any integer or bool dtype (to int8); ids any integer dtype (to
        uint32). A JAX array that already has its final dtype is kept as the
        same object (no host copy, no device change); one that needs a cast is
        cast on its device. NumPy input is copied and put on the device the
        JAX inputs share, or the default device.

        Shapes and dtypes are always checked (metadata only, no transfer).
        ``check_values=True`` also reads the values to the host and checks them:
        finite, each mask a prefix of at least ``MIN_TRACK_POINTS`` ones, zeros
        beyond it, lengths > 0, ids unique. ``check_values=False`` is for
        trusted device producers that validated upstream and must not read
        back: nothing is checked on JAX inputs, a JAX mask or id must then
        already be int8 or uint32 (a cast could wrap an unchecked value), and
        a host mask or id is still range-checked before its cast. ``save``
        checks values before it writes, so an unchecked bad pool cannot reach
        a file.

        Raises:
            TypeError: a wrong type or dtype, naming the argument.
            ValueError: a wrong shape or an inconsistent ``P``, no tracks, a bad
                value (with ``check_values``; naming the argument, row and id),
                or bad metadata.
        """
        level_id = _check_level_id(level_id)
        _check_name("split", split)
        _check_name("benchmark_version", benchmark_version)
        if not isinstance(check_values, bool):
            raise TypeError(f"check_values must be a bool, got {type(check_values).__name__}")

        given = dict(zip(_ARRAY_FIELDS, (centerline, left_boundary, right_boundary,
                                          track_mask, track_length, track_id)))
        inputs: dict[str, np.ndarray | jax.Array] = {}
        for name, value in given.items():
            inputs[name] = value if isinstance(value, jax.Array) else _host_array(name, value)
            dtype = inputs[name].dtype
            if name == "track_id":
                _check_id_kind(name, dtype)
            elif name == "track_mask":
                _check_int_kind(name, dtype)
            else:
                _check_float_kind(name, dtype)
        _check_pool_shapes({name: value.shape for name, value in inputs.items()})
        if not check_values:
            for name in ("track_mask", "track_id"):
                value = inputs[name]
                if isinstance(value, jax.Array) and value.dtype != _FIELD_DTYPES[name]:
                    raise TypeError(f"{name} must already have dtype {_FIELD_DTYPES[name]} when check_values=False "
                                    f"(a cast of unchecked values could wrap), got {value.dtype}")

        # Integer fields are range-checked on the host before any cast (a cast could wrap);
        # a JAX one is read back only when check_values asks for it.
        checked_host: dict[str, np.ndarray] = {}
        for name in ("track_mask", "track_id"):
            value = inputs[name]
            if check_values or not isinstance(value, jax.Array):
                host = np.asarray(value)
                if name == "track_mask":
                    _check_host_mask_values(name, host)
                else:
                    _check_host_id_values(name, host)
                checked_host[name] = host.astype(_FIELD_DTYPES[name])
        jax_inputs = [v for v in inputs.values() if isinstance(v, jax.Array)]
        device = _single_device(jax_inputs) if jax_inputs else None

        final: dict[str, jax.Array] = {}
        host_final: dict[str, np.ndarray] = {}
        for name, value in inputs.items():
            dtype = _FIELD_DTYPES[name]
            if isinstance(value, jax.Array):
                # Same object when the dtype is already right; else a cast on the array's device.
                final[name] = value if value.dtype == dtype else value.astype(dtype)
            else:
                with np.errstate(over="ignore"):  # an overflow to inf is a value error, found below
                    host_final[name] = _readonly(np.array(value, dtype=dtype, copy=True, order="C"))
        if check_values:
            host = {}
            for name in _ARRAY_FIELDS:
                if name in host_final:
                    host[name] = host_final[name]
                elif name in checked_host:
                    host[name] = checked_host[name]
                else:
                    host[name] = np.asarray(final[name])  # the float32 values the pool holds
            _check_values(host)
        for name, value in host_final.items():
            final[name] = jax.device_put(value, device)
        return cls(**final, level_id=level_id, split=split, benchmark_version=benchmark_version)

    # ----------------------------------------------------------------- reading

    def track(self, index: int) -> Track:
        """A host copy of row ``index`` (``0 <= index < P``) as a validated Track.

        Reads that one row back from the device.

        Raises:
            TypeError: ``index`` is not an integer.
            ValueError: ``index`` is out of range, or the row is not a valid
                Track (possible only in a pool built with ``check_values=False``).
        """
        i = _scalar_int("index", index)
        if not 0 <= i < len(self):
            raise ValueError(f"index must be in [0, {len(self)}), got {i}")
        row = {name: np.asarray(getattr(self, name)[i]) for name in _ARRAY_FIELDS}
        return Track(**row)

    def take(self, rows: Sequence[int] | np.ndarray | jax.Array) -> TrackPool:
        """A pool of these rows, in this order, with this pool's level,
        split and version; gathered on the pool's device (no values read
        back; the rows are checked on the host).

        Args:
            rows: row indices in ``[0, P)``, at least one, none repeated
                (a pool's track ids are unique).

        Raises:
            TypeError: ``rows`` is not a sequence or 1-D array of integers.
            ValueError: no rows, a row out of range or repeated, naming it.
        """
        if isinstance(rows, jax.Array):
            rows = np.asarray(rows)
        if isinstance(rows, np.ndarray):
            if rows.ndim != 1 or not (np.issubdtype(rows.dtype, np.integer) or rows.size == 0):
                raise TypeError(f"rows must be a 1-D array of integers, got {rows.dtype}{list(rows.shape)}")
            rows = rows.tolist()
        if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
            raise TypeError(f"rows must be a sequence of integers, got {type(rows).__name__}")
        if len(rows) == 0:
            raise ValueError("rows must hold at least one row")
        picked = [integer_in(row, f"rows[{k}]", 0, len(self)) for k, row in enumerate(rows)]
        seen: dict[int, int] = {}
        for k, row in enumerate(picked):
            if row in seen:
                raise ValueError(f"rows[{k}] repeats row {row} (rows[{seen[row]}]): a pool's track ids are unique")
            seen[row] = k
        index = jnp.asarray(picked, jnp.int32)
        return TrackPool(**{name: jnp.take(getattr(self, name), index, axis=0) for name in _ARRAY_FIELDS},
                         level_id=self.level_id, split=self.split, benchmark_version=self.benchmark_version)

    @classmethod
    def concatenate(cls, pools: Sequence[TrackPool]) -> TrackPool:
        """One pool of every row of ``pools``, in order, on their device.
        They must share the level, split and version, and no track id may
        appear twice (the ids are read back to check).

        Raises:
            TypeError: ``pools`` is not a sequence of TrackPool.
            ValueError: no pools, differing metadata or devices, or a repeated
                track id, naming the pools.
        """
        _check_items("pools", pools, TrackPool)
        first = pools[0]
        for k, pool in enumerate(pools[1:], start=1):
            for name in ("level_id", "split", "benchmark_version"):
                if getattr(pool, name) != getattr(first, name):
                    raise ValueError(f"pools[{k}].{name} is {getattr(pool, name)!r}, pools[0]'s "
                                     f"{getattr(first, name)!r}: a pool has one")
        devices = [sorted(map(str, pool.track_id.devices())) for pool in pools]
        for k, where in enumerate(devices):
            if where != devices[0]:
                raise ValueError(f"pools[{k}] lives on {where}, pools[0] on {devices[0]}: move one first")
        owner: dict[int, int] = {}
        for k, pool in enumerate(pools):
            for track_id in np.asarray(pool.track_id).tolist():
                if track_id in owner:
                    raise ValueError(f"track_id {track_id} is in pools[{owner[track_id]}] and pools[{k}]: "
                                     "a pool's track ids are unique")
                owner[track_id] = k
        return cls(**{name: jnp.concatenate([getattr(p, name) for p in pools]) for name in _ARRAY_FIELDS},
                   level_id=first.level_id, split=first.split, benchmark_version=first.benchmark_version)

    @functools.cached_property
    def geometry_hashes(self) -> tuple[str, ...]:
        """Each row's ``geometry_hash``, in row order.

        Computed on first access (which reads the whole pool back to the
        host) and cached; ``load`` fills it from the verified file.
        """
        return _hash_rows(self._host_arrays())

    def _host_arrays(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(getattr(self, name)) for name in _ARRAY_FIELDS}

    # ----------------------------------------------------------------- files

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the pool as ``path`` (must end in ``.npz``) and its manifest beside it (``.json``).

        Reads the pool back to the host, checks its values (as
        ``from_arrays(check_values=True)``), then writes both files through
        temporary files in the same folder (``.<name>.npz.*.tmp`` and
        ``.<name>.json.*.tmp``, fsynced, removed on any failure; a killed
        writer leaves them behind), renamed into place the manifest last.
        Never overwrites: a pool file is immutable once published. Changes
        nothing in the pool except filling the ``geometry_hashes`` cache.

        Raises:
            TypeError: ``path`` is not a path.
            ValueError: ``path`` does not end in ``.npz``, or the pool holds a bad value.
            FileExistsError: either file already exists.
        """
        npz_path, manifest_path = _check_path(path)
        for existing in (npz_path, manifest_path):
            if existing.exists():
                raise FileExistsError(f"{existing} already exists; TrackPool files are never overwritten")
        host = self._host_arrays()
        _check_values(host)
        hashes = self.geometry_hashes
        manifest = {
            "format": _MANIFEST_FORMAT,
            "benchmark_version": self.benchmark_version,
            "level_id": self.level_id,
            "split": self.split,
            "capacity": TRACK_CAPACITY,
            "tracks": [{"track_id": int(tid), "geometry_hash": h} for tid, h in zip(host["track_id"], hashes)],
        }
        folder = npz_path.parent
        temporaries: list[str] = []
        try:
            fd, tmp_npz = tempfile.mkstemp(dir=folder, prefix=f".{npz_path.name}.", suffix=".tmp")
            temporaries.append(tmp_npz)
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **host)
                f.flush()
                os.fsync(f.fileno())
            fd, tmp_json = tempfile.mkstemp(dir=folder, prefix=f".{manifest_path.name}.", suffix=".tmp")
            temporaries.append(tmp_json)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(manifest, f, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_npz, npz_path)
            temporaries.remove(tmp_npz)
            os.replace(tmp_json, manifest_path)
            temporaries.remove(tmp_json)
        finally:
            for leftover in temporaries:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        folder_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(folder_fd)
        finally:
            os.close(folder_fd)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrackPool:
        """Read a pool written by ``save``: ``path`` (``.npz``) and its ``.json`` manifest.

        Checks the manifest is well formed (exactly the documented keys,
        ``format`` 1, ``capacity`` ``TRACK_CAPACITY``), the npz holds exactly
        the six arrays in their exact dtypes and shapes, the counts and the
        ids match row by row, every value is valid, and every row's hash,
        recomputed from the loaded bytes, matches the manifest. The arrays go
        to the default JAX device.

        Raises:
            TypeError: ``path`` is not a path.
            FileNotFoundError: either file is missing.
            OSError: either file cannot be opened (permissions).
            ValueError: ``path`` does not end in ``.npz``, a malformed manifest
                or npz (not JSON, not a readable zip of the six arrays: a
                truncated or damaged file; each naming the file), a count,
                capacity or id mismatch, a bad value, or a hash mismatch
                (naming the row and its track_id).
        """
        npz_path, manifest_path = _check_path(path)
        with open(manifest_path, encoding="utf-8") as f:
            try:
                manifest = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ValueError(f"manifest {manifest_path} is not valid JSON: {err}") from None
        level_id, split, benchmark_version, entries = _parse_manifest(manifest, manifest_path)

        host = _read_npz(npz_path)
        for name, value in host.items():
            if value.dtype != _FIELD_DTYPES[name]:
                raise ValueError(f"{npz_path}: {name} must have dtype {_FIELD_DTYPES[name]}, got {value.dtype}")
        try:
            pool_size = _check_pool_shapes({name: value.shape for name, value in host.items()})
        except ValueError as err:
            raise ValueError(f"{npz_path}: {err}") from None
        if pool_size != len(entries):
            raise ValueError(f"manifest {manifest_path} lists {len(entries)} tracks, {npz_path} holds {pool_size}")
        ids = host["track_id"]
        for i, (tid, _) in enumerate(entries):
            if int(ids[i]) != tid:
                raise ValueError(f"row {i}: manifest {manifest_path} has track_id {tid}, "
                                 f"{npz_path} has {int(ids[i])}")
        try:
            _check_values(host)
        except ValueError as err:
            raise ValueError(f"{npz_path}: {err}") from None
        hashes = _hash_rows(host)
        for i, (tid, expected) in enumerate(entries):
            if hashes[i] != expected:
                raise ValueError(f"row {i} (track_id {tid}) of {npz_path}: geometry hash {hashes[i]} "
                                 f"does not match the manifest's {expected}")
        pool = cls(**{name: jax.device_put(_readonly(np.ascontiguousarray(value))) for name, value in host.items()},
                   level_id=level_id, split=split, benchmark_version=benchmark_version)
        # Seed the cached property with the hashes just verified against these bytes.
        pool.__dict__["geometry_hashes"] = hashes
        return pool


def _read_npz(npz_path: Path) -> dict[str, np.ndarray]:
    """The six arrays of a pool's npz, by name.

    Raises:
        OSError: the file is missing or cannot be opened.
        ValueError: the file is not a readable npz (truncated, damaged:
            whatever the zip or npy reader refuses, including a seek that a
            damaged offset sends past the file), or holds other arrays than
            the six; the message names the file.
    """
    with open(npz_path, "rb") as f:
        try:
            with np.load(f, allow_pickle=False) as data:
                keys = set(data.files)
                host = {name: data[name] for name in _ARRAY_FIELDS} if keys == set(_ARRAY_FIELDS) else {}
        except Exception as err:  # BadZipFile, EOFError, a seek past either end, ...: the bytes are damaged
            raise ValueError(f"{npz_path} is not a readable .npz file (truncated or damaged): "
                             f"{type(err).__name__}: {err}") from None
    if keys != set(_ARRAY_FIELDS):
        raise ValueError(f"{npz_path} must hold exactly the arrays {list(_ARRAY_FIELDS)}, got {sorted(keys)}")
    return host


def _check_pool_shapes(shapes: dict[str, tuple[int, ...]]) -> int:
    """Check the six shapes agree on one ``P >= 1``; returns ``P``."""
    first = tuple(shapes["centerline"])
    if len(first) != 3 or first[1:] != (TRACK_CAPACITY, 2):
        raise ValueError(f"centerline must have shape [P, TRACK_CAPACITY, 2] = [P, {TRACK_CAPACITY}, 2], got {first}")
    pool_size = first[0]
    if pool_size < 1:
        raise ValueError("a TrackPool must hold at least one track (P >= 1), got P = 0")
    expected = {
        "left_boundary": ((pool_size, TRACK_CAPACITY, 2), "[P, TRACK_CAPACITY, 2]"),
        "right_boundary": ((pool_size, TRACK_CAPACITY, 2), "[P, TRACK_CAPACITY, 2]"),
        "track_mask": ((pool_size, TRACK_CAPACITY), "[P, TRACK_CAPACITY]"),
        "track_length": ((pool_size,), "[P]"),
        "track_id": ((pool_size,), "[P]"),
    }
    for name, (shape, how) in expected.items():
        _check_shape(name, shapes[name], shape, f"{how} with P = {pool_size} from centerline")
    return pool_size


def _parse_manifest(manifest: Any, where: Path) -> tuple[int, str, str, list[tuple[int, str]]]:
    """The (level_id, split, benchmark_version, [(track_id, hash)]) of a well-formed manifest."""

    def fail(message: str) -> ValueError:
        return ValueError(f"manifest {where}: {message}")

    def json_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not isinstance(manifest, dict):
        raise fail(f"must be a JSON object, got {type(manifest).__name__}")
    missing = [key for key in _MANIFEST_KEYS if key not in manifest]
    extra = sorted(set(manifest) - set(_MANIFEST_KEYS))
    if missing or extra:
        raise fail(f"must have exactly the keys {list(_MANIFEST_KEYS)}; missing {missing}, unexpected {extra}")
    if not json_int(manifest["format"]) or manifest["format"] != _MANIFEST_FORMAT:
        raise fail(f"format must be {_MANIFEST_FORMAT}, got {manifest['format']!r}")
    if not json_int(manifest["capacity"]) or manifest["capacity"] != TRACK_CAPACITY:
        raise fail(f"capacity must be TRACK_CAPACITY = {TRACK_CAPACITY}, got {manifest['capacity']!r}")
    try:
        if not json_int(manifest["level_id"]):
            raise TypeError(f"level_id must be an integer, got {manifest['level_id']!r}")
        level_id = _check_level_id(manifest["level_id"])
        split = _check_name("split", manifest["split"])
        benchmark_version = _check_name("benchmark_version", manifest["benchmark_version"])
    except (TypeError, ValueError) as err:
        raise fail(str(err)) from None
    tracks = manifest["tracks"]
    if not isinstance(tracks, list):
        raise fail(f"tracks must be a list, got {type(tracks).__name__}")
    entries: list[tuple[int, str]] = []
    for i, entry in enumerate(tracks):
        if not isinstance(entry, dict) or set(entry) != {"track_id", "geometry_hash"}:
            raise fail(f"tracks[{i}] must be an object with exactly the keys track_id and geometry_hash, got {entry!r}")
        tid, digest = entry["track_id"], entry["geometry_hash"]
        if not json_int(tid) or not 0 <= tid < _UINT32_LIMIT:
            raise fail(f"tracks[{i}].track_id must be an integer in [0, 2**32), got {tid!r}")
        if not isinstance(digest, str) or not _HASH_PATTERN.fullmatch(digest):
            raise fail(f"tracks[{i}].geometry_hash must be 64 lowercase hex digits, got {digest!r}")
        entries.append((tid, digest))
    return level_id, split, benchmark_version, entries

