"""JAX and Torch on one device, without copies: the env's numeric outputs
become Torch tensors that are views of the same buffers (DLPack), and
Torch actions return to JAX the same way.

The rule of a crossing. A DLPack view is ordered after its producer on
the device: `torch.from_dlpack` hands JAX Torch's current stream and JAX
makes that stream wait for the buffer's definition event;
`jax.dlpack.from_dlpack` hands Torch JAX's stream and Torch records an
event on its own for that stream to wait on. Neither waits on the host.
What DLPack does not do is keep the producer's buffer out of its
allocator's hands while the consumer still reads it. When the last Python
reference to a view goes, its deleter gives the buffer back at once, on
the host, though the kernels that read it may still be queued on the other
framework's stream: JAX's allocator then hands the memory to JAX's next
computation (and Torch's caching allocator, which records only Torch's
streams, to Torch's next tensor), and the late reader sees data written
after it. A view made and dropped inside one expression
(``buf[t] = to_torch(f(x))``) is exactly that case.

`Handover` makes a crossing correct by construction: it holds the
producer's array and the consumer's view of every crossing until the
device has passed a fence placed after the consumer's reads (a CUDA event
recorded on Torch's stream, polled, never waited for on the host), then
lets both go. `to_torch` and `to_jax` alone are the bare crossings: whoever
calls them keeps both sides alive until the consumer's work is done.
`HostCopy` has `Handover`'s interface but copies through the host: it is
the reference the zero-copy path is checked against.

The public ``benchmark_version`` is a string (DLPack has no string dtype):
it stays a Python string and is checked against the expected version.
Neither framework may take the whole GPU: `share_gpu` stops JAX from
preallocating (Torch's caching allocator grows as it needs).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

__all__ = ["Handover", "HostCopy", "share_gpu", "to_jax", "to_torch", "tree_to_torch"]


def share_gpu() -> None:
    """Let JAX and Torch share one GPU: JAX allocates as it goes instead of
    taking 75 % of the device up front. Call it before JAX first touches the
    GPU (an environment variable set by the user wins)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def to_torch(array: jax.Array) -> torch.Tensor:
    """A Torch view of a JAX array: same device, same buffer, no copy. Torch's
    current stream waits for the array on the device. The caller keeps
    ``array`` and the view alive until Torch's reads of it are done (or uses
    a `Handover`).

    Raises:
        TypeError: ``array`` is not a JAX array.
    """
    if not isinstance(array, jax.Array):
        raise TypeError(f"array must be a jax.Array, got {type(array).__name__}")
    return torch.from_dlpack(array)


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """A JAX view of a Torch tensor: same device, same buffer, no copy (a
    non-contiguous tensor is made contiguous first, on its device). JAX's
    stream waits for Torch's current one on the device. The caller keeps the
    tensor alive until JAX's reads of it are done (or uses a `Handover`).

    Raises:
        TypeError: ``tensor`` is not a Torch tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    return jax.dlpack.from_dlpack(tensor.detach().contiguous())


class Handover:
    """Zero-copy crossings between JAX and Torch whose buffers stay alive
    until they have been read.

    Cross with `to_torch` and `to_jax`, then call `fence` once the Torch
    work that reads the crossings is enqueued and, for every JAX call that
    read a tensor crossed to JAX, Torch has read one of that call's outputs
    through this handover (an XLA call defines its outputs after it has
    read its inputs, so Torch's stream has then passed the JAX reads too).
    A training step does exactly this: the action to JAX, one pack of the
    step's outputs and the next features to Torch, `fence`. The crossings before a fence
    are released once the device has passed it: on CUDA when a Torch event
    recorded at the fence has completed (polled at each `fence`), on the CPU
    at the fence itself (Torch's CPU work is done when its call returns, and
    JAX hands a CPU array over only once it is ready). `drain` waits for
    every fence and releases everything.

    Args:
        device: the Torch device both frameworks compute on.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._open: list[tuple[Any, Any]] = []
        self._fenced: collections.deque[tuple[torch.cuda.Event | None, list[tuple[Any, Any]]]] = collections.deque()

    @property
    def held(self) -> int:
        """Crossings not yet released."""
        return len(self._open) + sum(len(items) for _, items in self._fenced)

    def to_torch(self, array: jax.Array) -> torch.Tensor:
        """`to_torch`, holding ``array`` and the view until a fence after this call has passed."""
        view = to_torch(array)
        self._open.append((array, view))
        return view

    def to_jax(self, tensor: torch.Tensor) -> jax.Array:
        """`to_jax`, holding the tensor and the view until a fence after this call has passed."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        source = tensor.detach().contiguous()
        view = to_jax(source)
        self._open.append((source, view))
        return view

    def fence(self) -> None:
        """Close the crossings made since the last fence (see the class),
        and release those of every fence the device has passed."""
        if self._open:
            event = None
            if self.device.type == "cuda":
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(self.device))
            self._fenced.append((event, self._open))
            self._open = []
        while self._fenced and (self._fenced[0][0] is None or self._fenced[0][0].query()):
            self._fenced.popleft()

    def drain(self) -> None:
        """Fence, wait for the device to pass every fence (a host wait), and
        release every crossing."""
        self.fence()
        for event, _ in self._fenced:
            if event is not None:
                event.synchronize()
        self._fenced.clear()


class HostCopy(Handover):
    """`Handover`'s interface, copying through the host: each crossing is a
    device-to-host copy and a new buffer of the other framework on the
    device, so nothing is shared and nothing needs holding. Slow; the
    reference that the zero-copy path is compared with."""

    def to_torch(self, array: jax.Array) -> torch.Tensor:
        if not isinstance(array, jax.Array):
            raise TypeError(f"array must be a jax.Array, got {type(array).__name__}")
        return torch.from_numpy(np.array(array)).to(self.device)

    def to_jax(self, tensor: torch.Tensor) -> jax.Array:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        return jnp.asarray(tensor.detach().cpu().numpy().copy())


def tree_to_torch(tree: Mapping[str, Any], benchmark_version: str | None = None) -> dict[str, Any]:
    """Every numeric leaf of an env output (an observation or an info dict)
    as a Torch view; ``benchmark_version`` stays a string. The caller keeps
    ``tree`` alive while Torch reads the views.

    Args:
        tree: a dict of JAX arrays, with at most the string field
            ``benchmark_version``.
        benchmark_version: the version the string field must equal, when given.

    Raises:
        TypeError: a leaf is neither a JAX array nor the version string.
        ValueError: the version string differs from ``benchmark_version``.
    """
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, str):
            if key != "benchmark_version":
                raise TypeError(f"{key} is a string; only benchmark_version may be")
            if benchmark_version is not None and value != benchmark_version:
                raise ValueError(f"benchmark_version is {value!r}, expected {benchmark_version!r}")
            out[key] = value
        else:
            out[key] = to_torch(value)
    return out
