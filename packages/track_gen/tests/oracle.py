"""An independent NumPy oracle for course geometry (never the library's routines)."""

from __future__ import annotations

import numpy as np


def course_line(center: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` used points of one env's course line, ``[n, 2]``."""
    return np.asarray(center[:count, :2], dtype=np.float64)


def segments_cross(p: np.ndarray) -> bool:
    """Do two non-adjacent segments of the closed polyline ``p`` cross?"""
    n = len(p)
    a, b = p, np.roll(p, -1, axis=0)
    i, j = np.triu_indices(n, k=2)
    keep = ~((i == 0) & (j == n - 1))  # the seam segments are adjacent
    i, j = i[keep], j[keep]

    def cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
        return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]

    r, s = b[i] - a[i], b[j] - a[j]
    d1, d2 = cross(r, a[j] - a[i]), cross(r, b[j] - a[i])
    d3, d4 = cross(s, a[i] - a[j]), cross(s, b[i] - a[j])
    return bool(np.any((d1 * d2 < 0) & (d3 * d4 < 0)))


def total_turning(p: np.ndarray) -> float:
    u = p - np.roll(p, 1, axis=0)
    v = np.roll(p, -1, axis=0) - p
    return float(np.sum(np.arctan2(u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0], np.sum(u * v, axis=1))))


def min_circumradius(p: np.ndarray, skip_seam: bool = True) -> float:
    """Smallest circumradius of consecutive triples (the two triples around the
    seam's short segment skipped)."""
    a, b, c = np.roll(p, 1, axis=0), p, np.roll(p, -1, axis=0)
    u, v, w = b - a, c - b, c - a
    area2 = np.abs(u[:, 0] * w[:, 1] - u[:, 1] * w[:, 0])
    with np.errstate(divide="ignore"):
        r = np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1) * np.linalg.norm(w, axis=1) / (2 * area2)
    if skip_seam:
        r = r[1:-1]
    return float(np.min(r))


def min_far_distance(p: np.ndarray, window: float, ds: float) -> float:
    """Smallest distance between points more than ``window`` of arc apart."""
    n = len(p)
    idx = np.arange(n)
    gap = np.abs(idx[:, None] - idx[None, :])
    gap = np.minimum(gap, n - gap) * ds
    d = np.linalg.norm(p[:, None] - p[None, :], axis=-1)
    far = gap > window
    return float(d[far].min()) if far.any() else np.inf


def runs_forward(boundary: np.ndarray, line: np.ndarray) -> bool:
    """Does every segment of the closed ``boundary`` (the seam's included) go
    the way the course ``line``'s matching segment goes?"""
    b = np.roll(boundary, -1, axis=0) - boundary
    c = np.roll(line, -1, axis=0) - line
    return bool(np.all(np.sum(b * c, axis=1) > 0))
