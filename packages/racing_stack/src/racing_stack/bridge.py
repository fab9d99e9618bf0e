"""The bridge from track_gen courses to racing_env TrackPools, on the course's device.

A track_gen track course (``Course.track``) becomes a racing_env
``TrackPool`` without its geometry leaving the device::

    from track_gen.course import Course
    from track_gen.pipeline import presets
    from racing_stack.bridge import pool_from_course

    course = Course.track(presets.track(num_envs=1024, device="cuda:0"), seeds=42)
    pool = pool_from_course(course, level_id=1, split="train")   # P = the valid envs

What happens, in order:

1. ``course_arrays(course)`` (``track_gen.interop.jax``, re-exported here)
   imports the course line and its metadata, track ids included, from Warp
   to JAX over DLPack (``jax.dlpack.from_dlpack(..., copy=False)``): the JAX
   arrays are the Warp buffers, on the same device, zero-copy.
2. ``admitted_envs(arrays)`` reads which envs are admitted: one
   device-to-host read of ``E`` int8 values (an explicit ``jax.device_get``),
   the only one. Its count sizes the pool (JAX shapes are static).
3. ``pool_arrays(arrays, num_rows)`` builds the rows on the device, in pure
   JAX, vectorised over the rows: no transfer in either direction.
4. ``TrackPool.from_arrays(..., check_values=False)`` wraps them; the values
   were validated upstream (track_gen's checks) and built on device, and
   reading them back to check them is what the bridge exists to avoid.

Admission. Only valid envs (``result.valid[e] == 1``: every track_gen check
passed) become rows, in env order. ``ValueError`` if none is valid, or if two
valid envs share a ``track_id`` (a pool's ids must be unique).

Identity. A row's ``track_id`` is its env's ``result.track_id``, which
track_gen writes with each regeneration: the effective uint32 seed the
course was built with, ``track_gen.seeds.effective_seed(seed_e, epoch_e)``
(the seed itself at epoch 0, else the hash of (seed, epoch) that rebuilds
the course as env 0 of a fresh ``Course.track(spec, seeds=track_id)``). A
seed written into ``course.rng.seeds_warp`` changes no id until a
regeneration selects the env.

Scale. track_gen works at small-robot scale; racing_env drives a full-size
car. One factor, ``scale`` (default ``COURSE_SCALE`` = 40), multiplies every
length, the course line and its width alike. Measured on 1,024 envs of
``presets.track(num_envs=1024, device="cpu")`` (seeds 0..1023, 1,021 valid):
laps 8.10 to 11.02 m (5th / 50th / 95th percentile 8.83 / 9.68 / 10.45 m),
width 0.30 m. At 40: laps 324 to 441 m (median 387 m), width 12 m (Level 0's
built-in track is 12 m wide, lap 742 m).

Geometry of a row (float32, car metres):

- ``centerline``: the closed course line (xy; the height profile is dropped,
  racing_env is flat) times ``scale``, resampled by arc length to exactly
  ``TRACK_CAPACITY`` = 640 points, point ``k`` at arc ``k * L / 640`` from
  track_gen's point 0 (so the start and the driving direction are the
  course's); every point lies on the scaled course line.
- ``left_boundary`` / ``right_boundary``: ``centerline ± h * n`` with ``h``
  half the env's width (``result.width[e] / 2 * scale``) and ``n`` the unit
  left normal: the central difference ``p[k+1] - p[k-1]`` (indices modulo
  640) rotated by +90 degrees, the formula of ``Track.from_centerline``.
  track_gen's loops run counter-clockwise and its ``normal`` is the tangent
  rotated by +90 degrees too, so racing_env's left (of the driving
  direction) is track_gen's left, the loop's inside.
- ``track_mask``: 640 ones (int8). ``track_length``: the resampled closed
  perimeter ``sum |p[k+1] - p[k]|``.

The Race Core's bound. racing_env refuses a pool whose shortest centerline
segment is below ``racing_env.race.min_segment_length(config)`` (0.340 m for
``ProjectConfig()``). A row's segments are chords of arc ``L / 640`` (a chord
across a bend of the course line is up to ~2% shorter), so a lap of at least
~220 m passes; the default preset at ``COURSE_SCALE`` gives 0.51 to 0.69 m.
A smaller preset or scale can fall below it; the env then raises at
construction.

Reproducibility. A row is a function of its env's course line, width and
track id, and of ``scale``, up to float32 rounding: XLA may round the last
bit differently for another number of rows or another device (~1e-5 m at car
scale), so the same ``track_id`` can hash differently in two pools. A saved
pool file, whose manifest binds ids to hashes, is the identity to rely on.

Lifetime. ``CourseArrays`` are views of the course's live Warp buffers (see
``track_gen.interop.jax``): do not keep them across a regeneration. A
``TrackPool`` shares no memory with the course, and ``pool_from_course``
returns only once the device has finished reading the course, so the course
may be regenerated at once.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from racing_env import checks, geometry
from racing_env.tracks import Track, TrackPool
from racing_env.types import BENCHMARK_VERSION, TRACK_CAPACITY, PoolArrays
from track_gen.course import Course
from track_gen.generator import TrackGenerator
from track_gen.interop.jax import CourseArrays, course_arrays

__all__ = [
    "COURSE_SCALE",
    "CourseArrays",
    "PoolArrays",
    "admitted_envs",
    "course_arrays",
    "pool_arrays",
    "pool_from_course",
    "track_from_course",
]

COURSE_SCALE: float = 40.0
"""track_gen metres -> car metres: a default course's lap of ~10 m becomes ~390 m, its 0.3 m width 12 m."""

