"""`racing_env.geometry`, the loop's segments and normals written once for
NumPy and JAX, against plain-Python loops on random padded loops of odd
sizes, on a square, and in both array libraries; `road_geometry` (where a
car sits on its road) on hand-built straight and circular roads."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from oracles import wheel_points
from racing_env import ProjectConfig, geometry

CONFIG = ProjectConfig()


def reference_segments(points: np.ndarray, count: int) -> tuple[list, list]:
    """Segment i of the loop of the first ``count`` points, one at a time."""
    following, lengths = [], []
    for i in range(points.shape[0]):
        if i < count:
            end = points[(i + 1) % count]
            following.append(end)
            lengths.append(math.dist(points[i], end))
        else:
            following.append(points[(i + 1) % points.shape[0]])
            lengths.append(0.0)
    return following, lengths


def reference_normals(points: np.ndarray) -> list:
    n, out = points.shape[0], []
    for i in range(n):
        tx, ty = points[(i + 1) % n] - points[i - 1]
        length = math.hypot(tx, ty)
        out.append((-ty / length, tx / length))
    return out


@pytest.mark.parametrize("n, count", [(3, 3), (7, 4), (11, 11), (64, 37)])
def test_segments_close_each_loop_at_its_last_used_point(n, count):
    rng = np.random.default_rng(n)
    points = rng.normal(0.0, 10.0, (2, n, 2))
    counts = np.array([count, n])
    following, lengths = geometry.loop_segments(np, points, counts)
    for row in range(2):
        want_following, want_lengths = reference_segments(points[row], int(counts[row]))
        np.testing.assert_allclose(lengths[row], want_lengths, rtol=1e-15)
        used = int(counts[row])
        np.testing.assert_array_equal(following[row, :used], np.asarray(want_following)[:used])
        assert lengths[row, used:].sum() == 0.0
    got_f32 = geometry.loop_segments(jnp, jnp.asarray(points, jnp.float32), jnp.asarray(counts))[1]
    np.testing.assert_allclose(np.asarray(got_f32), lengths, rtol=1e-5, atol=1e-5)


def test_a_square_has_sides_of_its_length_and_normals_into_it():
    square = np.array([[0.0, 0.0], [2.0, 0.0], [2.0, 2.0], [0.0, 2.0]])  # anticlockwise
    _, lengths = geometry.loop_segments(np, square, np.asarray(4))
    assert lengths.tolist() == [2.0, 2.0, 2.0, 2.0]
    normals = geometry.left_normals(np, geometry.loop_tangents(np, square))
    root = 1 / math.sqrt(2)
    np.testing.assert_allclose(normals, [[root, root], [-root, root], [-root, -root], [root, -root]], atol=1e-15)
    centre_side = (np.array([1.0, 1.0]) - square) * normals  # the left of an anticlockwise loop is its inside
    assert (centre_side.sum(axis=1) > 0).all()


@pytest.mark.parametrize("n", [3, 8, 301])
def test_normals_are_unit_left_turns_of_the_central_differences(n):
    rng = np.random.default_rng(n)
    points = rng.normal(0.0, 5.0, (n, 2))
    tangents = geometry.loop_tangents(np, points)
    normals = geometry.left_normals(np, tangents)
    np.testing.assert_allclose(normals, reference_normals(points), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(normals, axis=1), 1.0, rtol=1e-14)
    assert np.abs((normals * tangents).sum(axis=1)).max() < 1e-9  # perpendicular
    assert (tangents[:, 0] * normals[:, 1] - tangents[:, 1] * normals[:, 0] > 0).all()  # to the left
    in_jax = geometry.left_normals(jnp, geometry.loop_tangents(jnp, jnp.asarray(points, jnp.float32)))
    np.testing.assert_allclose(np.asarray(in_jax), normals, atol=1e-5)


def wrap(angle):
    """Angles into (-pi, pi], float64."""
    return np.angle(np.exp(1j * np.asarray(angle, np.float64)))


def wheels_by_hand(position, yaw, wheelbase, track_width):
    """[E, 4, 2] front left, front right, rear left, rear right, float64."""
    return np.stack([wheel_points(p, y, wheelbase, track_width) for p, y in zip(position, yaw)])


# ----------------------------------------------------------------- road_geometry on hand-built roads


@pytest.mark.parametrize("xp", [np, jnp], ids=["numpy", "jax"])
@pytest.mark.parametrize("worlds", [1, 7])
@pytest.mark.parametrize("wheelbase, track_width", [(2.6, 1.6), (3.3, 2.1)])
def test_road_geometry_on_a_straight_road(xp, worlds, wheelbase, track_width):
    """Centerline along +x or -x, the left boundary at y = +-w_i (a width
    that changes along the road): the lateral offset is y (signed to the
    driving direction's left), the heading error the yaw less the road's
    direction, the half width w at the rear axle's nearest point and each
    wheel's margin w - |y_wheel|. The padding past each track's points sits
    right on the car, where an unmasked search would find it."""
    rng = np.random.default_rng(worlds + int(10 * wheelbase))
    capacity = 300
    centerline = np.zeros((worlds, capacity, 2), np.float32)
    left = np.zeros((worlds, capacity, 2), np.float32)
    position = np.zeros((worlds, 2), np.float32)
    want_nearest, want_lateral, want_heading, want_along, half = [], [], [], [], np.zeros(worlds)
    direction = rng.choice([-1.0, 1.0], worlds)
    yaw = rng.uniform(-3 * np.pi, 3 * np.pi, worlds).astype(np.float32)
    count = rng.integers(120, capacity + 1, worlds)
    for w in range(worlds):
        n, spacing, x0 = count[w], rng.uniform(0.5, 1.5), rng.uniform(-50.0, 50.0)
        x = x0 + direction[w] * spacing * np.arange(n)
        width = rng.uniform(2.0, 7.0) * (1 + 0.3 * np.sin(np.arange(n) / 3.0))
        centerline[w, :n, 0] = x
        left[w, :n] = np.stack([x, direction[w] * width], 1)
        i = rng.integers(40, n - 40)  # far from the loop's closing segment
        half[w] = np.float32(width[i])
        fraction = rng.uniform(-0.45, 0.45)
        position[w] = [x[i] + direction[w] * fraction * spacing, rng.uniform(-1.6, 1.6) * half[w]]
        centerline[w, n:] = left[w, n:] = position[w]
        want_nearest.append(i)
        want_along.append(i + fraction)
        want_lateral.append(direction[w] * position[w, 1])
        want_heading.append(yaw[w] - (0.0 if direction[w] > 0 else np.pi))
    wheels = wheels_by_hand(position.astype(np.float64), yaw.astype(np.float64), wheelbase, track_width)
    want_margins = half[:, None] - np.abs(wheels[..., 1])

    nearest, half_width, lateral, heading, margins, along = (np.asarray(v) for v in geometry.road_geometry(
        xp, xp.asarray(position), xp.asarray(yaw), xp.asarray(centerline), xp.asarray(left),
        xp.asarray(count.astype(np.int32)), wheelbase, track_width))

    assert half_width.shape == lateral.shape == heading.shape == (worlds,) and margins.shape == (worlds, 4)
    assert all(v.dtype == np.float32 for v in (half_width, lateral, heading, margins, along))
    np.testing.assert_array_equal(nearest, want_nearest)
    np.testing.assert_allclose(along, want_along, atol=1e-3)  # float32 of up to 300 points
    np.testing.assert_allclose(half_width, half, atol=1e-5)
    np.testing.assert_allclose(lateral, want_lateral, atol=1e-4)
    assert np.all((heading > -np.pi - 1e-6) & (heading <= np.pi + 1e-6))
    np.testing.assert_allclose(wrap(heading - np.asarray(want_heading)), 0.0, atol=1e-5)
    np.testing.assert_allclose(margins, want_margins, atol=1e-4)


@pytest.mark.parametrize("xp", [np, jnp], ids=["numpy", "jax"])
@pytest.mark.parametrize("turn", [1, -1], ids=["counter-clockwise", "clockwise"])
def test_road_geometry_on_a_circle(xp, turn):
    """A circle of radius R in N points: driving counter-clockwise the left is
    the inside (lateral = R - distance from the centre), clockwise the
    outside; the heading error is the yaw less the tangent's angle. The
    polygon departs from the circle by its sagitta in distance and by about
    half a segment's turn in direction."""
    rng = np.random.default_rng(7 + turn)
    worlds, n, radius, w = 64, 400, 60.0, 4.0
    theta = turn * 2 * np.pi * np.arange(n) / n + 0.3
    ring = np.stack([np.cos(theta), np.sin(theta)], 1)
    centerline = np.zeros((worlds, 512, 2), np.float32)
    left = np.zeros((worlds, 512, 2), np.float32)
    centerline[:, :n] = radius * ring + [5.0, -3.0]
    left[:, :n] = (radius - turn * w) * ring + [5.0, -3.0]
    angle = rng.uniform(-np.pi, np.pi, worlds)
    distance = radius + rng.uniform(-1.5 * w, 1.5 * w, worlds)
    position = (distance[:, None] * np.stack([np.cos(angle), np.sin(angle)], 1) + [5.0, -3.0]).astype(np.float32)
    yaw = rng.uniform(-np.pi, np.pi, worlds).astype(np.float32)

    _, half_width, lateral, heading, margins, along = (np.asarray(v) for v in geometry.road_geometry(
        xp, xp.asarray(position), xp.asarray(yaw), xp.asarray(centerline), xp.asarray(left),
        xp.full(worlds, n, xp.int32), CONFIG.wheelbase_m, CONFIG.track_width_m))

    sagitta = radius * (1 - math.cos(math.pi / n))
    np.testing.assert_allclose(half_width, w, atol=1e-4)
    np.testing.assert_allclose(lateral, turn * (radius - distance), atol=sagitta + 1e-4)
    tangent = angle + turn * np.pi / 2
    # The nearest segment's middle lies within half a segment of the car's
    # angle, or, in the wedge outside a vertex (up to 1.5 w out), a little more.
    np.testing.assert_allclose(wrap(heading - (yaw - tangent)), 0.0, atol=np.pi / n * (1 + 1.5 * w / radius) + 1e-5)
    wheels = wheels_by_hand(position.astype(np.float64) - [5.0, -3.0], yaw.astype(np.float64),
                            CONFIG.wheelbase_m, CONFIG.track_width_m)
    want = w - np.abs(radius - np.linalg.norm(wheels, axis=-1))
    np.testing.assert_allclose(margins, want, atol=sagitta + 1e-4)
    # The projection, in points along the polygon, against the car's angle: on a chord of
    # half angle h, a point at distance d and angle delta from its middle projects to
    # 1/2 + (d / R) sin(delta) / (2 sin h), the angle's fraction to 1/2 + delta / (2 h).
    points = wrap(turn * (angle - 0.3)) / (2 * np.pi / n)
    np.testing.assert_allclose(wrap((along - points) * 2 * np.pi / n), 0.0,
                               atol=2 * np.pi / n * (0.5 * 1.5 * w / radius + 1e-3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7, 2), (3, 5, 11, 2), (1, 640, 2)])
