"""The pure-pursuit prior of a residual policy: what the reference
controller (`racing_env`'s ``pursuit`` plugin) would do, for a batch of
worlds at once.

`PursuitPrior` holds the reference's gains and computes its action with
the reference's own maths (`racing_env.pursuit.pursue`) from the public
observation's padded arrays, on the device and jitted (training,
validation) or in NumPy (the exported plugin), in float32; the reference
plugin computes it per world in float64, and the two agree to about 1e-4
(tests hold them together on random and on real tracks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from racing_env import ProjectConfig, checks, pursuit

__all__ = ["PursuitPrior"]

_CAR = ProjectConfig()
#: The car's action bounds (steering rad, acceleration m/s^2).
_LOW = (-_CAR.max_steering_rad, _CAR.min_acceleration_mps2)
_HIGH = (_CAR.max_steering_rad, _CAR.max_acceleration_mps2)


@dataclasses.dataclass(frozen=True)
class PursuitPrior:
    """The reference controller's gains (`racing_env.pursuit.Gains`, each
    checked; the defaults are those of the ``pursuit`` plugin's
    config.toml) and its action for a vector observation."""

    max_speed_mps: float = 22.0
    lateral_accel_mps2: float = 4.5
    brake_accel_mps2: float = 3.0
    drive_accel_mps2: float = 2.0
    preview_m: float = 120.0
    lookahead_min_m: float = 8.0
    lookahead_gain_s: float = 0.6

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            high = 100.0 if field.name.endswith("_s") else 1e4
            object.__setattr__(self, field.name, checks.real_in(getattr(self, field.name), field.name, 0.0, high,
                                                                low_open=field.name != "lookahead_gain_s"))

    def _gains(self) -> pursuit.Gains:
        return pursuit.Gains(**{f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)})

    def __call__(self, obs: Mapping[str, jax.Array]) -> jax.Array:
        """float32 [E, 2]: steering (rad) and acceleration (m/s^2) within the
        car's command ranges, from a vector observation of JAX arrays (on
        their device, jitted), with a leading [E]."""
        return pursuit.pursue_jax(self._gains(), *(obs[k] for k in pursuit.FIELDS), wheelbase_m=_CAR.wheelbase_m,
                                  low=_LOW, high=_HIGH, dtype=jnp.float32).action

    def host(self, obs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The same action from NumPy fields, in NumPy on the host."""
        return pursuit.pursue(np, self._gains(), *(np.asarray(obs[k]) for k in pursuit.FIELDS),
                              wheelbase_m=_CAR.wheelbase_m, low=_LOW, high=_HIGH, dtype=np.float32).action