# Admission codes of ``_admission``.
_INVALID, _ADMITTED, _REPEATED_ID = 0, 1, 2


# --------------------------------------------------------------------------- the course, in JAX


# --------------------------------------------------------------------------- admission: the one read


@jax.jit
def _admission(valid: jax.Array, ids: jax.Array) -> jax.Array:
    """``[E]`` int8 per env: 0 invalid, 1 admitted, 2 valid but with the
    ``track_id`` of an earlier valid env."""
    ok = valid != 0
    env = jnp.arange(valid.shape[0])
    # Valid envs first, by id, then by env: a repeat follows its first occurrence.
    order = jnp.lexsort((env, ids, ~ok))
    ok_sorted, ids_sorted = ok[order], ids[order]
    repeat = ok_sorted[1:] & ok_sorted[:-1] & (ids_sorted[1:] == ids_sorted[:-1])
    repeated = jnp.zeros(valid.shape, bool).at[order[1:]].set(repeat)
    return jnp.where(repeated, _REPEATED_ID, ok.astype(jnp.int8)).astype(jnp.int8)


def admitted_envs(arrays: CourseArrays) -> np.ndarray:
    """The envs that become pool rows: the valid ones, in env order.

    This is the bridge's only device-to-host read: ``E`` int8 admission
    codes, by an explicit ``jax.device_get`` (so ``jax.transfer_guard("disallow")``
    lets it through and ``"disallow_explicit"`` catches it). The geometry
    never leaves the device.

    Args:
        arrays: from ``course_arrays``.

    Returns:
        ``[P]`` int64 env indices, increasing, ``P >= 1``.

    Raises:
        TypeError: ``arrays`` is not a ``CourseArrays``.
        ValueError: no env is valid, or two valid envs share a ``track_id``.
    """
    _check_arrays(arrays)
    codes = np.asarray(jax.device_get(_admission(arrays.valid, arrays.track_id)))
    repeated = np.flatnonzero(codes == _REPEATED_ID)
    if repeated.size:
        ids = np.asarray(jax.device_get(arrays.track_id))  # the error path only
        first = int(repeated[0])
        twins = np.flatnonzero((ids == ids[first]) & (codes != _INVALID)).tolist()
        raise ValueError(f"valid envs {twins} share track_id {int(ids[first])} (their effective seed); "
                         "a TrackPool's ids must be unique: give them distinct seeds")
    envs = np.flatnonzero(codes == _ADMITTED)
    if envs.size == 0:
        raise ValueError(f"no course is valid: all {codes.size} envs have valid == 0 "
                         "(regenerate them, or see track_gen's fail_mask)")
    return envs


