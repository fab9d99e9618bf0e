"""Retrace(λ): ``Δ[t] = δ[t] + γ c[t+1](1-done[t]) Δ[t+1]``, targets and advantages."""

import triton
import triton.language as tl

from rl_triton._kernels.scan import (
    chunk_of_program, load_f32, load_flag, program_rows, scan_maps_with_previous,
    resolve, tile_count, tile_times,
)


@triton.jit
def retrace_kernel(
    pt_ptr, pb_ptr, q_ptr, nq_ptr, act_ptr, r_ptr, term_ptr, trunc_ptr, qret_ptr, adv_ptr, agg_ptr, sync_ptr,
    E, T, A, CHUNK_T, NUM_CHUNKS, gamma, lam, c_bar, rho_bar,
    HAS_TRUNC: tl.constexpr, CHUNKED: tl.constexpr, NC_PAD: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, A_PAD: tl.constexpr,
):
    rows, row_ok = program_rows(E, BLOCK_E)
    chunk = chunk_of_program(sync_ptr, NUM_CHUNKS, CHUNKED, True)
    cols = tl.arange(0, BLOCK_T)
    acts = tl.arange(0, A_PAD)
    row_off = rows.to(tl.int64)[:, None] * T
    zero = tl.zeros([BLOCK_E], tl.float32)
    carry = zero
    n_tiles = tile_count(chunk, T, CHUNK_T, BLOCK_T)
    for i in range(0, n_tiles):
        t = tile_times(chunk, i, n_tiles, CHUNK_T, BLOCK_T, True)
        m = row_ok[:, None] & (t < T)[None, :]
        off = row_off + t[None, :]
        m3 = m[:, :, None] & (acts < A)[None, None, :]
        off3 = off[:, :, None] * A + acts[None, None, :]
        probs = load_f32(pt_ptr, off3, m3, 0.0)
        expected_next_q = tl.sum(probs * load_f32(nq_ptr, off3, m3, 0.0), axis=2)
        action = tl.load(act_ptr + off, mask=m, other=0)
        pi = tl.sum(tl.where(acts[None, None, :] == action[:, :, None], probs, 0.0), axis=2)
        rho = tl.minimum(rho_bar, pi / load_f32(pb_ptr, off, m, 1.0))
        # c[t+1], and c[T] = 0.
        m1 = m & (t < T - 1)[None, :]
        action1 = tl.load(act_ptr + off + 1, mask=m1, other=0)
        # An action outside [0, A) has probability 0 and is never read.
        pi1 = load_f32(pt_ptr, (off + 1) * A + action1, m1 & (action1 >= 0) & (action1 < A), 0.0)
        c1 = tl.where(m1, lam * tl.minimum(c_bar, pi1 / load_f32(pb_ptr, off + 1, m1, 1.0)), 0.0)
        r = load_f32(r_ptr, off, m, 0.0)
        q = load_f32(q_ptr, off, m, 0.0)
        term = load_flag(term_ptr, off, m)
        if HAS_TRUNC:
            done = term | load_flag(trunc_ptr, off, m)
        else:
            done = term
        delta = tl.where(m, r + tl.where(term, 0.0, gamma * expected_next_q) - q, 0.0)
        decay = tl.where(m, tl.where(done, 0.0, gamma * c1), 1.0)
        y0, prod, prev0, prev_prod = scan_maps_with_previous(delta, decay, True)
        d, carry_in, carry = resolve(y0, prod, carry, cols, agg_ptr, sync_ptr, rows, row_ok, chunk, E, NUM_CHUNKS,
                              CHUNKED, NC_PAD, BLOCK_T, True)
        d_next = prev0 + prev_prod * carry_in[:, None]
        # Q_ret[t+1] = Q[t+1] + Δ[t+1]; past the buffer both are 0.
        q_ret_next = load_f32(q_ptr, off + 1, m1, 0.0) + d_next
        adv = rho * (r + tl.where(term, 0.0, gamma * q_ret_next) - q)
        tl.store(qret_ptr + off, q + d, mask=m)
        tl.store(adv_ptr + off, adv, mask=m)
