"""Pictures of a batch of courses (needs matplotlib: ``pip install track-gen[plot]``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from track_gen.checks import describe

if TYPE_CHECKING:
    from track_gen.course import Course


def save_png(course: Course, path: str | Path, envs: list[int] | None = None, columns: int = 4,
             title: str | None = None) -> Path:
    """Draw courses to a PNG: a track's boundaries and checkpoints, or a gate
    course's bars and posts; the course line; and each env's validity (the
    names of its fail bits when invalid).

    Args:
        course: the batch.
        path: where to write the PNG.
        envs: which envs (default: the first ``2 * columns``).
        columns: panels per row.
        title: a title for the figure.

    Returns:
        ``path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = course.result
    envs = list(range(min(course.num_envs, 2 * columns))) if envs is None else envs
    rows = math.ceil(len(envs) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 3.2 * rows), squeeze=False)
    count, fail, center = r.count.numpy(), r.fail_mask.numpy(), r.center.numpy()
    gates = hasattr(r, "posts")
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, e in zip(axes.flat, envs):
        n = int(count[e])
        closed = np.r_[np.arange(n), 0]
        ok = fail[e] == 0
        edge = "#333333" if ok else "#c0392b"
        if gates:
            _draw_gates(ax, r, e, edge)
        else:
            _draw_track(ax, r, e, n, closed, ok, edge)
        ax.plot(center[e, closed, 0], center[e, closed, 1], color="#999999", lw=0.6, ls="--")
        ax.scatter(center[e, :1, 0], center[e, :1, 1], s=20, marker="s", color="#27ae60", zorder=4)
        label = "valid" if ok else "invalid: " + ", ".join(describe(int(fail[e])))
        ax.set_title(f"env {e}: {label}", fontsize=8, color=edge)
        ax.set_aspect("equal")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _draw_track(ax, r, e: int, n: int, closed: np.ndarray, ok: bool, edge: str) -> None:
    left, right = r.left.numpy()[e], r.right.numpy()[e]
    ax.fill(np.r_[left[:n, 0], right[n - 1::-1, 0]], np.r_[left[:n, 1], right[n - 1::-1, 1]],
            color="#ecf0f1" if ok else "#fadbd8", lw=0)
    ax.plot(left[closed, 0], left[closed, 1], color=edge, lw=1)
    ax.plot(right[closed, 0], right[closed, 1], color=edge, lw=1)
    center, checkpoints = r.center.numpy()[e], r.checkpoints.numpy()[e]
    cp = checkpoints[checkpoints >= 0]
    ax.scatter(center[cp, 0], center[cp, 1], s=6, color="#2980b9", zorder=3)


def _draw_gates(ax, r, e: int, edge: str) -> None:
    g = int(r.num_gates.numpy()[e])
    posts = r.posts.numpy()[e, :g]
    for left, right in posts:
        ax.plot([left[0], right[0]], [left[1], right[1]], color=edge, lw=1.5)
    ax.scatter(posts[:, :, 0].ravel(), posts[:, :, 1].ravel(), s=8, color="#2980b9", zorder=3)
