"""The reference controller: pure pursuit on the centerline, and a speed
profile from the curvature ahead (the speed that keeps the lateral
acceleration within ``lateral_accel_mps2`` at every centerline point within
``preview_m``, reachable by braking at ``brake_accel_mps2``). It reads only
the public observation; a learned policy must beat it.
"""

import numpy as np

from racing_env.controller import Controller


class PursuitController(Controller):
    """Pure pursuit with a curvature speed profile (gains in config.toml)."""

    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        gains = config["controller"]
        self.max_speed = float(gains["max_speed_mps"])
        self.lateral = float(gains["lateral_accel_mps2"])
        self.brake = float(gains["brake_accel_mps2"])
        self.drive = float(gains["drive_accel_mps2"])
        self.preview = float(gains["preview_m"])
        self.lookahead_min = float(gains["lookahead_min_m"])
        self.lookahead_gain = float(gains["lookahead_gain_s"])
        self.wheelbase = float(config["vehicle"]["wheelbase_m"])
        self.low = np.asarray(config["action"]["low"], np.float32)
        self.high = np.asarray(config["action"]["high"], np.float32)
        count = int(np.asarray(obs["track_mask"]).astype(bool).sum())
        self.line = np.asarray(obs["centerline"], np.float64)[:count]
        step = np.linalg.norm(np.roll(self.line, -1, axis=0) - self.line, axis=1)
        self.step = step
        self.corner_speed = np.sqrt(self.lateral / np.maximum(_curvature(self.line), 1e-6))
        self.drawn: tuple[np.ndarray, np.ndarray, float] | None = None  # position, aim point, target speed

    def compute_control(self, obs, info=None):
        position = np.asarray(obs["position"], np.float64)
        yaw = float(obs["yaw"])
        speed = float(np.asarray(obs["velocity_body"])[0])
        n = len(self.line)
        i = int(np.argmin(np.linalg.norm(self.line - position, axis=1)))
        # Speed: the slowest corner ahead, reachable by braking.
        ahead = np.arange(1, n)
        index = (i + ahead) % n
        distance = np.cumsum(self.step[(i + ahead - 1) % n])
        near = distance <= self.preview
        allowed = np.sqrt(self.corner_speed[index[near]] ** 2 + 2.0 * self.brake * distance[near])
        target = min(self.max_speed, float(allowed.min()) if allowed.size else self.max_speed,
                     float(self.corner_speed[i]))
        # Steering: pure pursuit on a point a speed-dependent distance ahead.
        lookahead = self.lookahead_min + self.lookahead_gain * max(speed, 0.0)
        j = index[min(int(np.searchsorted(distance, lookahead)), len(index) - 1)]
        dx, dy = self.line[j] - position
        c, s = np.cos(yaw), np.sin(yaw)
        lx, ly = c * dx + s * dy, -s * dx + c * dy
        steering = np.arctan(self.wheelbase * 2.0 * ly / max(lx * lx + ly * ly, 1e-9))
        accel = min(2.0 * (target - speed), self.drive)
        self.drawn = (position, self.line[j], target)
        return np.clip(np.array([steering, accel], np.float32), self.low, self.high)

    def render_callback(self, debug_draw):
        """The pursuit's aim point and the target speed."""
        if self.drawn is None:
            return
        position, aim, target = self.drawn
        debug_draw.line([position, aim], color=(80, 200, 255), width=2)
        debug_draw.points([aim], color=(80, 200, 255), size=4)
        debug_draw.text(aim, f"{target:.1f} m/s", color=(80, 200, 255))


def _curvature(line: np.ndarray) -> np.ndarray:
    """Curvature (1/m) at every point of a closed polyline: the circumcircle
    of the point and its neighbours two points away on each side."""
    a, b, c = np.roll(line, 2, axis=0), line, np.roll(line, -2, axis=0)
    u, v, w = b - a, c - b, c - a
    area2 = np.abs(u[:, 0] * w[:, 1] - u[:, 1] * w[:, 0])
    sides = np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1) * np.linalg.norm(w, axis=1)
    return 2.0 * area2 / np.maximum(sides, 1e-12)

