"""Triton building blocks shared by every op: affine maps, tile scans, chunk carries.

Every recurrence here is ``y[t] = a[t] + b[t] * y[t±1]``: an affine map
``x -> a + b x`` per step. A scan composes those maps in order; the value
that enters a tile from the neighbouring tile (or chunk) is the carry.

Layout: a program owns ``BLOCK_E`` rows (environments). Fused path: it walks
the whole sequence in tiles of ``BLOCK_T``, carrying from tile to tile
(backward ops, ``REVERSE``, from the last tile to the first). Chunked path:
it owns one tile (a chunk), scans it from a zero carry, publishes the tile's
map, composes the maps of the chunks before it in scan order (decoupled, one
pass over the data) and fixes its values up with the resulting carry.
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
def scan_maps(a, b, REVERSE: tl.constexpr):
    """Scan a [BLOCK_E, N] tile of maps along axis 1 from a zero carry.

    Returns ``(y0, prod)``: the values with nothing entering the tile, and the
    product of ``b`` from the tile's entry up to each step, so that with a
    carry ``c`` entering the tile the values are ``y0 + prod * c``.
    """
    return tl.associative_scan((a, b), 1, compose, reverse=REVERSE)


@triton.jit
def scan_maps_with_previous(a, b, REVERSE: tl.constexpr):
    """``scan_maps`` plus ``(p, q)``: the value one step earlier in scan order
    (``y[t+1]`` for a backward scan) is ``p + q * c``."""
    zero = 0.0 * a
    return tl.associative_scan((a, b, zero, zero + 1.0), 1, compose_with_previous, reverse=REVERSE)


@triton.jit
def exit_column(N: tl.constexpr, REVERSE: tl.constexpr):
    """The tile column whose value leaves the tile (the earliest step when backward)."""
    if REVERSE:
        col = 0
    else:
        col = N - 1
    return col


@triton.jit
def chunk_of_program(sync_ptr, NUM_CHUNKS, CHUNKED: tl.constexpr, REVERSE: tl.constexpr):
    """The chunk this program scans.

    Chunked: programs take tickets in the order they start, and the first
    ticket gets the first chunk in scan order, so a program only ever waits
    for programs that started before it (no deadlock, on the GPU or in the
    interpreter, which runs programs one after another).
    """
    if CHUNKED:
        ticket = tl.atomic_add(sync_ptr + tl.num_programs(0) * NUM_CHUNKS + tl.program_id(0), 1)
        if REVERSE:
            chunk = NUM_CHUNKS - 1 - ticket
        else:
            chunk = ticket
    else:
        chunk = tl.program_id(1)
    return chunk


@triton.jit
def resolve(
    y0, prod, carry, cols, agg_ptr, sync_ptr, rows, row_ok, chunk, E, NUM_CHUNKS,
    CHUNKED: tl.constexpr, NC_PAD: tl.constexpr, N: tl.constexpr, REVERSE: tl.constexpr,
):
    """The tile's values from its zero-carry scan ``(y0, prod)``.

    Fused: ``carry`` is the value entering from the previous tile. Chunked:
    ``carry`` is the value from outside the sequence, and the carry entering
    the chunk comes from ``chained_carry``.

    Returns ``(y, carry_in, carry_out)``: the values, the carry that entered
    the tile, and the carry for the next tile.
    """
    exit = exit_column(N, REVERSE)
    if CHUNKED:
        carry = chained_carry(agg_ptr, sync_ptr, rows, row_ok, chunk, E, NUM_CHUNKS, carry,
                              pick(y0, cols, exit), pick(prod, cols, exit), NC_PAD, REVERSE)
    y = y0 + prod * carry[:, None]
    if CHUNKED:
        carry_out = carry
    else:
        carry_out = pick(y, cols, exit)
    return y, carry, carry_out


@triton.jit
def chained_carry(
    agg_ptr, sync_ptr, rows, row_ok, chunk, E, NUM_CHUNKS, boundary, a, b,
    NC_PAD: tl.constexpr, REVERSE: tl.constexpr,
):
    """Publish this chunk's map ``(a, b)`` ([BLOCK_E] each), wait until every
    chunk before it in scan order has published, and return the carry entering
    this chunk: their maps composed and applied to ``boundary``.

    ``agg_ptr``: float32 ``[2, E, NUM_CHUNKS]``; ``sync_ptr``: int32, zeroed,
    ``[row blocks, NUM_CHUNKS]`` ready flags then ``[row blocks]`` tickets.
    """
    off = rows.to(tl.int64) * NUM_CHUNKS + chunk
    tl.store(agg_ptr + off, a, mask=row_ok)
    tl.store(agg_ptr + E * NUM_CHUNKS + off, b, mask=row_ok)
    # Every thread's stores are ordered before the release of the flag.
    tl.debug_barrier()
    flags = sync_ptr + tl.program_id(0) * NUM_CHUNKS
    tl.atomic_xchg(flags + chunk, 1, sem="release")
    ks = tl.arange(0, NC_PAD)
    if REVERSE:
        before = (ks > chunk) & (ks < NUM_CHUNKS)
    else:
        before = ks < chunk
    waiting = tl.sum(tl.where(before, 1 - tl.atomic_add(flags + ks, 0, mask=before, sem="acquire"), 0))
    while waiting > 0:
        waiting = tl.sum(tl.where(before, 1 - tl.atomic_add(flags + ks, 0, mask=before, sem="acquire"), 0))
    tl.debug_barrier()
    m = row_ok[:, None] & before[None, :]
    maps = rows.to(tl.int64)[:, None] * NUM_CHUNKS + ks[None, :]
    ma = tl.load(agg_ptr + maps, mask=m, other=0.0, cache_modifier=".cg")
    mb = tl.load(agg_ptr + E * NUM_CHUNKS + maps, mask=m, other=1.0, cache_modifier=".cg")
    # The boundary enters at the first chunk in scan order; masked chunks are identities.
    if REVERSE:
        entry = NC_PAD - 1
    else:
        entry = 0
    ma = tl.where(ks[None, :] == entry, ma + mb * boundary[:, None], ma)
    y, _ = scan_maps(ma, mb, REVERSE)
    return pick(y, ks, exit_column(NC_PAD, REVERSE))


@triton.jit
def tile_times(chunk, i, n_tiles, CHUNK_T, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr):
    """Time indices [BLOCK_T] of the ``i``-th tile a program visits in its chunk
    (backward ops visit the last tile first). Tiles always lie in increasing
    time, so loads and stores stay vectorised."""
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
