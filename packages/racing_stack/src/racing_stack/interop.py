"""JAX and Torch on one device, without copies: the env's numeric outputs
become Torch tensors that are views of the same buffers (DLPack), and
Torch actions return to JAX the same way.

The public ``benchmark_version`` is a string (DLPack has no string dtype):
it stays a Python string and is checked against the expected version.
Neither framework may take the whole GPU: `share_gpu` stops JAX from
preallocating (Torch's caching allocator grows as it needs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import torch

__all__ = ["share_gpu", "to_jax", "to_torch", "tree_to_torch"]


def share_gpu() -> None:
    """Let JAX and Torch share one GPU: JAX allocates as it goes instead of
    taking 75 % of the device up front. Call it before JAX first touches the
    GPU (an environment variable set by the user wins)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def to_torch(array: jax.Array) -> torch.Tensor:
    """A Torch view of a JAX array: same device, same buffer, no copy.

    Raises:
        TypeError: ``array`` is not a JAX array.
    """
    if not isinstance(array, jax.Array):
        raise TypeError(f"array must be a jax.Array, got {type(array).__name__}")
    return torch.from_dlpack(array)


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """A JAX view of a Torch tensor: same device, same buffer, no copy (a
    non-contiguous tensor is made contiguous first, on its device).

    Raises:
        TypeError: ``tensor`` is not a Torch tensor.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    return jax.dlpack.from_dlpack(tensor.detach().contiguous())


def tree_to_torch(tree: Mapping[str, Any], benchmark_version: str | None = None) -> dict[str, Any]:
    """Every numeric leaf of an env output (an observation or an info dict)
    as a Torch view; ``benchmark_version`` stays a string.

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
