"""Presets: course specifications with the project's defaults."""

from __future__ import annotations

import dataclasses
import math
import numbers
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
    return _build(TrackSpec, ("ds", "radius", "width", "sdf_margin"), scale, num_envs=num_envs, device=device,
                  **overrides)


def gates(num_envs: int, device: str = "cpu", gate_width: float = GateSpec.gate_width, scale: float = 1.0,
          **overrides: Any) -> GateSpec:
    """A batch of gate courses (8 to 16 gates along a closed centerline).

    Args:
        num_envs: envs in the batch.
        device: ``"cpu"`` or ``"cuda:N"``.
        gate_width: distance between a gate's posts (m), > 0 (not scaled).
        scale: multiplies the centerline's lengths (radius, spacing).
        **overrides: any other ``GateSpec`` field.
    """
    return _build(GateSpec, ("ds", "radius"), scale, num_envs=num_envs, device=device, gate_width=gate_width,
                  **overrides)


def _build(spec: type[TrackSpec] | type[GateSpec], names: tuple[str, ...], scale: object,
           **fields: Any) -> TrackSpec | GateSpec:
    """``spec(**fields)`` with the length fields ``names`` that ``fields``
    leaves out at the spec's own defaults times ``scale``. A spec the
    scaled lengths make invalid (one the unscaled defaults would not) is
    refused naming ``scale``."""
    try:  # a real number (NumPy's too), finite once a float: an int too large for one is not
        finite = not isinstance(scale, bool) and isinstance(scale, numbers.Real) and math.isfinite(float(scale))
    except OverflowError:
        finite = False
    if not (finite and scale > 0):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    defaults = {field.name: field.default for field in dataclasses.fields(spec)}
    scaled = [name for name in names if name not in fields]
    try:
        return spec(**fields, **{name: defaults[name] * float(scale) for name in scaled})
    except ValueError as error:
        scaled_error = error
    spec(**fields)  # an error without the scale too is not the scale's: it is raised as it is
    multiplied = ", ".join(scaled)
    raise ValueError(f"scale={scale!r} (it multiplies {multiplied}) gives an invalid spec: {scaled_error}")
