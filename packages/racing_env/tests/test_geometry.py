"""`racing_env.geometry`, the loop's segments and normals written once for
NumPy and JAX, against plain-Python loops on random padded loops of odd
sizes, on a square, and in both array libraries."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from racing_env import geometry


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
