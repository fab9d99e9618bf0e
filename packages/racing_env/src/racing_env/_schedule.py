"""What `racing_env.envelope.measure_envelope` drives: the `Schedule` of
the proving-ground tests, its full and short instances, and the check of a
speed grid that `racing_env.envelope.Envelope` shares. Re-exported by
`racing_env.envelope`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from racing_env import checks
from racing_env.config import ProjectConfig

__all__ = ["FULL_SCHEDULE", "SHORT_SCHEDULE", "Schedule", "speed_grid"]


def speed_grid(value: object, name: str, *, allow_empty: bool = False) -> tuple[float, ...]:
    """`value` as a tuple of finite, positive, strictly increasing floats."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a sequence of speeds (m/s), got {checks.shown(value)}")
    grid = tuple(checks.positive(v, f"{name}[{i}]") for i, v in enumerate(value))
    if not grid and not allow_empty:
        raise ValueError(f"{name} must hold at least one speed, got an empty sequence")
    if any(b <= a for a, b in zip(grid, grid[1:])):
        raise ValueError(f"{name} must be strictly increasing, got {checks.shown(value)}")
    return grid


@dataclass(frozen=True)
class Schedule:
    """What `measure_envelope` drives (durations in s, of simulated time).

    Attributes:
        speeds_mps: the speed grid, m/s, strictly increasing, > 0.
        headings_rad: headings of the straight-line tests, rad.
        ramp_start_mps2: kinematic lateral acceleration the ramp starts
            at, m/s^2.
        ramp_mps2_per_lap: its rise per lap turned, m/s^2 (the
            resolution of the lateral limit).
        plateau_mps2: rise of the ramp over which the held lateral
            acceleration must gain a tenth as much, or the ramp ends, m/s^2.
        max_sideslip_rad: rear-axle sideslip beyond which the car lost it, rad.
        max_rise_m: rise of the rear axle above its height at rest beyond
            which the car lost it (its tyres left the ground), m.
        speed_tolerance: fraction of the target speed the hold may miss
            before the car counts as lost (in the ramp).
        settle_s: straight-line or circle driving before a measurement.
        smoothing_s: moving-average window of the lateral acceleration.
        window_s: the straight-line and combined tests' window.
        recovery_s: speed hold after a window, checked for a loss.
        gg_speeds_mps: speeds of the g-g polygons (each one of `speeds_mps`).
        gg_fractions: fractions of the lateral limit, in [0, 1], increasing.
        gg_heading_rad: heading at the middle of every combined window, rad.
        gg_bisections: halvings of a command the car does not hold.
        max_run_s: longest single run (a ramp, an acceleration run).
    """

    speeds_mps: tuple[float, ...] = tuple(2.5 * k for k in range(2, 17))
    headings_rad: tuple[float, ...] = (0.0, math.pi / 8, math.pi / 4)
    ramp_start_mps2: float = 3.0
    ramp_mps2_per_lap: float = 0.1
    plateau_mps2: float = 1.0
    max_sideslip_rad: float = 0.1
    max_rise_m: float = 0.02
    speed_tolerance: float = 0.1
    settle_s: float = 1.0
    smoothing_s: float = 0.5
    window_s: float = 0.25
    recovery_s: float = 1.0
    gg_speeds_mps: tuple[float, ...] = (10.0, 20.0, 30.0, 40.0)
    gg_fractions: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
    gg_heading_rad: float = math.pi / 4
    gg_bisections: int = 4
    max_run_s: float = 3000.0

    def __post_init__(self) -> None:
        speeds = speed_grid(self.speeds_mps, "speeds_mps")
        object.__setattr__(self, "speeds_mps", speeds)
        gg_speeds = speed_grid(self.gg_speeds_mps, "gg_speeds_mps", allow_empty=True)
        missing = [v for v in gg_speeds if v not in speeds]
        if missing:
            raise ValueError(f"gg_speeds_mps must be speeds of speeds_mps, got {missing[0]} not in {speeds}")
        object.__setattr__(self, "gg_speeds_mps", gg_speeds)
        if isinstance(self.headings_rad, (str, bytes)) or not isinstance(self.headings_rad, Sequence):
            raise TypeError(f"headings_rad must be a sequence of angles (rad), got {checks.shown(self.headings_rad)}")
        if not self.headings_rad:
            raise ValueError("headings_rad must hold at least one heading, got an empty sequence")
        headings = tuple(checks.real(h, f"headings_rad[{i}]") for i, h in enumerate(self.headings_rad))
        object.__setattr__(self, "headings_rad", headings)
        if isinstance(self.gg_fractions, (str, bytes)) or not isinstance(self.gg_fractions, Sequence):
            raise TypeError(f"gg_fractions must be a sequence of fractions, got {checks.shown(self.gg_fractions)}")
        fractions = tuple(checks.real_in(f, f"gg_fractions[{i}]", 0.0, 1.0) for i, f in enumerate(self.gg_fractions))
        if gg_speeds and not fractions:
            raise ValueError("gg_fractions must hold at least one fraction when gg_speeds_mps is not empty")
        if any(b <= a for a, b in zip(fractions, fractions[1:])):
            raise ValueError(f"gg_fractions must be strictly increasing, got {fractions}")
        object.__setattr__(self, "gg_fractions", fractions)
        for name in ("ramp_start_mps2", "ramp_mps2_per_lap", "plateau_mps2", "max_sideslip_rad",
                     "max_rise_m", "speed_tolerance", "settle_s", "smoothing_s", "window_s", "recovery_s", "max_run_s"):
            object.__setattr__(self, name, checks.positive(getattr(self, name), name))
        object.__setattr__(self, "gg_heading_rad", checks.real(self.gg_heading_rad, "gg_heading_rad"))
        checks.integer_in(self.gg_bisections, "gg_bisections", 0, 64)

    def steps(self, config: ProjectConfig) -> dict[str, int]:
        """Each duration in control steps of `config` (rounded).

        Raises:
            ValueError: a duration shorter than half a control step (zero
                steps), naming it.
        """
        out = {}
        for name in ("settle_s", "smoothing_s", "window_s", "recovery_s", "max_run_s"):
            out[name] = round(getattr(self, name) / config.control_dt_s)
            if out[name] < 1:
                raise ValueError(f"{name} must last at least one control step ({config.control_dt_s} s), "
                                 f"got {getattr(self, name)} s (0 steps)")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The schedule as plain JSON values (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


#: The benchmark's schedule (the defaults): 15 speeds from 5 to 40 m/s, three
#: headings, a ramp of 0.1 m/s^2 a lap, four g-g speeds.
FULL_SCHEDULE = Schedule()
#: A CPU test's schedule (seconds): two speeds, two headings, a ramp of
#: 0.5 m/s^2 a lap from 5 m/s^2, one g-g speed of three fractions.
SHORT_SCHEDULE = Schedule(
    speeds_mps=(10.0, 20.0),
    headings_rad=(0.0, math.pi / 4),
    ramp_start_mps2=5.0,
    ramp_mps2_per_lap=0.5,
    gg_speeds_mps=(10.0,),
    gg_fractions=(0.0, 0.5, 1.0),
    gg_bisections=2,
    max_run_s=600.0,
)
