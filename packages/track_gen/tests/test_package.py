import subprocess
import sys

import pytest

import track_gen
from track_gen._warp import NO_DRIVER


def test_version_is_the_distribution_metadata():
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert track_gen.__version__ == version("track-gen") == declared


def test_the_public_api_is_re_exported():
    from track_gen.course import Course
    from track_gen.queries import distance

    assert track_gen.Course is Course and track_gen.distance is distance
    assert sorted(track_gen.__all__) == sorted(set(track_gen.__all__))
    for name in track_gen.__all__:
        assert getattr(track_gen, name) is not None, name


def test_importing_track_gen_never_imports_torch():
    code = "import sys, track_gen; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_warp_runs_on_the_cpu_device():
    import warp as wp

    wp.init()
    x = wp.array([1.0, 2.0, 3.0], dtype=wp.float32, device="cpu")
    assert wp.get_device("cpu").is_cpu
    assert x.numpy().tolist() == [1.0, 2.0, 3.0]


def annotated_arrays(cls):
    """(field, annotated Warp array type) of a dataclass's array fields."""
    import dataclasses

    import warp as wp

    for field in dataclasses.fields(cls):
        if isinstance(field.type, str) and field.type.startswith("wp.array"):
            yield field.name, eval(field.type, {"wp": wp})  # noqa: S307 - the module's own annotations


def test_result_and_runtime_fields_hold_arrays_of_their_annotated_dtype_and_rank():
    import dataclasses

    import warp as wp

    from track_gen.course import Course
    from track_gen.pipeline import presets

    def check(obj):
        fields = dict(annotated_arrays(type(obj)))
        assert fields, type(obj).__name__
        for name, kind in fields.items():
            value = getattr(obj, name)
            assert value.dtype == kind.dtype and value.ndim == kind.ndim, (type(obj).__name__, name)
        for field in dataclasses.fields(obj):
            if dataclasses.is_dataclass(getattr(obj, field.name)):
                check(getattr(obj, field.name))

    pose = dict(position=wp.zeros(2, dtype=wp.vec3), orientation=wp.zeros(2, dtype=wp.quatf),
                half_extents=wp.zeros(2, dtype=wp.vec2f))
    for course in (Course.track(presets.track(num_envs=2, sdf_resolution=4)), Course.gates(presets.gates(num_envs=2)),
                   Course.gates(presets.gates(num_envs=2), collision="frames")):
        course.bind(**pose)
        check(course.result)
        check(course.step())
        check(course.runtime.progress)


QUIET = """
import warp as wp
from track_gen.course import Course
from track_gen.pipeline import presets
{after_import}
course = Course.track(presets.track(num_envs=4, device="cpu"), seeds=42)
print("valid", int(course.result.valid.numpy().sum()))
"""


@pytest.mark.parametrize("after_import, banner", [("", False), ("wp.config.log_level = wp.LOG_INFO", True)])
def test_warps_banner_stays_off_stdout_unless_the_user_asks(after_import, banner):
    """Importing track_gen lowers Warp's default log level (its banner and a
    line per loaded module on stdout) to warnings; a level set after the
    import is the user's."""
    run = subprocess.run([sys.executable, "-c", QUIET.format(after_import=after_import)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[-1].startswith("valid ")
    assert any(line.startswith("Warp ") and "initialized" in line for line in lines) == banner
    assert (len(lines) == 1) != banner, run.stdout
    # Where no NVIDIA driver loads, Warp's native line saying so is the user's to see, as the banner.
    no_driver = "CUDA driver not available" in run.stdout if banner else None
    assert (NO_DRIVER in run.stderr) == bool(no_driver), run.stderr


def test_a_native_line_printed_at_init_is_dropped_and_the_others_are_passed_on():
    """`init_without` catches file descriptor 2 itself (a native library
    writes there, not to sys.stderr): the line it names is dropped, the
    others and what Python wrote reach stderr in order, and stderr is
    stderr again afterwards (a fresh process: its descriptors are its own)."""
    code = ("import os, sys\n"
            "from track_gen._warp import init_without\n"
            "def init():\n"
            "    os.write(2, b'native: kept\\nnative: the driver is missing\\n')\n"
            "    print('python: kept', file=sys.stderr)\n"
            "init_without('the driver is missing', init)\n"
            "print('after', file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["native: kept", "python: kept", "after"]
