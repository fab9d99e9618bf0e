"""SDF queries (distance, normal, nearest) against an independent NumPy oracle:
a bilinear interpolation of the baked grid, and the exact signed distance to
the boundary computed from the course line."""

import numpy as np
import pytest
import warp as wp

import oracle
from track_gen import queries
from track_gen.course import Course
from track_gen.pipeline import presets

DEVICE = "cpu"
RES = 96  # cells of about 4.5 cm on default tracks


def build(num_envs=3, seeds=5, sdf_resolution=RES, **spec):
    return Course.track(presets.track(num_envs=num_envs, device=DEVICE, sdf_resolution=sdf_resolution, **spec),
                        seeds=seeds)


@pytest.fixture(scope="module")
def course():
    c = build()
    assert c.result.valid.numpy().all()
    return c


def warp_points(pts, dtype=wp.vec2):
    return wp.array(np.ascontiguousarray(pts, dtype=np.float32), dtype=dtype, device=DEVICE)


def grid(r, e):
    """Env ``e``'s bake: values, lower corner, cell size and the clamp ``+width / 2``."""
    return (r.sdf.numpy()[e].astype(np.float64), r.sdf_origin.numpy()[e].astype(np.float64),
            float(r.sdf_cell.numpy()[e]), 0.5 * float(r.width.numpy()[e]))


def bilinear(r, e, pts):
    """Oracle: the documented rule at ``pts`` [M, 2] (float64): cell ``(ix, iy)``'s
    value at ``origin + cell * (ix + 1/2, iy + 1/2)``, bilinear in between,
    the clamp beyond the square of the cell centres. Returns the value and
    whether the four cells around each point are exact (below the clamp)."""
    sdf, origin, cell, clamp = grid(r, e)
    res = sdf.shape[0]
    g = (pts - origin) / cell - 0.5
    inside = np.all((g >= 0) & (g <= res - 1), axis=1)
    i0 = np.clip(np.floor(np.nan_to_num(g)), 0, max(res - 2, 0)).astype(int)
    i1 = np.minimum(i0 + 1, res - 1)
    f = g - i0
    v00, v10 = sdf[i0[:, 1], i0[:, 0]], sdf[i0[:, 1], i1[:, 0]]
    v01, v11 = sdf[i1[:, 1], i0[:, 0]], sdf[i1[:, 1], i1[:, 0]]
    fx, fy = f[:, 0], f[:, 1]
    low, high = v00 + fx * (v10 - v00), v01 + fx * (v11 - v01)
    value = low + fy * (high - low)
    exact = inside & (np.max([v00, v10, v01, v11], axis=0) < clamp)
    return np.where(inside, value, clamp), exact


def exact_sdf(r, e, pts):
    """Oracle: signed distance of ``pts`` [M, 2] to the track boundary, ``|p - closest
    point of the closed course line| - width / 2``, and the unit direction from
    that closest point to ``p`` (the exact outward normal off the centre line)."""
    line = oracle.course_line(r.center.numpy()[e], int(r.count.numpy()[e]))
    a, ab = line, np.roll(line, -1, axis=0) - line
    t = np.clip(np.einsum("qnk,nk->qn", pts[:, None] - a[None], ab) / np.sum(ab * ab, 1), 0, 1)
    foot = a[None] + t[..., None] * ab[None]
    dist = np.linalg.norm(pts[:, None] - foot, axis=-1)
    k = dist.argmin(1)
    m = np.arange(len(pts))
    return dist[m, k] - 0.5 * float(r.width.numpy()[e]), (pts - foot[m, k]) / dist[m, k, None]


def line_frame(r, e):
    """The course line and its unit left normals (central differences), NumPy."""
    line = oracle.course_line(r.center.numpy()[e], int(r.count.numpy()[e]))
    t = np.roll(line, -1, axis=0) - np.roll(line, 1, axis=0)
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    return line, np.stack([-t[:, 1], t[:, 0]], axis=1)


