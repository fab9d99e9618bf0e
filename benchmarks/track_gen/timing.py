"""Timing helpers of the track_gen benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import warp as wp


def runs(sizes: str, cpu_sizes: str) -> tuple[list[str], list[tuple[str, int]]]:
    """The devices here (``cpu``, and ``cuda:0`` when there is one) and the
    ``(device, batch size)`` pairs to time: the comma-separated ``cpu_sizes``
    on ``cpu`` (none when empty), ``sizes`` on ``cuda:0``."""
    devices = ["cpu"] + (["cuda:0"] if wp.get_cuda_device_count() > 0 else [])
    pairs = [(d, int(size)) for d in devices for size in (cpu_sizes if d == "cpu" else sizes).split(",") if size]
    return devices, pairs


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


def replay_seconds(graph: Any, device: str, reps: int, batch: int = 20) -> float:
    """Device time of one replay of ``graph``: on CUDA, CUDA events around
    ``batch`` back-to-back replays (median over ``reps`` batches, per replay);
    on CPU, the median wall time of one replay."""
    if not wp.get_device(device).is_cuda:
        return median_seconds(lambda: wp.capture_launch(graph), device, reps)
    wp.capture_launch(graph)
    start, end = wp.Event(device, enable_timing=True), wp.Event(device, enable_timing=True)
    times = []
    for _ in range(reps):
        wp.record_event(start)
        for _ in range(batch):
            wp.capture_launch(graph)
        wp.record_event(end)
        wp.synchronize_event(end)
        times.append(wp.get_event_elapsed_time(start, end) / 1e3 / batch)
    return statistics.median(times)
