"""The racing-line controller: at the episode's start it computes the
track's lap at the limit from the initial observation
(`racing_env.raceline.min_time_lap`: a racing line inside the boundaries
less the car's half-width and ``margin_m``, and the quasi-steady speed
profile along it under the car's measured envelope, ``envelope.json``
beside this file), then tracks it:

- steering by Stanley's rule on the line: the front axle's heading error
  to the line's tangent ``preview_s`` ahead, plus
  ``atan(cross_track_gain * e / (speed + softening_mps))`` towards the line
  (``e`` the front axle's signed distance from it);
- acceleration: the profile's own on the line's segment ``preview_s``
  ahead (its speed change along it) plus ``speed_gain_per_s`` times the
  gap to the speed at that segment's start, at most ``drive_accel_mps2``;
  every speed ``speed_fraction`` of the profile's (the margin; 1.0 drives
  the limit itself).

It reads only the public observation (the track's arrays, the car's pose
and velocity) and the Challenge's vehicle, which must be the car the
envelope measured.
"""

import math
from pathlib import Path

import numpy as np

from racing_env import checks
from racing_env.config import ProjectConfig
from racing_env.controller import Controller
from racing_env.envelope import Envelope, config_hash
from racing_env.raceline import LineSettings, min_time_lap

#: The car's measured envelope (`racing_env.envelope.Envelope.to_json` of benchmarks/results/car_envelope.json's).
ENVELOPE = Path(__file__).with_name("envelope.json")
#: The line points searched around the last call's nearest one (behind, ahead).
WINDOW = (-10, 40)


class RacelineController(Controller):
    """Stanley steering and speed tracking on the lap at the limit (settings in config.toml)."""

    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        own = config["controller"]
        self.fraction = checks.real_in(own["speed_fraction"], "speed_fraction", 0.0, 1.0, low_open=True)
        self.preview_s = checks.real_in(own["preview_s"], "preview_s", 0.0, 1.0, unit="s")
        self.gain, self.softening, self.speed_gain, self.drive = (
            checks.positive(own[name], name)
            for name in ("cross_track_gain", "softening_mps", "speed_gain_per_s", "drive_accel_mps2"))
        car = ProjectConfig(**config["vehicle"])
        envelope = Envelope.from_json(ENVELOPE.read_text())
        if envelope.config_sha256 != config_hash(car):
            raise ValueError(f"{ENVELOPE.name} was measured on another car (config {envelope.config_sha256[:12]}, "
                             f"this Challenge's is {config_hash(car)[:12]}): remeasure it (make "
                             f"benchmark-car-envelope) and copy its envelope here")
        settings = LineSettings(car_half_width_m=car.track_width_m / 2, margin_m=float(own["margin_m"]))
        self.lap = min_time_lap(obs, envelope, settings)
        line, profile = self.lap.line, self.lap.profile
        self.points, self.arc, self.length = line.points_m, line.arc_m, line.length_m
        self.segment = profile.segment_m
        self.unit = (np.roll(self.points, -1, axis=0) - self.points) / self.segment[:, None]  # segment i's direction
        self.heading = np.arctan2(self.unit[:, 1], self.unit[:, 0])
        self.speed = self.fraction * profile.speed_mps
        # The profile's own acceleration along segment i (constant along it), at the fraction's speeds.
        self.accel = (np.roll(self.speed, -1) ** 2 - self.speed**2) / (2 * self.segment)
        self.wheelbase = car.wheelbase_m
        self.low = np.asarray(config["action"]["low"], np.float64)
        self.high = np.asarray(config["action"]["high"], np.float64)
        self.index: int | None = None  # the segment nearest the front axle at the last call
        self.drawn: tuple[np.ndarray, np.ndarray, float] | None = None  # front axle, reference point, target

    def compute_control(self, obs, info=None):
        yaw = float(obs["yaw"])
        speed = float(np.asarray(obs["velocity_body"])[0])
        forward = np.array([math.cos(yaw), math.sin(yaw)])
        front = np.asarray(obs["position"], np.float64) + self.wheelbase * forward
        k, along, error = self._project(front)
        # The reference preview_s ahead of the front axle's foot on the line.
        ahead = (self.arc[k] + along + max(speed, 0.0) * self.preview_s) % self.length
        j = int(np.searchsorted(self.arc, ahead, side="right")) - 1
        turn = (self.heading[j] - yaw + math.pi) % (2 * math.pi) - math.pi
        steering = turn - math.atan(self.gain * error / (max(speed, 0.0) + self.softening))
        accel = min(self.accel[j] + self.speed_gain * (self.speed[j] - speed), self.drive)
        self.drawn = (front, self.points[j], float(self.speed[j]))
        return np.clip([steering, accel], self.low, self.high).astype(np.float32)

    def _project(self, point: np.ndarray) -> tuple[int, float, float]:
        """The segment of the line nearest ``point`` (within `WINDOW` of the
        last one, after the first call), the distance along it to the foot
        (m) and the point's signed distance from it (m, + left of the line)."""
        n = len(self.points)
        if self.index is None:
            candidates = np.arange(n)
        else:
            candidates = (self.index + np.arange(*WINDOW)) % n
        start = self.points[candidates]
        along = np.clip(np.einsum("ij,ij->i", point - start, self.unit[candidates]), 0.0, self.segment[candidates])
        gap = point - (start + along[:, None] * self.unit[candidates])
        best = int(np.argmin(np.einsum("ij,ij->i", gap, gap)))
        self.index = int(candidates[best])
        u = self.unit[self.index]
        return self.index, float(along[best]), float(u[0] * gap[best, 1] - u[1] * gap[best, 0])

    def render_callback(self, debug_draw):
        """The racing line, the reference point and its target speed."""
        debug_draw.line(np.vstack([self.points, self.points[:1]]), color=(255, 170, 60), width=1)
        if self.drawn is None:
            return
        front, reference, target = self.drawn
        debug_draw.line([front, reference], color=(255, 170, 60), width=2)
        debug_draw.text(reference, f"{target:.1f} m/s", color=(255, 170, 60))
