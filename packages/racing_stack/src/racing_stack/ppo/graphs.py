"""CUDA graph capture for the trainer: which runs capture, the warm-up a
capture needs, and the stream each family of graphs is captured on.

Each object that captures graphs (a rollout's steps, an optimisation, a
validation's mean action) takes a
CUDA stream of its own to capture on (`capture_stream`): Torch keys cuBLAS's
workspace by stream, and a captured matrix product keeps the workspace's
address, so graphs captured on one stream share one workspace. Two of them
replaying at once (a lagged rollout's steps beside the optimisation) would write each
other's partial sums, and destroying one graph frees the workspace the
others captured on that stream still use.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group

__all__ = ["capture_stream", "captured", "capturing", "moments", "warm_up"]

#: Torch hands out a device's streams of one priority from a pool of 32, in turn.
_POOL = 32
#: The CUDA streams (their handles) that live capturing objects hold.
_HELD: set[int] = set()


def captured(config: PPOConfig, device: torch.device, group: Group) -> bool:
    """Whether the policy's work replays captured CUDA graphs:
    ``config.update_path`` is ``"graph"``, on a CUDA device, in a process
    training alone (else the eager path)."""
    return config.update_path == "graph" and device.type == "cuda" and group.size == 1


def warm_up(device: torch.device, step: Callable[[], object]) -> None:
    """Run ``step`` twice on a side stream of ``device``, ordered after and
    before the current stream's work: cuBLAS and autograd set themselves
    up at first use, which a CUDA graph capture must not see."""
    side = _free_stream(device)  # not a capture's: its eager products would use that capture's workspace
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(side)


def capture_stream(owner: object, device: torch.device) -> torch.cuda.Stream:
    """A stream of ``device`` for ``owner``'s captures alone while ``owner``
    lives: none of whose CUDA stream another live owner holds.

    Raises:
        RuntimeError: every stream of Torch's pool is held (32 live owners).
    """
    stream = _free_stream(device)
    _HELD.add(stream.cuda_stream)
    weakref.finalize(owner, _HELD.discard, stream.cuda_stream)
    return stream


def _free_stream(device: torch.device) -> torch.cuda.Stream:
    """A stream of ``device`` whose CUDA stream no live capturing object holds."""
    for _ in range(2 * _POOL):
        stream = torch.cuda.Stream(device)
        if stream.cuda_stream not in _HELD:
            return stream
    raise RuntimeError(f"every one of Torch's {_POOL} streams of {device} holds captured graphs")


def moments(optimizer: torch.optim.Optimizer) -> list[int]:
    """Where ``optimizer``'s moments and step counts live (a captured step writes there)."""
    return [v.data_ptr() for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, device: torch.device, stream: torch.cuda.Stream,
              pool: Any = None) -> Iterator[None]:
    """Capture the work inside into ``graph`` on ``device``'s ``stream``
    (`capture_stream`'s) in memory pool ``pool`` (None: a new one),
    thread_local: another thread's CUDA calls (JAX's runtime) do not
    invalidate the capture."""
    with torch.cuda.device(device), torch.cuda.graph(graph, pool=pool, stream=stream,
                                                     capture_error_mode="thread_local"):
        yield
