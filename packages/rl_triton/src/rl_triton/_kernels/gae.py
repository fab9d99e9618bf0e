"""GAE: ``A[t] = δ[t] + γλ(1-done[t]) A[t+1]``, ``A[T] = 0``."""

import triton
import triton.language as tl

from rl_triton._kernels.scan import (
    backward_tile_times, chunk_of_program, load_f32, load_flag, next_state_value, program_rows,
    row_value, scan_backward, store_tile, tile_carry, tile_count,
)


@triton.jit
def gae_kernel(
    r_ptr, v_ptr, term_ptr, trunc_ptr, boot_ptr, adv_ptr, agg_ptr, sync_ptr,
    E, T, CHUNK_T, NUM_CHUNKS, gamma, lam,
    HAS_TRUNC: tl.constexpr, BOOT: tl.constexpr, CHUNKED: tl.constexpr,
    NC_PAD: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, FLIP: tl.constexpr,
    EVEN: tl.constexpr,
):
    rows, row_ok = program_rows(E, BLOCK_E)
    chunk = chunk_of_program(sync_ptr, NUM_CHUNKS, CHUNKED, True)
    row_off = rows.to(tl.int64)[:, None, None] * T
    last = row_value(boot_ptr, rows, row_ok, BOOT == 2)
    carry = tl.zeros_like(last)
    n_tiles = tile_count(chunk, T, CHUNK_T, BLOCK_T)
    for i in range(0, n_tiles):
        t = backward_tile_times(chunk, i, n_tiles, CHUNK_T, BLOCK_T, FLIP)
        m = row_ok[:, None, None] & (t < T)
        off = row_off + t
        if EVEN:
            lm = None
        else:
            lm = m
        r = load_f32(r_ptr, off, lm, 0.0)
        v = load_f32(v_ptr, off, lm, 0.0)
        term = load_flag(term_ptr, off, lm)
        if HAS_TRUNC:
            trunc = load_flag(trunc_ptr, off, lm)
        else:
            trunc = term
        v_next = next_state_value(v_ptr, boot_ptr, last[:, None, None], v, off, t, m, lm, T, trunc,
                                  HAS_TRUNC, BOOT, FLIP)
        delta = tl.where(m, r + tl.where(term, 0.0, gamma * v_next) - v, 0.0)
        decay = tl.where(m, tl.where(term | trunc, 0.0, gamma * lam), 1.0)
        y0, prod, _, _, exit_y0, exit_prod = scan_backward(delta, decay, FLIP, False)
        carry_in, carry = tile_carry(exit_y0, exit_prod, carry, agg_ptr, rows, row_ok, chunk,
                                     NUM_CHUNKS, CHUNKED, NC_PAD, True)
        store_tile(adv_ptr, off, y0 + prod * carry_in[:, None, None], lm)