def max_turning(r, e):
    """Largest angle between consecutive course-line segments (rad)."""
    line = oracle.course_line(r.center.numpy()[e], int(r.count.numpy()[e]))
    u, v = line - np.roll(line, 1, axis=0), np.roll(line, -1, axis=0) - line
    return float(np.max(np.abs(np.arctan2(u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0], np.sum(u * v, 1)))))


def random_in_grid(r, p, rng, spill=1.5):
    """``[E, p, 2]`` float32-exact points uniform over each grid (``spill``
    cells beyond it), none within 1e-3 cells of a line through cell centres
    (where the cell a point falls in, in float32, could differ)."""
    out = np.empty((r.sdf.shape[0], p, 2))
    res = r.sdf.shape[1]
    for e in range(r.sdf.shape[0]):
        _, origin, cell, _ = grid(r, e)
        g = rng.uniform(-spill, res - 1 + spill, size=(4 * p, 2))
        g = g[np.all(np.abs(g - np.round(g)) > 1e-3, axis=1)][:p]
        out[e] = origin + cell * (g + 0.5)
    return out.astype(np.float32).astype(np.float64)


def near_boundary(r, p, rng, cells):
    """``[E, p, 2]`` points within ``cells`` cells of the boundaries (either
    side of each, on either side of the track), off course-line points along
    their normals."""
    out = np.empty((r.sdf.shape[0], p, 2))
    for e in range(r.sdf.shape[0]):
        line, left = line_frame(r, e)
        _, _, h, half = grid(r, e)
        i = rng.integers(0, len(line), p)
        offset = half + rng.uniform(-cells, cells, p) * h
        out[e] = line[i] + (rng.choice([-1.0, 1.0], p) * offset)[:, None] * left[i]
    return out.astype(np.float32).astype(np.float64)


def well_inside(r, p, rng):
    """``[E, p, 2]`` points within a quarter width of the course line."""
    out = np.empty((r.sdf.shape[0], p, 2))
    for e in range(r.sdf.shape[0]):
        line, left = line_frame(r, e)
        i = rng.integers(0, len(line), p)
        out[e] = line[i] + rng.uniform(-0.5, 0.5, (p, 1)) * grid(r, e)[3] * left[i]
    return out.astype(np.float32).astype(np.float64)


def near_tolerance(r, e, cells):
    """Bounds on the overestimate and the underestimate of the distance at
    points within ``cells`` cells of the boundary, where the field is smooth:
    each distance to a point of the course line is convex with Hessian at
    most ``1 / r`` (``r``: how far the point's cell lies from the line), so
    bilinear interpolation overestimates by at most ``h^2 / (4 r)``; it
    underestimates only at the field's kinks behind the line's vertices (a
    gradient jump of at most the turning angle ``a``), by at most
    ``a * h / (2 sqrt(2))``."""
    _, _, h, half = grid(r, e)
    reach = half - cells * h - h / np.sqrt(2)
    return h * h / (4 * reach), max_turning(r, e) * h / (2 * np.sqrt(2))


def test_distance_is_the_bilinear_interpolation_of_the_bake(course):
    r = course.result
    pts = random_in_grid(r, 400, np.random.default_rng(0))
    d = queries.distance(r, warp_points(pts)).numpy()
    assert d.shape == (3, 400) and d.dtype == np.float32
    for e in range(3):
        want, _ = bilinear(r, e, pts[e])
        np.testing.assert_allclose(d[e], want, atol=2e-6, rtol=0)


