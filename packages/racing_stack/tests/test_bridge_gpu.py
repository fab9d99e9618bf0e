"""The bridge on a CUDA device: no host copy.

On the GPU ``jax.transfer_guard`` catches device-to-host transfers too (on
CPU it catches host-to-device only), so these tests prove that the geometry
never leaves the device and that the bridge's one read is the documented
``E``-int8 admission read. Skipped, never passed, without a CUDA device that
both Warp and JAX can use.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import warp as wp
from racing_env import TRACK_CAPACITY, TrackPool
from test_bridge import arc_table, scaled_line
from track_gen.course import Course
from track_gen.pipeline import presets
from track_gen.seeds import effective_seed

from racing_stack.bridge import admitted_envs, course_arrays, pool_arrays, pool_from_course

pytestmark = pytest.mark.gpu

E = 64


@pytest.fixture(scope="module")
def gpu() -> jax.Device:
    """JAX's device for Warp's ``cuda:0``."""
    wp.init()
    if wp.get_cuda_device_count() == 0:
        pytest.skip("needs a CUDA device (Warp sees none)")
    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("needs a CUDA device (JAX has no GPU backend)")
    return devices[0]


@pytest.fixture(scope="module")
def course(gpu) -> Course:
    course = Course.track(presets.track(num_envs=E, device="cuda:0"), seeds=42)
    widths = course.generator.params["width"].numpy()
    widths[[3, 9]] = 3.0  # two invalid envs (thickness)
    course.generator.params["width"].assign(widths)
    course.regenerate(mask=wp.array(np.isin(np.arange(E), [3, 9]).astype(np.int32), dtype=wp.int32,
                                    device="cuda:0"), advance=False)
    wp.synchronize_device("cuda:0")
    return course


def test_the_guard_is_live_on_this_device(gpu):
    on_device = jax.device_put(np.ones(4, np.float32), gpu)
    with jax.transfer_guard("disallow"), pytest.raises(Exception, match="isallowed"):
        np.asarray(on_device)  # an implicit device-to-host read


def test_the_geometry_runs_alone_under_the_strictest_guard(gpu, course):
    with jax.transfer_guard("disallow_explicit"):
        arrays = course_arrays(course)
    num_rows = len(admitted_envs(arrays))  # the one read, outside the guard
    with jax.transfer_guard("disallow_explicit"):
        built = pool_arrays(arrays, num_rows)
        pool = TrackPool.from_arrays(*built, level_id=1, split="train", check_values=False)
        jax.block_until_ready(built)
    for name in ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length", "track_id"):
        assert getattr(pool, name).devices() == {gpu}, name
    assert pool.centerline.shape == (num_rows, TRACK_CAPACITY, 2)


def test_the_admission_read_is_the_one_explicit_transfer(course):
    arrays = course_arrays(course)
    with jax.transfer_guard("disallow_explicit"), pytest.raises(Exception, match="isallowed"):
        admitted_envs(arrays)


def test_the_whole_bridge_runs_under_disallow(gpu, course):
    with jax.transfer_guard("disallow"):
        pool = pool_from_course(course, level_id=1, split="train")
    assert pool.track_id.devices() == {gpu}


def test_zero_copy_and_the_rows_against_the_oracle(gpu, course):
    arrays = course_arrays(course)
    r = course.result
    for name, warp_array in dict(center=r.center, count=r.count, valid=r.valid, width=r.width,
                                 generation=r.generation, track_id=r.track_id).items():
        assert getattr(arrays, name).unsafe_buffer_pointer() == warp_array.ptr, name
        assert getattr(arrays, name).devices() == {gpu}, name
    pool = pool_from_course(course, level_id=1, split="train")
    host = dict(center=r.center.numpy(), count=r.count.numpy(), valid=r.valid.numpy(), width=r.width.numpy(),
                seed=course.rng.seeds_warp.numpy(), generation=r.generation.numpy())
    envs = np.flatnonzero(host["valid"] != 0)
    assert 3 not in envs and 9 not in envs and len(pool) == len(envs)
    ids = np.asarray(pool.track_id)
    assert ids.tolist() == [effective_seed(int(host["seed"][e]), int(host["generation"][e])) for e in envs]
    centerline, length = np.asarray(pool.centerline), np.asarray(pool.track_length)
    for row, e in enumerate(envs):
        line = scaled_line(host, e)
        arc = arc_table(line)
        closed = np.vstack([line, line[:1]])
        at = arc[-1] * np.arange(TRACK_CAPACITY) / TRACK_CAPACITY
        expected = np.stack([np.interp(at, arc, closed[:, 0]), np.interp(at, arc, closed[:, 1])], axis=1)
        np.testing.assert_allclose(centerline[row], expected, atol=1e-3, err_msg=f"env {e}")
        assert abs(length[row] - arc[-1]) <= 1e-3 * arc[-1]
