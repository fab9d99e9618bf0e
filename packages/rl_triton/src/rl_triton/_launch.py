"""Which path answers a call, and how a Triton kernel is launched.

Paths (``rl_triton.last_path()`` tells which one ran last):

- ``"triton"``: CUDA tensors, compiled Triton kernels;
- ``"triton-interpreter"``: ``TRITON_INTERPRET=1`` was set before Triton was
  imported; the same kernels run on CPU tensors through Triton's interpreter;
- ``"reference"``: CPU tensors otherwise; the NumPy references of
  ``rl_triton.reference`` answer, in float64, cast to float32.

Launch plan: a program owns ``block_e`` rows. When the rows alone give the
GPU enough programs, each program walks its rows' whole sequence in tiles of
``block_t`` (the fused path). When they do not (few, long rows), each
program takes one tile-sized chunk and the chunks chain their carries through
a decoupled scan in the same launch (the chunked path): one pass over the
data either way, and no sequence-length limit.
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
from triton import knobs
from triton.runtime import driver as _driver

PATH_TRITON = "triton"
PATH_INTERPRETER = "triton-interpreter"
PATH_REFERENCE = "reference"

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Tile shapes measured best on an H200 (``benchmarks/rl_triton/sweep.py``).
#: Fused path: elements per tile (steps x rows x width), and steps per tile at most.
FUSED_TILE = 512
FUSED_MAX_BLOCK_T = 512
#: Short rows (at most this many steps, padded): one warp a program, tiles of
#: ``SHORT_TILE`` elements (many small programs beat fewer wide ones there).
SHORT_MAX_BLOCK_T = 64
SHORT_TILE = 256
#: Chunked path: elements per tile (one tile is one chunk).
CHUNK_TILE = 2048
#: Chunked path: registers per thread at most. A chunk program waits for its
#: one tile's loads; only the programs beside it on the SM hide that wait. At
#: 64 registers eight 4-warp programs fit an SM, against five at the
#: compiler's choice (88 for GAE): 16 x 262144 GAE 2.04x -> 1.85x its floor.
CHUNK_MAX_REGISTERS = 64
#: Shortest tile along time (backward ops group steps by 4).
MIN_BLOCK_T = 4
#: Largest tile side: Triton's most elements in one block (``TRITON_MAX_TENSOR_NUMEL``).
MAX_BLOCK = 2**20
#: Most warps per program (1,024 threads, the CUDA block limit).
MAX_NUM_WARPS = 32
#: Programs per streaming multiprocessor the plan aims for before it chunks.
PROGRAMS_PER_SM = 8
#: Most chunks per row block on the chunked path (the width of the carry composition).
MAX_CHUNKS = 4096
#: Tiles with several values per step (Retrace's actions): steps per fused tile
#: at most. They scan ``flip`` tiles, measured faster for them on an H200.
WIDE_MAX_BLOCK_T = 256

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
        block_e: rows (environments) per program, a power of two in
            [1, 2**20].
        block_t: time steps per tile, a power of two in [4, 2**20].
        chunked: ``True`` forces the chunked path (one tile per chunk),
            ``False`` the fused path.
        num_warps: warps per program, a power of two in [1, 32].
        flip: backward ops: ``True`` scans tiles laid out in decreasing time
            (one plain scan, scalar loads), ``False`` tiles of 4-step groups
            (16-byte loads, a scan over the groups).
        max_registers: registers per thread at most (``0``: the compiler's
            choice), 16 to 255.
    """

    block_e: int | None = None
    block_t: int | None = None
    chunked: bool | None = None
    num_warps: int | None = None
    flip: bool | None = None
    max_registers: int | None = None
    _hash: int = dataclasses.field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for field, least, most in (("block_e", 1, MAX_BLOCK), ("block_t", MIN_BLOCK_T, MAX_BLOCK),
                                   ("num_warps", 1, MAX_NUM_WARPS)):
            v = getattr(self, field)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not least <= v <= most
                                  or v & (v - 1)):
                raise ValueError(f"{field} must be a power of two in [{least}, {most}], got {v!r}")
        for field in ("chunked", "flip"):
            v = getattr(self, field)
            if v is not None and not isinstance(v, bool):
                raise ValueError(f"{field} must be a bool, got {v!r}")
        v = self.max_registers
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)
                              or v != 0 and not 16 <= v <= 255):
            raise ValueError(f"max_registers must be 0 or an int in [16, 255], got {v!r}")
        # Hashed on every launch (the plan's cache key): once, here.
        object.__setattr__(self, "_hash", hash((self.block_e, self.block_t, self.chunked,
                                                self.num_warps, self.flip, self.max_registers)))

    def __hash__(self) -> int:
        return self._hash


