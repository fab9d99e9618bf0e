"""Track ids on the device and the zero-copy JAX views of a course (Warp's
cpu device, JAX's CPU), against ``effective_seed`` on the host."""

from __future__ import annotations

import subprocess
import sys

import jax
import numpy as np
import pytest
import warp as wp

from track_gen.course import Course
from track_gen.interop.jax import CourseArrays, course_arrays
from track_gen.pipeline import presets
from track_gen.seeds import effective_seed

wp.config.quiet = True

E = 6
#: Seeds at the uint32 edges and in between.
SEEDS = np.array([0, 1, 2**31, 2**32 - 1, 12345, 987654321], dtype=np.uint32)


def ids_of(course) -> list[int]:
    """``effective_seed(seed_e, generation_e)`` for every env, on the host."""
    seeds, epochs = course.rng.seeds_warp.numpy(), course.result.generation.numpy()
    return [effective_seed(int(s), int(e)) for s, e in zip(seeds, epochs)]


def one_hot(envs) -> wp.array:
    return wp.array(np.isin(np.arange(E), envs).astype(np.int32), dtype=wp.int32, device="cpu")


@pytest.fixture
def course() -> Course:
    return Course.track(presets.track(num_envs=E, device="cpu", sdf_resolution=8), seeds=SEEDS)


def test_a_fresh_course_ids_are_its_seeds(course):
    assert course.result.track_id.dtype == wp.uint32
    assert course.result.track_id.numpy().tolist() == SEEDS.tolist()


def test_each_regeneration_writes_the_effective_seed_of_the_envs_it_selects(course):
    rng = np.random.default_rng(0)
    for _ in range(4):
        envs = np.flatnonzero(rng.random(E) < 0.5)
        before = course.result.track_id.numpy().copy()
        course.regenerate(mask=one_hot(envs), advance=True)
        ids = course.result.track_id.numpy()
        assert ids.tolist() == ids_of(course)
        untouched = np.setdiff1d(np.arange(E), envs)
        np.testing.assert_array_equal(ids[untouched], before[untouched])
    assert (course.result.generation.numpy() > 0).any()


def test_a_written_seed_changes_no_id_until_a_regeneration_selects_the_env(course):
    course.regenerate(advance=True)
    built = course.result.track_id.numpy().copy()
    seeds = course.rng.seeds_warp.numpy()
    seeds[2] = 77
    course.rng.seeds_warp.assign(seeds)
    np.testing.assert_array_equal(course.result.track_id.numpy(), built)
    course.regenerate(mask=one_hot([2]), advance=False)
    ids = course.result.track_id.numpy()
    assert ids[2] == effective_seed(77, int(course.result.generation.numpy()[2])) != built[2]
    np.testing.assert_array_equal(np.delete(ids, 2), np.delete(built, 2))


def test_the_id_rebuilds_the_course_as_env_0_at_epoch_0(course):
    course.regenerate(mask=one_hot([1, 4]), advance=True)
    for env in (1, 4):
        assert course.result.generation.numpy()[env] == 1
        again = Course.track(presets.track(num_envs=1, device="cpu", sdf_resolution=8),
                             seeds=int(course.result.track_id.numpy()[env]))
        assert again.result.center.numpy()[0].tobytes() == course.result.center.numpy()[env].tobytes()


def test_a_gates_course_has_ids_too():
    gates = Course.gates(presets.gates(num_envs=3, device="cpu"), seeds=np.array([5, 2**32 - 1, 9]))
    gates.regenerate(mask=wp.array([0, 1, 0], dtype=wp.int32, device="cpu"), advance=True)
    assert gates.result.track_id.numpy().tolist() == ids_of(gates)
    assert gates.result.track_id.numpy()[1] != 2**32 - 1


def test_course_arrays_are_zero_copy_views_on_the_course_device(course):
    course.regenerate(mask=one_hot([3]), advance=True)
    arrays = course_arrays(course)
    assert isinstance(arrays, CourseArrays) and arrays.num_envs == E
    r = course.result
    cpu = jax.devices("cpu")[0]
    for name in ("center", "count", "valid", "width", "generation", "track_id"):
        value, warp_array = getattr(arrays, name), getattr(r, name)
        assert value.unsafe_buffer_pointer() == warp_array.ptr, name
        assert value.devices() == {cpu}, name
        np.testing.assert_array_equal(np.asarray(value), warp_array.numpy(), err_msg=name)
    assert arrays.center.shape == (E, course.generator.spec.n_max, 3) and arrays.center.dtype == np.float32
    assert arrays.track_id.dtype == np.uint32 and np.asarray(arrays.track_id).tolist() == ids_of(course)
    assert arrays.points.shape == (E, course.generator.spec.n_max, 2)
    np.testing.assert_array_equal(np.asarray(arrays.half_width), 0.5 * r.width.numpy())
    np.testing.assert_array_equal(np.asarray(course_arrays(course.generator).track_id), r.track_id.numpy())


def test_the_views_see_a_regeneration(course):
    arrays = course_arrays(course)
    course.regenerate(advance=True)
    assert np.asarray(arrays.track_id).tolist() == ids_of(course) != SEEDS.tolist()


@pytest.mark.parametrize("bad, match", [
    ("course", "course must be a track_gen Course"),
    (None, "course must be a track_gen Course"),
])
def test_what_is_not_a_course_is_refused(bad, match):
    with pytest.raises(TypeError, match=match):
        course_arrays(bad)


def test_a_gates_course_is_refused():
    gates = Course.gates(presets.gates(num_envs=2, device="cpu"), seeds=0)
    with pytest.raises(TypeError, match="track course"):
        course_arrays(gates)


def test_track_gen_does_not_import_jax_unless_asked():
    code = "import sys, track_gen, track_gen.course, track_gen.interop; sys.exit('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