def test_a_pair_sum_is_numpys_reduction_bit_for_bit(dtype, shape):
    """NumPy's sum over an axis of two numbers is their one sum: the
    faster form gives its very bits (infinities and the squares and
    products the geometry sums included), but for two negative zeros
    (-0.0 here, +0.0 from the reduction); JAX keeps its reduction."""
    rng = np.random.default_rng(len(shape))
    v = (rng.normal(size=shape) * 10.0 ** rng.integers(-30, 30, size=shape)).astype(dtype)
    v.flat[:4] = [-0.0, -0.0, np.inf, -1.0]
    with np.errstate(over="ignore"):  # products past the dtype's range: infinities, summed as any other
        products = (v * v, v * v[..., ::-1])
    for value in (v, *products):
        got = geometry._pair_sum(np, value)
        want = np.sum(value, axis=-1)
        assert got.dtype == dtype and (got + 0.0).tobytes() == want.tobytes()  # + 0.0: -0.0 to +0.0
    assert np.signbit(geometry._pair_sum(np, v).flat[0]) and not np.signbit(np.sum(v, axis=-1).flat[0])
    assert np.array_equal(np.asarray(geometry._pair_sum(jnp, jnp.asarray(v, jnp.float32))),
                          np.asarray(jnp.sum(jnp.asarray(v, jnp.float32), axis=-1)), equal_nan=True)
