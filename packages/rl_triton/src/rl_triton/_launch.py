"""Which path answers a call, and how a Triton kernel is launched.

Paths (``rl_triton.last_path()`` tells which one ran last):

- ``"triton"``: CUDA tensors, compiled Triton kernels;
- ``"triton-interpreter"``: ``TRITON_INTERPRET=1`` was set before Triton was
  imported; the same kernels run on CPU tensors through Triton's interpreter;
- ``"reference"``: CPU tensors otherwise; the NumPy references of
  ``rl_triton.reference`` answer, in float64, cast to float32.

Launch plan: a program owns ``block_e`` rows and one chunk of ``chunk_t``
steps, walked in tiles of ``block_t``. When the rows alone give the GPU enough
programs the whole sequence is one chunk (the fused path: one launch). When
they do not (few, long rows), the sequence is cut into chunks: one launch
stores each chunk's affine map, a second composes them into its carry and
writes the outputs (the chunked path). There is no length limit on either.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import triton

PATH_TRITON = "triton"
PATH_INTERPRETER = "triton-interpreter"
PATH_REFERENCE = "reference"

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: Elements of one tile per input tensor (``block_e * block_t * width``).
TILE_ELEMENTS = 2048
#: Longest tile along time.
MAX_BLOCK_T = 1024
#: Programs per streaming multiprocessor the plan aims for before it cuts chunks.
PROGRAMS_PER_SM = 8
#: Most chunks per row (bounds the carry composition's width).
MAX_CHUNKS = 1024

_last_path: str | None = None


def last_path() -> str | None:
    """The path the most recent op call took: ``"triton"``,
    ``"triton-interpreter"`` or ``"reference"`` (``None`` before any call)."""
    return _last_path


def select_path(device: torch.device) -> str:
    """Choose and record the path for tensors on ``device``."""
    global _last_path
    if _INTERPRET:
        _last_path = PATH_INTERPRETER
    elif device.type == "cuda":
        _last_path = PATH_TRITON
    else:
        _last_path = PATH_REFERENCE
    return _last_path


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Launch parameters; ``None`` fields are chosen by the plan.

    Attributes:
        block_e: rows (environments) per program, a power of two.
        block_t: time steps per tile, a power of two.
        chunk_t: time steps per chunk, a multiple of ``block_t``; a value
            below ``seq_len`` forces the chunked path.
        num_warps: warps per program.
    """

    block_e: int | None = None
    block_t: int | None = None
    chunk_t: int | None = None
    num_warps: int | None = None

    def __post_init__(self) -> None:
        for field in ("block_e", "block_t", "num_warps"):
            v = getattr(self, field)
            if v is not None and (not isinstance(v, int) or v < 1 or v & (v - 1)):
                raise ValueError(f"{field} must be a power of two >= 1, got {v!r}")
        if self.chunk_t is not None:
            if not isinstance(self.chunk_t, int) or self.chunk_t < 1:
                raise ValueError(f"chunk_t must be a positive int, got {self.chunk_t!r}")
            if self.block_t is not None and self.chunk_t % self.block_t:
                raise ValueError(
                    f"chunk_t must be a multiple of block_t, got {self.chunk_t} and {self.block_t}")


_override: contextvars.ContextVar[LaunchConfig] = contextvars.ContextVar(
    "rl_triton_launch_config", default=LaunchConfig())


@contextlib.contextmanager
def launch_config(**fields: int) -> Iterator[LaunchConfig]:
    """Override launch parameters inside a ``with`` block (tests, tuning).

    ``with rl_triton.launch_config(block_t=16, chunk_t=32): ...`` runs every op
    with 16-step tiles and 32-step chunks, so short inputs exercise the chunked path.
    """
    config = LaunchConfig(**fields)
    token = _override.set(config)
    try:
        yield config
    finally:
        _override.reset(token)