_override: contextvars.ContextVar[LaunchConfig] = contextvars.ContextVar(
    "rl_triton_launch_config", default=LaunchConfig())


@contextlib.contextmanager
def launch_config(**fields: int | bool) -> Iterator[LaunchConfig]:
    """Override launch parameters (the fields of ``LaunchConfig``) inside a
    ``with`` block, for tests and tuning.

    ``with rl_triton.launch_config(block_t=16, chunked=True): ...`` runs every
    op in 16-step chunks, so short inputs exercise the chunked path.
    """
    config = LaunchConfig(**fields)
    token = _override.set(config)
    try:
        yield config
    finally:
        _override.reset(token)


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A launch: ``grid = (row_blocks, num_chunks)`` programs of ``num_warps``
    warps, each owning ``block_e`` rows and ``chunk_t`` steps in tiles of
    ``block_t``; ``even`` when those tiles cover the inputs exactly (no
    bounds masks); ``max_registers`` per thread at most (``None``: the
    compiler's choice).

    Compared by identity (``plan`` returns one object per set of arguments):
    hashing it costs nothing on the launch path.
    """

    block_e: int
    block_t: int
    chunk_t: int
    num_chunks: int
    num_warps: int
    flip: bool
    row_blocks: int
    even: bool
    max_registers: int | None

    @property
    def chunked(self) -> bool:
        return self.num_chunks > 1

    @property
    def nc_pad(self) -> int:
        """The chunk count padded to a power of two (the carry composition's width)."""
        return _next_pow2(self.num_chunks)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _target_programs(device_index: int) -> int:
    """Programs the plan aims for on CUDA device ``device_index`` (1 in the interpreter)."""
    if _INTERPRET:
        return 1
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=4096)
def plan(num_envs: int, seq_len: int, width: int, target_programs: int,
         config: LaunchConfig, chunk_tile: int = CHUNK_TILE,
         chunk_registers: int = CHUNK_MAX_REGISTERS, chunk_unmasked: bool = True) -> Plan:
    """The launch plan for ``[num_envs, seq_len]`` inputs whose tiles carry
    ``width`` values per step (1, or the padded action count for Retrace).

    Fused when the rows alone give ``target_programs`` programs (or the
    sequence fits one tile), chunked otherwise: chunks of ``chunk_tile``
    elements (twice that for wide tiles), ``chunk_registers`` per thread at
    most, unmasked where they cover the rows if ``chunk_unmasked``.
    """
    steps = _next_pow2(seq_len)
    wide = width > 1
    short = steps <= SHORT_MAX_BLOCK_T
    if short:
        fused_t = max(MIN_BLOCK_T, steps)
        fused_tile = SHORT_TILE
    elif wide:
        fused_t = max(MIN_BLOCK_T, min(steps, WIDE_MAX_BLOCK_T))
        fused_tile = max(FUSED_TILE, fused_t * width)
    else:
        fused_t = max(MIN_BLOCK_T, min(steps, FUSED_MAX_BLOCK_T, FUSED_TILE))
        fused_tile = FUSED_TILE
    chunk_tile *= 2 if wide else 1
    chunk_t = max(MIN_BLOCK_T, min(steps, chunk_tile // width))
    chunked = config.chunked
    if chunked is None:
        block_e = max(1, min(fused_tile // (fused_t * width), _next_pow2(num_envs)))
        few_rows = _cdiv(num_envs, block_e) < target_programs
        chunked = few_rows and 1 < _cdiv(seq_len, chunk_t) <= MAX_CHUNKS
    block_t = config.block_t or (chunk_t if chunked else fused_t)
    tiles = _cdiv(seq_len, block_t)
    chunked = chunked and tiles > 1
    tile = chunk_tile if chunked else fused_tile
    block_e = config.block_e or max(1, min(tile // (block_t * width), _next_pow2(num_envs)))
    elements = block_e * block_t * width
    if config.num_warps:
        num_warps = config.num_warps
    elif short and not chunked:
        num_warps = 1
    elif wide:
        num_warps = 8 if elements >= 2048 else 2
    elif chunked:
        num_warps = 4
    else:
        num_warps = 4 if block_t >= 256 else 2
    span = block_t if chunked else tiles * block_t
    flip = wide if config.flip is None else config.flip
    # Unmasked tiles let the compiler issue a tile's loads together (with
    # masks it loads a chunk's vectors one after another): measured faster on
    # an H200 for programs that walk several tiles and for chunks (unless the
    # op says otherwise), slower for short rows' one-tile programs.
    even = (tiles > 1 and (not chunked or chunk_unmasked) and num_envs % block_e == 0
            and seq_len % block_t == 0)
    if config.max_registers is not None:
        max_registers = config.max_registers or None
    else:
        max_registers = chunk_registers if chunked else None
    return Plan(block_e, block_t, span, _cdiv(seq_len, span), num_warps, flip,
                _cdiv(num_envs, block_e), even, max_registers)


#: Kernel arguments the launch supplies, by name; every kernel takes its
#: pointers, then ``agg_ptr`` and ``sync_ptr``, then its scalars and constexprs.
_SUPPLIED = ("agg_ptr", "sync_ptr", "E", "T", "CHUNK_T", "NUM_CHUNKS",
             "CHUNKED", "NC_PAD", "BLOCK_E", "BLOCK_T", "FLIP", "EVEN")


def _supplied(p: Plan, agg: torch.Tensor, sync: torch.Tensor, num_envs: int,
              seq_len: int) -> tuple[Any, ...]:
    """The values of ``_SUPPLIED``, in its order."""
    return (agg, sync, num_envs, seq_len, p.chunk_t, p.num_chunks,
            p.chunked, p.nc_pad, p.block_e, p.block_t, p.flip, p.even)


class _Launcher:
    """Launches one jitted kernel, paying Triton's argument binding only once
    per specialisation.

    Triton specialises a kernel on each pointer's dtype and 16-byte alignment,
    on each integer's size, divisibility by 16 and equality to 1, and on the
    constexpr values. Here the integers are the shape's and the plan's, so a
    specialisation is fixed by the device, the shape, the plan, the op's
    params other than floats, and the pointers' dtypes and alignment. The
    first launch of one goes through ``kernel[grid](...)`` (compiling if
    needed); later launches call the compiled kernel directly, which takes a
    fraction of the host time.
    """

    def __init__(self, kernel: Any, pointers: int, params: dict[str, Any]) -> None:
        param_names = tuple(params)
        self.kernel = kernel
        names = kernel.arg_names
        sources = {name: pointers + i for i, name in enumerate(_SUPPLIED)}
        sources.update({name: pointers + len(_SUPPLIED) + i for i, name in enumerate(param_names)})
        if len(names) != pointers + len(param_names) + sum(n in names for n in _SUPPLIED):
            raise TypeError(f"{kernel.fn.__name__} takes {names}, launched with "
                            f"{pointers} pointers and {param_names}")
        #: Position in (pointers, supplied, params) of each kernel argument.
        self.order = [i if i < pointers else sources[name] for i, name in enumerate(names)]
        #: The params that specialise the kernel: all but the floats.
        self.key_params = [i for i, v in enumerate(params.values()) if not isinstance(v, float)]
        self.compiled: dict[tuple, tuple[Any, ...]] = {}

    def __call__(self, p: Plan, pointers: Sequence[torch.Tensor], supplied: tuple[Any, ...],
                 num_envs: int, seq_len: int, params: tuple[Any, ...], device: int) -> None:
        addresses = [x.data_ptr() for x in pointers]
        misaligned = 0
        for address in addresses:
            misaligned |= address
        aligned = not misaligned & 15 or tuple([a & 15 == 0 for a in addresses])
        key = (device, p, num_envs, seq_len, aligned, *[x.dtype for x in pointers],
               *[params[i] for i in self.key_params])
        compiled = self.compiled.get(key)
        grid = (p.row_blocks, p.num_chunks)
        if compiled is None:
            source = (*pointers, *supplied, *params)
            # FP fusion (a * b + c as one FMA) named, not left to Triton's default (on so far, off from
            # Triton 3.10): the kernels' tested numbers do not change with the Triton version.
            kernel = self.kernel[grid](*[source[i] for i in self.order], num_warps=p.num_warps,
                                       maxnreg=p.max_registers, enable_fp_fusion=True)
            if all(hasattr(kernel, a) for a in _COMPILED_ATTRS):
                self.compiled[key] = (kernel.run, kernel.function, kernel.packed_metadata, kernel)
            return
        run, function, metadata, kernel = compiled
        stream = _driver.active.get_current_stream(device)
        enter = _registered(knobs.runtime.launch_enter_hook)
        leave = _registered(knobs.runtime.launch_exit_hook)
        if enter is None and leave is None:
            # Addresses, not tensors: Triton's launcher then skips a data_ptr()
            # call and a driver query per pointer (the tensors are on ``device``).
            agg, sync = supplied[0].data_ptr(), supplied[1].data_ptr()
            source = (*addresses, agg, sync, *supplied[2:], *params)
            run(grid[0], grid[1], 1, stream, function, metadata, None, None, None,
                *[source[i] for i in self.order])
        else:
            source = (*pointers, *supplied, *params)
            args = [source[i] for i in self.order]
            run(grid[0], grid[1], 1, stream, function, metadata,
                kernel.launch_metadata(grid, stream, *args), enter, leave, *args)


def _registered(hook: Any) -> Any:
    """Triton's launch hook, or ``None`` when none is registered (an empty chain)."""
    return hook if hook is not None and getattr(hook, "calls", True) else None


_COMPILED_ATTRS = ("run", "function", "packed_metadata", "launch_metadata")
#: By the kernel's id (kernels live as long as their modules) and param names.
_launchers: dict[tuple[int, tuple[str, ...]], _Launcher] = {}


def launch(
    kernel: Any,
    pointers: Sequence[torch.Tensor],
    num_envs: int,
    seq_len: int,
    device: torch.device,
    width: int = 1,
    chunk_tile: int = CHUNK_TILE,
    chunk_registers: int = CHUNK_MAX_REGISTERS,
    chunk_unmasked: bool = True,
    **params: Any,
) -> None:
    """Launch ``kernel`` over ``[num_envs, seq_len]`` with the planned path
    (``width`` and the ``chunk_`` parameters: as for ``plan``).

    ``pointers`` are the kernel's leading tensor arguments; ``params`` its own
    scalars and constexprs by name, except the launch plan's (``_SUPPLIED``).
    """
    index = device.index or 0
    p = plan(num_envs, seq_len, width, _target_programs(index), _override.get(), chunk_tile,
             chunk_registers, chunk_unmasked)
    if p.chunked:
        # One fill: the chunks' maps (unpublished), then the ticket counters.
        maps = num_envs * p.num_chunks
        agg = torch.full((maps + p.row_blocks,), -1, dtype=torch.int64, device=device)
        sync = agg[maps:]
    else:
        agg = sync = pointers[0]
    supplied = _supplied(p, agg, sync, num_envs, seq_len)
    if _INTERPRET:
        named = dict(zip(_SUPPLIED, supplied), **params)
        names = kernel.arg_names[len(pointers):]
        kernel[(p.row_blocks, p.num_chunks)](*pointers, *(named[n] for n in names),
                                             num_warps=p.num_warps)
        return
    names = tuple(params)
    launcher = _launchers.get((id(kernel), names))
    if launcher is None:
        launcher = _launchers.setdefault((id(kernel), names), _Launcher(kernel, len(pointers), params))
    launcher(p, pointers, supplied, num_envs, seq_len, tuple(params.values()), index)


def float32_like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialised float32 output shaped like the contiguous ``[E, T]`` input ``x``."""
    return torch.empty_like(x, dtype=torch.float32)


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
