"""Compile the kernel variants for an sm_90 (Hopper) target, without a GPU.

    python compile_sm90.py [OP ...]
    RL_TRITON_COMPILE_ALL=1 python compile_sm90.py [OP ...]

By default every code path of every kernel (each combination of its flags,
chunked or not, masked or not) and every tile (each under every chunked and
masked mode); with ``RL_TRITON_COMPILE_ALL=1`` every combination of the two
(about ten times as many compiles).

Triton compiles to a cubin with the ptxas it ships, so compiler crashes show
up on a CPU machine. Exits non-zero (or aborts, as the compiler does) on the
first failure; prints one line per variant.
"""

from __future__ import annotations

import itertools
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rl_triton._kernels.forward import forward_kernel
from rl_triton._kernels.gae import gae_kernel
from rl_triton._kernels.retrace import retrace_kernel
from rl_triton._kernels.returns import returns_kernel
from rl_triton._kernels.vtrace import vtrace_kernel

INTS = {"E", "T", "A", "CHUNK_T", "NUM_CHUNKS"}
FLOATS = {"gamma", "lam", "rho_bar", "c_bar", "decay"}
POINTER_TYPES = {"act_ptr": "*i64", "sync_ptr": "*i64", "agg_ptr": "*i64"}
# (block_e, block_t, num_warps) tiles the plan and the tests use.
TILES = [(1, 512, 4), (8, 32, 1), (1, 2048, 4), (2, 8, 1), (2, 4, 1), (1, 64, 1), (1, 256, 8)]
OPS = {
    "gae": (gae_kernel, dict(HAS_TRUNC=(False, True), BOOT=(0, 1, 2), FLIP=(False, True))),
    "vtrace": (vtrace_kernel, dict(HAS_TRUNC=(False, True), BOOT=(0, 1, 2), FLIP=(False, True))),
    "retrace": (retrace_kernel, dict(HAS_TRUNC=(False, True), A=(5, 8), A_PAD=(8,),
                                      FLIP=(False, True))),
    "returns": (returns_kernel, dict(HAS_NEXT_VALUES=(False, True), HAS_TRUNC=(False, True),
                                     HAS_BOOT=(False, True), FLIP=(False, True))),
    "forward": (forward_kernel, dict(SHIFT=(0, 1), HAS_SEED=(False, True))),
}


def compile_variant(kernel, constexprs: dict, num_warps: int) -> None:
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in INTS:
            signature[name] = "i32"
        elif name in FLOATS:
            signature[name] = "fp32"
        else:
            signature[name] = POINTER_TYPES.get(name, "*fp32")
    # As at launch: pointers and sizes divisible by 16 (aligned, vectorisable).
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
               if signature[name][0] == "*" or name in ("T", "CHUNK_T")}
    src = ASTSource(kernel, signature, constexprs=constexprs, attrs=aligned)
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "enable_fp_fusion": True})


def variants(op: str, exhaustive: bool) -> list[tuple[tuple, tuple, bool, bool | None]]:
    """(flag values, tile, chunked, even) to compile for ``op``: with
    ``exhaustive`` every combination; else every code path (the flags x
    chunked x even, each on the next tile in turn) and every tile under
    every chunked x even on the first flags."""
    kernel, flags = OPS[op]
    paths = list(itertools.product(*flags.values()))
    evens = (False, True) if "EVEN" in kernel.arg_names else (None,)  # tiles masked or not, chunks too
    modes = list(itertools.product((False, True), evens))
    if exhaustive:
        return [(v, tile, c, e) for v in paths for tile in TILES for c, e in modes]
    out = [(v, TILES[k % len(TILES)], c, e) for k, (v, (c, e)) in enumerate(itertools.product(paths, modes))]
    return out + [(paths[0], tile, c, e) for tile in TILES for c, e in modes]


def main(ops: list[str]) -> None:
    exhaustive = os.environ.get("RL_TRITON_COMPILE_ALL") == "1"
    for op in ops:
        kernel, flags = OPS[op]
        for values, (block_e, block_t, warps), chunked, even in variants(op, exhaustive):
            if op == "retrace":
                block_t = max(4, block_t // 8)
            c = dict(zip(flags, values), CHUNKED=chunked, NC_PAD=128 if chunked else 1,
                     BLOCK_E=block_e, BLOCK_T=block_t)
            if not chunked:
                c["NUM_CHUNKS"] = 1  # an int argument equal to 1 is specialised as a constant
            if even is not None:
                c["EVEN"] = even
            compile_variant(kernel, c, warps)
            print(op, c, warps, "ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(OPS))
