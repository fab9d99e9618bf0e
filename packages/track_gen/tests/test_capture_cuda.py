"""Recording courses into CUDA graphs: the RL auto-reset page's graph and
torch recipes, and every CUDA row of its cost table, counted in the captured
graph's nodes (run on the GPU machine)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import warp as wp
from graph_nodes import CONDITIONAL, KERNEL, captured, destroy, node_types

from track_gen import _capture
from track_gen import exec as track_exec
from track_gen.course import Course
from track_gen.errors import CaptureError
from track_gen.pipeline import presets
from track_gen.seeds import effective_seed

pytestmark = pytest.mark.gpu

E = 256


@pytest.fixture
def course(cuda):
    if not wp.is_conditional_graph_supported():
        pytest.skip("needs conditional graph nodes (CUDA 12.4+)")
    return Course.track(presets.track(num_envs=E, device=cuda), seeds=5)


def recorded(fn, device):
    with wp.ScopedCapture(device=device) as cap:
        fn()
    return cap.graph


def snapshot(course):
    r = course.result
    return [a.numpy().copy() for a in (r.center, r.sdf, r.checkpoints, r.valid, r.generation, r.track_id)]


def top_level(fn, device):
    """Node types of the top level of the CUDA graph ``fn`` records."""
    graph, _ = captured(fn, wp.get_stream(device))
    try:
        return node_types(graph)
    finally:
        destroy(graph)


def full_generation_kernels(course, device):
    with track_exec.unconditional():
        return top_level(lambda: course.regenerate(), device)[KERNEL]


def condition_kernels(device):
    """Top-level kernels Warp's own ``capture_if`` adds (it sets the node's handle from the flag)."""
    flag = wp.zeros(1, dtype=wp.int32, device=device)
    types = top_level(lambda: wp.capture_if(flag, on_true=lambda: None), device)
    assert types[CONDITIONAL] == 1
    return types[KERNEL]


def test_scoped_capture_skips_an_all_zero_mask_on_device_and_runs_a_set_one(course, cuda):
    mask = wp.zeros(E, dtype=wp.int32, device=cuda)
    graph = recorded(lambda: course.regenerate(mask=mask, advance=True), cuda)
    types = node_types(graph.graph)
    # The two kernels that reduce the mask to a flag, Warp's, the conditional node.
    assert types == {KERNEL: 2 + condition_kernels(cuda), CONDITIONAL: 1}
    before = snapshot(course)
    for _ in range(3):
        wp.capture_launch(graph)
    after = snapshot(course)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, after))
    mask.assign(np.eye(1, E, 7, dtype=np.int32)[0])
    wp.capture_launch(graph)
    generation = course.result.generation.numpy()
    assert generation[7] == before[4][7] + 1
    assert np.array_equal(np.delete(generation, 7), np.delete(before[4], 7))
    track_id = course.result.track_id.numpy()
    assert track_id[7] == effective_seed(int(course.rng.seeds_warp.numpy()[7]), int(generation[7])) != before[5][7]
    assert np.array_equal(np.delete(track_id, 7), np.delete(before[5], 7))
    keep = np.arange(E) != 7
    assert course.result.center.numpy()[keep].tobytes() == before[0][keep].tobytes()


def test_unconditional_records_a_full_generation(course, cuda):
    mask = wp.zeros(E, dtype=wp.int32, device=cuda)
    with track_exec.unconditional():
        types = top_level(lambda: course.regenerate(mask=mask), cuda)
    assert CONDITIONAL not in types
    assert types[KERNEL] == full_generation_kernels(course, cuda) >= 15


def test_without_conditional_nodes_the_regeneration_is_recorded_unconditionally(course, cuda, monkeypatch):
    """The "older CUDA" row: no conditional node support, plain nodes."""
    monkeypatch.setattr(wp, "is_conditional_graph_supported", lambda: False)
    types = top_level(lambda: course.regenerate(mask=course.inputs["regen_mask"]), cuda)
    assert CONDITIONAL not in types
    assert types[KERNEL] == full_generation_kernels(course, cuda)


def test_an_eager_generator_call_runs_every_kernel_with_an_all_zero_mask(course, cuda):
    zero = wp.zeros(E, dtype=wp.int32, device=cuda)
    full = full_generation_kernels(course, cuda) - 2  # without the course's two progress resets
    wp.timing_begin(cuda_filter=wp.TIMING_KERNEL)
    course.generator.enqueue(mask=zero)
    launched = wp.timing_end()
    assert len(launched) == full


def test_eager_regenerate_replays_the_courses_own_graph_which_skips(course, cuda):
    mask = course.inputs["regen_mask"]
    before = snapshot(course)
    course.regenerate(mask=mask)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(before, snapshot(course)))
    (graph, kept_mask), = course._graphs.values()
    assert kept_mask is mask
    assert node_types(graph.graph) == {KERNEL: 2 + condition_kernels(cuda), CONDITIONAL: 1}
    mask.assign(np.eye(1, E, 3, dtype=np.int32)[0])
    course.regenerate(mask=mask)
    assert len(course._graphs) == 1  # the same graph, replayed
    assert course.result.generation.numpy()[3] == before[4][3] + 1


def test_graph_recipe_on_cuda(course, cuda):
    """The page's graph recipe, with a trivial sim and respawn."""
    from recipes import graph_recipe

    rewards, observations, generations = graph_recipe(course, cuda, steps=20)
    assert np.isfinite(rewards).all() and np.isfinite(observations).all()
    assert (generations[-1] > generations[0]).any()  # envs finished and got new courses


