"""The reference controller: pure pursuit on the centerline, and a speed
profile from the curvature ahead (the speed that keeps the lateral
acceleration within ``lateral_accel_mps2`` at every centerline point within
``preview_m``, reachable by braking at ``brake_accel_mps2``), computed by
`racing_env.pursuit` in float64 for a batch of one (the episode's loop
once, the plan every call). It reads only the public observation; a
learned policy must beat it.
"""

import numpy as np

from racing_env.controller import Controller
from racing_env.pursuit import Gains, loop, plan


class PursuitController(Controller):
    """Pure pursuit with a curvature speed profile (gains in config.toml)."""

    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        self.gains = Gains(*(float(config["controller"][name]) for name in Gains._fields))
        self.wheelbase = float(config["vehicle"]["wheelbase_m"])
        self.low = np.asarray(config["action"]["low"], np.float32)
        self.high = np.asarray(config["action"]["high"], np.float32)
        self.loop = loop(np, np.asarray(obs["centerline"])[None], np.asarray(obs["track_mask"])[None],
                         dtype=np.float64)
        self.drawn: tuple[np.ndarray, np.ndarray, float] | None = None  # position, aim point, target speed

    def compute_control(self, obs, info=None):
        one = plan(np, self.gains, self.loop, np.asarray(obs["position"])[None], np.asarray(obs["yaw"])[None],
                   np.asarray(obs["velocity_body"])[None], wheelbase_m=self.wheelbase, low=self.low,
                   high=self.high, dtype=np.float64)
        self.drawn = (np.asarray(obs["position"], np.float64), self.loop.line[0, one.aim[0]],
                      float(one.target_mps[0]))
        return one.action[0].astype(np.float32)

    def render_callback(self, debug_draw):
        """The pursuit's aim point and the target speed."""
        if self.drawn is None:
            return
        position, aim, target = self.drawn
        debug_draw.line([position, aim], color=(80, 200, 255), width=2)
        debug_draw.points([aim], color=(80, 200, 255), size=4)
        debug_draw.text(aim, f"{target:.1f} m/s", color=(80, 200, 255))