# --------------------------------------------------------------------------- geometry, on device


def pool_arrays(arrays: CourseArrays, num_rows: int, *, scale: float = COURSE_SCALE) -> PoolArrays:
    """The rows of the valid envs, built on the device with no transfer at all.

    The rows are the first ``num_rows`` envs with ``valid != 0``, picked on
    the device (``jnp.nonzero(..., size=num_rows)``), so ``num_rows`` must be
    ``len(admitted_envs(arrays))``, read from the same course state (no
    regeneration between): this is what lets the geometry run under
    ``jax.transfer_guard("disallow_explicit")``. One compilation per
    ``(num_rows, scale)`` and shapes.

    Args:
        arrays: from ``course_arrays``.
        num_rows: ``P``, an int in ``[1, E]``.
        scale: track_gen metres -> car metres, finite and > 0.

    Returns:
        ``PoolArrays`` on the course's device (see the module for the geometry).

    Raises:
        TypeError: a wrong type.
        ValueError: ``num_rows`` outside ``[1, E]`` or ``scale`` not finite and > 0.
    """
    _check_arrays(arrays)
    num_rows = checks.integer_in(num_rows, "num_rows", 1, arrays.num_envs + 1)
    scale = checks.positive(scale, "scale")
    return _pool_geometry(arrays.center, arrays.count, arrays.width, arrays.track_id,
                          arrays.valid, num_rows=num_rows, scale=scale)


@functools.partial(jax.jit, static_argnames=("num_rows", "scale"))
def _pool_geometry(center, count, width, track_id, valid, *, num_rows: int, scale: float) -> PoolArrays:
    rows = jnp.nonzero(valid != 0, size=num_rows)[0]
    return _rows_geometry(center, count, width, track_id, rows, scale)


@functools.partial(jax.jit, static_argnames=("env", "scale"))
def _env_geometry(center, count, width, track_id, *, env: int, scale: float) -> PoolArrays:
    rows = jnp.full((1,), env, jnp.int32)
    return _rows_geometry(center, count, width, track_id, rows, scale)


def _rows_geometry(center: jax.Array, count: jax.Array, width: jax.Array, track_id: jax.Array,
                   rows: jax.Array, scale: float) -> PoolArrays:
    """The rows ``rows`` ``[P]`` of a pool (the envs' course lines resampled
    to ``TRACK_CAPACITY`` points by arc length, boundaries, mask, length, id)."""
    capacity = TRACK_CAPACITY
    n = count[rows]  # [P]
    used = jnp.arange(center.shape[1])[None, :] < n[:, None]  # [P, N]
    # Past ``count`` the course line is NaN: zeros there keep NaN out of every sum.
    points = jnp.where(used[..., None], center[rows, :, :2] * np.float32(scale), 0.0)  # [P, N, 2], m
    # Segment i joins point i to point (i + 1) mod n: the last used point closes the loop.
    after, seg = geometry.loop_segments(jnp, points, n)  # [P, N, 2] and [P, N], m
    seg_end = jnp.cumsum(seg, axis=1)  # arc at the end of segment i
    lap = seg_end[:, -1]  # [P], m
    target = lap[:, None] * (jnp.arange(capacity, dtype=jnp.float32) / capacity)[None, :]  # [P, C], in [0, L)
    # The segment holding each target: the first one that ends beyond it.
    j = jax.vmap(functools.partial(jnp.searchsorted, side="right"))(seg_end, target)
    j = jnp.clip(j, 0, (n - 1)[:, None])
    seg_j = jnp.take_along_axis(seg, j, axis=1)
    begin = jnp.take_along_axis(seg_end, j, axis=1) - seg_j
    frac = jnp.clip((target - begin) / jnp.maximum(seg_j, jnp.finfo(jnp.float32).tiny), 0.0, 1.0)
    a = jnp.take_along_axis(points, j[..., None], axis=1)
    b = jnp.take_along_axis(after, j[..., None], axis=1)
    centerline = a + frac[..., None] * (b - a)  # [P, C, 2], m

    spacing = geometry.loop_segments(jnp, centerline, jnp.full(rows.shape[0], capacity))[1]  # [P, C], m
    left_normal = geometry.left_normals(jnp, geometry.loop_tangents(jnp, centerline))
    offset = (np.float32(0.5 * scale) * width[rows])[:, None, None] * left_normal
    return PoolArrays(
        centerline=centerline,
        left_boundary=centerline + offset,
        right_boundary=centerline - offset,
        track_mask=jnp.ones((rows.shape[0], capacity), jnp.int8),
        track_length=jnp.sum(spacing, axis=1),
        track_id=track_id[rows],
    )