@dataclasses.dataclass(frozen=True)
class Plan:
    block_e: int
    block_t: int
    chunk_t: int
    num_chunks: int
    num_warps: int

    @property
    def nc_pad(self) -> int:
        return triton.next_power_of_2(self.num_chunks)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _target_programs(device: torch.device) -> int:
    if device.type == "cuda" and not _INTERPRET:
        index = device.index if device.index is not None else torch.cuda.current_device()
        return PROGRAMS_PER_SM * _sm_count(index)
    return 1


@functools.lru_cache(maxsize=4096)
def plan(num_envs: int, seq_len: int, width: int, target_programs: int,
         config: LaunchConfig) -> Plan:
    """The launch plan for ``[num_envs, seq_len]`` inputs whose tiles carry
    ``width`` values per step (1, or the padded action count for Retrace)."""
    block_t = config.block_t or min(triton.next_power_of_2(seq_len), MAX_BLOCK_T)
    tile = max(TILE_ELEMENTS // width, 1)
    block_e = config.block_e or max(1, min(tile // block_t, triton.next_power_of_2(num_envs)))
    tiles = triton.cdiv(seq_len, block_t)
    if config.chunk_t is not None:
        chunk_t = max(config.chunk_t, block_t)
    else:
        row_programs = triton.cdiv(num_envs, block_e)
        wanted = max(1, triton.cdiv(target_programs, row_programs))
        tiles_per_chunk = max(triton.cdiv(tiles, wanted), triton.cdiv(tiles, MAX_CHUNKS))
        chunk_t = tiles_per_chunk * block_t
    num_chunks = triton.cdiv(seq_len, chunk_t)
    if num_chunks == 1:
        chunk_t = tiles * block_t
    elements = block_e * block_t * width
    num_warps = config.num_warps or (8 if elements >= 2048 else 4 if elements >= 512 else 1)
    return Plan(block_e, block_t, chunk_t, num_chunks, num_warps)


def launch(
    kernel: Any,
    args: Sequence[Any],
    num_envs: int,
    seq_len: int,
    device: torch.device,
    width: int = 1,
    **params: Any,
) -> None:
    """Launch ``kernel`` over ``[num_envs, seq_len]``: the aggregate pass first
    when the plan has several chunks, then the output pass.

    ``args`` are the kernel's leading pointer arguments; ``params`` its
    op-specific scalars and constexprs, by name.
    """
    p = plan(num_envs, seq_len, width, _target_programs(device), _override.get())
    if p.num_chunks > 1:
        agg = torch.empty((2, num_envs, p.num_chunks), dtype=torch.float32, device=device)
    else:
        agg = args[0]
    grid = (triton.cdiv(num_envs, p.block_e), p.num_chunks)
    common = dict(E=num_envs, T=seq_len, CHUNK_T=p.chunk_t, NUM_CHUNKS=p.num_chunks,
                  NC_PAD=p.nc_pad, BLOCK_E=p.block_e, BLOCK_T=p.block_t,
                  num_warps=p.num_warps, **params)
    if p.num_chunks > 1:
        kernel[grid](*args, agg, AGGREGATE=True, **common)
    kernel[grid](*args, agg, AGGREGATE=False, **common)


def or_placeholder(x: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """A pointer argument for an optional tensor; the kernel never reads an absent one."""
    return placeholder if x is None else x


def on_reference(fn: Callable[..., Any], device: torch.device, *args: Any, **kwargs: Any) -> Any:
    """Run a NumPy reference on tensor arguments; float32 tensors come back on ``device``."""

    def to_numpy(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", torch.float64 if x.is_floating_point() else x.dtype).numpy()
        return x

    out = fn(*[to_numpy(a) for a in args], **{k: to_numpy(v) for k, v in kwargs.items()})
    if isinstance(out, tuple):
        return tuple(_from_numpy(o, device) for o in out)
    return _from_numpy(out, device)


def _from_numpy(x: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device)