def test_distance_is_within_the_interpolation_error_of_the_exact_distance(course):
    """Bilinear interpolation of a 1-Lipschitz field is within ``h / sqrt(2)``
    of it (the weighted distance to the four cell centres, largest at a
    cell's middle) wherever the four cells are exact: anywhere, the centre
    line's ridge included. Near the boundary: ``near_tolerance``."""
    r = course.result
    rng = np.random.default_rng(1)
    pts = np.concatenate([random_in_grid(r, 300, rng), near_boundary(r, 300, rng, 1.0), well_inside(r, 300, rng)],
                         axis=1)
    d = queries.distance(r, warp_points(pts)).numpy()
    near = near_boundary(r, 400, rng, 0.5)
    d_near = queries.distance(r, warp_points(near)).numpy()
    for e in range(3):
        _, _, h, half = grid(r, e)
        _, exact = bilinear(r, e, pts[e])
        truth, _ = exact_sdf(r, e, pts[e])
        assert exact[300:].all() and exact.sum() > 600
        assert np.abs(d[e] - truth)[exact].max() <= h / np.sqrt(2) + 1e-5
        assert np.all(d[e] <= half)

        truth, _ = exact_sdf(r, e, near[e])
        over, under = near_tolerance(r, e, 0.5)
        assert over + under < 0.25 * h  # tight enough to tell a half-cell shift of the grid apart
        assert np.all(d_near[e] - truth <= over + 1e-5) and np.all(truth - d_near[e] <= under + 1e-5)


def test_normal_is_the_unit_gradient_of_the_interpolated_field(course):
    r = course.result
    rng = np.random.default_rng(2)
    pts = random_in_grid(r, 400, rng)
    n = queries.normal(r, warp_points(pts)).numpy()
    assert n.shape == (3, 400, 2) and n.dtype == np.float32
    for e in range(3):
        h = grid(r, e)[2]
        _, exact = bilinear(r, e, pts[e])
        eps = 1e-4 * h  # the points stay 1e-3 cells from a cell line: one cell each side
        fd = np.stack([(bilinear(r, e, pts[e] + eps * u)[0] - bilinear(r, e, pts[e] - eps * u)[0]) / (2 * eps)
                       for u in np.eye(2)], axis=1)
        size = np.linalg.norm(fd, axis=1)
        ok = exact & (size > 1e-6)
        assert ok.sum() > 20
        assert np.isnan(n[e, ~exact]).all()
        np.testing.assert_allclose(np.linalg.norm(n[e, ok], axis=1), 1, atol=1e-5)
        np.testing.assert_allclose(n[e, ok], fd[ok] / size[ok, None], atol=1e-4)

    near = near_boundary(r, 300, rng, 0.5)
    n = queries.normal(r, warp_points(near)).numpy()
    for e in range(3):
        _, outward = exact_sdf(r, e, near[e])
        assert np.isfinite(n[e]).all()
        assert np.sum(n[e] * outward, axis=1).min() > 0.94  # out of the track, within 20 degrees


def test_nearest_lies_on_the_boundary(course):
    """``|f(p - d n)| <= |d - f(p)| + |f(p)| |n - grad f|`` (``f`` is
    1-Lipschitz and zero at the true nearest point ``p - f grad f``): with the
    distance's tolerance near the boundary and ``|n - grad f| <= 0.35``
    (within 20 degrees), a fraction of a cell at points half a cell from it."""
    r = course.result
    near = near_boundary(r, 400, np.random.default_rng(3), 0.5)
    out = queries.query(r, warp_points(near))
    q, d, n = out.nearest.numpy(), out.distance.numpy(), out.normal.numpy()
    np.testing.assert_allclose(q, near - d[..., None] * n, atol=1e-5)
    for e in range(3):
        truth, outward = exact_sdf(r, e, near[e])
        assert np.sum(n[e] * outward, axis=1).min() > 0.94
        over, under = near_tolerance(r, e, 0.5)
        on_boundary, _ = exact_sdf(r, e, q[e].astype(np.float64))
        assert np.all(np.abs(on_boundary) <= max(over, under) + 0.35 * np.abs(truth) + 1e-5)
        assert np.abs(on_boundary).mean() < np.abs(truth).mean() / 5  # far closer than where it started


