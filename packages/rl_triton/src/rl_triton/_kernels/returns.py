"""λ-returns and discounted returns:
``G[t] = r + γ(1-done)[(1-λ)V(s_{t+1}) + λG[t+1]] + γ truncated bootstrap``."""

import triton
import triton.language as tl

from rl_triton._kernels.scan import (
    backward_tile_times, chunk_of_program, load_f32, load_flag, program_rows, scan_backward,
    store_tile, tile_carry, tile_count,
)


@triton.jit
def returns_kernel(
    r_ptr, nv_ptr, term_ptr, trunc_ptr, boot_ptr, out_ptr, agg_ptr, sync_ptr,
    E, T, CHUNK_T, NUM_CHUNKS, gamma, lam,
    HAS_NEXT_VALUES: tl.constexpr, HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr,
    CHUNKED: tl.constexpr, NC_PAD: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, FLIP: tl.constexpr, EVEN: tl.constexpr,
):
    rows, row_ok = program_rows(E, BLOCK_E)
    chunk = chunk_of_program(sync_ptr, NUM_CHUNKS, CHUNKED, True)
    row_off = rows.to(tl.int64)[:, None, None] * T
    # The carry past the buffer is G[T] = bootstrap_values[:, -1].
    if HAS_BOOT:
        carry = load_f32(boot_ptr, rows.to(tl.int64) * T + T - 1, row_ok, 0.0)
    else:
        carry = tl.zeros([BLOCK_E], tl.float32)
    n_tiles = tile_count(chunk, T, CHUNK_T, BLOCK_T)
    for i in range(0, n_tiles):
        t = backward_tile_times(chunk, i, n_tiles, CHUNK_T, BLOCK_T, FLIP)
        m = row_ok[:, None, None] & (t < T)
        off = row_off + t
        if EVEN:
            lm = None
        else:
            lm = m
        g = load_f32(r_ptr, off, lm, 0.0)
        done = load_flag(term_ptr, off, lm)
        if HAS_TRUNC:
            trunc = load_flag(trunc_ptr, off, lm)
            done = done | trunc
            if HAS_BOOT:
                g += tl.where(trunc, gamma * load_f32(boot_ptr, off, lm, 0.0), 0.0)
        if HAS_NEXT_VALUES:
            g += tl.where(done, 0.0, gamma * (1.0 - lam) * load_f32(nv_ptr, off, lm, 0.0))
        g = tl.where(m, g, 0.0)
        decay = tl.where(m, tl.where(done, 0.0, gamma * lam), 1.0)
        y0, prod, _, _, exit_y0, exit_prod = scan_backward(g, decay, FLIP, False)
        carry_in, carry = tile_carry(exit_y0, exit_prod, carry, agg_ptr, rows, row_ok, chunk,
                                     NUM_CHUNKS, CHUNKED, NC_PAD, True)
        store_tile(out_ptr, off, y0 + prod * carry_in[:, None, None], lm)
