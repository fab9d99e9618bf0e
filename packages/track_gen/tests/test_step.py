"""The runtime step on tracks: frames, out of bounds, progress, resets, invalid
envs, and the host and graph recipes of the RL auto-reset page (on cpu)."""

import numpy as np
import pytest
import warp as wp

from recipes import graph_recipe, host_recipe

from track_gen.course import Course
from track_gen.pipeline import presets

E = 6


def build(device, num_envs=E, seeds=42):
    return Course.track(presets.track(num_envs=num_envs, device=device, sdf_resolution=8),
                        checkpoint_spacing=0.6, collision="segments", seeds=seeds)


def agents(device, num_envs=E, half=(0.02, 0.01)):
    pos = wp.zeros(num_envs, dtype=wp.vec3, device=device)
    quat = wp.full(num_envs, wp.quat_identity(), dtype=wp.quatf, device=device)
    he = wp.full(num_envs, wp.vec2f(*half), dtype=wp.vec2f, device=device)
    return pos, quat, he


def place(course, pos, index, offset=0.0):
    """Agents at course-line point ``index`` (per env), ``offset`` to the left (m)."""
    r = course.result
    c = r.center.numpy()
    nl = r.normal.numpy() if offset else np.zeros_like(c)
    p = np.stack([c[e, index[e]] + offset * nl[e, index[e]] for e in range(course.num_envs)])
    pos.assign(p.astype(np.float32))


def test_bind_checks_the_buffers(device):
    course = build(device)
    pos, quat, he = agents(device)
    with pytest.raises(RuntimeError, match="bind"):
        course.step()
    with pytest.raises(TypeError, match="position must have dtype"):
        course.bind(position=wp.zeros(E, dtype=wp.vec2, device=device), orientation=quat, half_extents=he)
    with pytest.raises(ValueError, match=r"orientation must have shape \[6\]"):
        course.bind(position=pos, orientation=wp.zeros(E + 1, dtype=wp.quatf, device=device), half_extents=he)
    with pytest.raises(TypeError, match="half_extents must be a warp array"):
        course.bind(position=pos, orientation=quat, half_extents=np.zeros((E, 2)))
    with pytest.raises(RuntimeError):
        course.step()  # nothing was bound by the failed calls


def test_frame_locates_the_agent_and_oob_tests_its_box(device):
    course = build(device)
    assert (course.result.valid.numpy() == 1).all()
    pos, quat, he = agents(device)
    course.bind(position=pos, orientation=quat, half_extents=he)
    idx = np.array([10, 20, 30, 40, 50, 60])
    arc = course.result.arc.numpy()
    place(course, pos, idx)
    res = course.step()
    np.testing.assert_allclose(res.frame.s.numpy(), arc[np.arange(E), idx], atol=1e-5)
    np.testing.assert_allclose(res.frame.n.numpy(), 0, atol=1e-5)
    place(course, pos, idx, offset=0.05)
    res = course.step()
    # Off the line, the point projects a little off the vertex on a curve.
    np.testing.assert_allclose(res.frame.s.numpy(), arc[np.arange(E), idx], atol=5e-3)
    np.testing.assert_allclose(res.frame.n.numpy(), 0.05, atol=1e-3)
    assert (res.contacts.oob.numpy() == 0).all()
    place(course, pos, idx, offset=-0.14)  # half width 0.15: a 2 cm box pokes out
    res = course.step()
    np.testing.assert_allclose(res.frame.n.numpy(), -0.14, atol=2e-3)
    assert (res.contacts.oob.numpy() == 1).all()