def test_outside_the_grid_and_at_the_clamp(course):
    """Beyond the square of the cell centres (the half-cell rim included):
    distance ``+width/2``, normal and nearest NaN; where a cell around the
    point holds the clamp: the interpolated distance, normal and nearest NaN."""
    r = course.result
    e = 1
    sdf, origin, h, half = grid(r, e)
    res = sdf.shape[0]
    top = origin + res * h
    rim = [origin + 0.25 * h, top - 0.25 * h, [origin[0] + 0.25 * h, 0.5 * (origin[1] + top[1])]]
    far = [origin - 1.0, top + 5.0, [top[0] + 0.1, origin[1] + 3 * h]]
    full = np.argwhere(np.all([sdf[:-1, :-1] >= half, sdf[1:, :-1] >= half, sdf[:-1, 1:] >= half,
                               sdf[1:, 1:] >= half], axis=0))
    iy, ix = full[len(full) // 2]
    clamped = origin + h * (np.array([ix, iy]) + 0.8)  # in a cell whose four corners are clamped
    pts = np.array(rim + far + [clamped])
    out = queries.query(r, warp_points(np.broadcast_to(pts, (3,) + pts.shape)))
    d, n, q = out.distance.numpy()[e], out.normal.numpy()[e], out.nearest.numpy()[e]
    assert np.all(d == np.float32(half)) and np.isnan(n).all() and np.isnan(q).all()

    pts = random_in_grid(r, 300, np.random.default_rng(4), spill=0.0)
    out = queries.query(r, warp_points(pts))
    want, exact = bilinear(r, e, pts[e])
    mixed = ~exact & (want < half)
    assert mixed.any() and (~exact & (want == half)).any()
    np.testing.assert_allclose(out.distance.numpy()[e][~exact], want[~exact], atol=2e-6)
    assert np.isnan(out.normal.numpy()[e][~exact]).all() and np.isnan(out.nearest.numpy()[e][~exact]).all()


def test_non_finite_points_give_nan_and_z_is_ignored(course):
    r = course.result
    line, _ = line_frame(r, 0)
    pts = np.repeat(line[None, :5], 3, axis=0)
    pts[:, 1] = [np.nan, 0.0]
    pts[:, 2] = [np.inf, 0.0]
    out = queries.query(r, warp_points(pts))
    for a in (out.distance.numpy(), out.normal.numpy(), out.nearest.numpy()):
        assert np.isnan(a[:, 1:3]).all() and np.isfinite(a[0, [0, 3, 4]]).all()
    z = np.random.default_rng(5).uniform(-3, 3, pts.shape[:2] + (1,))
    out3 = queries.query(r, warp_points(np.concatenate([pts, z], axis=-1), wp.vec3))
    for a, b in ((out.distance, out3.distance), (out.normal, out3.normal), (out.nearest, out3.nearest)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_invalid_envs_answer_nan():
    wide = build(2, sdf_resolution=16, width=2.5)  # too wide for any bend: every env invalid
    assert not wide.result.valid.numpy().any()
    line, _ = line_frame(wide.result, 0)
    pts = np.repeat(line[None, ::20], 2, axis=0)
    out = queries.query(wide.result, warp_points(pts))
    for a in (out.distance, out.normal, out.nearest, queries.distance(wide.result, warp_points(pts))):
        assert np.isnan(a.numpy()).all()

    mixed = build(6, seeds=4, sdf_resolution=24, width=0.6)  # envs 0 and 5 invalid
    valid = mixed.result.valid.numpy().astype(bool)
    assert valid.any() and not valid.all()
    pts = np.stack([line_frame(mixed.result, e)[0][:7] for e in range(6)])  # on each course line
    d = queries.distance(mixed.result, warp_points(pts)).numpy()
    assert np.isnan(d[~valid]).all() and np.isfinite(d[valid]).all() and (d[valid] < 0).all()
    for e in np.flatnonzero(valid):
        np.testing.assert_allclose(d[e], bilinear(mixed.result, e, pts[e])[0], atol=2e-6)


@pytest.mark.parametrize("num_envs, p", [(1, 1), (1, 7), (2, 1), (2, 7)])
def test_odd_shapes(num_envs, p):
    c = build(num_envs, seeds=9, sdf_resolution=24)
    r = c.result
    pts = random_in_grid(r, p, np.random.default_rng(p), spill=0.0)
    out = queries.query(r, warp_points(pts))
    assert out.distance.shape == (num_envs, p) and out.normal.shape == out.nearest.shape == (num_envs, p)
    for e in range(num_envs):
        np.testing.assert_allclose(out.distance.numpy()[e], bilinear(r, e, pts[e])[0], atol=2e-6)


def test_a_one_cell_grid_answers_the_clamp_off_its_centre():
    r = build(1, sdf_resolution=1).result
    sdf, origin, h, half = grid(r, 0)
    pts = np.array([[origin + 0.3 * h, origin + 0.5 * h, origin + 0.7 * h]])
    out = queries.query(r, warp_points(pts))
    d = out.distance.numpy()[0]
    assert d[0] == d[2] == np.float32(half)
    assert d[1] in (np.float32(sdf[0, 0]), np.float32(half))  # the centre itself, up to rounding
    assert np.isnan(out.normal.numpy()).all()  # no gradient on one cell


def test_out_arrays_are_written_in_place_and_record_one_launch(course):
    r = course.result
    rng = np.random.default_rng(6)
    pts = warp_points(near_boundary(r, 7, rng, 0.5))
    fresh = queries.query(r, pts)
    bufs = {name: wp.full((3, 7), value, dtype=dtype, device=DEVICE)
            for name, value, dtype in (("distance", 9.0, wp.float32), ("normal", wp.vec2(9.0, 9.0), wp.vec2),
                                       ("nearest", wp.vec2(9.0, 9.0), wp.vec2))}
    assert queries.distance(r, pts, out=bufs["distance"]) is bufs["distance"]
    assert queries.normal(r, pts, out=bufs["normal"]) is bufs["normal"]
    assert queries.nearest(r, pts, out=bufs["nearest"]) is bufs["nearest"]
    both = queries.QueryResult(**{k: wp.zeros_like(v) for k, v in bufs.items()})
    assert queries.query(r, pts, out=both) is both
    for name, buf in bufs.items():
        np.testing.assert_array_equal(buf.numpy(), getattr(fresh, name).numpy())
        np.testing.assert_array_equal(getattr(both, name).numpy(), getattr(fresh, name).numpy())

    with wp.ScopedCapture(device=DEVICE) as cap:  # no allocation, one launch: recordable
        queries.query(r, pts, out=both)
    assert cap.graph._apic_capture.operation_count == 1
    moved = near_boundary(r, 7, rng, 0.5)
    pts.assign(moved.astype(np.float32))
    wp.capture_launch(cap.graph)
    np.testing.assert_array_equal(both.distance.numpy(), queries.distance(r, warp_points(moved)).numpy())


def test_a_gate_result_is_refused():
    gates = Course.gates(presets.gates(num_envs=2, device=DEVICE), seeds=1)
    pts = wp.zeros((2, 3), dtype=wp.vec2, device=DEVICE)
    for fn in (queries.distance, queries.normal, queries.nearest, queries.query):
        with pytest.raises(TypeError, match="result must be a TrackResult.*GateResult"):
            fn(gates.result, pts)


def bad_inputs():
    z = lambda shape, dtype=wp.vec2: wp.zeros(shape, dtype=dtype, device=DEVICE)  # noqa: E731
    good = z((3, 4))
    return [
        (dict(result=object()), TypeError, "result must be a TrackResult, got object"),
        (dict(points=np.zeros((3, 4, 2), np.float32)), TypeError, "points must be a warp array"),
        (dict(points=z((3, 4), wp.float32)), TypeError, "points must have dtype vec2f or vec3f, got float32"),
        (dict(points=z((3, 4), wp.vec2d)), TypeError, "points must have dtype vec2f or vec3f, got vec2d"),
        (dict(points=z(3)), ValueError, r"points must have shape \[E, P\] = \[3, P >= 1\], got \[3\]"),
        (dict(points=z((3, 4, 1))), ValueError, r"points must have shape .*got \[3, 4, 1\]"),
        (dict(points=z((2, 4))), ValueError, r"points must have shape .*got \[2, 4\]"),
        (dict(points=z((3, 0))), ValueError, r"points must have shape .*got \[3, 0\]"),
        (dict(out=good.numpy()), TypeError, "out must be a warp array"),
        (dict(out=z((3, 4), wp.float64)), TypeError, "out must have dtype float32, got float64"),
        (dict(out=z((3, 5), wp.float32)), ValueError, r"out must have the points' shape \[3, 4\], got \[3, 5\]"),
        (dict(stream="default"), TypeError, "stream must be a wp.Stream"),
    ]


@pytest.mark.parametrize("args, error, message", bad_inputs())
def test_bad_inputs_raise_naming_the_argument_before_anything_runs(course, args, error, message):
    sentinel = wp.full((3, 4), 7.0, dtype=wp.float32, device=DEVICE)
    call = dict(result=course.result, points=wp.zeros((3, 4), dtype=wp.vec2, device=DEVICE), out=sentinel)
    call.update(args)
    with pytest.raises(error, match=message):
        queries.distance(**call)
    assert (sentinel.numpy() == 7.0).all()


def test_bad_out_arrays_of_normal_nearest_and_query(course):
    r = course.result
    pts = wp.zeros((3, 4), dtype=wp.vec2, device=DEVICE)
    wrong = wp.zeros((3, 4), dtype=wp.float32, device=DEVICE)
    for fn in (queries.normal, queries.nearest):
        with pytest.raises(TypeError, match="out must have dtype vec2f, got float32"):
            fn(r, pts, out=wrong)
    good = queries.query(r, pts)
    with pytest.raises(TypeError, match="out must be a QueryResult, got tuple"):
        queries.query(r, pts, out=(good.distance, good.normal, good.nearest))
    with pytest.raises(TypeError, match="out.normal must have dtype vec2f, got float32"):
        queries.query(r, pts, out=queries.QueryResult(good.distance, wrong, good.nearest))
    with pytest.raises(ValueError, match=r"out.nearest must have the points' shape \[3, 4\], got \[3, 3\]"):
        queries.query(r, pts, out=queries.QueryResult(good.distance, good.normal,
                                                      wp.zeros((3, 3), dtype=wp.vec2, device=DEVICE)))
    with pytest.raises(ValueError, match="out.normal and out.nearest must be different arrays"):
        queries.query(r, pts, out=queries.QueryResult(good.distance, good.normal, good.normal))


@pytest.mark.gpu
def test_arrays_on_another_device_are_refused(cuda):
    c = build(2, sdf_resolution=16)
    on_gpu = wp.zeros((2, 3), dtype=wp.vec2, device=cuda)
    with pytest.raises(ValueError, match="points must be on the result's device cpu, got cuda:0"):
        queries.distance(c.result, on_gpu)
    pts = wp.zeros((2, 3), dtype=wp.vec2, device=DEVICE)
    with pytest.raises(ValueError, match="out must be on the result's device cpu, got cuda:0"):
        queries.distance(c.result, pts, out=wp.zeros((2, 3), dtype=wp.float32, device=cuda))
    with pytest.raises(ValueError, match="stream must be on the result's device cpu"):
        queries.distance(c.result, pts, stream=wp.get_device(cuda).stream)


@pytest.mark.gpu
def test_cuda_answers_match_cpu(cuda):
    cpu = build(3, sdf_resolution=48)
    gpu = Course.track(presets.track(num_envs=3, device=cuda, sdf_resolution=48), seeds=5)
    pts = random_in_grid(cpu.result, 200, np.random.default_rng(7))
    want = queries.query(cpu.result, warp_points(pts))
    got = queries.query(gpu.result, wp.array(pts.astype(np.float32), dtype=wp.vec2, device=cuda))
    for name in ("distance", "normal", "nearest"):
        np.testing.assert_allclose(getattr(got, name).numpy(), getattr(want, name).numpy(), atol=1e-5)
