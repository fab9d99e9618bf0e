"""Retrace(λ): ``Δ[t] = δ[t] + γ c[t+1](1-done[t]) Δ[t+1]``, targets and advantages."""

import triton
import triton.language as tl

from rl_triton._kernels.scan import (
    backward_tile_times, chunk_of_program, load_f32, load_flag, load_tile, program_rows,
    scan_backward, store_tile, tile_carry, tile_count,
)


@triton.jit
def retrace_kernel(
    pt_ptr, pb_ptr, q_ptr, nq_ptr, act_ptr, r_ptr, term_ptr, trunc_ptr, qret_ptr, adv_ptr,
    agg_ptr, sync_ptr,
    E, T, A: tl.constexpr, CHUNK_T, NUM_CHUNKS, gamma, lam, c_bar, rho_bar,
    HAS_TRUNC: tl.constexpr, CHUNKED: tl.constexpr, NC_PAD: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_T: tl.constexpr, A_PAD: tl.constexpr,
    FLIP: tl.constexpr, EVEN: tl.constexpr,
):
    """``A``: actions, ``A_PAD`` that rounded up to a power of two. ``EVEN``:
    the tiles cover the rows and steps exactly, so nothing is masked but the
    action axis (when ``A < A_PAD``); the step after each is read clamped
    into the row."""
    rows, row_ok = program_rows(E, BLOCK_E)
    chunk = chunk_of_program(sync_ptr, NUM_CHUNKS, CHUNKED, True)
    acts = tl.arange(0, A_PAD)[None, None, None, :]
    row_off = rows.to(tl.int64)[:, None, None] * T
    carry = tl.zeros([BLOCK_E], tl.float32)
    n_tiles = tile_count(chunk, T, CHUNK_T, BLOCK_T)
    for i in range(0, n_tiles):
        t = backward_tile_times(chunk, i, n_tiles, CHUNK_T, BLOCK_T, FLIP)
        m = row_ok[:, None, None] & (t < T)
        off = row_off + t
        m1 = m & (t < T - 1)
        # [BLOCK_E, R, 4, A_PAD] (or [BLOCK_E, BLOCK_T, 1, A_PAD]) tiles of the per-action inputs.
        m4 = m[:, :, :, None] & (acts < A)
        off4 = off[:, :, :, None] * A + acts
        if EVEN:
            lm = None
            lm1 = None
            if A_PAD == A:
                lm4 = None
            else:
                lm4 = m4
            # The step after, clamped into the row (unused at t = T-1).
            off1 = row_off + tl.minimum(t + 1, T - 1)
        else:
            lm = m
            lm1 = m1
            lm4 = m4
            off1 = off + 1
        probs = load_f32(pt_ptr, off4, lm4, 0.0)
        expected_next_q = tl.sum(probs * load_f32(nq_ptr, off4, lm4, 0.0), axis=3)
        action = load_tile(act_ptr, off, lm, 0)
        pi = tl.sum(tl.where(acts == action[:, :, :, None], probs, 0.0), axis=3)
        rho = tl.minimum(rho_bar, pi / load_f32(pb_ptr, off, lm, 1.0))
        # c[t+1], and c[T] = 0. An action outside [0, A) has probability 0.
        action1 = load_tile(act_ptr, off1, lm1, 0)
        valid1 = m1 & (action1 >= 0) & (action1 < A)
        if EVEN:
            # Unmasked: an out-of-range action reads a clamped one, then 0.
            pi1 = load_f32(pt_ptr, off1 * A + tl.minimum(tl.maximum(action1, 0), A - 1), None, 0.0)
            pi1 = tl.where(valid1, pi1, 0.0)
        else:
            pi1 = load_f32(pt_ptr, off1 * A + action1, valid1, 0.0)
        c1 = tl.where(m1, lam * tl.minimum(c_bar, pi1 / load_f32(pb_ptr, off1, lm1, 1.0)), 0.0)
        r = load_f32(r_ptr, off, lm, 0.0)
        q = load_f32(q_ptr, off, lm, 0.0)
        term = load_flag(term_ptr, off, lm)
        if HAS_TRUNC:
            done = term | load_flag(trunc_ptr, off, lm)
        else:
            done = term
        delta = tl.where(m, r + tl.where(term, 0.0, gamma * expected_next_q) - q, 0.0)
        decay = tl.where(m, tl.where(done, 0.0, gamma * c1), 1.0)
        y0, prod, next0, next_prod, exit_y0, exit_prod = scan_backward(delta, decay, FLIP, True)
        carry_in, carry = tile_carry(exit_y0, exit_prod, carry, agg_ptr, rows, row_ok, chunk,
                                     NUM_CHUNKS, CHUNKED, NC_PAD, True)
        d = y0 + prod * carry_in[:, None, None]
        # Q_ret[t+1] = Q[t+1] + Δ[t+1]; past the buffer both are 0.
        q1 = load_f32(q_ptr, off1, lm1, 0.0)
        if EVEN:
            q1 = tl.where(m1, q1, 0.0)
        q_ret_next = q1 + next0 + next_prod * carry_in[:, None, None]
        adv = rho * (r + tl.where(term, 0.0, gamma * q_ret_next) - q)
        store_tile(qret_ptr, off, q + d, lm)
        store_tile(adv_ptr, off, adv, lm)
