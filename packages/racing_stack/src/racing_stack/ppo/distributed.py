"""The processes that train one policy together (one per GPU, under
``torchrun``): which share of the batch this one drives, and the sums that
make their update the update of one process over all their worlds.

Process ``rank`` of ``size`` drives worlds ``rank x worlds .. (rank + 1) x
worlds - 1`` of one batch of ``size x worlds`` (`VecCarRacingEnv`'s
``first_world``: its seeds and tracks are those worlds' in one env of all
of them). Every draw of the shared generator is made for the whole batch
and each process keeps its share, so the generator stays the same in
every process and a world's noise does not depend on how the worlds are
split. Sums over the batch (the advantages' and the features'
statistics, the minibatches' valid counts, the gradients, the losses)
are all-reduced. Alone (no process group), every method is the identity.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Group", "start", "stop"]


@dataclasses.dataclass(frozen=True)
class Group:
    """This process's place among those training one policy.

    Attributes:
        rank: this process's index, in [0, size).
        size: the number of processes.
    """

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        for name in ("rank", "size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"rank must be in [0, size) and size >= 1, got rank {self.rank}, size {self.size}")

    @classmethod
    def current(cls) -> Group:
        """The initialised `torch.distributed` group, or a process alone."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def lead(self) -> bool:
        """Whether this process validates, logs, checkpoints and exports (rank 0)."""
        return self.rank == 0

    def first_world(self, worlds: int) -> int:
        """The world index of this process's first world, when each drives ``worlds``."""
        return self.rank * worlds

    def share(self, whole: torch.Tensor) -> torch.Tensor:
        """This process's rows of ``whole`` [size x n, ...]: ``rank x n .. (rank + 1) x n - 1``."""
        n = whole.shape[0] // self.size
        return whole[self.rank * n:(self.rank + 1) * n]

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the processes, in place (returned)."""
        if self.size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over the processes (each process's
        loss is its part of the whole minibatch's mean), in one all-reduce;
        a missing gradient counts as zeros."""
        if self.size == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self.sum(torch.cat([g.reshape(-1) for g in grads]))
        for p, part in zip(params, flat.split([g.numel() for g in grads])):
            p.grad = part.view_as(p)

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true in any process (each must ask)."""
        if self.size == 1:
            return flag
        value = torch.tensor([float(flag)], device=_device())
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[size, ...]: every process's ``tensor`` (of one shape), in rank order."""
        if self.size == 1:
            return tensor[None]
        out = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(out, tensor.contiguous())
        return torch.stack(out)

    def objects(self, value: Any) -> list[Any]:
        """Every process's ``value`` (picklable), in rank order."""
        if self.size == 1:
            return [value]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value)
        return out


def _device() -> torch.device:
    """Where the backend's collectives take their tensors."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def start(timeout_s: float = 600.0) -> Group:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE``,
    ``RANK``, ``MASTER_ADDR``, ...), on NCCL with CUDA and gloo without;
    alone when ``WORLD_SIZE`` is unset or 1. A process that dies makes the
    others' next collective fail (gloo: at once; NCCL: within
    ``timeout_s``) instead of waiting for it forever.

    Call it before JAX starts: with CUDA it makes this process's GPU
    (``LOCAL_RANK``) the only one JAX and Torch see.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return Group()
    if "LOCAL_RANK" in os.environ:  # before anything asks CUDA about its devices
        local = int(os.environ["LOCAL_RANK"])
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        if visible and local >= len(visible):
            raise ValueError(f"LOCAL_RANK {local} has no GPU in CUDA_VISIBLE_DEVICES={','.join(visible)}")
        os.environ["CUDA_VISIBLE_DEVICES"] = visible[local] if visible else str(local)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return Group.current()


def stop() -> None:
    """Leave the process group `start` joined (nothing alone)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
