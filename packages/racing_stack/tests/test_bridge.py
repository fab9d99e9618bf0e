"""The bridge from track_gen courses to racing_env TrackPools, on Warp's cpu
device and JAX's CPU, against an independent NumPy oracle computed from host
copies of the course line."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import warp as wp
from racing_env import BENCHMARK_VERSION, TRACK_CAPACITY, Level, ProjectConfig, Track, TrackPool, VecCarRacingEnv
from racing_env.race import min_segment_length
from track_gen.checks import FAIL_THICKNESS
from track_gen.course import Course
from track_gen.pipeline import presets
from track_gen.seeds import effective_seed

from racing_stack.bridge import (
    COURSE_SCALE,
    CourseArrays,
    admitted_envs,
    course_arrays,
    pool_arrays,
    pool_from_course,
    track_from_course,
)

wp.config.quiet = True

DEVICE = "cpu"
E = 8
SEED = 100
LEVEL = Level(level_id=3, name="bridge", max_episode_steps=50)
#: Envs made invalid by a width their curvature cannot hold (thickness).
TOO_WIDE = (2, 5)
#: An env rebuilt with a wider, still valid track; an env moved to epoch 1.
WIDER, ADVANCED = 1, 6


def mask(envs) -> wp.array:
    return wp.array(np.isin(np.arange(E), envs).astype(np.int32), dtype=wp.int32, device=DEVICE)


@pytest.fixture(scope="module")
def course() -> Course:
    """Eight tracks: two too wide to be valid, one wider but valid, one at epoch 1."""
    course = Course.track(presets.track(num_envs=E, device=DEVICE), seeds=SEED)
    widths = course.generator.params["width"].numpy()
    widths[list(TOO_WIDE)] = 3.0
    widths[WIDER] = 0.4
    course.generator.params["width"].assign(widths)
    course.regenerate(mask=mask([*TOO_WIDE, WIDER]), advance=False)
    course.regenerate(mask=mask([ADVANCED]), advance=True)
    return course


@pytest.fixture(scope="module")
def host(course) -> dict[str, np.ndarray]:
    """Host copies of the course line (``.numpy()`` is a view on cpu)."""
    r = course.result
    return dict(center=r.center.numpy().copy(), normal=r.normal.numpy().copy(), count=r.count.numpy().copy(),
                valid=r.valid.numpy().copy(), fail_mask=r.fail_mask.numpy().copy(), width=r.width.numpy().copy(),
                seed=course.rng.seeds_warp.numpy().copy(), generation=r.generation.numpy().copy())


@pytest.fixture(scope="module")
def pool(course) -> TrackPool:
    return pool_from_course(course, level_id=LEVEL.level_id, split="train")


@pytest.fixture(scope="module")
def rows(pool) -> dict[str, np.ndarray]:
    return {name: np.asarray(getattr(pool, name)) for name in
            ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id")}


def valid_envs(host) -> list[int]:
    return np.flatnonzero(host["valid"] != 0).tolist()


def scaled_line(host, e: int) -> np.ndarray:
    """Env e's closed course line, ``[n, 2]`` float64 car metres (the oracle's input)."""
    n = int(host["count"][e])
    return host["center"][e, :n, :2].astype(np.float64) * COURSE_SCALE


def arc_table(line: np.ndarray) -> np.ndarray:
    """``[n + 1]`` cumulative arc length of the closed polyline (the last entry is the lap)."""
    closed = np.vstack([line, line[:1]])
    return np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(closed, axis=0), axis=1))])


def distance_to_polyline(points: np.ndarray, line: np.ndarray) -> np.ndarray:
    """Distance of each point ``[M, 2]`` to the closed polyline ``[n, 2]``."""
    a, b = line, np.roll(line, -1, axis=0)
    ab = b - a
    t = np.clip(np.einsum("mnk,nk->mn", points[:, None] - a[None], ab) / np.sum(ab * ab, axis=1), 0.0, 1.0)
    nearest = a[None] + t[..., None] * ab[None]
    return np.min(np.linalg.norm(nearest - points[:, None], axis=-1), axis=1)


def cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]


# --------------------------------------------------------------------------- admission and identity


def test_the_fixture_has_invalid_and_valid_envs(host):
    assert all(host["valid"][e] == 0 and host["fail_mask"][e] & FAIL_THICKNESS for e in TOO_WIDE)
    assert host["valid"][[WIDER, ADVANCED]].all() and len(valid_envs(host)) >= 4
    assert host["generation"][ADVANCED] == 1 and host["width"][WIDER] == np.float32(0.4)


def test_only_valid_envs_become_rows_in_env_order_with_their_effective_seeds(course, host, pool, rows):
    envs = valid_envs(host)
    assert admitted_envs(course_arrays(course)).tolist() == envs
    assert len(pool) == len(envs)
    expected = [effective_seed(int(host["seed"][e]), int(host["generation"][e])) for e in envs]
    assert rows["track_id"].dtype == np.uint32 and rows["track_id"].tolist() == expected
    # At epoch 0 the id is the seed itself (SEED + e); the advanced env's is the hash.
    row = envs.index(ADVANCED)
    assert rows["track_id"][envs.index(0)] == SEED and rows["track_id"][row] != SEED + ADVANCED


def test_a_track_id_rebuilds_its_course_as_env_0_of_a_fresh_course(host, rows):
    row = valid_envs(host).index(ADVANCED)
    fresh = Course.track(presets.track(num_envs=1, device=DEVICE), seeds=int(rows["track_id"][row])).result
    n = int(host["count"][ADVANCED])
    assert int(fresh.count.numpy()[0]) == n
    np.testing.assert_array_equal(fresh.center.numpy()[0, :n], host["center"][ADVANCED, :n])


def test_metadata_mask_and_dtypes(pool, rows):
    assert (pool.level_id, pool.split, pool.benchmark_version) == (LEVEL.level_id, "train", BENCHMARK_VERSION)
    assert rows["track_mask"].dtype == np.int8 and (rows["track_mask"] == 1).all()
    assert rows["centerline"].shape == (len(pool), TRACK_CAPACITY, 2)
    for name in ("centerline", "left_boundary", "right_boundary", "track_length"):
        assert rows[name].dtype == np.float32


# --------------------------------------------------------------------------- geometry against the oracle


def test_points_lie_on_the_scaled_course_line_at_equal_arc_steps(host, rows):
    for row, e in enumerate(valid_envs(host)):
        line = scaled_line(host, e)
        arc = arc_table(line)
        closed = np.vstack([line, line[:1]])
        at = arc[-1] * np.arange(TRACK_CAPACITY) / TRACK_CAPACITY
        expected = np.stack([np.interp(at, arc, closed[:, 0]), np.interp(at, arc, closed[:, 1])], axis=1)
        got = rows["centerline"][row].astype(np.float64)
        np.testing.assert_allclose(got, expected, atol=1e-3, err_msg=f"env {e}")
        assert distance_to_polyline(got, line).max() < 1e-3
        chords = np.linalg.norm(np.roll(got, -1, axis=0) - got, axis=1)
        assert chords.std() / chords.mean() < 2e-3, f"env {e}"
        np.testing.assert_allclose(chords, arc[-1] / TRACK_CAPACITY, rtol=0.02)


def test_track_length_is_the_closed_perimeter(host, rows):
    for row, e in enumerate(valid_envs(host)):
        lap = arc_table(scaled_line(host, e))[-1]
        assert abs(rows["track_length"][row] - lap) <= 1e-3 * lap, f"env {e}"
        c = rows["centerline"][row].astype(np.float64)
        perimeter = np.linalg.norm(np.roll(c, -1, axis=0) - c, axis=1).sum()
        np.testing.assert_allclose(rows["track_length"][row], perimeter, rtol=1e-5)


def test_boundaries_lie_half_a_width_to_each_side(host, rows):
    for row, e in enumerate(valid_envs(host)):
        half = 0.5 * float(host["width"][e]) * COURSE_SCALE
        c = rows["centerline"][row].astype(np.float64)
        to_left = rows["left_boundary"][row] - c
        to_right = rows["right_boundary"][row] - c
        tangent = np.roll(c, -1, axis=0) - np.roll(c, 1, axis=0)
        np.testing.assert_allclose(np.linalg.norm(to_left, axis=1), half, rtol=1e-5)
        np.testing.assert_allclose(to_right, -to_left, atol=1e-4)
        unit = tangent / np.linalg.norm(tangent, axis=1, keepdims=True)
        assert np.abs(np.sum(to_left * unit, axis=1)).max() < 1e-4 * half  # perpendicular
        assert (cross(tangent, to_left) > 0).all() and (cross(tangent, to_right) < 0).all(), f"env {e}"
        # racing_env's left is track_gen's left: the nearest course-line point's normal.
        line = scaled_line(host, e)
        nearest = np.argmin(np.linalg.norm(c[:, None] - line[None], axis=-1), axis=1)
        assert (np.sum(to_left * host["normal"][e, nearest, :2], axis=1) > 0).all()
    assert 0.5 * float(host["width"][WIDER]) * COURSE_SCALE == pytest.approx(8.0)  # 0.4 m -> 16 m wide


def test_rows_pass_every_racing_env_check_and_the_race_core_bound(pool, rows):
    checked = TrackPool.from_arrays(**rows, level_id=pool.level_id, split=pool.split)  # values read and checked
    assert len(checked) == len(pool)
    for i in range(len(pool)):
        assert pool.track(i).num_points == TRACK_CAPACITY  # a validated host Track
    c = rows["centerline"].astype(np.float64)
    shortest = np.linalg.norm(np.roll(c, -1, axis=1) - c, axis=-1).min()
    assert shortest > min_segment_length(ProjectConfig())


def test_default_scale_gives_laps_of_hundreds_of_metres_and_12_m_wide_roads():
    course = Course.track(presets.track(num_envs=64, device=DEVICE), seeds=0)
    pool = pool_from_course(course, level_id=1, split="train")
    laps = np.asarray(pool.track_length)
    assert 300.0 < laps.min() and laps.max() < 1500.0
    width = np.linalg.norm(np.asarray(pool.left_boundary) - np.asarray(pool.right_boundary), axis=-1)
    np.testing.assert_allclose(width, 12.0, rtol=1e-5)


def test_scale_multiplies_every_length(course, rows):
    half = pool_from_course(course, level_id=LEVEL.level_id, split="train", scale=COURSE_SCALE / 2)
    np.testing.assert_allclose(np.asarray(half.centerline), rows["centerline"] / 2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(half.left_boundary), rows["left_boundary"] / 2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(half.track_length), rows["track_length"] / 2, rtol=1e-5)


def test_track_from_course_is_the_pools_row_to_float32_rounding(course, host, pool):
    for row, e in enumerate(valid_envs(host)[:3]):
        track, expected = track_from_course(course, e), pool.track(row)
        assert isinstance(track, Track) and track.track_id == expected.track_id
        np.testing.assert_array_equal(track.track_mask, expected.track_mask)
        for name in ("centerline", "left_boundary", "right_boundary", "track_length"):
            np.testing.assert_allclose(getattr(track, name), getattr(expected, name), rtol=1e-6, atol=1e-4)


# --------------------------------------------------------------------------- device and memory


def test_pool_arrays_live_on_the_course_device(pool):
    cpu = jax.devices("cpu")[0]
    for name in ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id"):
        assert getattr(pool, name).devices() == {cpu}, name


def test_the_geometry_makes_no_host_to_device_transfer(course, rows):
    # On CPU the guard catches host-to-device transfers only (device-to-host
    # is the GPU test's): the geometry runs under "disallow_explicit", the
    # whole bridge under "disallow" (its one read is an explicit device_get).
    num_rows = len(rows["track_id"])
    with jax.transfer_guard("disallow_explicit"):
        arrays = course_arrays(course)
        built = pool_arrays(arrays, num_rows)
        pool = TrackPool.from_arrays(*built, level_id=LEVEL.level_id, split="train", check_values=False)
    with jax.transfer_guard("disallow"):
        again = pool_from_course(course, level_id=LEVEL.level_id, split="train")
    for name, value in rows.items():
        np.testing.assert_array_equal(np.asarray(getattr(pool, name)), value)
        np.testing.assert_array_equal(np.asarray(getattr(again, name)), value)


def test_the_pool_shares_no_memory_with_the_course(host):
    course = Course.track(presets.track(num_envs=4, device=DEVICE), seeds=7)
    pool = pool_from_course(course, level_id=1, split="train")
    before = {name: np.asarray(getattr(pool, name)).copy() for name in ("centerline", "track_length", "track_id")}
    course.regenerate(advance=True)  # rewrites every course buffer in place
    for name, value in before.items():
        np.testing.assert_array_equal(np.asarray(getattr(pool, name)), value)


def test_a_seed_written_after_the_build_changes_no_track_id():
    course = Course.track(presets.track(num_envs=3, device=DEVICE), seeds=SEED)
    course.regenerate(advance=True)
    ids = np.asarray(pool_from_course(course, level_id=1, split="train").track_id).copy()
    course.rng.seeds_warp.assign(np.array([1, 2, 3], np.uint32))  # not yet the courses'
    again = pool_from_course(course, level_id=1, split="train")
    np.testing.assert_array_equal(np.asarray(again.track_id), ids)
    assert ids.tolist() == [effective_seed(SEED + e, 1) for e in range(3) if course.result.valid.numpy()[e]]


# --------------------------------------------------------------------------- racing_env drives it


def test_the_pool_drives_in_racing_env(pool, rows):
    env = VecCarRacingEnv(1, config=ProjectConfig(), level=LEVEL, backend="cpu_reference", track_pool=pool)
    obs, info = env.reset(seed=0)
    assert int(np.asarray(info["track_id"])[0]) in rows["track_id"].tolist()
    for _ in range(5):
        obs, reward, terminated, truncated, info = env.step(np.zeros((1, 2), np.float32))
    assert np.isfinite(np.asarray(reward)).all() and not np.asarray(terminated).any()
    assert np.isfinite(np.asarray(obs["centerline"])).all()


# --------------------------------------------------------------------------- refusals


def test_no_valid_course_is_refused():
    course = Course.track(presets.track(num_envs=2, device=DEVICE, width=3.0), seeds=0)
    assert (course.result.valid.numpy() == 0).all()
    with pytest.raises(ValueError, match="no course is valid"):
        pool_from_course(course, level_id=1, split="train")
    with pytest.raises(ValueError, match="env 0 has no valid course"):
        track_from_course(course, 0)


def test_repeated_track_ids_are_refused():
    course = Course.track(presets.track(num_envs=3, device=DEVICE), seeds=np.array([SEED, SEED, SEED + 1]))
    assert (course.result.valid.numpy()[:2] == 1).all()
    with pytest.raises(ValueError, match=rf"valid envs \[0, 1\] share track_id {SEED}"):
        pool_from_course(course, level_id=1, split="train")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"course": "course"}, TypeError, "course must be"),
    ({"scale": 0.0}, ValueError, "scale"),
    ({"scale": -1.0}, ValueError, "scale"),
    ({"scale": float("nan")}, ValueError, "scale"),
    ({"scale": float("inf")}, ValueError, "scale"),
    ({"scale": "40"}, TypeError, "scale"),
    ({"scale": True}, TypeError, "scale"),
    ({"level_id": -1}, ValueError, "level_id"),
    ({"level_id": 1.5}, TypeError, "level_id"),
    ({"level_id": True}, TypeError, "level_id"),
    ({"split": 3}, TypeError, "split"),
    ({"split": "no spaces"}, ValueError, "split"),
    ({"benchmark_version": None}, TypeError, "benchmark_version"),
])
def test_bad_arguments_of_pool_from_course(course, kwargs, error, match):
    args = {"course": course, "level_id": 1, "split": "train"} | kwargs
    with pytest.raises(error, match=match):
        pool_from_course(args.pop("course"), **args)


def test_bad_arguments_of_the_parts(course):
    arrays = course_arrays(course)
    assert isinstance(arrays, CourseArrays) and arrays.num_envs == E
    with pytest.raises(TypeError, match="arrays"):
        admitted_envs(course)
    with pytest.raises(TypeError, match="arrays"):
        pool_arrays(course, 1)
    for bad in (0, E + 1):
        with pytest.raises(ValueError, match="num_rows"):
            pool_arrays(arrays, bad)
    with pytest.raises(TypeError, match="num_rows"):
        pool_arrays(arrays, 2.0)
    with pytest.raises(ValueError, match="scale"):
        pool_arrays(arrays, 1, scale=0)
    with pytest.raises(ValueError, match="env"):
        track_from_course(course, E)
    with pytest.raises(TypeError, match="env"):
        track_from_course(course, "0")
    with pytest.raises(ValueError, match=f"env {TOO_WIDE[0]} has no valid course"):
        track_from_course(course, TOO_WIDE[0])
