"""No argument or parameter crashes the process, hangs, reads out of bounds or
yields a course marked valid that is not one: spec values are refused on the
host with the field named; per-env params out of range make only their env
invalid, with the params bit."""

import math
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import warp as wp

from track_gen.checks import FAIL_PARAMS, PARAM_RANGES, describe
from track_gen.course import Course
from track_gen.pipeline import presets
from track_gen.spec import GateSpec, TrackSpec

DEVICE = "cpu"
E = 4


def snapshot(result):
    return {name: getattr(result, name).numpy().copy() for name in result.__dataclass_fields__}


def assert_untouched(before, after, envs):
    for name, old in before.items():
        np.testing.assert_array_equal(after[name][envs], old[envs], err_msg=name)


def masked_regenerate(course, env, param, value):
    """Write ``value`` into env ``env``'s param and rebuild that env only."""
    values = course.generator.params[param].numpy()
    values[env] = value
    course.generator.params[param].assign(values)
    mask = wp.array(np.eye(course.num_envs, dtype=np.int32)[env], dtype=wp.int32, device=course.generator.device)
    course.regenerate(mask=mask, advance=False)


BAD_PARAMS = [
    ("track", "radius", v) for v in (0.0, -1.0, math.nan, math.inf, 1e7)
] + [
    ("track", "radius_jitter", v) for v in (1.0, -0.1, math.nan)
] + [
    ("track", "angle_jitter", v) for v in (-1.0, math.nan, math.inf)
] + [
    ("track", "width", v) for v in (0.0, -0.3, math.nan)
] + [
    ("track", "height_amplitude", v) for v in (-0.1, math.nan, math.inf)
] + [
    ("gates", "gate_width", v) for v in (0.0, -0.1, math.nan)
] + [
    ("gates", "radius", v) for v in (0.0, math.nan)
]


@pytest.mark.parametrize("kind,param,value", BAD_PARAMS)
def test_a_param_out_of_range_makes_only_its_env_invalid(device, kind, param, value):
    if kind == "track":
        course = Course.track(presets.track(num_envs=E, device=device, sdf_resolution=8), seeds=3)
    else:
        course = Course.gates(presets.gates(num_envs=E, device=device), seeds=3)
    before = snapshot(course.result)
    assert before["valid"].all()
    masked_regenerate(course, 2, param, value)
    after = snapshot(course.result)
    assert after["valid"][2] == 0
    assert after["fail_mask"][2] & FAIL_PARAMS, describe(int(after["fail_mask"][2]))
    assert "params" in describe(int(after["fail_mask"][2]))
    assert_untouched(before, after, [0, 1, 3])


@pytest.mark.parametrize("kind", ["track", "gates"])
def test_a_param_array_is_written_into_never_replaced(kind):
    """A shorter array put in place of a param once reached the kernels
    (reads past its end); replacing or removing one is refused, naming it,
    and the course regenerates as before."""
    if kind == "track":
        course = Course.track(presets.track(num_envs=E, device=DEVICE, sdf_resolution=8), seeds=3)
    else:
        course = Course.gates(presets.gates(num_envs=E, device=DEVICE), seeds=3)
    params = course.generator.params
    name = next(iter(params))
    kept = params[name]
    with pytest.raises(TypeError, match=re.escape(f"params[{name!r}] cannot be replaced")):
        params[name] = wp.zeros(E - 1, dtype=wp.float32, device=DEVICE)
    with pytest.raises(TypeError, match=re.escape(f"params[{name!r}] cannot be removed")):
        del params[name]
    with pytest.raises(KeyError, match="no param 'speed': the params are"):
        params["speed"] = kept
    with pytest.raises(AttributeError):
        course.generator.params = {}
    assert course.generator.params[name] is kept and len(course.generator.params) == len(params)
    before = snapshot(course.result)
    course.regenerate(advance=False)
    assert_untouched(before, snapshot(course.result), list(range(E)))


def test_params_at_their_lowest_allowed_values_are_valid(device):
    course = Course.track(presets.track(num_envs=E, device=device, sdf_resolution=8, radius_jitter=0.0,
                                        angle_jitter=0.0, height_amplitude=0.0), seeds=1)
    assert course.result.valid.numpy().all()


