"""Forward scans: eligibility traces and episodic prefix sums,
``y[t] = x[t] + decay (1-done[t-SHIFT]) y[t-1]``, ``y[-1] = seed``."""

import triton
import triton.language as tl

from rl_triton._kernels.scan import (
    chunk_of_program, forward_tile_times, load_f32, load_flag, program_rows, row_value,
    scan_forward, tile_carry, tile_count,
)


@triton.jit
def forward_kernel(
    x_ptr, done_ptr, seed_ptr, out_ptr, agg_ptr, sync_ptr,
    E, T, CHUNK_T, NUM_CHUNKS, decay,
    SHIFT: tl.constexpr, HAS_SEED: tl.constexpr, CHUNKED: tl.constexpr,
    NC_PAD: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """``SHIFT`` 1: the boundary flag of the previous step severs the carry
    (``ends_at``); 0: the step's own flag does (``starts_at``)."""
    rows, row_ok = program_rows(E, BLOCK_E)
    chunk = chunk_of_program(sync_ptr, NUM_CHUNKS, CHUNKED, False)
    row_off = rows.to(tl.int64)[:, None] * T
    carry = row_value(seed_ptr, rows, row_ok, HAS_SEED)
    n_tiles = tile_count(chunk, T, CHUNK_T, BLOCK_T)
    for i in range(0, n_tiles):
        t = forward_tile_times(chunk, i, CHUNK_T, BLOCK_T)[None, :]
        m = row_ok[:, None] & (t < T)
        off = row_off + t
        x = load_f32(x_ptr, off, m, 0.0)
        severed = load_flag(done_ptr, off - SHIFT, m & (t >= SHIFT))
        keep = tl.where(m, tl.where(severed, 0.0, decay), 1.0)
        y0, prod, exit_y0, exit_prod = scan_forward(x, keep)
        carry_in, carry = tile_carry(exit_y0, exit_prod, carry, agg_ptr, rows, row_ok, chunk,
                                     NUM_CHUNKS, CHUNKED, NC_PAD, False)
        tl.store(out_ptr + off, y0 + prod * carry_in[:, None], mask=m)
