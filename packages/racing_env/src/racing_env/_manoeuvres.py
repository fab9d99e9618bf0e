"""The proving-ground tests behind `racing_env.envelope`, each driven on a
`racing_env._rig.Rig` (the method is written out in the envelope module's
docstring). Each takes the `Schedule` and its durations in control steps
(`Schedule.steps`).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import numpy as np

from racing_env._rig import Reading, Rig, SpeedHold, wrap_angle
from racing_env._schedule import Schedule

__all__ = ["Ramp", "from_rest", "gg_polygon", "hold_speed", "ramp_steer", "speed_hold", "straight_limits"]

#: The ramp-steer test ends on a plateau once the held lateral acceleration
#: gains less than this fraction of what the steering asked for more (the
#: rise of the kinematic lateral acceleration, ``plateau_mps2``).
PLATEAU_SLOPE = 0.1
#: The from-rest run's acceleration at a speed v is its mean from
#: v - band / 2 to v + band / 2, m/s (the run's tyres may slip and grip in
#: turns: a mean over a speed band, not a peak).
FROM_REST_BAND_MPS = 2.0


class _Trailing:
    """Mean of the last `n` values pushed (None until `n` were)."""

    def __init__(self, n: int) -> None:
        self.values: collections.deque[float] = collections.deque(maxlen=n)

    def push(self, value: float) -> float | None:
        self.values.append(value)
        return sum(self.values) / len(self.values) if len(self.values) == self.values.maxlen else None


class _LapMin:
    """The least value pushed over the last full turn of heading (2 pi of
    accumulated yaw, `psi`), None until the car has turned a full lap."""

    def __init__(self) -> None:
        self.window: collections.deque[tuple[float, float]] = collections.deque()
        self.first: float | None = None

    def push(self, psi: float, value: float) -> float | None:
        if self.first is None:
            self.first = psi
        while self.window and self.window[-1][1] >= value:
            self.window.pop()
        self.window.append((psi, value))
        while self.window[0][0] < psi - 2 * math.pi:
            self.window.popleft()
        return self.window[0][1] if psi - self.first >= 2 * math.pi else None


def _lost(reading: Reading, schedule: Schedule, target_mps: float | None = None) -> bool:
    """Whether the car lost it: rear-axle sideslip beyond the schedule's
    limit, the rear axle risen off the ground, or (with a target) speed off
    the target by more than its tolerance."""
    if abs(reading.rear_slip_rad) > schedule.max_sideslip_rad or abs(reading.rise_m) > schedule.max_rise_m:
        return True
    return target_mps is not None and abs(reading.speed_mps - target_mps) > schedule.speed_tolerance * target_mps


def speed_hold(rig: Rig, target_mps: float) -> SpeedHold:
    """A `SpeedHold` of `target_mps` within the car's action range."""
    c = rig.config
    return SpeedHold(target_mps, c.min_acceleration_mps2, c.max_acceleration_mps2, rig.dt)


def hold_speed(rig: Rig, reading: Reading, hold: SpeedHold, steering: float, steps: int) -> Reading:
    """`steps` control steps at a fixed steering, speed held by `hold`."""
    for _ in range(steps):
        reading = rig.step(steering, hold.command(reading.speed_mps))
    return reading


def from_rest(rig: Rig, heading: float, speeds: np.ndarray, schedule: Schedule,
              steps: dict[str, int]) -> np.ndarray:
    """float64 [K]: full throttle from rest, straight ahead at `heading`:
    the mean acceleration over `FROM_REST_BAND_MPS` around each speed, m/s^2;
    NaN for a speed whose band the car did not finish (it lost it, or the
    run reached ``max_run_s``)."""
    reading = rig.launch(heading, 0.0)
    top = speeds[-1] + FROM_REST_BAND_MPS / 2
    times, speed = [0.0], [reading.speed_mps]
    for k in range(steps["max_run_s"]):
        reading = rig.step(0.0, rig.config.max_acceleration_mps2)
        if _lost(reading, schedule):
            break
        times.append((k + 1) * rig.dt)
        speed.append(reading.speed_mps)
        if reading.speed_mps >= top:
            break
    times, speed = np.array(times), np.array(speed)
    # The first time the speed reached v (linear between control steps), NaN if it never did.
    crossed = np.maximum.accumulate(speed)

    def time_at(v: float) -> float:
        after = np.flatnonzero(crossed >= v)
        if not len(after):
            return math.nan
        i = after[0]
        if i == 0:
            return times[0]
        return float(np.interp(v, [crossed[i - 1], crossed[i]], times[i - 1:i + 1]))

    out = []
    for v in speeds:
        low, high = max(v - FROM_REST_BAND_MPS / 2, 0.0), v + FROM_REST_BAND_MPS / 2
        out.append((high - low) / (time_at(high) - time_at(low)))
    return np.array(out)