def test_a_course_line_of_no_length_is_invalid_and_steps_without_crashing():
    """A gates env of radius 0 once built a valid course of 0 points, and the
    next step killed the process (an integer division by zero). The case runs
    in a child process so that a crash fails this test instead of the run."""
    code = """
import numpy as np, warp as wp
wp.config.quiet = True
from track_gen.course import Course
from track_gen.pipeline import presets
course = Course.gates(presets.gates(num_envs=3, device="cpu"), seeds=0)
radius = course.generator.params["radius"].numpy(); radius[0] = 0.0
course.generator.params["radius"].assign(radius)
course.regenerate(mask=wp.array([1, 0, 0], dtype=wp.int32, device="cpu"), advance=False)
course.bind(position=wp.zeros(3, dtype=wp.vec3), orientation=wp.array([wp.quat_identity()] * 3, dtype=wp.quatf),
            half_extents=wp.full(3, wp.vec2f(0.02, 0.01), dtype=wp.vec2f))
out = course.step()
wp.synchronize()
print(int(course.result.valid.numpy()[0]), int(course.result.count.numpy()[0]), int(out.valid.numpy()[0]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    valid, count, step_valid = map(int, done.stdout.split()[-3:])
    assert valid == 0 and step_valid == 0 and count >= 1


FLOAT_FIELDS = {
    TrackSpec: ("ds", "sdf_margin", "radius", "radius_jitter", "angle_jitter", "width", "height_amplitude",
                "height_wavelength"),
    GateSpec: ("ds", "radius", "radius_jitter", "angle_jitter", "gate_width"),
}


@pytest.mark.parametrize("spec_type,field", [(t, f) for t, fields in FLOAT_FIELDS.items() for f in fields])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "1", True])
def test_spec_values_that_are_not_finite_numbers_are_refused_by_name(spec_type, field, value):
    with pytest.raises(ValueError, match=field):
        spec_type(num_envs=2, **{field: value})


@pytest.mark.parametrize("preset", [presets.track, presets.gates])
def test_preset_lengths_are_checked(preset):
    with pytest.raises(ValueError, match="ds"):
        preset(num_envs=2, ds=math.inf)
    with pytest.raises(ValueError, match="scale"):
        preset(num_envs=2, scale=math.inf)
    with pytest.raises(ValueError, match="^scale must be a finite number > 0"):
        preset(num_envs=2, scale=10**400)  # finite as an int, not as a float
    assert preset(num_envs=2, scale=np.float32(2.0)).radius == preset(num_envs=2, scale=2.0).radius


@pytest.mark.parametrize("preset", [presets.track, presets.gates])
@pytest.mark.parametrize("scale", [1e30, 1e-9, np.float32(1e30)])
def test_a_scale_that_takes_a_length_out_of_range_is_refused_by_its_name(preset, scale):
    with pytest.raises(ValueError, match="^" + re.escape(f"scale={scale!r} (it multiplies ds, radius")):
        preset(num_envs=2, scale=scale)


@pytest.mark.parametrize("preset", [presets.track, presets.gates])
def test_a_bad_override_is_not_blamed_on_the_scale(preset):
    with pytest.raises(ValueError, match="^radius must be in") as error:
        preset(num_envs=2, scale=2.0, radius=1e9)
    assert "scale" not in str(error.value) and error.value.__context__ is None


@pytest.mark.parametrize("field,value", [(f, PARAM_RANGES[f][1]) for f in ("radius", "radius_jitter", "width")])
def test_param_defaults_outside_their_range_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        TrackSpec(num_envs=2, **{field: value})


@pytest.mark.parametrize("build", [
    lambda: Course.gates(presets.gates(num_envs=10**7, device=DEVICE, max_gates=1024)),
    lambda: Course.gates(presets.gates(num_envs=10**9, device=DEVICE)),
    lambda: Course.track(presets.track(num_envs=10**8, device=DEVICE)),
    lambda: Course.track(presets.track(num_envs=2, device=DEVICE, sdf_resolution=10**5)),
    lambda: Course.track(presets.track(num_envs=2, device=DEVICE, n_control=10**6, samples_per_segment=10**4)),
])
def test_absurd_sizes_fail_fast_with_num_envs_named(build):
    with pytest.raises(ValueError, match="num_envs"):
        build()


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf, "0.6"])
def test_checkpoint_spacing_is_checked(value):
    with pytest.raises(ValueError, match="checkpoint_spacing"):
        Course.track(presets.track(num_envs=2, device=DEVICE), checkpoint_spacing=value)


@pytest.mark.parametrize("call", ["enqueue", "enqueue_generate", "generate"])
@pytest.mark.parametrize("mask,error", [
    (lambda d: wp.ones(E - 1, dtype=wp.int32, device=d), ValueError),
    (lambda d: wp.ones(E + 1, dtype=wp.int32, device=d), ValueError),
    (lambda d: wp.ones(E, dtype=wp.float32, device=d), TypeError),
    (lambda d: np.ones(E, np.int32), TypeError),
])
def test_every_generator_entry_point_checks_its_mask(device, call, mask, error):
    course = Course.track(presets.track(num_envs=E, device=device, sdf_resolution=8), seeds=2)
    before = snapshot(course.result)
    epochs = course.rng.epochs.numpy().copy()
    with pytest.raises(error, match="mask"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # enqueue_generate, the deprecated alias
        getattr(course.generator, call)(mask=mask(device))
    assert_untouched(before, snapshot(course.result), slice(None))
    np.testing.assert_array_equal(course.rng.epochs.numpy(), epochs)


@pytest.mark.parametrize("mask,error", [
    (lambda d: wp.ones(0, dtype=wp.int32, device=d), ValueError),  # once a segfault
    (lambda d: wp.ones(2, dtype=wp.int32, device=d), ValueError),
    (lambda d: np.ones(E, np.int32), TypeError),
    (lambda d: wp.ones(E, dtype=wp.float32, device=d), TypeError),
])
def test_runtime_reset_checks_its_mask(device, mask, error):
    course = Course.track(presets.track(num_envs=E, device=device, sdf_resolution=8), seeds=2)
    with pytest.raises(error, match="active"):
        course.runtime.reset(mask(device))


def test_query_refuses_a_missing_out_field():
    from track_gen.queries import QueryResult, query

    course = Course.track(presets.track(num_envs=2, device=DEVICE, sdf_resolution=8), seeds=2)
    points = wp.zeros((2, 3), dtype=wp.vec2, device=DEVICE)
    z = lambda dtype: wp.zeros((2, 3), dtype=dtype, device=DEVICE)  # noqa: E731
    with pytest.raises(TypeError, match="out.distance"):
        query(course.result, points, out=QueryResult(None, z(wp.vec2), z(wp.vec2)))


def test_gate_counts_are_bounded():
    """The bar check is quadratic in gates: more than MAX_GATES is refused."""
    from track_gen.spec import MAX_GATES

    with pytest.raises(ValueError, match="max_gates must be <= 1024"):
        GateSpec(num_envs=1, min_gates=3, max_gates=MAX_GATES + 1)
    GateSpec(num_envs=1, min_gates=3, max_gates=MAX_GATES)


@pytest.mark.parametrize("field,value", [("height_wavelength", 1e-300), ("height_wavelength", 1e-45),
                                         ("sdf_margin", 1e39), ("sdf_margin", 1e300), ("ds", 1e-30),
                                         ("radius", 1e-300), ("width", 1e7)])
def test_lengths_outside_float32s_safe_range_are_refused(field, value):
    """Finite in float64 but 0 or infinite in float32: they once built
    valid courses with NaN or infinite geometry."""
    with pytest.raises(ValueError, match=field):
        TrackSpec(num_envs=1, **{field: value})


def test_numpy_scalars_are_numbers():
    spec = TrackSpec(num_envs=np.int64(2), ds=np.float32(0.05), radius=np.float64(1.5))
    assert Course.track(spec).result.count.numpy().min() >= 3


@pytest.mark.parametrize("collision", [math.inf, math.nan, 1e300, 0.0, -1.0, None, "disc", True, np.ones(2)])
def test_gate_collision_must_be_a_finite_post_radius_or_frames(collision):
    with pytest.raises(ValueError, match="collision"):
        Course.gates(presets.gates(num_envs=2, device=DEVICE), collision=collision)


@pytest.mark.parametrize("device", [None, ["cpu"], 0])
def test_device_must_be_a_device_name(device):
    with pytest.raises(ValueError, match="device"):
        TrackSpec(num_envs=1, device=device)