# --------------------------------------------------------------------------- the public joins


def pool_from_course(course: Course | TrackGenerator, *, level_id: int, split: str,
                     scale: float = COURSE_SCALE, benchmark_version: str = BENCHMARK_VERSION) -> TrackPool:
    """A ``TrackPool`` of a track course's valid envs, built on the course's device.

    ``course_arrays``, then ``admitted_envs`` (the one device-to-host read,
    of ``E`` int8), then ``pool_arrays``, then
    ``TrackPool.from_arrays(..., check_values=False)``. Returns once the pool
    is computed, so the course may be regenerated right after.

    Args:
        course: a ``Course.track(...)`` (or its ``TrackGenerator``).
        level_id: the Level the pool is for, an int >= 0.
        split: e.g. ``"train"``, ``"validation"``, ``"test"`` (1-32 of ``[0-9A-Za-z._-]``).
        scale: track_gen metres -> car metres, finite and > 0 (default ``COURSE_SCALE``).
        benchmark_version: the pool's benchmark version (1-32 of ``[0-9A-Za-z._-]``).

    Returns:
        The ``TrackPool``: one row per valid env, in env order, ``track_id`` the
        env's effective seed; its arrays on the course's device.

    Raises:
        TypeError: a wrong type (naming the argument).
        ValueError: a bad value (naming the argument), no valid env, or two
            valid envs with the same ``track_id``.
    """
    checks.integer_in(level_id, "level_id", 0)
    for name, value in (("split", split), ("benchmark_version", benchmark_version)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    scale = checks.positive(scale, "scale")
    arrays = course_arrays(course)
    num_rows = len(admitted_envs(arrays))
    built = pool_arrays(arrays, num_rows, scale=scale)
    pool = TrackPool.from_arrays(*built, level_id=level_id, split=split, benchmark_version=benchmark_version,
                                 check_values=False)
    # The course's views must not be read after the caller regenerates it.
    jax.block_until_ready(built)
    return pool


def track_from_course(course: Course | TrackGenerator, env: int, *, scale: float = COURSE_SCALE) -> Track:
    """One valid env's course as a host ``Track``: the row ``pool_from_course``
    builds for it, to float32 rounding (see "Reproducibility").

    The geometry is built on the device; the Track is a host object, so its
    row is then read back (and validated by ``Track``).

    Args:
        course: a ``Course.track(...)`` (or its ``TrackGenerator``).
        env: the env, an int in ``[0, E)``.
        scale: track_gen metres -> car metres, finite and > 0.

    Raises:
        TypeError: a wrong type.
        ValueError: ``env`` out of range, the env is invalid, or a bad ``scale``.
    """
    scale = checks.positive(scale, "scale")
    arrays = course_arrays(course)
    env = checks.integer_in(env, "env", 0, arrays.num_envs)
    if int(jax.device_get(arrays.valid)[env]) == 0:
        raise ValueError(f"env {env} has no valid course (valid == 0): only valid courses become Tracks")
    row = _env_geometry(arrays.center, arrays.count, arrays.width, arrays.track_id,
                        env=env, scale=scale)
    return Track(**{name: np.asarray(value[0]) for name, value in jax.device_get(row)._asdict().items()})


# --------------------------------------------------------------------------- checks


def _check_arrays(arrays: Any) -> None:
    if not isinstance(arrays, CourseArrays):
        raise TypeError(f"arrays must be a CourseArrays (from course_arrays), got {type(arrays).__name__}")
