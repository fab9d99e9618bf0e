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
in config.toml runs it on the CPU or a GPU. The network computes in
float64 and gives its action in float32 (`NETWORK_DTYPE`): a float32
matrix product's rounding depends on how many rows a call holds and on
the device's kernels, and a car's lap amplifies one rounding into
another lap (a float32 network batched on an H100 drove laps up to
0.22 s, 11 env calls, from its one-world-a-call laps); float64's
rounding lies far below float32's step, so the action does not depend
on them.

`LearnedBatchController` drives every world of a batched run
(`racing_env.runner.run` with ``batched=True``, ``evaluate --batched``)
with the same network, loaded once: on a GPU every world's row in one
call; on the CPU one world's row at a time, so that its numbers are
`LearnedController`'s bit for bit (in float64 a batched call could
still round one row's action across a float32 step, once in many
millions). On the CPU both run Torch on one thread (`one_thread`).
On a GPU a batched call's features are computed on the host in blocks of
rows on a few threads (`batch_features`): the features of 1,000 rows took
14-22 ms on one thread of an H100 machine's host, most of a call.
"""

import contextlib
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from racing_env.controller import BatchController, Controller
from racing_stack.features import LocalTrack
from racing_stack.ppo.export import load_policy
from racing_stack.ppo.networks import ActorCritic

WEIGHTS = Path(__file__).with_name("weights.pt")
NETWORK_DTYPE = torch.float64
#: The most threads a batched call's features take, and the fewest rows a
#: thread's block holds (1,000 rows on an H100 machine's host: 14-22 ms on
#: one thread, 12 on two, 8 on four, 13 on eight, 31 on sixteen).
FEATURE_THREADS = 4
FEATURE_BLOCK_ROWS = 128


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


def _network(config) -> tuple[torch.device, ActorCritic, LocalTrack]:
    """The plugin's device, its network there in `NETWORK_DTYPE`, and its features."""
    settings = config["controller"]
    device = torch.device(settings["device"])
    policy, features = load_policy(settings, WEIGHTS, config["action"]["low"], config["action"]["high"], device)
    return device, policy.to(NETWORK_DTYPE), features


def batch_features(features: LocalTrack, obs: Mapping[str, np.ndarray], previous: np.ndarray,
                   pool: ThreadPoolExecutor | None) -> np.ndarray:
    """``features.host(obs, previous)`` [K, D] for K rows, in up to
    `FEATURE_THREADS` blocks of consecutive rows on ``pool``'s threads
    (NumPy leaves Python's lock while it computes; ``pool`` None: here).
    Each row's features depend on its own fields only: the same bits as
    one call over all rows (rows that do not match ``previous``'s: that
    call's error)."""
    rows = len(previous)
    blocks = min(FEATURE_THREADS, rows // FEATURE_BLOCK_ROWS)
    if pool is None or blocks < 2 or np.shape(obs["position"])[0] != rows:
        return features.host(obs, previous)
    edges = np.linspace(0, rows, blocks + 1).astype(int)

    def block(k: int) -> np.ndarray:
        a, b = edges[k], edges[k + 1]
        return features.host({key: value if isinstance(value, str) else np.asarray(value)[a:b]
                              for key, value in obs.items()}, previous[a:b])

    return np.concatenate(list(pool.map(block, range(blocks))))


class LearnedController(Controller):
    """The trained policy's mean action."""

    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        self.device, self.policy, self.features = _network(config)
        self.previous = np.zeros((1, 2), np.float32)

    def compute_control(self, obs, info=None):
        batch = {key: np.asarray(value)[None] for key, value in obs.items()}
        x = torch.from_numpy(self.features.host(batch, self.previous)).to(self.device, NETWORK_DTYPE)
        with torch.no_grad(), one_thread(self.device):
            action = self.policy.mean_action(x)[0].cpu().numpy()
        self.previous = action[None].astype(np.float32)
        return action


class LearnedBatchController(BatchController):
    """The trained policy's mean action for every world at once, each
    world's previous action its own (zero at its episode's start)."""

    def __init__(self, config, worlds):
        super().__init__(config, worlds)
        self.device, self.policy, self.features = _network(config)
        self.previous = np.zeros((worlds, 2), np.float32)
        self.pool = None if self.device.type == "cpu" else ThreadPoolExecutor(FEATURE_THREADS)

    def start(self, worlds, obs, info):
        self.previous[worlds] = 0.0

    def compute_controls(self, worlds, obs, info):
        if self.device.type == "cpu":
            with one_thread(self.device):
                actions = np.concatenate([self._one(obs, k, worlds[k]) for k in range(len(worlds))])
        else:
            x = torch.from_numpy(batch_features(self.features, obs, self.previous[worlds], self.pool))
            x = x.to(self.device, NETWORK_DTYPE)
            with torch.no_grad():
                actions = self.policy.mean_action(x).cpu().numpy()
        self.previous[worlds] = actions.astype(np.float32)
        return actions

    def _one(self, obs, k, world):
        """World ``world``'s action from row ``k`` of ``obs``, as `LearnedController` computes it: [1, 2]."""
        batch = {key: value if isinstance(value, str) else np.asarray(value)[k:k + 1] for key, value in obs.items()}
        x = torch.from_numpy(self.features.host(batch, self.previous[world:world + 1])).to(NETWORK_DTYPE)
        with torch.no_grad():
            return self.policy.mean_action(x).numpy()
