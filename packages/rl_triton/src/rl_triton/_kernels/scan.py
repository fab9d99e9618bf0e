"""Triton building blocks shared by every op: affine maps, tile scans, chunk carries.

Every recurrence here is ``y[t] = a[t] + b[t] * y[t±1]``: an affine map
``x -> a + b x`` per step. A scan composes those maps in order; the element
that enters a tile from the neighbouring tile (or chunk) is the carry.

Layout: a program owns ``BLOCK_E`` rows (environments) and one chunk of
``CHUNK_T`` time steps, walked in tiles of ``BLOCK_T``. Backward ops
(``REVERSE``) walk from the chunk's last tile to its first. With several
chunks, an aggregate pass stores each chunk's map ``(A, B)`` (shape
``[2, E, NUM_CHUNKS]``) and the output pass composes the maps of the chunks
that come before it in scan order to get its carry.
"""

import triton
import triton.language as tl


@triton.jit
def compose(a_in, b_in, a_out, b_out):
    """The map ``out ∘ in``: apply the inner map first, then the outer one."""
    return a_out + b_out * a_in, b_in * b_out


@triton.jit
def compose_with_previous(a_in, b_in, p_in, q_in, a_out, b_out, p_out, q_out):
    """``compose`` that also carries ``(p, q)``: the map of the outer segment
    without its outermost element, i.e. the value one step earlier in scan order."""
    return a_out + b_out * a_in, b_in * b_out, p_out + q_out * a_in, b_in * q_out


@triton.jit
def pick(x, cols, index):
    """Column ``index`` of ``x`` ([BLOCK_E, N]) as a [BLOCK_E] vector."""
    return tl.sum(tl.where(cols[None, :] == index, x, 0.0), axis=1)


@triton.jit
def scan_tile(a, b, carry, cols, N: tl.constexpr, REVERSE: tl.constexpr):
    """Scan a [BLOCK_E, N] tile of maps along axis 1 starting from ``carry``.

    Returns the values ``y`` of the tile, the value leaving the tile (the carry
    for the next tile) and the product of ``b`` over the tile.
    """
    if REVERSE:
        entry = N - 1
        exit = 0
    else:
        entry = 0
        exit = N - 1
    a = tl.where(cols[None, :] == entry, a + b * carry[:, None], a)
    y, prod = tl.associative_scan((a, b), 1, compose, reverse=REVERSE)
    return y, pick(y, cols, exit), pick(prod, cols, exit)


@triton.jit
def scan_tile_with_previous(a, b, carry, cols, N: tl.constexpr, REVERSE: tl.constexpr):
    """``scan_tile`` that also returns ``y`` one step earlier in scan order
    (``y[t+1]`` for a backward scan): the carry at the tile's entry column."""
    if REVERSE:
        entry = N - 1
        exit = 0
    else:
        entry = 0
        exit = N - 1
    at_entry = cols[None, :] == entry
    a = tl.where(at_entry, a + b * carry[:, None], a)
    p = tl.where(at_entry, carry[:, None] + 0.0 * a, 0.0 * a)
    q = 1.0 + 0.0 * a
    y, prod, y_prev, _ = tl.associative_scan((a, b, p, q), 1, compose_with_previous, reverse=REVERSE)
    return y, y_prev, pick(y, cols, exit), pick(prod, cols, exit)


@triton.jit
def tile_times(chunk, i, n_tiles, CHUNK_T, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr):
    """Time indices [BLOCK_T] of the ``i``-th tile a program visits in its chunk."""
    if REVERSE:
        tile = n_tiles - 1 - i
    else:
        tile = i
    return chunk * CHUNK_T + tile * BLOCK_T + tl.arange(0, BLOCK_T)


@triton.jit
def tile_count(chunk, T, CHUNK_T, BLOCK_T: tl.constexpr):
    """Number of tiles in ``chunk`` (the last chunk may be shorter)."""
    return tl.cdiv(tl.minimum(CHUNK_T, T - chunk * CHUNK_T), BLOCK_T)


@triton.jit
def entering_carry(
    agg_ptr, rows, row_ok, chunk, E, NUM_CHUNKS, boundary,
    AGGREGATE: tl.constexpr, NC_PAD: tl.constexpr, REVERSE: tl.constexpr,
):
    """The carry entering this program's chunk.

    ``boundary`` [BLOCK_E] is the value from outside the sequence (``y[T]`` or
    ``y[-1]``). The aggregate pass computes pure chunk maps (carry 0); a single
    chunk starts from ``boundary``; otherwise the maps of the chunks before this
    one in scan order are composed and applied to ``boundary``.
    """
    if AGGREGATE:
        carry = 0.0 * boundary
    elif NC_PAD == 1:
        carry = boundary
    else:
        ks = tl.arange(0, NC_PAD)
        if REVERSE:
            before = (ks > chunk) & (ks < NUM_CHUNKS)
        else:
            before = ks < chunk
        m = row_ok[:, None] & before[None, :]
        off = rows.to(tl.int64)[:, None] * NUM_CHUNKS + ks[None, :]
        a = tl.load(agg_ptr + off, mask=m, other=0.0)
        b = tl.load(agg_ptr + E * NUM_CHUNKS + off, mask=m, other=1.0)
        _, carry, _ = scan_tile(a, b, boundary, ks, NC_PAD, REVERSE)
    return carry


@triton.jit
def store_aggregate(agg_ptr, rows, row_ok, chunk, E, NUM_CHUNKS, a, b):
    """Store this chunk's map ``(a, b)`` ([BLOCK_E] each) for the output pass."""
    off = rows.to(tl.int64) * NUM_CHUNKS + chunk
    tl.store(agg_ptr + off, a, mask=row_ok)
    tl.store(agg_ptr + E * NUM_CHUNKS + off, b, mask=row_ok)


@triton.jit
def load_flag(ptr, off, mask):
    """A boolean tile: nonzero entries of a flag tensor of any dtype."""
    return tl.load(ptr + off, mask=mask, other=0) != 0


@triton.jit
def load_f32(ptr, off, mask, other):
    return tl.load(ptr + off, mask=mask, other=other).to(tl.float32)


@triton.jit
def next_state_value(v_ptr, boot_ptr, last, off, t, m, T, trunc, BOOT: tl.constexpr):
    """``v_next[t]``: the bootstrap where truncated or ``t = T-1``, else ``v[t+1]``.

    ``BOOT``: 0 no bootstrap (zeros), 1 a ``[E, T]`` ``bootstrap_values``,
    2 a ``[E]`` ``last_value`` (``last``; no truncations allowed with it).
    """
    at_end = (t == T - 1)[None, :]
    v1 = load_f32(v_ptr, off + 1, m & (t < T - 1)[None, :], 0.0)
    if BOOT == 1:
        boot = load_f32(boot_ptr, off, m, 0.0)
        v_next = tl.where(trunc | at_end, boot, v1)
    elif BOOT == 2:
        v_next = tl.where(at_end, last[:, None], tl.where(trunc, 0.0, v1))
    else:
        v_next = tl.where(trunc | at_end, 0.0, v1)
    return v_next


@triton.jit
def program_rows(E, BLOCK_E: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    return rows, rows < E


@triton.jit
def row_value(ptr, rows, row_ok, HAS: tl.constexpr):
    """A per-row float32 value ([BLOCK_E]) from ``ptr``, or zeros when absent."""
    if HAS:
        x = tl.load(ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    else:
        x = tl.zeros(rows.shape, tl.float32)
    return x
