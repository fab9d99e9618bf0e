"""A policy trained by ``racing_stack.ppo``, as a controller plugin.

It acts from the public observation alone: the same local-track features
the policy was trained on (``racing_stack.features.LocalTrack``, settings
in config.toml; the previous action is its own, zero at the episode's
start; a residual policy's end with the pure-pursuit prior's action),
normalised by the statistics trained with it, and the policy's mean
action (no sampling: the mean of the actions its draws give the env,
`ActorCritic.mean_action`; for a residual policy, of the prior's action
plus the correction, clipped to the bounds).
``weights.pt`` beside this file holds the network
(a checked `racing_stack.checkpoints` file: a damaged, foreign or changed
one is refused by name, and nothing but tensors is unpickled); ``device``
in config.toml runs it on the CPU or a GPU.
"""

from pathlib import Path

import numpy as np
import torch

from racing_env.controller import Controller
from racing_stack.ppo.export import load_policy

WEIGHTS = Path(__file__).with_name("weights.pt")


class LearnedController(Controller):
    """The trained policy's mean action."""

    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        settings = config["controller"]
        self.device = torch.device(settings["device"])
        self.policy, self.features = load_policy(settings, WEIGHTS, config["action"]["low"],
                                                 config["action"]["high"], self.device)
        self.previous = np.zeros((1, 2), np.float32)

    def compute_control(self, obs, info=None):
        batch = {key: np.asarray(value)[None] for key, value in obs.items()}
        x = torch.from_numpy(self.features.host(batch, self.previous)).to(self.device)
        with torch.no_grad():
            action = self.policy.mean_action(x)[0].cpu().numpy()
        self.previous = action[None].astype(np.float32)
        return action