def test_an_open_fork_raises_before_the_capture_is_invalidated(course, cuda):
    mask = course.inputs["regen_mask"]
    side = wp.Stream(cuda)
    scratch = wp.zeros(E, dtype=wp.int32, device=cuda)
    with wp.ScopedCapture(device=cuda) as cap:
        main = fork(side, scratch)
        with pytest.raises(CaptureError, match="not joined"):
            course.regenerate(mask=mask)
        main.wait_stream(side)  # joined: now it records
        course.regenerate(mask=mask)
    assert node_types(cap.graph.graph)[CONDITIONAL] == 1
    wp.capture_launch(cap.graph)
    assert scratch.numpy().sum() == E


def test_a_fork_is_fine_inside_unconditional(course, cuda):
    side = wp.Stream(cuda)
    scratch = wp.zeros(E, dtype=wp.int32, device=cuda)
    with wp.ScopedCapture(device=cuda) as cap:
        main = fork(side, scratch)
        with track_exec.unconditional():
            course.regenerate(mask=course.inputs["regen_mask"])
        main.wait_stream(side)
    wp.capture_launch(cap.graph)
    assert scratch.numpy().sum() == E


def test_a_course_built_on_a_stream_refuses_to_run_outside_the_capture(cuda):
    s = wp.Stream(cuda)
    course = Course.track(presets.track(num_envs=64, device=cuda), seeds=1, stream=s)
    mask = course.inputs["regen_mask"]
    with wp.ScopedCapture(device=cuda) as cap:
        with pytest.raises(CaptureError, match="stream="):
            course.regenerate(mask=mask)
        with pytest.raises(CaptureError, match="stream="):
            course.reset()
        course.regenerate(mask=mask, stream=wp.get_stream(cuda))
    wp.capture_launch(cap.graph)


@wp.kernel
def _touch(a: wp.array(dtype=wp.int32)):
    a[wp.tid()] = 1


def fork(side, scratch):
    """Fork ``side`` off the capturing stream and give it work (``_touch`` on
    ``scratch``), not joined; returns the capturing stream."""
    main = wp.get_stream(scratch.device)
    side.wait_stream(main)
    wp.launch(_touch, scratch.shape[0], [scratch], stream=side)
    return main


