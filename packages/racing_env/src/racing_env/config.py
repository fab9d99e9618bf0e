"""What the Challenge is made of: the car and its clock (`ProjectConfig`) and
what differs per level (`Level`).

Both are immutable. Every number is in SI units (kg, m, s, rad). The public
action is applied for one control step of `ProjectConfig.control_dt_s`, made
of `substeps` physics steps of `physics_dt_s` each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from racing_env import checks

__all__ = ["ProjectConfig", "Level", "LEVEL_0", "KNUCKLE_MASS_KG", "MAX_EPISODE_STEPS"]

#: Most physics substeps per control step, and most solver iterations.
_MAX_ITERATIONS = 1000

#: Mass of one steering knuckle (the body between the chassis and a front
#: wheel that carries the steering hinge), kg; part of the sprung mass.
KNUCKLE_MASS_KG = 1.0


@dataclass(frozen=True)
class ProjectConfig:
    """The physical car, its action ranges and the simulation clock.

    The car: a chassis on a free joint, two steered front wheels (position
    servos on the steering hinges, parallel steering) and four spinning
    wheels with sphere tyres. Drive is on the rear wheels; brakes act on all
    four, `brake_front_share` of the braking torque on the front axle.

    Attributes:
        physics_dt_s: MuJoCo timestep, s.
        substeps: physics steps per control step.
        chassis_mass_kg: sprung mass (everything but the four wheels,
            steering knuckles included), kg.
        wheel_mass_kg: one wheel, kg.
        wheelbase_m: front to rear axle, m.
        track_width_m: left to right wheel centre, m.
        wheel_radius_m: tyre radius, m.
        com_ahead_of_rear_axle_m: chassis centre of mass ahead of the rear
            axle, m (sets the static front/rear weight split).
        com_height_m: chassis centre of mass above the ground, m.
        chassis_size_m: chassis box (length, width, height), m; sets the
            chassis inertia and the drawing, it does not collide.
        tyre_friction: sliding friction coefficient of tyre on ground.
        steer_kp: steering servo stiffness, N m / rad.
        steer_kv: steering servo damping, N m s / rad.
        brake_front_share: fraction of the braking torque on the front wheels.
        brake_fade_speed_mps: below this wheel surface speed the braking
            torque fades linearly to zero (the car stops; it has no reverse).
        max_steering_rad: steering command range is [-max, +max], rad.
        min_acceleration_mps2: most negative longitudinal command, m/s^2.
        max_acceleration_mps2: most positive longitudinal command, m/s^2.
        solver_iterations: MuJoCo constraint solver iterations.
        ls_iterations: MuJoCo line-search iterations.
    """

    physics_dt_s: float = 0.01
    substeps: int = 2
    chassis_mass_kg: float = 1110.0
    wheel_mass_kg: float = 20.0
    wheelbase_m: float = 2.6
    track_width_m: float = 1.6
    wheel_radius_m: float = 0.33
    com_ahead_of_rear_axle_m: float = 1.43
    com_height_m: float = 0.5
    chassis_size_m: tuple[float, float, float] = (4.2, 1.75, 0.5)
    tyre_friction: float = 1.0
    steer_kp: float = 8000.0
    steer_kv: float = 200.0
    brake_front_share: float = 0.7
    brake_fade_speed_mps: float = 0.5
    max_steering_rad: float = 0.6
    min_acceleration_mps2: float = -8.0
    max_acceleration_mps2: float = 4.0
    solver_iterations: int = 10
    ls_iterations: int = 10

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("substeps", "solver_iterations", "ls_iterations"):
                # Bounded so that no config makes one control step run for hours.
                checks.integer_in(value, field.name, 1, _MAX_ITERATIONS + 1)
            elif field.name == "chassis_size_m":
                if not isinstance(value, tuple) or len(value) != 3:
                    raise TypeError(f"chassis_size_m must be a tuple of 3 numbers, got {value!r}")
                for i, side in enumerate(value):
                    checks.positive(side, f"chassis_size_m[{i}]")
            elif field.name == "min_acceleration_mps2":
                if checks.real(value, field.name) >= 0:
                    raise ValueError(f"min_acceleration_mps2 must be finite and < 0, got {value!r}")
            else:
                checks.positive(value, field.name)
        if not self.chassis_mass_kg > 2 * KNUCKLE_MASS_KG:
            raise ValueError(
                f"chassis_mass_kg must exceed the two steering knuckles' {2 * KNUCKLE_MASS_KG} kg, "
                f"got {self.chassis_mass_kg}"
            )
        if not self.brake_front_share <= 1.0:
            raise ValueError(f"brake_front_share must be in (0, 1], got {self.brake_front_share}")
        if not self.com_ahead_of_rear_axle_m < self.wheelbase_m:
            raise ValueError(
                "com_ahead_of_rear_axle_m must lie between the axles (< wheelbase_m), "
                f"got {self.com_ahead_of_rear_axle_m} with wheelbase_m {self.wheelbase_m}"
            )

    @property
    def control_dt_s(self) -> float:
        """Duration of one public step, s."""
        return self.physics_dt_s * self.substeps

    @property
    def total_mass_kg(self) -> float:
        """Chassis plus four wheels, kg."""
        return self.chassis_mass_kg + 4 * self.wheel_mass_kg

    @property
    def wheel_spin_inertia(self) -> float:
        """One wheel's moment of inertia about its axle (a solid sphere), kg m^2."""
        return 0.4 * self.wheel_mass_kg * self.wheel_radius_m**2

    @property
    def effective_mass_kg(self) -> float:
        """Mass the longitudinal force accelerates: the car plus the four
        wheels' rotary inertia seen at the tyre, kg."""
        return self.total_mass_kg + 4 * self.wheel_spin_inertia / self.wheel_radius_m**2


#: The largest ``Level.max_episode_steps``: each world's step counter is an
#: int32 on the device (``EnvState.steps``), so a timeout must be one it holds.
MAX_EPISODE_STEPS = 2**31 - 1


@dataclass(frozen=True)
class Level:
    """What differs per level.

    Attributes:
        level_id: the Level's number; a TrackPool made for another level is
            refused.
        name: a short human name.
        max_episode_steps: control steps after which an episode is truncated
            (termination reason `timeout`), in ``[1, MAX_EPISODE_STEPS]``
            (2**31 - 1: the env counts steps in int32).
    """

    level_id: int
    name: str
    max_episode_steps: int

    def __post_init__(self) -> None:
        checks.integer_in(self.level_id, "level_id", 0)
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        if not self.name:
            raise ValueError("name must be a non-empty str")
        checks.integer_in(self.max_episode_steps, "max_episode_steps", 1, MAX_EPISODE_STEPS + 1)


#: Level 0: the built-in development track, a timeout of 3,970 control steps
#: (79.4 s at the default 50 Hz).
LEVEL_0 = Level(level_id=0, name="development", max_episode_steps=3970)
#: Level 1: generated tracks (TrackPools of track_gen courses), Level 0's timeout.
LEVEL_1 = Level(level_id=1, name="generated", max_episode_steps=LEVEL_0.max_episode_steps)