def _held_point(rig: Rig, start: tuple, steering: float, command: float, schedule: Schedule,
                steps: dict[str, int]) -> tuple[float, float, bool]:
    """(mean a_x, mean a_y over ``window_s``, whether the car held) of
    `command` from the snapshot `start` at a fixed `steering`; held means
    not lost within the window nor the ``recovery_s`` of speed hold after it."""
    rig.restore(start)
    readings = [rig.step(steering, command) for _ in range(steps["window_s"])]
    held = not any(_lost(r, schedule) for r in readings)
    reading = readings[-1]
    if held:
        hold = speed_hold(rig, reading.speed_mps)
        for _ in range(steps["recovery_s"]):
            reading = rig.step(steering, hold.command(reading.speed_mps))
            if _lost(reading, schedule):
                held = False
                break
    return float(np.mean([r.a_x_mps2 for r in readings])), float(np.mean([r.a_y_mps2 for r in readings])), held


def _largest_held(rig: Rig, start: tuple, steering: float, command: float, schedule: Schedule,
                  steps: dict[str, int]) -> tuple[float, float]:
    """(a_x, a_y) of `command`, or of the largest fraction of it the car
    holds (``gg_bisections`` halvings; a fraction 0 is the steady state)."""
    a_x, a_y, held = _held_point(rig, start, steering, command, schedule, steps)
    if held:
        return a_x, a_y
    best = _held_point(rig, start, steering, 0.0, schedule, steps)[:2]
    low, high = 0.0, 1.0
    for _ in range(schedule.gg_bisections):
        middle = 0.5 * (low + high)
        a_x, a_y, held = _held_point(rig, start, steering, middle * command, schedule, steps)
        if held:
            low, best = middle, (a_x, a_y)
        else:
            high = middle
    return best


def straight_limits(rig: Rig, heading: float, speed: float, schedule: Schedule,
                    steps: dict[str, int]) -> tuple[float, float]:
    """(forward acceleration, braking deceleration), both >= 0 m/s^2, the
    car rolling straight at `heading` and `speed`: full throttle and full
    brake over ``window_s`` (or the largest fraction of each it holds)."""
    reading = rig.launch(heading, speed)
    hold_speed(rig, reading, speed_hold(rig, speed), 0.0, steps["settle_s"])
    start = rig.snapshot()
    c = rig.config
    forward = _largest_held(rig, start, 0.0, c.max_acceleration_mps2, schedule, steps)[0]
    braking = -_largest_held(rig, start, 0.0, c.min_acceleration_mps2, schedule, steps)[0]
    return forward, braking


@dataclass
class Ramp:
    """One ramp-steer test: the held lateral limit (m/s^2; NaN if the car
    was lost before a full lap), how it ended, and the trace of steering
    (rad) against smoothed lateral acceleration (m/s^2), float64 [T]."""

    lateral_mps2: float
    limited_by: str
    steering: np.ndarray
    smoothed_a_y: np.ndarray

    def steering_for(self, a_y: float) -> float:
        """The steering at which the smoothed lateral acceleration first reached `a_y`."""
        reached = np.flatnonzero(self.smoothed_a_y >= a_y)
        return float(self.steering[reached[0]]) if len(reached) else float(self.steering[-1])


