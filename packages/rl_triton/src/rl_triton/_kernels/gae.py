"""GAE: ``A[t] = δ[t] + γλ(1-done[t]) A[t+1]``, ``A[T] = 0``."""

import triton
import triton.language as tl

from rl_triton._kernels.scan import (
    chunk_of_program, load_f32, load_flag, next_state_value, program_rows, row_value,
    scan_maps, resolve, tile_count, tile_times,
)


@triton.jit
def gae_kernel(
    r_ptr, v_ptr, term_ptr, trunc_ptr, boot_ptr, adv_ptr, agg_ptr, sync_ptr,
    E, T, CHUNK_T, NUM_CHUNKS, gamma, lam,
    HAS_TRUNC: tl.constexpr, BOOT: tl.constexpr, CHUNKED: tl.constexpr,
    NC_PAD: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr,
):
    rows, row_ok = program_rows(E, BLOCK_E)
    chunk = chunk_of_program(sync_ptr, NUM_CHUNKS, CHUNKED, True)
    cols = tl.arange(0, BLOCK_T)
    row_off = rows.to(tl.int64)[:, None] * T
    last = row_value(boot_ptr, rows, row_ok, BOOT == 2)
    carry = 0.0 * last
    n_tiles = tile_count(chunk, T, CHUNK_T, BLOCK_T)
    for i in range(0, n_tiles):
        t = tile_times(chunk, i, n_tiles, CHUNK_T, BLOCK_T, True)
        m = row_ok[:, None] & (t < T)[None, :]
        off = row_off + t[None, :]
        r = load_f32(r_ptr, off, m, 0.0)
        v = load_f32(v_ptr, off, m, 0.0)
        term = load_flag(term_ptr, off, m)
        if HAS_TRUNC:
            trunc = load_flag(trunc_ptr, off, m)
        else:
            trunc = term
        v_next = next_state_value(v_ptr, boot_ptr, last, off, t, m, T, trunc, BOOT)
        delta = tl.where(m, r + tl.where(term, 0.0, gamma * v_next) - v, 0.0)
        decay = tl.where(m, tl.where(term | trunc, 0.0, gamma * lam), 1.0)
        y0, prod = scan_maps(delta, decay, True)
        adv, _, carry = resolve(y0, prod, carry, cols, agg_ptr, sync_ptr, rows, row_ok, chunk, E, NUM_CHUNKS,
                        CHUNKED, NC_PAD, BLOCK_T, True)
        tl.store(adv_ptr + off, adv, mask=m)
