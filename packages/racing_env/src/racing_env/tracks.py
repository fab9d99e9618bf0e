"""Tracks as data: one ``Track`` on the host, a ``TrackPool`` of them on a JAX device.

A Track is what the observation shows: a fixed-capacity centerline, its left
and right boundaries, a mask of the valid prefix and the lap length, all in
SI units (m). The valid prefix of ``N`` points (``MIN_TRACK_POINTS <= N <=
TRACK_CAPACITY``) is a closed loop: the last valid point joins the first, and
the first point is not repeated. "Left" is left of the driving direction
(the order of the points). Every float row past the prefix is exactly zero.

Identity. ``track_id`` is the uint32 seed of the course that produced the
Track (``LEVEL0_TRACK_ID`` = ``2**32 - 1`` for Level 0's built-in track); the
stable identity is ``(benchmark_version, level_id, track_id)``, and the
geometry hash (``racing_env.track_files``) binds an id to exact bytes.
``TrackPool.save`` and ``TrackPool.load`` write and read pool files (an
``.npz`` and its ``.json`` manifest, ``racing_env.track_files``).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from racing_env import checks, geometry, track_files
from racing_env.track_files import geometry_hash
from racing_env.types import (
    BENCHMARK_VERSION,
    LEVEL0_TRACK_ID,
    MIN_TRACK_POINTS,
    POOL_DTYPES,
    TRACK_CAPACITY,
    PoolArrays,
)

__all__ = [
    "Track",
    "TrackPool",
    "geometry_hash",
    "level0_track",
]

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
        for name in checks.FLOAT_FIELDS:
            arr = checks.host_array(name, getattr(self, name))
            checks.check_float_kind(name, arr.dtype)
            checks.check_shape(name, arr.shape, (TRACK_CAPACITY, 2), "[TRACK_CAPACITY, 2]")
            arrays[name] = checks.to_float32(arr)
        mask = checks.host_array("track_mask", self.track_mask)
        checks.check_int_kind("track_mask", mask.dtype)
        checks.check_shape("track_mask", mask.shape, (TRACK_CAPACITY,), "[TRACK_CAPACITY]")
        checks.check_host_mask_values("track_mask", mask)
        arrays["track_mask"] = mask.astype(np.int8, copy=True)
        length = checks.positive_length("track_length", self.track_length)
        track_id = checks.check_track_id("track_id", self.track_id)
        # The pool's row checks with P = 1 (the length was checked above).
        checks.check_values({name: arr[None] for name, arr in arrays.items()}
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
        return track_files.hash_row(self.centerline, self.left_boundary, self.right_boundary,
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
        points = checks.host_array("centerline", centerline)
        checks.check_float_kind("centerline", points.dtype)
        if points.ndim != 2 or points.shape[1] != 2:
            raise ValueError(f"centerline must have shape [N, 2], got {points.shape}")
        n = points.shape[0]
        if not MIN_TRACK_POINTS <= n <= TRACK_CAPACITY:
            raise ValueError(f"centerline must have N in [MIN_TRACK_POINTS, TRACK_CAPACITY] = "
                             f"[{MIN_TRACK_POINTS}, {TRACK_CAPACITY}] points, got {n}")
        stored = checks.to_float32(points)
        if not np.all(np.isfinite(stored)):
            raise ValueError("centerline must be finite (after conversion to float32)")
        p = stored.astype(np.float64)

        if isinstance(half_width, (bool, np.bool_)):
            raise TypeError("half_width must be a real number or array, got a bool")
        width = checks.host_array("half_width", half_width)
        if not (checks.is_floating(width.dtype) or jnp.issubdtype(width.dtype, jnp.integer)):
            raise TypeError(f"half_width must be real, got {str(width.dtype)}")
        if width.shape not in ((), (n,)):
            raise ValueError(f"half_width must be a scalar or have shape [N] = ({n},), got {width.shape}")
        width = np.broadcast_to(width.astype(np.float64), (n,))
        if not np.all(np.isfinite(width) & (width > 0)):
            raise ValueError("half_width must be finite and > 0 (m)")

        segment_length = checks.loop_segment_lengths("centerline points", p,
                                                     " (as float32); do not repeat the first point at the end")
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
        level_id = checks.check_level_id(self.level_id)
        checks.check_name("split", self.split)
        checks.check_name("benchmark_version", self.benchmark_version)
        values = [getattr(self, name) for name in PoolArrays._fields]
        for name, value in zip(PoolArrays._fields, values):
            if not isinstance(value, jax.Array):
                raise TypeError(f"{name} must be a jax.Array (TrackPool.from_arrays takes NumPy), "
                                f"got {type(value).__name__}")
            if value.dtype != POOL_DTYPES[name]:
                raise TypeError(f"{name} must have dtype {POOL_DTYPES[name]}, got {value.dtype}")
        checks.check_pool_shapes({name: value.shape for name, value in zip(PoolArrays._fields, values)})
        devices = [frozenset(value.devices()) for value in values]
        if len(set(devices)) != 1:
            found = zip(PoolArrays._fields, devices)
            raise ValueError("every TrackPool array must live on the same device(s), got "
                             + ", ".join(f"{name}: {sorted(map(str, d))}" for name, d in found))
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
        checks.check_items("tracks", tracks, Track)
        stacked = {name: np.stack([np.asarray(getattr(t, name)) for t in tracks]) for name in PoolArrays._fields}
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
        level_id = checks.check_level_id(level_id)
        checks.check_name("split", split)
        checks.check_name("benchmark_version", benchmark_version)
        if not isinstance(check_values, bool):
            raise TypeError(f"check_values must be a bool, got {type(check_values).__name__}")

        given = dict(zip(PoolArrays._fields, (centerline, left_boundary, right_boundary,
                                          track_mask, track_length, track_id)))
        inputs: dict[str, np.ndarray | jax.Array] = {}
        for name, value in given.items():
            inputs[name] = value if isinstance(value, jax.Array) else checks.host_array(name, value)
            dtype = inputs[name].dtype
            if name == "track_id":
                checks.check_id_kind(name, dtype)
            elif name == "track_mask":
                checks.check_int_kind(name, dtype)
            else:
                checks.check_float_kind(name, dtype)
        checks.check_pool_shapes({name: value.shape for name, value in inputs.items()})
        if not check_values:
            for name in ("track_mask", "track_id"):
                value = inputs[name]
                if isinstance(value, jax.Array) and value.dtype != POOL_DTYPES[name]:
                    raise TypeError(f"{name} must already have dtype {POOL_DTYPES[name]} when check_values=False "
                                    f"(a cast of unchecked values could wrap), got {value.dtype}")

        # Integer fields are range-checked on the host before any cast (a cast could wrap);
        # a JAX one is read back only when check_values asks for it.
        checked_host: dict[str, np.ndarray] = {}
        for name in ("track_mask", "track_id"):
            value = inputs[name]
            if check_values or not isinstance(value, jax.Array):
                host = np.asarray(value)
                if name == "track_mask":
                    checks.check_host_mask_values(name, host)
                else:
                    checks.check_host_id_values(name, host)
                checked_host[name] = host.astype(POOL_DTYPES[name])
        jax_inputs = [v for v in inputs.values() if isinstance(v, jax.Array)]
        device = _single_device(jax_inputs) if jax_inputs else None

        final: dict[str, jax.Array] = {}
        host_final: dict[str, np.ndarray] = {}
        for name, value in inputs.items():
            dtype = POOL_DTYPES[name]
            if isinstance(value, jax.Array):
                # Same object when the dtype is already right; else a cast on the array's device.
                final[name] = value if value.dtype == dtype else value.astype(dtype)
            else:
                with np.errstate(over="ignore"):  # an overflow to inf is a value error, found below
                    host_final[name] = _readonly(np.array(value, dtype=dtype, copy=True, order="C"))
        if check_values:
            host = {}
            for name in PoolArrays._fields:
                if name in host_final:
                    host[name] = host_final[name]
                elif name in checked_host:
                    host[name] = checked_host[name]
                else:
                    host[name] = np.asarray(final[name])  # the float32 values the pool holds
            checks.check_values(host)
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
        i = checks.integer_in(index, "index", 0, len(self))
        row = {name: np.asarray(getattr(self, name)[i]) for name in PoolArrays._fields}
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
        picked = [checks.integer_in(row, f"rows[{k}]", 0, len(self)) for k, row in enumerate(rows)]
        seen: dict[int, int] = {}
        for k, row in enumerate(picked):
            if row in seen:
                raise ValueError(f"rows[{k}] repeats row {row} (rows[{seen[row]}]): a pool's track ids are unique")
            seen[row] = k
        index = jnp.asarray(picked, jnp.int32)
        return TrackPool(**{name: jnp.take(getattr(self, name), index, axis=0) for name in PoolArrays._fields},
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
        checks.check_items("pools", pools, TrackPool)
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
        return cls(**{name: jnp.concatenate([getattr(p, name) for p in pools]) for name in PoolArrays._fields},
                   level_id=first.level_id, split=first.split, benchmark_version=first.benchmark_version)

    @functools.cached_property
    def geometry_hashes(self) -> tuple[str, ...]:
        """Each row's ``geometry_hash``, in row order.

        Computed on first access (which reads the whole pool back to the
        host) and cached; ``load`` fills it from the verified file.
        """
        return track_files.hash_rows(self._host_arrays())

    def _host_arrays(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(getattr(self, name)) for name in PoolArrays._fields}

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
        paths = track_files.destination(path)
        host = self._host_arrays()
        checks.check_values(host)
        track_files.write(paths, host, self.geometry_hashes, level_id=self.level_id, split=self.split,
                          benchmark_version=self.benchmark_version)

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
            ValueError: ``path`` does not end in ``.npz``, either file is not
                a regular file (a named pipe, which an open would wait on for
                good, a folder, a device), a malformed manifest
                or npz (not JSON, not a readable zip of the six arrays: a
                truncated or damaged file; each naming the file), a count,
                capacity or id mismatch, a bad value, or a hash mismatch
                (naming the row and its track_id).
        """
        found = track_files.read(path)
        pool = cls(**{name: jax.device_put(_readonly(np.ascontiguousarray(value)))
                      for name, value in found.arrays.items()},
                   level_id=found.level_id, split=found.split, benchmark_version=found.benchmark_version)
        # Seed the cached property with the hashes just verified against these bytes.
        pool.__dict__["geometry_hashes"] = found.hashes
        return pool