def ramp_steer(rig: Rig, speed: float, schedule: Schedule, steps: dict[str, int]) -> Ramp:
    """The ramp-steer test at `speed`, m/s."""
    config = rig.config
    reading = rig.launch(0.0, speed)
    hold = speed_hold(rig, speed)
    reading = hold_speed(rig, reading, hold, 0.0, steps["settle_s"])
    smooth, lap = _Trailing(steps["smoothing_s"]), _LapMin()
    window = schedule.plateau_mps2 / schedule.ramp_mps2_per_lap * 2 * math.pi  # of accumulated yaw, rad
    wanted_gain = PLATEAU_SLOPE * schedule.plateau_mps2
    psi, best, lock_at = 0.0, -math.inf, None
    history: collections.deque[tuple[float, float]] = collections.deque()  # (psi, best so far)
    steering_trace, a_y_trace = [], []
    limited_by = "run_length"
    for _ in range(steps["max_run_s"]):
        kinematic = schedule.ramp_start_mps2 + schedule.ramp_mps2_per_lap * psi / (2 * math.pi)
        steering = math.atan(config.wheelbase_m * kinematic / speed**2)
        if steering >= config.max_steering_rad:
            steering = config.max_steering_rad
            lock_at = psi if lock_at is None else lock_at
        reading = rig.step(steering, hold.command(reading.speed_mps))
        psi += reading.yaw_rate_radps * rig.dt
        if _lost(reading, schedule, speed):
            limited_by = "loss"
            break
        a_y = smooth.push(reading.a_y_mps2)
        if a_y is None:
            continue
        steering_trace.append(steering)
        a_y_trace.append(a_y)
        held = lap.push(psi, a_y)
        if held is None:
            continue
        best = max(best, held)
        history.append((psi, best))
        while len(history) > 1 and history[1][0] <= psi - window:
            history.popleft()
        if lock_at is not None and psi - lock_at >= 2 * math.pi:
            limited_by = "steering_lock"
            break
        if history[0][0] <= psi - window and best - history[0][1] < wanted_gain:
            limited_by = "plateau"
            break
    return Ramp(best if math.isfinite(best) else math.nan, limited_by, np.array(steering_trace),
                np.array(a_y_trace))


def _circle_start(rig: Rig, speed: float, a_y: float, steering: float, schedule: Schedule,
                  steps: dict[str, int]) -> tuple:
    """A snapshot of the car in a steady left circle of `steering` at
    `speed` (expected lateral acceleration `a_y`), its heading half a window
    short of ``gg_heading_rad``; straight at that heading for `a_y` 0."""
    rate = a_y / speed  # the yaw rate expected, rad/s
    lead = rate * (schedule.settle_s + 0.5 * schedule.window_s)
    reading = rig.launch(schedule.gg_heading_rad - lead, speed)
    hold = speed_hold(rig, speed)
    reading = hold_speed(rig, reading, hold, steering, steps["settle_s"])
    if rate == 0:
        return rig.snapshot()
    previous = None
    for _ in range(steps["max_run_s"]):
        target = schedule.gg_heading_rad - 0.5 * reading.yaw_rate_radps * schedule.window_s
        offset = wrap_angle(reading.yaw_rad - target)
        if previous is not None and previous < 0 <= offset < 0.5:
            break
        previous = offset
        reading = rig.step(steering, hold.command(reading.speed_mps))
    return rig.snapshot()


def gg_polygon(rig: Rig, speed: float, ramp: Ramp, schedule: Schedule, steps: dict[str, int]) -> np.ndarray:
    """float64 [P, 2]: the closed g-g polygon at `speed`, (a_x, a_y) in m/s^2."""
    config = rig.config
    points = []
    for fraction in schedule.gg_fractions:
        a_y = fraction * ramp.lateral_mps2
        steering = ramp.steering_for(a_y) if fraction > 0 else 0.0
        start = _circle_start(rig, speed, a_y, steering, schedule, steps)
        for command in (config.max_acceleration_mps2, config.min_acceleration_mps2):
            a_x, a_y_point = _largest_held(rig, start, steering, command, schedule, steps)
            points.append((a_x, a_y_point))
            if fraction > 0:
                points.append((a_x, -a_y_point))  # the right-hand turn: the car is symmetric
    ordered = np.array(sorted(points, key=lambda p: math.atan2(p[1], p[0])))
    return np.concatenate([ordered, ordered[:1]])
