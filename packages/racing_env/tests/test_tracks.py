"""Tests for racing_env.tracks: Track, level0_track, geometry_hash and TrackPool.

Every geometric expectation is recomputed here with NumPy (float64) or hashlib,
never with the library's own routines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from racing_env.tracks import Track, TrackPool, geometry_hash, level0_track
from racing_env.types import BENCHMARK_VERSION, LEVEL0_TRACK_ID, MIN_TRACK_POINTS, TRACK_CAPACITY

# Level 0's identity: its geometry hash is part of the published benchmark. A
# deliberate change of the built-in track must change this pin (and the CHANGELOG).
LEVEL0_GEOMETRY_HASH = "7447ed3e9389b7b5d4625ce43175d8f37a915e18c5554308b7eaf88a51c6740c"


# --------------------------------------------------------------------------- oracles


def oracle_hash(centerline, left, right, mask, length) -> str:
    """sha256 over the documented byte order, built by hand."""
    digest = hashlib.sha256()
    for values in (centerline, left, right):
        values = np.asarray(values)
        assert values.shape == (TRACK_CAPACITY, 2)
        digest.update(values.astype("<f4").tobytes(order="C"))
    digest.update(np.asarray(mask).astype(np.int8).tobytes())
    digest.update(np.asarray(length).astype("<f4").tobytes())
    return digest.hexdigest()


def oracle_perimeter(points: np.ndarray) -> float:
    p = np.asarray(points, np.float64)
    return float(np.sum(np.linalg.norm(np.roll(p, -1, axis=0) - p, axis=1)))


def oracle_signed_area(points: np.ndarray) -> float:
    x, y = np.asarray(points, np.float64).T
    return 0.5 * float(np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y))


def oracle_circumradius(points: np.ndarray) -> np.ndarray:
    """Radius of the circle through each point and its two neighbours (closed loop), m."""
    b = np.asarray(points, np.float64)
    a, c = np.roll(b, 1, axis=0), np.roll(b, -1, axis=0)
    ab, bc, ca = (np.linalg.norm(u - v, axis=1) for u, v in ((a, b), (b, c), (c, a)))
    twice_area = np.abs((b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0]))
    with np.errstate(divide="ignore"):
        return ab * bc * ca / (2.0 * twice_area)


def ellipse(n: int, a: float = 120.0, b: float = 80.0, phase: float = 0.0) -> np.ndarray:
    t = phase + 2 * np.pi * np.arange(n) / n
    return np.stack([a * np.cos(t), b * np.sin(t)], axis=1)


def make_track(track_id: int, n: int = 200, half_width: float = 6.0, phase: float = 0.0) -> Track:
    return Track.from_centerline(ellipse(n, phase=phase), half_width, track_id)


def track_arrays(track: Track) -> dict:
    return {name: np.array(getattr(track, name)) for name in
            ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")}


@pytest.fixture(scope="module")
def three_tracks() -> list[Track]:
    return [make_track(11, n=200), make_track(22, n=TRACK_CAPACITY, phase=0.3), make_track(33, n=MIN_TRACK_POINTS)]


@pytest.fixture(scope="module")
def pool(three_tracks) -> TrackPool:
    return TrackPool.from_tracks(three_tracks, level_id=1, split="train")


def pool_numpy(tracks: list[Track]) -> dict:
    return {name: np.stack([track_arrays(t)[name] for t in tracks]) for name in track_arrays(tracks[0])}


# --------------------------------------------------------------------------- constants


def test_constants():
    assert TRACK_CAPACITY == 640
    assert LEVEL0_TRACK_ID == 2**32 - 1 == np.iinfo(np.uint32).max
    assert BENCHMARK_VERSION == "0.1"
    assert MIN_TRACK_POINTS == 8


# --------------------------------------------------------------------------- Track.from_centerline


@pytest.mark.parametrize("n", [MIN_TRACK_POINTS, 97, TRACK_CAPACITY])
@pytest.mark.parametrize("width_kind", ["scalar", "array"])
def test_from_centerline_geometry(n, width_kind):
    points = ellipse(n)
    widths = 6.0 if width_kind == "scalar" else 4.0 + 3.0 * np.sin(np.arange(n)) ** 2
    track = Track.from_centerline(points, widths, 7)
    widths = np.broadcast_to(widths, (n,))

    assert track.num_points == n
    assert track.track_id == 7 and track.track_id.dtype == np.uint32
    assert track.track_length.dtype == np.float32 and track.track_length.shape == ()
    for name in ("centerline", "left_boundary", "right_boundary"):
        arr = getattr(track, name)
        assert arr.dtype == np.float32 and arr.shape == (TRACK_CAPACITY, 2)
        assert np.all(arr[n:] == 0)
    assert track.track_mask.dtype == np.int8 and track.track_mask.shape == (TRACK_CAPACITY,)
    np.testing.assert_array_equal(track.track_mask, (np.arange(TRACK_CAPACITY) < n).astype(np.int8))

    c = track.centerline[:n].astype(np.float64)
    np.testing.assert_array_equal(track.centerline[:n], points.astype(np.float32))
    tangent = np.roll(c, -1, axis=0) - np.roll(c, 1, axis=0)
    for name, side in (("left_boundary", +1), ("right_boundary", -1)):
        offset = getattr(track, name)[:n].astype(np.float64) - c
        np.testing.assert_allclose(np.linalg.norm(offset, axis=1), widths, rtol=0, atol=2e-5)
        cross = tangent[:, 0] * offset[:, 1] - tangent[:, 1] * offset[:, 0]
        assert np.all(np.sign(cross) == side), name
        # Perpendicular to the central-difference tangent (float32 rounding allowed).
        cos = np.sum(tangent * offset, axis=1) / (np.linalg.norm(tangent, axis=1) * np.linalg.norm(offset, axis=1))
        np.testing.assert_allclose(cos, 0, atol=1e-5)

    perimeter = oracle_perimeter(c)
    assert track.track_length == np.float32(perimeter)


def test_from_centerline_accepts_float_dtypes_and_lists():
    points = ellipse(50)
    reference = Track.from_centerline(points.astype(np.float32), 5.0, 1)
    for value in (points, points.tolist(), jnp.asarray(points, jnp.float32)):
        track = Track.from_centerline(value, 5.0, 1)
        assert track.geometry_hash == reference.geometry_hash
    assert Track.from_centerline(points.astype(np.float16), 5, np.uint32(1)).num_points == 50


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"centerline": ellipse(MIN_TRACK_POINTS - 1)}, ValueError, "centerline.*N in"),
        ({"centerline": ellipse(TRACK_CAPACITY + 1)}, ValueError, "centerline.*N in"),
        ({"centerline": ellipse(20)[:, :1]}, ValueError, r"centerline.*\[N, 2\]"),
        ({"centerline": np.zeros((20, 2), np.int64)}, TypeError, "centerline.*floating"),
        ({"centerline": np.vstack([ellipse(20), ellipse(20)[:1]])}, ValueError, "centerline.*repeat the first"),
        ({"centerline": np.where(np.arange(20)[:, None] == 3, np.nan, ellipse(20))}, ValueError, "centerline.*finite"),
        ({"half_width": 0.0}, ValueError, "half_width"),
        ({"half_width": -1.0}, ValueError, "half_width"),
        ({"half_width": np.inf}, ValueError, "half_width"),
        ({"half_width": np.ones(19)}, ValueError, "half_width.*shape"),
        ({"half_width": True}, TypeError, "half_width"),
        ({"half_width": "6"}, TypeError, "half_width"),
        ({"track_id": -1}, ValueError, "track_id"),
        ({"track_id": 2**32}, ValueError, "track_id"),
        ({"track_id": 3.0}, TypeError, "track_id"),
    ],
)
def test_from_centerline_rejects(kwargs, error, match):
    args = {"centerline": ellipse(20), "half_width": 6.0, "track_id": 5} | kwargs
    with pytest.raises(error, match=match):
        Track.from_centerline(**args)


def test_from_centerline_rejects_a_loop_that_doubles_back():
    points = ellipse(20)
    points[5] = points[3]  # p_{i-1} == p_{i+1} at i = 4
    with pytest.raises(ValueError, match="doubles back at point 4"):
        Track.from_centerline(points, 6.0, 1)


# --------------------------------------------------------------------------- Track validation


def test_track_accepts_valid_arrays_and_copies():
    fields = track_arrays(make_track(9))
    fields["centerline"] = fields["centerline"].astype(np.float64)  # any real float
    fields["track_mask"] = fields["track_mask"].astype(np.int64)  # any integer, 0/1
    fields["track_length"] = float(fields["track_length"])
    fields["track_id"] = 9
    track = Track(**fields)
    assert track.centerline.dtype == np.float32 and track.track_mask.dtype == np.int8
    assert isinstance(track.track_length, np.float32) and isinstance(track.track_id, np.uint32)
    before = track.geometry_hash
    fields["centerline"][0, 0] += 1.0  # the caller's array is not the Track's
    fields["left_boundary"][0, 0] += 1.0
    fields["track_mask"][-1] = 1
    assert oracle_hash(track.centerline, track.left_boundary, track.right_boundary,
                       track.track_mask, track.track_length) == before


def _bad_track_fields(change):
    fields = track_arrays(make_track(9, n=100))
    change(fields)
    return fields


def _set(name, value):
    return lambda f: f.__setitem__(name, value)


def _poke(name, index, value, dtype=None):
    def change(f):
        f[name] = f[name].astype(dtype or f[name].dtype)  # a copy
        f[name][index] = value
    return change


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (_set("centerline", np.zeros((TRACK_CAPACITY - 1, 2), np.float32)), ValueError, "centerline.*shape"),
        (_set("left_boundary", np.zeros((TRACK_CAPACITY, 3), np.float32)), ValueError, "left_boundary.*shape"),
        (_set("right_boundary", np.zeros((TRACK_CAPACITY, 2), np.int32)), TypeError, "right_boundary.*floating"),
        (_set("centerline", np.zeros((TRACK_CAPACITY, 2), np.complex64)), TypeError, "centerline.*floating"),
        (_set("centerline", [[0.0, 1.0], [2.0]]), ValueError, "centerline"),
        (_poke("centerline", (3, 1), np.nan), ValueError, "centerline.*finite"),
        (_poke("left_boundary", (3, 1), np.inf), ValueError, "left_boundary.*finite"),
        (_poke("right_boundary", (300, 0), 1.0), ValueError, "right_boundary.*zero beyond"),
        (_poke("centerline", (0, 0), 1e39, np.float64), ValueError, "centerline.*finite"),  # overflows float32
        (_set("track_mask", np.zeros(TRACK_CAPACITY, np.float32)), TypeError, "track_mask.*integer"),
        (_set("track_mask", np.zeros(TRACK_CAPACITY + 1, np.int8)), ValueError, "track_mask.*shape"),
        (_poke("track_mask", 50, 0), ValueError, "track_mask.*prefix"),  # a hole in the prefix
        (_poke("track_mask", 500, 1), ValueError, "track_mask.*prefix"),  # a one after the prefix
        (_poke("track_mask", 0, 2), ValueError, "track_mask.*0 and 1"),
        (_poke("track_mask", 0, 257, np.int32), ValueError, "track_mask.*0 and 1"),  # would wrap to 1 as int8
        (_set("track_mask", (np.arange(TRACK_CAPACITY) < MIN_TRACK_POINTS - 1).astype(np.int8)),
         ValueError, "track_mask.*MIN_TRACK_POINTS"),
        (_set("track_mask", np.zeros(TRACK_CAPACITY, np.int8)), ValueError, "track_mask"),
        (_set("track_length", 0.0), ValueError, "track_length"),
        (_set("track_length", -3.0), ValueError, "track_length"),
        (_set("track_length", np.nan), ValueError, "track_length"),
        (_set("track_length", 1e39), ValueError, "track_length"),
        (_set("track_length", np.ones(1, np.float32)), ValueError, "track_length.*scalar"),
        (_set("track_length", "700"), TypeError, "track_length"),
        (_set("track_length", True), TypeError, "track_length"),
        (_set("track_id", -1), ValueError, "track_id"),
        (_set("track_id", 2**32), ValueError, "track_id"),
        (_set("track_id", 1.0), TypeError, "track_id"),
        (_set("track_id", True), TypeError, "track_id"),
    ],
)
def test_track_rejects(change, error, match):
    with pytest.raises(error, match=match):
        Track(**_bad_track_fields(change))


def test_track_is_immutable():
    track = make_track(4)
    for name in ("centerline", "left_boundary", "right_boundary", "track_mask"):
        arr = getattr(track, name)
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0] = 1
    for name in ("centerline", "track_length", "track_id"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(track, name, getattr(track, name))
    with pytest.raises(dataclasses.FrozenInstanceError):
        track.geometry_hash = "0" * 64


# --------------------------------------------------------------------------- geometry_hash


def test_geometry_hash_matches_hashlib_oracle():
    track = make_track(12, n=123)
    expected = oracle_hash(track.centerline, track.left_boundary, track.right_boundary,
                           track.track_mask, track.track_length)
    assert track.geometry_hash == expected
    assert geometry_hash(track.centerline, track.left_boundary, track.right_boundary,
                         track.track_mask, track.track_length) == expected
    # The documented byte layout: 3 * 640 * 2 * 4 + 640 + 4 bytes.
    raw = b"".join([track.centerline.astype("<f4").tobytes(), track.left_boundary.astype("<f4").tobytes(),
                    track.right_boundary.astype("<f4").tobytes(), track.track_mask.tobytes(),
                    np.float32(track.track_length).astype("<f4").tobytes()])
    assert len(raw) == 16004 and hashlib.sha256(raw).hexdigest() == expected


def test_geometry_hash_sees_every_byte():
    track = make_track(12, n=123)
    fields = track_arrays(track)
    del fields["track_id"]
    base = geometry_hash(**fields)
    assert geometry_hash(**(fields | {"track_length": np.nextafter(fields["track_length"], np.float32(1e9))})) != base
    for name in ("centerline", "left_boundary", "right_boundary"):
        changed = fields[name].copy()
        changed[600, 1] = np.float32(1e-30)  # even in the padding
        assert geometry_hash(**(fields | {name: changed})) != base
    mask = fields["track_mask"].copy()
    mask[123] = 1
    assert geometry_hash(**(fields | {"track_mask": mask})) != base
    # Same values in another float dtype: same bytes after the float32 conversion.
    assert geometry_hash(**(fields | {"centerline": fields["centerline"].astype(np.float64)})) == base


def test_geometry_hash_rejects_bad_input():
    fields = track_arrays(make_track(1))
    del fields["track_id"]
    with pytest.raises(ValueError, match="left_boundary.*shape"):
        geometry_hash(**(fields | {"left_boundary": fields["left_boundary"][:10]}))
    with pytest.raises(TypeError, match="track_mask.*integer"):
        geometry_hash(**(fields | {"track_mask": fields["track_mask"].astype(np.float32)}))


# --------------------------------------------------------------------------- level0_track


def test_level0_track():
    track = level0_track()
    n = track.num_points
    assert n == TRACK_CAPACITY
    assert track.track_id == LEVEL0_TRACK_ID and track.track_id.dtype == np.uint32
    c = track.centerline.astype(np.float64)

    lap = oracle_perimeter(c)
    assert 600.0 <= lap <= 900.0
    assert track.track_length == np.float32(lap)
    assert oracle_signed_area(c) > 0  # counter-clockwise

    half_width = np.linalg.norm(track.left_boundary - track.centerline, axis=1)
    np.testing.assert_allclose(half_width, 6.0, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(track.right_boundary - track.centerline, axis=1), 6.0, atol=2e-5)

    radius = oracle_circumradius(c)
    assert radius.min() > 2 * 6.0
    assert radius.min() > 30.0  # "well above" the half-width: a car-sized corner, not a hairpin

    # Resampled to equal arc length.
    spacing = np.linalg.norm(np.roll(c, -1, axis=0) - c, axis=1)
    np.testing.assert_allclose(spacing, lap / n, rtol=1e-3)

    # Starts on a straight-ish section: the first ~40 m ahead bend far less than the lap's tightest corner.
    ahead = radius[: int(40.0 / (lap / n))]
    assert ahead.min() > 4 * radius.min()

    # The boundaries never cross the centerline's other side: no self-intersection of the left/right
    # offsets, checked coarsely as every boundary point being >= half-width from every centerline point.
    for boundary in (track.left_boundary, track.right_boundary):
        distance = np.linalg.norm(boundary.astype(np.float64)[:, None, :] - c[None, :, :], axis=2)
        assert distance.min() > 6.0 - 1e-3


def test_level0_track_is_deterministic():
    first, second = level0_track(), level0_track()
    assert first is not second
    assert first.geometry_hash == second.geometry_hash == LEVEL0_GEOMETRY_HASH
    for name in ("centerline", "left_boundary", "right_boundary", "track_mask"):
        assert getattr(first, name).tobytes() == getattr(second, name).tobytes()


# --------------------------------------------------------------------------- TrackPool construction


def test_from_tracks(pool, three_tracks):
    assert len(pool) == 3
    assert (pool.level_id, pool.split, pool.benchmark_version) == (1, "train", BENCHMARK_VERSION)
    expected_shapes = {
        "centerline": ((3, TRACK_CAPACITY, 2), jnp.float32),
        "left_boundary": ((3, TRACK_CAPACITY, 2), jnp.float32),
        "right_boundary": ((3, TRACK_CAPACITY, 2), jnp.float32),
        "track_mask": ((3, TRACK_CAPACITY), jnp.int8),
        "track_length": ((3,), jnp.float32),
        "track_id": ((3,), jnp.uint32),
    }
    for name, (shape, dtype) in expected_shapes.items():
        value = getattr(pool, name)
        assert isinstance(value, jax.Array) and value.shape == shape and value.dtype == dtype, name
        assert value.devices() == {jax.devices()[0]}
    np.testing.assert_array_equal(np.asarray(pool.track_id), [11, 22, 33])
    for i, track in enumerate(three_tracks):
        row = pool.track(i)
        for name, value in track_arrays(track).items():
            assert np.asarray(getattr(row, name)).tobytes() == value.tobytes(), (i, name)
    assert pool.geometry_hashes == tuple(t.geometry_hash for t in three_tracks)
    hashes = []
    for i in range(3):
        arrays = [np.asarray(getattr(pool, name))[i] for name in
                  ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length")]
        hashes.append(oracle_hash(*arrays))
    assert pool.geometry_hashes == tuple(hashes)
    assert pool.geometry_hashes is pool.geometry_hashes  # cached


def test_from_arrays_numpy_round_trip(pool, three_tracks):
    arrays = pool_numpy(three_tracks)
    again = TrackPool.from_arrays(**arrays, level_id=1, split="train")
    assert again.geometry_hashes == pool.geometry_hashes
    # Other real float / integer dtypes are converted.
    widened = arrays | {"centerline": arrays["centerline"].astype(np.float64),
                        "track_mask": arrays["track_mask"].astype(np.int32),
                        "track_id": arrays["track_id"].astype(np.int64)}
    converted = TrackPool.from_arrays(**widened, level_id=1, split="train")
    assert converted.centerline.dtype == jnp.float32 and converted.track_id.dtype == jnp.uint32
    assert converted.geometry_hashes == pool.geometry_hashes
    # The pool holds a copy: changing the caller's arrays afterwards changes nothing.
    arrays["centerline"][0, 0, 0] += 10.0
    assert again.geometry_hashes == pool.geometry_hashes
    np.testing.assert_array_equal(np.asarray(again.centerline), np.asarray(pool.centerline))


@pytest.mark.parametrize("check_values", [True, False])
def test_from_arrays_keeps_jax_arrays(pool, check_values):
    given = {name: jnp.array(getattr(pool, name)) for name in
             ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")}
    pointers = {name: value.unsafe_buffer_pointer() for name, value in given.items()}
    kept = TrackPool.from_arrays(**given, level_id=1, split="train", check_values=check_values)
    for name, value in given.items():
        assert getattr(kept, name) is value, name
        assert getattr(kept, name).unsafe_buffer_pointer() == pointers[name]
    assert kept.geometry_hashes == pool.geometry_hashes


def test_from_arrays_mixed_jax_and_numpy(pool, three_tracks):
    arrays = pool_numpy(three_tracks)
    centerline = jnp.asarray(arrays["centerline"])
    mixed = TrackPool.from_arrays(**(arrays | {"centerline": centerline}), level_id=1, split="train")
    assert mixed.centerline is centerline
    assert mixed.geometry_hashes == pool.geometry_hashes


def test_from_arrays_unchecked_is_trusted_but_save_refuses(pool, tmp_path):
    given = {name: getattr(pool, name) for name in
             ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")}
    bad = given | {"centerline": given["centerline"].at[1, 5, 0].set(jnp.nan)}
    with pytest.raises(ValueError, match=r"centerline row 1 \(track_id 22\).*finite"):
        TrackPool.from_arrays(**bad, level_id=1, split="train")
    unchecked = TrackPool.from_arrays(**bad, level_id=1, split="train", check_values=False)
    with pytest.raises(ValueError, match="centerline row 1"):
        unchecked.save(tmp_path / "bad.npz")
    assert not list(tmp_path.iterdir())
    # Without value checks, JAX integer fields must already be exact (a cast could wrap).
    with pytest.raises(TypeError, match="track_mask.*check_values=False"):
        TrackPool.from_arrays(**(given | {"track_mask": given["track_mask"].astype(jnp.int32)}),
                              level_id=1, split="train", check_values=False)
    with pytest.raises(TypeError, match="track_id.*check_values=False"):
        TrackPool.from_arrays(**(given | {"track_id": given["track_id"].astype(jnp.int32)}),
                              level_id=1, split="train", check_values=False)
    # With value checks a JAX cast is fine (checked on the host first) and stays on device.
    cast = TrackPool.from_arrays(**(given | {"track_mask": given["track_mask"].astype(jnp.int32)}),
                                 level_id=1, split="train")
    assert cast.track_mask.dtype == jnp.int8 and cast.geometry_hashes == pool.geometry_hashes


def _arrays_change(name, fn):
    def change(arrays):
        arrays[name] = fn(arrays[name].copy())
        return arrays
    return change


def _poke_array(name, index, value):
    def fn(a):
        a[index] = value
        return a
    return _arrays_change(name, fn)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (_arrays_change("centerline", lambda a: a[:, :-1]), ValueError, "centerline.*shape"),
        (_arrays_change("left_boundary", lambda a: a[:2]), ValueError, "left_boundary.*shape.*P = 3"),
        (_arrays_change("right_boundary", lambda a: a[..., :1]), ValueError, "right_boundary.*shape"),
        (_arrays_change("track_mask", lambda a: a[:, :10]), ValueError, "track_mask.*shape"),
        (_arrays_change("track_length", lambda a: a[:, None]), ValueError, "track_length.*shape"),
        (_arrays_change("track_id", lambda a: a[:2]), ValueError, "track_id.*shape"),
        (_arrays_change("centerline", lambda a: a.astype(np.int32)), TypeError, "centerline.*floating"),
        (_arrays_change("track_length", lambda a: a.astype(np.int32)), TypeError, "track_length.*floating"),
        (_arrays_change("track_mask", lambda a: a.astype(np.float32)), TypeError, "track_mask.*integer"),
        (_arrays_change("track_id", lambda a: a.astype(np.float64)), TypeError, "track_id.*integer"),
        (_arrays_change("track_id", lambda a: a.astype(bool)), TypeError, "track_id.*integer"),
        (_poke_array("left_boundary", (2, 3, 1), np.nan), ValueError, r"left_boundary row 2 \(track_id 33\)"),
        (_poke_array("right_boundary", (0, 600, 1), 0.5), ValueError, r"right_boundary row 0.*zero beyond"),
        (_poke_array("track_mask", (1, 30), 0), ValueError, r"track_mask row 1 \(track_id 22\).*prefix"),
        (_poke_array("track_mask", (0, 639), 1), ValueError, "track_mask row 0.*prefix"),
        (_poke_array("track_mask", (0, 0), 3), ValueError, "track_mask.*0 and 1"),
        (_poke_array("track_length", 1, 0.0), ValueError, "track_length row 1"),
        (_poke_array("track_length", 2, np.inf), ValueError, "track_length row 2"),
        (_arrays_change("track_id", lambda a: a.astype(np.int64) - 12), ValueError, r"track_id.*\[0, 2\*\*32\).*-1"),
        (_arrays_change("track_id", lambda a: a.astype(np.int64) + 2**32), ValueError, r"track_id.*\[0, 2\*\*32\)"),
        (_poke_array("track_id", 2, 11), ValueError, r"track_id 11 appears in rows \[0, 2\]"),
        (_arrays_change("centerline", lambda a: a[:0]), ValueError, "at least one track"),
    ],
)
def test_from_arrays_rejects(three_tracks, change, error, match):
    arrays = change(pool_numpy(three_tracks))
    if match == "at least one track":
        arrays = {name: value[:0] for name, value in arrays.items()}
    with pytest.raises(error, match=match):
        TrackPool.from_arrays(**arrays, level_id=1, split="train")


def test_from_arrays_rejects_jax_with_bad_shape_or_dtype(pool):
    given = {name: getattr(pool, name) for name in
             ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")}
    with pytest.raises(ValueError, match="track_mask.*shape"):
        TrackPool.from_arrays(**(given | {"track_mask": given["track_mask"][:, :5]}), level_id=1, split="train")
    with pytest.raises(TypeError, match="right_boundary.*floating"):
        TrackPool.from_arrays(**(given | {"right_boundary": given["right_boundary"].astype(jnp.int32)}),
                              level_id=1, split="train")


@pytest.mark.parametrize(
    ("metadata", "error", "match"),
    [
        ({"split": ""}, ValueError, "split"),
        ({"split": "train set"}, ValueError, "split"),
        ({"split": "x" * 33}, ValueError, "split"),
        ({"split": None}, TypeError, "split"),
        ({"split": b"train"}, TypeError, "split"),
        ({"benchmark_version": ""}, ValueError, "benchmark_version"),
        ({"benchmark_version": "0.1/../x"}, ValueError, "benchmark_version"),
        ({"benchmark_version": "v" * 33}, ValueError, "benchmark_version"),
        ({"benchmark_version": 0.1}, TypeError, "benchmark_version"),
        ({"level_id": -1}, ValueError, "level_id"),
        ({"level_id": 1.0}, TypeError, "level_id"),
        ({"level_id": True}, TypeError, "level_id"),
        ({"check_values": 1}, TypeError, "check_values"),
    ],
)
def test_from_arrays_rejects_metadata(three_tracks, metadata, error, match):
    kwargs = {"level_id": 1, "split": "train"} | metadata
    with pytest.raises(error, match=match):
        TrackPool.from_arrays(**pool_numpy(three_tracks), **kwargs)


def test_from_tracks_rejects(three_tracks):
    with pytest.raises(ValueError, match="at least one"):
        TrackPool.from_tracks([], level_id=0, split="fixed")
    with pytest.raises(TypeError, match=r"tracks\[1\]"):
        TrackPool.from_tracks([three_tracks[0], "track"], level_id=0, split="fixed")
    with pytest.raises(TypeError, match="tracks"):
        TrackPool.from_tracks(three_tracks[0], level_id=0, split="fixed")
    with pytest.raises(ValueError, match="track_id 11 appears"):
        TrackPool.from_tracks([three_tracks[0], three_tracks[0]], level_id=0, split="fixed")


def test_direct_construction_checks_metadata(pool, three_tracks):
    arrays = pool_numpy(three_tracks)
    with pytest.raises(TypeError, match="centerline must be a jax.Array"):
        TrackPool(**arrays, level_id=1, split="train", benchmark_version="0.1")
    given = {name: getattr(pool, name) for name in arrays}
    with pytest.raises(TypeError, match="track_id must have dtype uint32"):
        TrackPool(**(given | {"track_id": given["track_id"].astype(jnp.int32)}),
                  level_id=1, split="train", benchmark_version="0.1")
    with pytest.raises(ValueError, match="split"):
        TrackPool(**given, level_id=1, split="", benchmark_version="0.1")


def test_pool_track_index(pool):
    assert pool.track(np.int64(2)).track_id == 33
    for index in (-1, 3):
        with pytest.raises(ValueError, match=r"index must be in \[0, 2\]"):
            pool.track(index)
    for index in (1.0, True, "0"):
        with pytest.raises(TypeError, match="index"):
            pool.track(index)


@pytest.mark.parametrize("rows", [[2, 0], np.array([1], np.int64), jnp.asarray([0, 2, 1]), (2,)])
def test_take_keeps_those_rows_in_that_order(pool, three_tracks, rows):
    picked = [int(r) for r in np.asarray(rows)]
    taken = pool.take(rows)
    assert len(taken) == len(picked)
    assert (taken.level_id, taken.split, taken.benchmark_version) == (pool.level_id, pool.split,
                                                                      pool.benchmark_version)
    for k, row in enumerate(picked):  # against the Tracks the pool was built from
        for name, want in track_arrays(three_tracks[row]).items():
            np.testing.assert_array_equal(np.asarray(getattr(taken, name)[k]), want, err_msg=f"{name}, row {k}")
    assert taken.geometry_hashes == tuple(pool.geometry_hashes[r] for r in picked)


@pytest.mark.parametrize("rows, error, match", [
    ([], ValueError, "rows must hold at least one row"),
    ([3], ValueError, r"rows\[0\] must be in \[0, 2\], got 3"),
    ([0, -1], ValueError, r"rows\[1\] must be in \[0, 2\], got -1"),
    ([1, 2, 1], ValueError, r"rows\[2\] repeats row 1 \(rows\[0\]\)"),
    ([0.0], TypeError, r"rows\[0\] must be an int"),
    ([True], TypeError, r"rows\[0\] must be an int"),
    (np.zeros((1, 1), np.int32), TypeError, "rows must be a 1-D array of integers"),
    (np.array([0.5]), TypeError, "rows must be a 1-D array of integers"),
    ("01", TypeError, "rows must be a sequence of integers"),
    (5, TypeError, "rows must be a sequence of integers"),
])
def test_take_refuses_bad_rows_by_name(pool, rows, error, match):
    with pytest.raises(error, match=match):
        pool.take(rows)


def test_concatenate_joins_pools_in_order(pool, three_tracks):
    other = TrackPool.from_tracks([make_track(44, n=300), make_track(55, n=120, phase=1.0)], level_id=1,
                                  split="train")
    joined = TrackPool.concatenate([pool.take([2]), other, pool.take([0, 1])])
    assert np.asarray(joined.track_id).tolist() == [33, 44, 55, 11, 22]
    assert joined.geometry_hashes == (pool.geometry_hashes[2], *other.geometry_hashes, *pool.geometry_hashes[:2])
    assert TrackPool.concatenate([pool]).geometry_hashes == pool.geometry_hashes


def test_concatenate_refuses_by_name(pool):
    with pytest.raises(ValueError, match="track_id 11 is in pools\\[0\\] and pools\\[1\\]"):
        TrackPool.concatenate([pool, pool.take([0])])
    test = TrackPool.from_tracks([make_track(44)], level_id=1, split="test")
    with pytest.raises(ValueError, match="pools\\[1\\].split is 'test', pools\\[0\\]'s 'train'"):
        TrackPool.concatenate([pool, test])
    other_level = TrackPool.from_tracks([make_track(44)], level_id=2, split="train")
    with pytest.raises(ValueError, match="pools\\[1\\].level_id is 2"):
        TrackPool.concatenate([pool, other_level])
    with pytest.raises(ValueError, match="at least one TrackPool"):
        TrackPool.concatenate([])
    with pytest.raises(TypeError, match="pools\\[1\\] must be a TrackPool"):
        TrackPool.concatenate([pool, "pool"])
    with pytest.raises(TypeError, match="pools must be a sequence of TrackPool"):
        TrackPool.concatenate(pool)


def test_pool_is_immutable(pool):
    before = pool.geometry_hashes
    for name in ("centerline", "track_id", "level_id", "split", "benchmark_version", "geometry_hashes"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(pool, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        del pool.split
    view = np.asarray(pool.centerline)
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0, 0] = 1.0
    with pytest.raises(TypeError):
        pool.centerline[0, 0, 0] = 1.0  # JAX arrays do not support item assignment
    assert pool.geometry_hashes == before


# --------------------------------------------------------------------------- files


def test_save_load_round_trip(pool, tmp_path):
    path = tmp_path / "train.npz"
    fields = ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")
    objects = {name: getattr(pool, name) for name in fields}
    bytes_before = {name: np.asarray(value).tobytes() for name, value in objects.items()}
    pool.save(path)
    # Saving mutates nothing.
    for name in fields:
        assert getattr(pool, name) is objects[name]
        assert np.asarray(getattr(pool, name)).tobytes() == bytes_before[name]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.json", "train.npz"]  # no temporaries left

    manifest = json.loads((tmp_path / "train.json").read_text())
    assert manifest == {
        "format": 1, "benchmark_version": "0.1", "level_id": 1, "split": "train", "capacity": 640,
        "tracks": [{"track_id": tid, "geometry_hash": h} for tid, h in zip([11, 22, 33], pool.geometry_hashes)],
    }
    with np.load(path, allow_pickle=False) as data:
        assert sorted(data.files) == sorted(fields)
        for name in fields:
            assert data[name].dtype == np.asarray(objects[name]).dtype
            assert data[name].tobytes() == bytes_before[name]

    loaded = TrackPool.load(str(path))
    assert (len(loaded), loaded.level_id, loaded.split, loaded.benchmark_version) == (3, 1, "train", "0.1")
    for name in fields:
        value = getattr(loaded, name)
        assert isinstance(value, jax.Array) and value.devices() == {jax.devices()[0]}
        assert np.asarray(value).dtype == np.asarray(objects[name]).dtype
        assert np.asarray(value).tobytes() == bytes_before[name], name
    assert loaded.geometry_hashes == pool.geometry_hashes
    recomputed = tuple(oracle_hash(*(np.asarray(getattr(loaded, n))[i] for n in fields[:5])) for i in range(3))
    assert loaded.geometry_hashes == recomputed


def test_save_never_overwrites_and_checks_path(pool, tmp_path):
    path = tmp_path / "pool.npz"
    pool.save(path)
    manifest = (tmp_path / "pool.json").read_bytes()
    with pytest.raises(FileExistsError):
        pool.save(path)
    assert (tmp_path / "pool.json").read_bytes() == manifest
    with pytest.raises(ValueError, match="path must name the .npz"):
        pool.save(tmp_path / "pool.bin")
    with pytest.raises(ValueError, match="path must name the .npz"):
        TrackPool.load(tmp_path / "pool")
    with pytest.raises(TypeError, match="path"):
        pool.save(3)


def test_level0_fixed_pool_round_trip(tmp_path):
    fixed = TrackPool.from_tracks([level0_track()], level_id=0, split="fixed")
    fixed.save(tmp_path / "level0.npz")
    loaded = TrackPool.load(tmp_path / "level0.npz")
    assert loaded.geometry_hashes == (LEVEL0_GEOMETRY_HASH,)
    assert int(loaded.track_id[0]) == LEVEL0_TRACK_ID


@pytest.fixture
def saved(pool, tmp_path):
    path = tmp_path / "pool.npz"
    pool.save(path)
    return path, tmp_path / "pool.json"


def _rewrite_npz(path, change):
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name].copy() for name in data.files}
    change(arrays)
    path.unlink()
    np.savez(path, **arrays)


def test_load_rejects_a_tampered_float(saved):
    path, _ = saved

    def change(arrays):
        arrays["left_boundary"][1, 17, 0] = np.nextafter(arrays["left_boundary"][1, 17, 0], np.float32(np.inf))

    _rewrite_npz(path, change)
    with pytest.raises(ValueError, match=r"row 1 \(track_id 22\).*geometry hash"):
        TrackPool.load(path)


def test_load_rejects_a_tampered_length(saved):
    path, _ = saved
    _rewrite_npz(path, lambda a: a["track_length"].__setitem__(2, a["track_length"][2] + 1))
    with pytest.raises(ValueError, match=r"row 2 \(track_id 33\).*geometry hash"):
        TrackPool.load(path)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: a.__setitem__("track_id", a["track_id"] + np.uint32(1)), "row 0: manifest .* track_id 11"),
        (lambda a: a.__setitem__("centerline", a["centerline"].astype(np.float64)), "centerline must have dtype"),
        (lambda a: a.pop("track_length"), "exactly the arrays"),
        (lambda a: a.__setitem__("extra", np.zeros(3)), "exactly the arrays"),
        (lambda a: [a.__setitem__(k, v[:2]) for k, v in list(a.items())], "lists 3 tracks.*holds 2"),
        (lambda a: a["track_mask"].__setitem__((0, 100), 0), "track_mask row 0.*prefix"),
    ],
)
def test_load_rejects_a_bad_npz(saved, change, match):
    path, _ = saved
    _rewrite_npz(path, change)
    with pytest.raises(ValueError, match=match):
        TrackPool.load(path)


def _edit_manifest(manifest_path, change):
    manifest = json.loads(manifest_path.read_text())
    change(manifest)
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m["tracks"][1].__setitem__("track_id", 23), "row 1: manifest .* track_id 23"),
        (lambda m: m["tracks"].pop(), "lists 2 tracks.*holds 3"),
        (lambda m: m["tracks"].append(m["tracks"][0]), "lists 4 tracks.*holds 3"),
        (lambda m: m.__setitem__("capacity", 512), "capacity must be TRACK_CAPACITY = 640"),
        (lambda m: m.__setitem__("capacity", "640"), "capacity"),
        (lambda m: m.__setitem__("format", 2), "format must be 1"),
        (lambda m: m.__setitem__("format", True), "format must be 1"),
        (lambda m: m.pop("split"), r"missing \['split'\]"),
        (lambda m: m.__setitem__("note", "x"), r"unexpected \['note'\]"),
        (lambda m: m.__setitem__("split", ""), "split"),
        (lambda m: m.__setitem__("benchmark_version", 1), "benchmark_version"),
        (lambda m: m.__setitem__("level_id", "1"), "level_id"),
        (lambda m: m.__setitem__("level_id", -2), "level_id"),
        (lambda m: m.__setitem__("tracks", {}), "tracks must be a list"),
        (lambda m: m["tracks"][0].__setitem__("track_id", 2**32), r"tracks\[0\].track_id"),
        (lambda m: m["tracks"][0].__setitem__("track_id", 11.0), r"tracks\[0\].track_id"),
        (lambda m: m["tracks"][2].__setitem__("geometry_hash", "ab"), r"tracks\[2\].geometry_hash"),
        (lambda m: m["tracks"][2].__setitem__("geometry_hash", m["tracks"][2]["geometry_hash"].upper()),
         r"tracks\[2\].geometry_hash"),
        (lambda m: m["tracks"][0].pop("geometry_hash"), r"tracks\[0\] must be an object"),
        (lambda m: m["tracks"][0].__setitem__("geometry_hash", m["tracks"][1]["geometry_hash"]),
         r"row 0 \(track_id 11\).*geometry hash"),
    ],
)
def test_load_rejects_a_bad_manifest(saved, change, match):
    path, manifest_path = saved
    _edit_manifest(manifest_path, change)
    with pytest.raises(ValueError, match=match):
        TrackPool.load(path)


def test_load_rejects_unreadable_files(saved):
    path, manifest_path = saved
    manifest_path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        TrackPool.load(path)
    manifest_path.write_text("[]")
    with pytest.raises(ValueError, match="JSON object"):
        TrackPool.load(path)
    manifest_path.write_bytes(b'{"format": 1, "split": "\xff"}')
    with pytest.raises(ValueError, match="not valid JSON"):
        TrackPool.load(path)
    manifest_path.unlink()
    with pytest.raises(FileNotFoundError):
        TrackPool.load(path)


def _damaged_copies(good: bytes):
    """The file cut short at several lengths, then with single bits flipped
    across it (headers, array bytes and the zip directory)."""
    for length in (0, 1, 30, len(good) // 2, len(good) - 100, len(good) - 1):
        yield f"cut to {length} bytes", good[:length]
    for position in range(0, len(good), max(1, len(good) // 97)):
        flipped = bytearray(good)
        flipped[position] ^= 0x10
        yield f"bit 4 of byte {position} flipped", bytes(flipped)


def test_load_names_a_truncated_or_damaged_npz(pool, saved):
    path, _ = saved
    good = path.read_bytes()
    for what, damaged in _damaged_copies(good):
        path.write_bytes(damaged)
        try:
            loaded = TrackPool.load(path)
        except ValueError as error:  # anything else (BadZipFile, EOFError, ...) fails the test
            assert str(error).startswith(f"{path} ") or re.match(r"row \d+ \(track_id", str(error)), (what, error)
        else:  # a flip in zip metadata the reader ignores (a date): the verified arrays are unchanged
            assert loaded.geometry_hashes == pool.geometry_hashes, what
    path.write_bytes(good)
    assert len(TrackPool.load(path)) == 3
