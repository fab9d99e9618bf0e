"""Recording on the cpu device: what each call records (counted in the
capture's recorded launches), the exec modes, the torch interop's rules that
hold without a GPU, and the errors that leave nothing changed."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import weakref

import numpy as np
import pytest
import warp as wp

from track_gen import exec as track_exec
from track_gen.course import Course
from track_gen.errors import CaptureError
from track_gen.interop.torch import registered, retain
from track_gen.pipeline import presets
from track_gen.seeds import effective_seed

E = 8


def build(**kw):
    return Course.track(presets.track(num_envs=E, device="cpu", sdf_resolution=8), seeds=4, **kw)


def recorded(fn):
    with wp.ScopedCapture(device="cpu") as cap:
        fn()
    return cap.graph


def launches(graph) -> int:
    """How many operations the cpu capture recorded (what each replay runs)."""
    return graph._apic_capture.operation_count


def snapshot(course):
    r = course.result
    return [a.numpy().copy() for a in (r.center, r.sdf, r.height, r.checkpoints, r.valid, r.track_id,
                                          r.generation)]


@pytest.mark.parametrize("mode", [track_exec.unconditional, track_exec.conditional, None])
def test_a_cpu_capture_records_a_full_generation_whatever_the_mask(mode):
    course = build()
    zero = wp.zeros(E, dtype=wp.int32, device="cpu")
    with mode() if mode else track_exec.unconditional():
        full = launches(recorded(lambda: course.regenerate()))
    with mode() if mode else contextlib.nullcontext():
        graph = recorded(lambda: course.regenerate(mask=zero))
    assert launches(graph) == full
    assert full >= 15  # the generator's kernels and the two progress resets
    before = snapshot(course)
    wp.capture_launch(graph)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, snapshot(course)))  # still a no-op


def test_eager_cpu_calls_run_and_an_all_zero_mask_is_a_no_op():
    course = build()
    before = snapshot(course)
    course.regenerate(mask=course.inputs["regen_mask"])
    course.generator.enqueue(mask=course.inputs["regen_mask"])
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, snapshot(course)))
    course.generator.enqueue(mask=course.generator.everyone)
    assert (course.result.generation.numpy() == before[-1] + 1).all()


def test_exec_modes_nest_and_restore():
    assert track_exec.mode() == "default"
    with track_exec.conditional():
        assert track_exec.mode() == "conditional"
        with track_exec.unconditional():
            assert track_exec.mode() == "unconditional"
        assert track_exec.mode() == "conditional"
    assert track_exec.mode() == "default"
    with pytest.raises(KeyError), track_exec.unconditional():
        raise KeyError
    assert track_exec.mode() == "default"


def test_construction_and_reseeding_inside_a_capture_raise_capture_error():
    course = build()
    before = snapshot(course)
    with wp.ScopedCapture(device="cpu"):
        with pytest.raises(CaptureError, match="outside a graph capture"):
            build()
        with pytest.raises(CaptureError, match="outside a graph capture"):
            course.generate(seeds=11)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, snapshot(course)))


def test_a_stream_must_be_a_warp_stream_on_the_course_device():
    with pytest.raises(TypeError, match="stream must be a wp.Stream"):
        build(stream="cuda:0")
    course = build()
    before = snapshot(course)
    with pytest.raises(TypeError, match="stream must be a wp.Stream"):
        course.regenerate(mask=course.inputs["regen_mask"], stream=0)
    with pytest.raises(TypeError, match="stream must be a wp.Stream"):
        course.reset(stream=object())
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, snapshot(course)))


def test_registered_raises_outside_a_torch_capture():
    pytest.importorskip("torch")
    with pytest.raises(CaptureError, match="torch.cuda.graph"), registered():
        pass
    with pytest.raises(ValueError, match="capture_mode"), registered(capture_mode="strict"):
        pass


def test_retain_keeps_the_course_alive_as_long_as_the_graph():
    course = build()
    graph = recorded(lambda: course.regenerate(mask=course.inputs["regen_mask"]))  # noqa: F821 - the deleted name
    alive = weakref.ref(course)
    retain(graph, course)
    retain(graph, course)
    del course
    assert alive() is not None
    wp.capture_launch(graph)
    del graph
    assert alive() is None
    with pytest.raises(TypeError, match="graph must be an object with attributes"):
        retain(3, build())


def test_importing_track_gen_and_its_torch_interop_does_not_import_torch():
    code = ("import sys, track_gen, track_gen.course, track_gen.interop.torch, track_gen.exec; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_recorded_masked_regeneration_follows_the_mask_written_before_each_replay():
    course = build()
    mask = course.inputs["regen_mask"]
    graph = recorded(lambda: course.regenerate(mask=mask))
    before = snapshot(course)
    mask.assign(np.eye(1, E, 2, dtype=np.int32)[0])
    wp.capture_launch(graph)
    generation = course.result.generation.numpy()
    assert generation[2] == before[-1][2] + 1
    assert np.array_equal(np.delete(generation, 2), np.delete(before[-1], 2))
    track_id = course.result.track_id.numpy()
    assert track_id[2] == effective_seed(int(course.rng.seeds_warp.numpy()[2]), int(generation[2])) != before[-2][2]
    assert np.array_equal(np.delete(track_id, 2), np.delete(before[-2], 2))


def test_bind_inside_a_capture_records_nothing_and_a_step_keeps_the_buffers_it_was_recorded_with():
    """``bind`` neither allocates nor copies: it works inside a capture, and a
    recorded step reads the buffers bound when it was recorded."""
    course = build()
    start = course.result.center.numpy()[:, 0]
    first = wp.array(start, dtype=wp.vec3, device="cpu")
    quat = wp.array([wp.quat_identity()] * E, dtype=wp.quatf, device="cpu")
    he = wp.full(E, wp.vec2f(0.02, 0.01), dtype=wp.vec2f, device="cpu")
    assert launches(recorded(lambda: course.bind(position=first, orientation=quat, half_extents=he))) == 0
    with wp.ScopedCapture(device="cpu") as cap:
        out = course.step()
    far = wp.array(start + np.array([100.0, 0.0, 0.0], np.float32), dtype=wp.vec3, device="cpu")
    course.bind(position=far, orientation=quat, half_extents=he)
    wp.capture_launch(cap.graph)
    valid = course.result.valid.numpy().astype(bool)
    assert valid.any() and not out.contacts.oob.numpy()[valid].any()  # at the start lines, not 100 m away
    assert course.step().contacts.oob.numpy()[valid].all()  # an eager step reads the new binding
