"""The neutral template: copy this directory to start a controller.

It returns a neutral action (no steering, no acceleration) every step, so
the car stays at rest and the episode reaches the Level's timeout: it shows
the API, not a driving result.
"""

import numpy as np

from racing_env.controller import Controller


class TemplateController(Controller):
    """Neutral action every step."""

    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        self.steps = 0

    def compute_control(self, obs, info=None):
        return np.zeros(2, dtype=np.float32)

    def step_callback(self, action, obs, reward, terminated, truncated, info):
        self.steps += 1