# --- torch.cuda.graph ---------------------------------------------------------------------

torch = pytest.importorskip("torch")


def torch_graph_types(g):
    return node_types(g.raw_cuda_graph())


def test_plain_torch_graph_adopts_the_capture_stream_and_records_unconditionally(course, cuda):
    mask = course.inputs["regen_mask"]
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g):
        course.regenerate(mask=mask)
    types = torch_graph_types(g)
    assert CONDITIONAL not in types
    assert types[KERNEL] == full_generation_kernels(course, cuda)
    g.replay()
    torch.cuda.synchronize()


def test_torch_recipe_with_registered_conditional(cuda):
    from recipes import torch_recipe

    course = Course.track(presets.track(num_envs=E, device=cuda), seeds=5)
    g, views = torch_recipe(course, cuda)
    assert torch_graph_types(g)[CONDITIONAL] == 1
    generation = course.result.generation.numpy().copy()
    for _ in range(60):
        g.replay()
        torch.cuda.synchronize()
        assert torch.isfinite(views["reward"]).all() and torch.isfinite(views["obs_dist"]).all()
    assert (course.result.generation.numpy() > generation).any()


def test_registered_keeps_the_course_alive_as_long_as_the_graph(cuda):
    from track_gen.interop.torch import registered

    course = Course.track(presets.track(num_envs=E, device=cuda), seeds=5)
    mask, alive = course.inputs["regen_mask"], weakref.ref(course)
    mask.fill_(1)
    generation = course.result.generation.numpy().copy()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g), registered():
        course.regenerate(mask=mask)
    types = torch_graph_types(g)
    assert CONDITIONAL not in types and types[KERNEL] == full_generation_kernels(course, cuda)
    result = course.result
    del course
    gc.collect()
    assert alive() is not None
    g.replay()
    torch.cuda.synchronize()
    assert (result.generation.numpy() == generation + 1).all()
    del g
    gc.collect()
    torch.cuda.synchronize()
    _capture.release_dropped()
    gc.collect()
    assert alive() is None


def test_registered_outside_a_torch_capture_raises():
    from track_gen.interop.torch import registered

    with pytest.raises(CaptureError, match="torch.cuda.graph"), registered():
        pass


def test_own_capture_of_torchs_stream_needs_exec_conditional(course, cuda):
    mask = course.inputs["regen_mask"]
    with torch.cuda.stream(torch.cuda.Stream()):
        stream = wp.stream_from_torch(torch.cuda.current_stream())
        with wp.ScopedStream(stream, sync_enter=False):
            plain = top_level(lambda: course.regenerate(mask=mask), cuda)
            with track_exec.conditional():
                cond = top_level(lambda: course.regenerate(mask=mask), cuda)
    assert CONDITIONAL not in plain and plain[KERNEL] == full_generation_kernels(course, cuda)
    assert cond[CONDITIONAL] == 1


def test_buffers_and_masks_on_another_device_are_refused(cuda):
    course = Course.track(presets.track(num_envs=8, device=cuda), seeds=1)
    before = course.result.generation.numpy().copy()
    pos = wp.zeros(8, dtype=wp.vec3, device="cpu")
    quat = wp.full(8, wp.quat_identity(), dtype=wp.quatf, device=cuda)
    he = wp.full(8, wp.vec2f(0.02, 0.01), dtype=wp.vec2f, device=cuda)
    with pytest.raises(ValueError, match="position must be on the course device"):
        course.bind(position=pos, orientation=quat, half_extents=he)
    with pytest.raises(ValueError, match="mask must be on the course device"):
        course.regenerate(mask=wp.ones(8, dtype=wp.int32, device="cpu"))
    with pytest.raises(RuntimeError, match="bind"):
        course.step()  # nothing was bound
    assert (course.result.generation.numpy() == before).all()
