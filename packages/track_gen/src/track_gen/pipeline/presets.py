"""Presets: course specifications with the project's defaults."""

from __future__ import annotations

from typing import Any

from track_gen.spec import TrackSpec


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
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    lengths = dict(ds=0.05 * scale, radius=1.5 * scale, width=0.3 * scale, sdf_margin=0.5 * scale)
    lengths.update(overrides)
    return TrackSpec(num_envs=num_envs, device=device, **lengths)
