"""Forward scans: eligibility traces and episodic prefix sums,
``y[t] = x[t] + decay (1-done[t-SHIFT]) y[t-1]``, ``y[-1] = seed``."""

import triton
import triton.language as tl

from rl_triton._kernels.scan import (
    chunk_of_program, load_f32, load_flag, program_rows, row_value, scan_maps,
    resolve, tile_count, tile_times,
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
    cols = tl.arange(0, BLOCK_T)
    row_off = rows.to(tl.int64)[:, None] * T
    seed = row_value(seed_ptr, rows, row_ok, HAS_SEED)
    carry = seed
    n_tiles = tile_count(chunk, T, CHUNK_T, BLOCK_T)
    for i in range(0, n_tiles):
        t = tile_times(chunk, i, n_tiles, CHUNK_T, BLOCK_T, False)
        m = row_ok[:, None] & (t < T)[None, :]
        off = row_off + t[None, :]
        x = load_f32(x_ptr, off, m, 0.0)
        severed = load_flag(done_ptr, off - SHIFT, m & (t >= SHIFT)[None, :])
        keep = tl.where(m, tl.where(severed, 0.0, decay), 1.0)
        y0, prod = scan_maps(x, keep, False)
        y, _, carry = resolve(y0, prod, carry, cols, agg_ptr, sync_ptr, rows, row_ok, chunk, E, NUM_CHUNKS,
                      CHUNKED, NC_PAD, BLOCK_T, False)
        tl.store(out_ptr + off, y, mask=m)
