"""The car's envelope, measured: what accelerations the MuJoCo car holds
at each speed, driven through the classic proving-ground tests.

`measure_envelope` drives the env's car (`racing_env.car.build_model`, the
env's ``dt``, substeps and action mapping, MuJoCo C in float64) on the flat
ground plane, outside the race logic (no track, no Race Core), by public
actions of the action space. Every acceleration is the whole car's centre
of mass, in its heading frame (x forward, y left), m/s^2. The car *loses
it* when its rear axle's sideslip passes ``max_sideslip_rad`` or the axle
rises off the ground by more than ``max_rise_m``.

- **Acceleration from rest**: full throttle, straight ahead, from a
  standstill: the mean acceleration over each 2 m/s band around a grid
  speed (NaN past the speed where the car lost it).
- **Straight-line limits**: rolling straight at each grid speed (speed
  held for ``settle_s``), full throttle, and apart from it full brake, for
  ``window_s``: the mean acceleration over the window. A command after
  which the car loses it within the window or the ``recovery_s`` of speed
  hold that follows is halved by bisection (``gg_bisections`` times) down
  to the largest fraction of it the car holds.
- **Steady circles (a ramp-steer test)**: at each grid speed, held by a PI
  speed controller, the steering is set for a kinematic lateral
  acceleration (``atan(wheelbase * a / v^2)``) that starts at
  ``ramp_start_mps2`` and rises by ``ramp_mps2_per_lap`` per lap the car
  turns. The lateral acceleration *held* at a moment is the least smoothed
  (``smoothing_s``) lateral acceleration over the lap that ends there: a
  whole circle, every heading. The limit is the largest held value before
  the ramp ends: the car lost it (or missed its speed by more than
  ``speed_tolerance``), the held value stopped rising (it gained less than
  a tenth of the last ``plateau_mps2`` of the ramp's rise), or it drove a
  lap at the steering lock.
- **Combined (g-g)**: at each of ``gg_speeds_mps``, steady circles at
  ``gg_fractions`` of that speed's lateral limit (the steering at which the
  ramp first reached that lateral acceleration), then full throttle and
  full brake as in the straight-line limits, the window centred on the
  heading ``gg_heading_rad``. The (a_x, a_y) points, mirrored to the
  right-hand turn, make a closed polygon ordered by angle.

The straight-line tests run at each heading of ``headings_rad``: the
model's tyres use MuJoCo's default pyramidal friction cone, whose edges lie
along the world axes, so grip depends on the heading (weakest on the
diagonals). `Envelope.forward_mps2` and `Envelope.braking_mps2` are the
least over those headings and `Envelope.lateral_mps2` holds around a whole
circle: the envelope is what the car holds at every heading; the tables of
each heading are kept beside them. See docs/racing_env/envelope.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from racing_env import _manoeuvres, checks
from racing_env._rig import Rig
from racing_env._schedule import FULL_SCHEDULE, SHORT_SCHEDULE, Schedule, speed_grid
from racing_env.config import ProjectConfig

__all__ = [
    "FORMAT",
    "FULL_SCHEDULE",
    "LIMITS",
    "SHORT_SCHEDULE",
    "CircleRun",
    "Envelope",
    "Schedule",
    "config_hash",
    "measure_envelope",
    "steady_circle",
]

#: The JSON format `Envelope.to_json` writes.
FORMAT = "racing_env.envelope/1"
#: How the ramp-steer test ended at a speed (`Envelope.lateral_limited_by`).
LIMITS = ("loss", "plateau", "steering_lock", "run_length")


def config_hash(config: ProjectConfig) -> str:
    """sha256 hex digest of every field of `config` (all of them shape the
    car or its clock): ``json.dumps(dataclasses.asdict(config),
    sort_keys=True)`` encoded as UTF-8 (tuples become lists, floats their
    shortest repr)."""
    if not isinstance(config, ProjectConfig):
        raise TypeError(f"config must be a ProjectConfig, got {type(config).__name__}")
    text = json.dumps(dataclasses.asdict(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _array(value: object, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    arr = np.array(value, dtype=np.float64)
    if shape is not None and arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class Envelope:
    """The measured envelope of one car (`config_sha256`).

    NaN marks a value not measured: a speed the run from rest did not
    pass (the car lost it first, or ``max_run_s`` ran out), a lateral limit
    of a car lost before its first full lap.

    Attributes:
        config_sha256: `config_hash` of the car measured.
        speeds_mps: float64 [K], the speed grid, m/s, increasing.
        lateral_mps2: float64 [K], lateral acceleration held around a whole
            circle at each speed, m/s^2.
        forward_mps2: float64 [K], full-throttle acceleration, the least
            over `headings_rad`, m/s^2.
        braking_mps2: float64 [K], full-brake deceleration (positive), the
            least over `headings_rad`, m/s^2.
        headings_rad: float64 [H], headings of the straight-line tests, rad.
        forward_by_heading_mps2: float64 [H, K], m/s^2.
        braking_by_heading_mps2: float64 [H, K], m/s^2.
        from_rest_by_heading_mps2: float64 [H, K], full throttle from
            rest as the car passes each speed, m/s^2 (NaN past a loss).
        lateral_steering_rad: float64 [K], steering at which the ramp first
            reached the lateral limit, rad.
        lateral_limited_by: [K] how each ramp ended (one of `LIMITS`).
        gg_speeds_mps: float64 [G], speeds of the g-g polygons, m/s.
        gg_heading_rad: heading at the middle of the combined windows, rad.
        gg: [G] closed polygons, float64 [P_g, 2] of (a_x, a_y) in m/s^2,
            counter-clockwise, the last point the first.
    """

    config_sha256: str
    speeds_mps: np.ndarray
    lateral_mps2: np.ndarray
    forward_mps2: np.ndarray
    braking_mps2: np.ndarray
    headings_rad: np.ndarray
    forward_by_heading_mps2: np.ndarray
    braking_by_heading_mps2: np.ndarray
    from_rest_by_heading_mps2: np.ndarray
    lateral_steering_rad: np.ndarray
    lateral_limited_by: tuple[str, ...]
    gg_speeds_mps: np.ndarray
    gg_heading_rad: float
    gg: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.config_sha256, str) or len(self.config_sha256) != 64:
            raise ValueError(f"config_sha256 must be a sha256 hex digest, got {checks.shown(self.config_sha256)}")
        speeds = np.array(speed_grid(list(np.asarray(self.speeds_mps, np.float64).ravel()), "speeds_mps"))
        if np.shape(self.speeds_mps) != speeds.shape:
            raise ValueError(f"speeds_mps must be one-dimensional, got shape {np.shape(self.speeds_mps)}")
        k = len(speeds)
        headings = _array(self.headings_rad, "headings_rad")
        if headings.ndim != 1 or not len(headings):
            raise ValueError(f"headings_rad must be a non-empty [H] array, got shape {headings.shape}")
        h = len(headings)
        fields = {"speeds_mps": speeds, "headings_rad": headings}
        for name in ("lateral_mps2", "forward_mps2", "braking_mps2", "lateral_steering_rad"):
            fields[name] = _array(getattr(self, name), name, (k,))
        for name in ("forward_by_heading_mps2", "braking_by_heading_mps2", "from_rest_by_heading_mps2"):
            fields[name] = _array(getattr(self, name), name, (h, k))
        limited = tuple(self.lateral_limited_by)
        if len(limited) != k or any(x not in LIMITS for x in limited):
            raise ValueError(f"lateral_limited_by must be {k} of {LIMITS}, got {checks.shown(limited)}")
        gg_speeds = np.array(speed_grid(list(np.asarray(self.gg_speeds_mps, np.float64).ravel()), "gg_speeds_mps",
                                         allow_empty=True))
        polygons = tuple(_array(p, f"gg[{i}]") for i, p in enumerate(self.gg))
        if len(polygons) != len(gg_speeds):
            raise ValueError(f"gg must hold one polygon per gg speed ({len(gg_speeds)}), got {len(polygons)}")
        for i, polygon in enumerate(polygons):
            if polygon.ndim != 2 or polygon.shape[1] != 2 or len(polygon) < 2:
                raise ValueError(f"gg[{i}] must be a [P, 2] polygon, got shape {polygon.shape}")
            if not np.array_equal(polygon[0], polygon[-1]):
                raise ValueError(f"gg[{i}] must be closed (its last point its first)")
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "lateral_limited_by", limited)
        object.__setattr__(self, "gg_speeds_mps", gg_speeds)
        object.__setattr__(self, "gg", polygons)
        object.__setattr__(self, "gg_heading_rad", checks.real(self.gg_heading_rad, "gg_heading_rad"))

    def _at(self, table: np.ndarray, speed_mps: object) -> float | np.ndarray:
        speed = np.asarray(speed_mps, dtype=np.float64) if not isinstance(speed_mps, str) else None
        if speed is None or speed.dtype.kind not in "fiu":
            raise TypeError(f"speed_mps must be a number or an array of numbers, got {checks.shown(speed_mps)}")
        low, high = self.speeds_mps[0], self.speeds_mps[-1]
        if not np.all(np.isfinite(speed)) or np.any(speed < low) or np.any(speed > high):
            raise ValueError(f"speed_mps must lie in the measured range [{low:g}, {high:g}] m/s, "
                             f"got {checks.shown(speed_mps)}")
        value = np.interp(speed, self.speeds_mps, table)
        return float(value) if value.ndim == 0 else value

    def lateral_at(self, speed_mps: float | np.ndarray) -> float | np.ndarray:
        """Held lateral acceleration (m/s^2) at `speed_mps` (m/s, scalar or
        array), linear between grid speeds.

        Raises:
            ValueError: a speed outside ``[speeds_mps[0], speeds_mps[-1]]``
                or not finite (nothing is extrapolated).
        """
        return self._at(self.lateral_mps2, speed_mps)

    def forward_at(self, speed_mps: float | np.ndarray) -> float | np.ndarray:
        """Full-throttle acceleration (m/s^2) at `speed_mps`, as `lateral_at`."""
        return self._at(self.forward_mps2, speed_mps)

    def braking_at(self, speed_mps: float | np.ndarray) -> float | np.ndarray:
        """Full-brake deceleration (m/s^2, positive) at `speed_mps`, as `lateral_at`."""
        return self._at(self.braking_mps2, speed_mps)

    def gg_at(self, speed_mps: float) -> np.ndarray:
        """The g-g polygon (float64 [P, 2], m/s^2) measured at `speed_mps`.

        Raises:
            ValueError: `speed_mps` is not one of `gg_speeds_mps`.
        """
        speed = checks.real(speed_mps, "speed_mps")
        hits = np.flatnonzero(np.isclose(self.gg_speeds_mps, speed, rtol=0, atol=1e-9))
        if not len(hits):
            raise ValueError(f"speed_mps must be one of gg_speeds_mps {self.gg_speeds_mps.tolist()}, got {speed}")
        return self.gg[hits[0]].copy()

    def to_json(self) -> str:
        """The envelope as JSON text (format `FORMAT`; NaN written as null)."""

        def plain(value: Any) -> Any:
            if isinstance(value, np.ndarray):
                return [plain(v) for v in value]
            if isinstance(value, (float, np.floating)):
                return None if math.isnan(value) else float(value)
            return value

        body = {"format": FORMAT, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}
        body["lateral_limited_by"] = list(self.lateral_limited_by)
        body["gg"] = [plain(p) for p in self.gg]
        return json.dumps({k: plain(v) for k, v in body.items()}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Envelope:
        """The envelope `to_json` wrote.

        Raises:
            ValueError: not JSON, another format, or fields that do not fit.
        """
        try:
            body = json.loads(text)
        except (TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"text must be an envelope's JSON: {err}") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ValueError(f"text must be JSON of format {FORMAT!r}")
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in body]
        if missing:
            raise ValueError(f"text lacks the envelope field {missing[0]!r}")

        def numbers(value: Any) -> Any:
            if isinstance(value, list):
                return [numbers(v) for v in value]
            return math.nan if value is None else value

        fields = {n: body[n] if n in ("config_sha256", "lateral_limited_by") else numbers(body[n]) for n in names}
        fields["gg"] = tuple(fields["gg"])
        try:
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"text holds an envelope field of the wrong kind: {err}") from None


def measure_envelope(config: ProjectConfig, schedule: Schedule = FULL_SCHEDULE,
                     log: Callable[[str], None] | None = None) -> Envelope:
    """Drive the car of `config` through `schedule` and return its envelope.

    Args:
        config: the car (its MJCF, ``dt``, substeps and action ranges).
        schedule: what to drive; `SHORT_SCHEDULE` runs in seconds,
            `FULL_SCHEDULE` in minutes of one CPU core.
        log: called with a line after each part, if given.

    Raises:
        TypeError: `config` not a ProjectConfig or `schedule` not a Schedule.
        ValueError: a duration of the schedule shorter than one control
            step of `config`, naming it.
    """
    if not isinstance(config, ProjectConfig):
        raise TypeError(f"config must be a ProjectConfig, got {type(config).__name__}")
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule, got {type(schedule).__name__}")
    steps = schedule.steps(config)
    say = log or (lambda _: None)
    rig = Rig(config)
    speeds = np.array(schedule.speeds_mps)
    headings = schedule.headings_rad
    from_rest = np.array([_manoeuvres.from_rest(rig, h, speeds, schedule, steps) for h in headings])
    say(f"full throttle from rest, by heading: {np.round(from_rest, 3).tolist()} m/s^2")
    limits = np.array([[_manoeuvres.straight_limits(rig, h, v, schedule, steps) for v in speeds] for h in headings])
    forward, braking = limits[..., 0], limits[..., 1]
    say(f"forward, by heading: {np.round(forward, 3).tolist()} m/s^2")
    say(f"braking, by heading: {np.round(braking, 3).tolist()} m/s^2")
    ramps = {}
    for v in speeds:
        ramps[v] = _manoeuvres.ramp_steer(rig, float(v), schedule, steps)
        say(f"ramp-steer at {v:g} m/s: {ramps[v].lateral_mps2:.3f} m/s^2 ({ramps[v].limited_by})")
    polygons = []
    for v in schedule.gg_speeds_mps:
        polygons.append(_manoeuvres.gg_polygon(rig, v, ramps[v], schedule, steps))
        say(f"g-g at {v:g} m/s: {len(polygons[-1]) - 1} points")
    return Envelope(
        config_sha256=config_hash(config),
        speeds_mps=speeds,
        lateral_mps2=np.array([ramps[v].lateral_mps2 for v in speeds]),
        forward_mps2=forward.min(axis=0),
        braking_mps2=braking.min(axis=0),
        headings_rad=np.array(headings),
        forward_by_heading_mps2=forward,
        braking_by_heading_mps2=braking,
        from_rest_by_heading_mps2=from_rest,
        lateral_steering_rad=np.array([ramps[v].steering_for(ramps[v].lateral_mps2) for v in speeds]),
        lateral_limited_by=tuple(ramps[v].limited_by for v in speeds),
        gg_speeds_mps=np.array(schedule.gg_speeds_mps),
        gg_heading_rad=schedule.gg_heading_rad,
        gg=tuple(polygons),
    )


# --------------------------------------------------------------------------- one steady circle


@dataclass(frozen=True)
class CircleRun:
    """A steady circle driven by `steady_circle`, one row per control step.

    Attributes:
        time_s: float64 [T], s since the recording began (each row is
            the car at the end of one control step).
        com_xy: float64 [T, 2], the car's centre of mass, m.
        speed_mps: float64 [T], its horizontal speed, m/s.
        yaw_rad: float64 [T], heading in [-pi, pi), rad.
        yaw_rate_radps: float64 [T], rad/s.
        a_x_mps2: float64 [T], acceleration along the heading, m/s^2.
        a_y_mps2: float64 [T], lateral acceleration (left positive), m/s^2,
            as `measure_envelope` measures it.

    On a steady circle of radius R the centre of mass accelerates at
    ``v^2 / R`` towards the centre, at right angles to its velocity, which
    points ``beta`` (its sideslip) left of the heading: so ``a_y = v^2 / R
    * cos(beta)`` and ``a_x = -v^2 / R * sin(beta)``.
    """

    time_s: np.ndarray
    com_xy: np.ndarray
    speed_mps: np.ndarray
    yaw_rad: np.ndarray
    yaw_rate_radps: np.ndarray
    a_x_mps2: np.ndarray
    a_y_mps2: np.ndarray


def steady_circle(config: ProjectConfig, speed_mps: float, steering_rad: float, duration_s: float,
                  settle_s: float = 2.0, heading_rad: float = 0.0) -> CircleRun:
    """Drive a circle at a fixed steering, the speed held by the PI
    controller that `measure_envelope` uses, on the rig it drives.

    Args:
        config: the car.
        speed_mps: the speed held, m/s (> 0).
        steering_rad: the steering command, rad (in the action range;
            positive turns left).
        duration_s: how long to record, s (> 0).
        settle_s: how long to drive the circle before recording, s (>= 0).
        heading_rad: the heading the car starts at, rad.

    Raises:
        TypeError: `config` not a ProjectConfig, a non-number argument.
        ValueError: a speed or duration not > 0, a negative settle time, a
            steering outside the action range, a non-finite value; the
            message names the argument.
    """
    if not isinstance(config, ProjectConfig):
        raise TypeError(f"config must be a ProjectConfig, got {type(config).__name__}")
    speed = checks.positive(speed_mps, "speed_mps")
    steering = checks.real_in(steering_rad, "steering_rad", -config.max_steering_rad, config.max_steering_rad)
    duration = checks.positive(duration_s, "duration_s")
    settle = checks.real_in(settle_s, "settle_s", 0.0, math.inf)
    rig = Rig(config)
    reading = rig.launch(checks.real(heading_rad, "heading_rad"), speed)
    hold = _manoeuvres.speed_hold(rig, speed)
    reading = _manoeuvres.hold_speed(rig, reading, hold, steering, round(settle / rig.dt))
    rows = []
    for k in range(max(1, round(duration / rig.dt))):
        reading = rig.step(steering, hold.command(reading.speed_mps))
        rows.append(((k + 1) * rig.dt, *reading.com_xy, reading.speed_mps, reading.yaw_rad, reading.yaw_rate_radps,
                     reading.a_x_mps2, reading.a_y_mps2))
    table = np.array(rows)
    return CircleRun(time_s=table[:, 0], com_xy=table[:, 1:3], speed_mps=table[:, 3], yaw_rad=table[:, 4],
                     yaw_rate_radps=table[:, 5], a_x_mps2=table[:, 6], a_y_mps2=table[:, 7])
