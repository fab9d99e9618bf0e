"""Independent NumPy oracles for the environment tests (they never call
the library's geometry)."""

from __future__ import annotations

import numpy as np


def inside_loop(points: np.ndarray, loop: np.ndarray) -> np.ndarray:
    """Even-odd test of points [M, 2] against the closed polygon loop [N, 2]."""
    x, y = points[:, 0:1], points[:, 1:2]
    x0, y0 = loop[None, :, 0], loop[None, :, 1]
    x1, y1 = np.roll(loop, -1, axis=0)[None, :, 0], np.roll(loop, -1, axis=0)[None, :, 1]
    straddle = (y0 > y) != (y1 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    return (np.sum(straddle & (x < x_cross), axis=1) % 2) == 1


def on_track(points: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """A point is on the road when it is inside exactly one boundary loop."""
    return inside_loop(points, left) != inside_loop(points, right)


def wheel_points(position: np.ndarray, yaw: float, wheelbase: float, track_width: float) -> np.ndarray:
    """The four wheel ground points [4, 2] of a car whose rear axle is at position."""
    c, s = np.cos(yaw), np.sin(yaw)
    local = np.array([[wheelbase, track_width / 2], [wheelbase, -track_width / 2],
                      [0.0, track_width / 2], [0.0, -track_width / 2]])
    return position[None, :] + local @ np.array([[c, s], [-s, c]])


class PursuitOracle:
    """The reference ``pursuit`` plugin as it was written on its own, before
    its maths moved to `racing_env.pursuit`: float64, one world, its own
    loops over the episode's first centerline. The plugin must act bitwise
    as it does (the committed reference lap times rest on that)."""

    def __init__(self, obs: dict, config: dict) -> None:
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
        self.step = np.linalg.norm(np.roll(self.line, -1, axis=0) - self.line, axis=1)
        a, b, c = np.roll(self.line, 2, axis=0), self.line, np.roll(self.line, -2, axis=0)
        u, v, w = b - a, c - b, c - a
        area2 = np.abs(u[:, 0] * w[:, 1] - u[:, 1] * w[:, 0])
        sides = np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1) * np.linalg.norm(w, axis=1)
        curvature = 2.0 * area2 / np.maximum(sides, 1e-12)
        self.corner_speed = np.sqrt(self.lateral / np.maximum(curvature, 1e-6))

    def act(self, obs: dict) -> tuple[np.ndarray, np.ndarray, float]:
        """(float32 [2] action, the aim point [2], m, the target speed, m/s)."""
        position = np.asarray(obs["position"], np.float64)
        yaw = float(obs["yaw"])
        speed = float(np.asarray(obs["velocity_body"])[0])
        n = len(self.line)
        i = int(np.argmin(np.linalg.norm(self.line - position, axis=1)))
        ahead = np.arange(1, n)
        index = (i + ahead) % n
        distance = np.cumsum(self.step[(i + ahead - 1) % n])
        near = distance <= self.preview
        allowed = np.sqrt(self.corner_speed[index[near]] ** 2 + 2.0 * self.brake * distance[near])
        target = min(self.max_speed, float(allowed.min()) if allowed.size else self.max_speed,
                     float(self.corner_speed[i]))
        lookahead = self.lookahead_min + self.lookahead_gain * max(speed, 0.0)
        j = index[min(int(np.searchsorted(distance, lookahead)), len(index) - 1)]
        dx, dy = self.line[j] - position
        c, s = np.cos(yaw), np.sin(yaw)
        lx, ly = c * dx + s * dy, -s * dx + c * dy
        steering = np.arctan(self.wheelbase * 2.0 * ly / max(lx * lx + ly * ly, 1e-9))
        accel = min(2.0 * (target - speed), self.drive)
        return np.clip(np.array([steering, accel], np.float32), self.low, self.high), self.line[j], target


def distance_to_loop(points: np.ndarray, loop: np.ndarray) -> np.ndarray:
    """[M]: each point's distance to the closed polyline loop [N, 2] (its
    nearest segment, the last point joined to the first)."""
    start, end = loop[None, :, :], np.roll(loop, -1, axis=0)[None, :, :]
    along, offset = end - start, points[:, None, :] - start
    t = np.clip(np.sum(offset * along, axis=-1) / np.sum(along * along, axis=-1), 0.0, 1.0)
    gap = offset - t[..., None] * along
    return np.sqrt(np.min(np.sum(gap * gap, axis=-1), axis=1))


def raceline_action(points: np.ndarray, speed: np.ndarray, obs: dict, settings: dict, wheelbase: float,
                    low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The racing-line controller's action, computed from its documented
    rule one segment at a time in plain Python floats: the closed line
    ``points`` [N, 2] (m) with the target ``speed`` [N] (m/s, the profile's
    times the fraction) at each point; the segment nearest the front axle
    of all N, the reference ``preview_s`` of speed ahead of the foot,
    Stanley's steering and the speed tracking with the profile's own
    acceleration on the reference's segment."""
    n = len(points)
    yaw, v = float(obs["yaw"]), float(obs["velocity_body"][0])
    fx = float(obs["position"][0]) + wheelbase * np.cos(yaw)
    fy = float(obs["position"][1]) + wheelbase * np.sin(yaw)
    best = None
    for i in range(n):
        (ax, ay), (bx, by) = points[i], points[(i + 1) % n]
        length = float(np.hypot(bx - ax, by - ay))
        ux, uy = (bx - ax) / length, (by - ay) / length
        t = min(max((fx - ax) * ux + (fy - ay) * uy, 0.0), length)
        gx, gy = fx - (ax + t * ux), fy - (ay + t * uy)
        if best is None or gx * gx + gy * gy < best[0]:
            best = (gx * gx + gy * gy, i, t, ux * gy - uy * gx)
    _, i, t, error = best
    starts = np.concatenate([[0.0], np.cumsum(np.hypot(*(np.roll(points, -1, 0) - points).T))])
    target = (starts[i] + t + max(v, 0.0) * settings["preview_s"]) % starts[-1]
    j = max(k for k in range(n) if starts[k] <= target)
    (ax, ay), (bx, by) = points[j], points[(j + 1) % n]
    turn = (np.arctan2(by - ay, bx - ax) - yaw + np.pi) % (2 * np.pi) - np.pi
    steering = turn - np.arctan(settings["cross_track_gain"] * error / (max(v, 0.0) + settings["softening_mps"]))
    own = (speed[(j + 1) % n] ** 2 - speed[j] ** 2) / (2 * np.hypot(bx - ax, by - ay))
    accel = min(own + settings["speed_gain_per_s"] * (speed[j] - v), settings["drive_accel_mps2"])
    return np.clip([steering, accel], low, high).astype(np.float32)
