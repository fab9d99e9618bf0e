"""Presets: course specifications with the project's defaults."""

from __future__ import annotations

import math
from typing import Any

from track_gen.spec import GateSpec, TrackSpec


def track(num_envs: int, device: str = "cpu", scale: float = 1.0, **overrides: Any) -> TrackSpec:
    """A batch of closed-loop tracks.

    Args:
        num_envs: envs in the batch.
        device: ``"cpu"`` or ``"cuda:N"``.
        scale: multiplies every length (radius, width, spacing, margin):
            1 is small-robot scale (laps of about 10 m).
        **overrides: any other ``TrackSpec`` field.

    Returns:
        The ``TrackSpec``.
    """
    _check_scale(scale)
    lengths = dict(ds=0.05 * scale, radius=1.5 * scale, width=0.3 * scale, sdf_margin=0.5 * scale)
    lengths.update(overrides)
    return TrackSpec(num_envs=num_envs, device=device, **lengths)


def gates(num_envs: int, device: str = "cpu", gate_width: float = 0.1, scale: float = 1.0,
          **overrides: Any) -> GateSpec:
    """A batch of gate courses (8 to 16 gates along a closed centerline).

    Args:
        num_envs: envs in the batch.
        device: ``"cpu"`` or ``"cuda:N"``.
        gate_width: distance between a gate's posts (m), > 0 (not scaled).
        scale: multiplies the centerline's lengths (radius, spacing).
        **overrides: any other ``GateSpec`` field.
    """
    _check_scale(scale)
    lengths = dict(ds=0.05 * scale, radius=1.5 * scale)
    lengths.update(overrides)
    return GateSpec(num_envs=num_envs, device=device, gate_width=gate_width, **lengths)


def _check_scale(scale: object) -> None:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
