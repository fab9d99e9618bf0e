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

`LearnedBatchController` drives every world of a batched run
(`racing_env.runner.run` with ``batched=True``, ``evaluate --batched``)
with the same network, loaded once: on a GPU every world's row in one
call; on the CPU one world's row at a time, so that its numbers are
`LearnedController`'s bit for bit (a CPU matrix product's rounding
depends on how many rows it holds). On the CPU both run Torch on one
thread (`one_thread`).
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from racing_env.controller import BatchController, Controller
from racing_stack.ppo.export import load_policy

WEIGHTS = Path(__file__).with_name("weights.pt")


@contextlib.contextmanager
def one_thread(device: torch.device) -> Iterator[None]:
    """Torch on one CPU thread inside, where ``device`` is the CPU (its
    thread count as it was after): a row's network is too small to share
    out, and threads that share it wait on each other under load (a call
    of 1,000 rows took 9.6 s with two threads on a busy 2-core CPU, 0.55 s
    with one). Its numbers then do not depend on the machine's cores.
    Torch's thread count is the process's: a controller's calls are one
    thread's (the Runner's), which this assumes."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
        with torch.no_grad(), one_thread(self.device):
            action = self.policy.mean_action(x)[0].cpu().numpy()
        self.previous = action[None].astype(np.float32)
        return action


class LearnedBatchController(BatchController):
    """The trained policy's mean action for every world at once, each
    world's previous action its own (zero at its episode's start)."""

    def __init__(self, config, worlds):
        super().__init__(config, worlds)
        settings = config["controller"]
        self.device = torch.device(settings["device"])
        self.policy, self.features = load_policy(settings, WEIGHTS, config["action"]["low"],
                                                 config["action"]["high"], self.device)
        self.previous = np.zeros((worlds, 2), np.float32)

    def start(self, worlds, obs, info):
        self.previous[worlds] = 0.0

    def compute_controls(self, worlds, obs, info):
        if self.device.type == "cpu":
            with one_thread(self.device):
                actions = np.concatenate([self._one(obs, k, worlds[k]) for k in range(len(worlds))])
        else:
            x = torch.from_numpy(self.features.host(obs, self.previous[worlds])).to(self.device)
            with torch.no_grad():
                actions = self.policy.mean_action(x).cpu().numpy()
        self.previous[worlds] = actions.astype(np.float32)
        return actions

    def _one(self, obs, k, world):
        """World ``world``'s action from row ``k`` of ``obs``, as `LearnedController` computes it: [1, 2]."""
        batch = {key: value if isinstance(value, str) else np.asarray(value)[k:k + 1] for key, value in obs.items()}
        x = torch.from_numpy(self.features.host(batch, self.previous[world:world + 1]))
        with torch.no_grad():
            return self.policy.mean_action(x).numpy()
