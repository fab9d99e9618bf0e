"""Timing helpers of the track_gen benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import warp as wp


def median_seconds(fn: Callable[[], Any], device: str, reps: int) -> float:
    """Median wall time of ``fn`` (synchronised with ``device``), after one warm-up call."""
    fn()
    wp.synchronize_device(device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        wp.synchronize_device(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def captured(fn: Callable[[], Any], device: str) -> Any:
    """``fn``'s launches recorded into a graph on ``device``."""
    with wp.ScopedCapture(device=device) as capture:
        fn()
    return capture.graph