def test_driving_a_lap_passes_every_checkpoint_in_order_and_counts_the_lap(device):
    course = build(device, seeds=5)
    r = course.result
    pos, quat, he = agents(device)
    course.bind(position=pos, orientation=quat, half_extents=he)
    count, cps = r.count.numpy(), r.num_checkpoints.numpy()
    arc, checkpoints = r.arc.numpy(), r.checkpoints.numpy()
    total = np.zeros(E, int)
    for step in range(int(count.max()) // 3 + 12):
        idx = (3 * step) % count
        place(course, pos, idx)
        res = course.step()
        total += res.events.passed.numpy()
        nxt = (res.events.dist_to_next.numpy())
        assert (nxt > 0).all() and (nxt <= r.length.numpy()).all()
    laps, length = res.events.laps.numpy(), r.length.numpy()
    steps = int(count.max()) // 3 + 12
    travelled = unwrapped_arc(3 * (steps - 1), count, length, 0.05)  # the first step only places
    for e in range(E):
        marks = np.r_[arc[e, checkpoints[e, 1:cps[e]]], length[e]]  # 1..C-1, then the start line
        marks = np.r_[marks, marks + length[e]]
        assert total[e] == int(np.sum(marks <= travelled[e] + 1e-4)), e
        assert laps[e] == int(travelled[e] >= length[e] - 1e-4)


@pytest.mark.parametrize("spacing", [0.01, 0.02, 0.6])
def test_checkpoints_closer_than_the_course_line_points_still_count_every_lap(device, spacing):
    """Checkpoints every 1-2 cm on a line of 5 cm points: several share a
    point (the last ones used to get index -1 and stall progress)."""
    course = Course.track(presets.track(num_envs=2, device=device, sdf_resolution=8), seeds=0,
                          checkpoint_spacing=spacing)
    r = course.result
    count, cps = r.count.numpy(), r.num_checkpoints.numpy()
    checkpoints = r.checkpoints.numpy()
    for e in range(2):
        assert ((checkpoints[e, :cps[e]] >= 0) & (checkpoints[e, :cps[e]] < count[e])).all()
        assert (np.diff(checkpoints[e, :cps[e]]) >= 0).all() and (checkpoints[e, cps[e]:] == -1).all()
    pos, quat, he = agents(device, 2)
    course.bind(position=pos, orientation=quat, half_extents=he)
    for step in range(2 * int(count.max()) + 2):
        place(course, pos, step % count)  # from the start line
        res = course.step()
        assert np.isfinite(res.events.dist_to_next.numpy()).all()
    assert (res.events.laps.numpy() == 2).all()


def test_reset_restarts_progress_of_the_masked_envs_only(device):
    course = build(device)
    pos, quat, he = agents(device)
    course.bind(position=pos, orientation=quat, half_extents=he)
    count = course.result.count.numpy()
    for step in range(int(count.max()) // 4 + 6):
        place(course, pos, (4 * step) % count)
        res = course.step()
    laps = res.events.laps.numpy().copy()
    assert (laps == 1).all()
    mask = wp.array(np.eye(E, dtype=np.int32)[2], dtype=wp.int32, device=device)
    course.reset(mask)
    assert res.events.laps.numpy()[2] == 0
    np.testing.assert_array_equal(np.delete(res.events.laps.numpy(), 2), np.delete(laps, 2))
    course.regenerate(mask=wp.array(np.eye(E, dtype=np.int32)[4], dtype=wp.int32, device=device))
    assert res.events.laps.numpy()[4] == 0 and res.events.laps.numpy()[3] == 1


def test_invalid_envs_answer_as_envs_without_a_course_and_stay_dead_after_reset(device):
    course = build(device)
    widths = course.generator.params["width"].numpy()
    widths[1] = 3.0
    course.generator.params["width"].assign(widths)
    one = wp.array(np.eye(E, dtype=np.int32)[1], dtype=wp.int32, device=device)
    course.regenerate(mask=one, advance=False)
    assert course.result.valid.numpy()[1] == 0
    pos, quat, he = agents(device)
    course.bind(position=pos, orientation=quat, half_extents=he)
    place(course, pos, np.zeros(E, int))
    res = course.step()
    assert res.contacts.oob.numpy()[1] == 1 and res.events.dist_to_next.numpy()[1] == 0
    assert np.isnan(res.frame.s.numpy()[1]) and np.isnan(res.frame.n.numpy()[1])
    assert res.events.passed.numpy()[1] == 0
    course.reset(one)
    course.step()
    assert course.result.valid.numpy()[1] == 0 and res.contacts.oob.numpy()[1] == 1
    assert np.isfinite(np.delete(res.frame.s.numpy(), 1)).all()


def test_host_recipe_runs_and_no_nan_reaches_reward_or_observation(device):
    course = build(device, 16, seeds=3)
    out = host_recipe(course, steps=200, max_laps=1)
    assert np.isfinite(out["rewards"]).all() and np.isfinite(out["observations"]).all()
    assert out["regenerated"] >= 16  # every env finished at least one lap and got a new course
    assert (course.result.generation.numpy() >= 1).all()


def test_graph_recipe_records_and_replays(device):
    course = build(device, 16, seeds=8)
    rewards, observations, generations = graph_recipe(course, device, steps=150, max_laps=1)
    assert np.isfinite(rewards).all() and np.isfinite(observations).all()
    assert (generations[-1] > generations[0]).all()  # every env got new courses by replay


def gates_course(device, num_envs=4, collision=0.02, gate_width=0.1, seeds=2):
    return Course.gates(presets.gates(num_envs=num_envs, device=device, gate_width=gate_width),
                        collision=collision, seeds=seeds)


def unwrapped_arc(points, count, length, ds):
    """Arc length driven after ``points`` course-line points (the index wraps at ``count``)."""
    return (points % count) * ds + (points // count) * length


def post_hits(course, positions, hx, hy, radius):
    """Oracle: does an axis-aligned box of half extents (hx, hy) at each
    position come within ``radius`` of a post?"""
    r = course.result
    out = np.zeros(course.num_envs, np.int32)
    for e in range(course.num_envs):
        posts = r.posts.numpy()[e, :r.num_gates.numpy()[e]].reshape(-1, 3)[:, :2]
        d = np.abs(posts - positions[e, :2])
        gap = np.hypot(np.maximum(d[:, 0] - hx, 0), np.maximum(d[:, 1] - hy, 0))
        out[e] = int((gap <= radius).any())
    return out


def test_gate_course_counts_gates_passed_in_order_and_laps(device):
    course = gates_course(device)
    r = course.result
    pos, quat, he = agents(device, 4)
    course.bind(position=pos, orientation=quat, half_extents=he)
    count, num = r.count.numpy(), r.num_gates.numpy()
    total = np.zeros(4, int)
    steps = int(count.max()) // 2 + 8
    for step in range(steps):
        place(course, pos, (2 * step) % count)
        res = course.step()
        total += res.events.passed.numpy()
        np.testing.assert_array_equal(res.contacts.hit.numpy(), post_hits(course, pos.numpy(), 0.02, 0.01, 0.02))
    gate_arc, length = r.gate_arc.numpy(), r.length.numpy()
    travelled = unwrapped_arc(2 * (steps - 1), count, length, course.generator.spec.ds)
    for e in range(4):
        arcs = np.r_[gate_arc[e, 1:num[e]], length[e]]  # gates 1..G-1, then gate 0 after a lap
        arcs = np.r_[arcs, arcs + length[e]]
        assert total[e] == int(np.sum(arcs <= travelled[e] + 1e-4)), e
    np.testing.assert_array_equal(res.events.laps.numpy(), (travelled >= length - 1e-4).astype(int))
    assert np.isfinite(res.events.dist_to_next.numpy()).all()


def test_post_discs_and_frames(device):
    course = gates_course(device, collision=0.02)
    r = course.result
    pos, quat, he = agents(device, 4)
    course.bind(position=pos, orientation=quat, half_extents=he)
    post = r.posts.numpy()[:, 1, 0]  # gate 1's left post, every env
    pos.assign(post.astype(np.float32))
    assert (course.step().contacts.hit.numpy() == 1).all()
    framed = gates_course(device, collision="frames")
    r = framed.result
    pos, quat, he = agents(device, 4)
    framed.bind(position=pos, orientation=quat, half_extents=he)
    c, nrm = r.gate_center.numpy()[:, 1], r.gate_normal.numpy()[:, 1]
    tangent = np.stack([np.array([nrm[e, 1], -nrm[e, 0], 0.0]) for e in range(4)])
    outside = c + 0.08 * nrm  # beyond the left post (0.05 from the centre), within a gate width
    pos.assign((outside - 0.03 * tangent).astype(np.float32))
    framed.step()
    pos.assign((outside + 0.03 * tangent).astype(np.float32))
    res = framed.step()
    assert (res.contacts.frames.numpy() == 1).all() and (res.events.passed.numpy() == 0).all()


def test_invalid_gate_envs_have_no_contact_and_frozen_progress(device):
    course = gates_course(device, gate_width=1.4, seeds=11, num_envs=16)
    r = course.result
    bad = np.nonzero(r.valid.numpy() == 0)[0]
    assert len(bad) > 0
    pos, quat, he = agents(device, 16)
    course.bind(position=pos, orientation=quat, half_extents=he)
    res = course.step()
    assert (res.contacts.hit.numpy()[bad] == 0).all()
    assert np.isnan(res.frame.s.numpy()[bad]).all() and (res.events.dist_to_next.numpy()[bad] == 0).all()
