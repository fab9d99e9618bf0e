"""Kernels of the runtime step: localise each agent on its course line, test
its box against the track (or the gates' posts and frames), and count its
progress (checkpoints, or gates passed).

Conventions: see ``track_gen._kernels``; these kernels run over every env.
"""

import warp as wp

from track_gen._kernels.geometry import NAN, cross2, segment_t, xy

#: Course-line segments searched on each side of the last match: an agent may
#: move up to ``WINDOW`` course-line spacings (``WINDOW * ds`` at most) per step.
WINDOW = wp.constant(32)


@wp.func
def _nearest(p: wp.vec2, center: wp.array2d(dtype=wp.vec3), e: int, n: int, start: int, span: int) -> wp.vec3:
    """(segment index, t, signed offset) of the nearest segment among
    ``start .. start + span`` (wrapped), as floats. Each course-line point
    is loaded once (a segment's end is the next one's start)."""
    best = float(1.0e30)
    best_i = int(0)
    best_t = float(0.0)
    best_side = float(0.0)
    i = (start % n + n) % n
    a = xy(center[e, i])
    for _k in range(span):
        j = i + 1
        if j == n:
            j = 0
        b = xy(center[e, j])
        ab = b - a
        t = segment_t(p, a, ab)
        d = p - (a + t * ab)
        dist2 = wp.dot(d, d)
        if dist2 < best:
            best = dist2
            best_i = i
            best_t = t
            best_side = cross2(ab, d) / wp.max(wp.length(ab), 1.0e-12)
        a = b
        i = j
    return wp.vec3(float(best_i), best_t, best_side)


@wp.func
def _within(p: wp.vec2, center: wp.array2d(dtype=wp.vec3), e: int, n: int, i: int, reach: int,
            limit: float) -> int:
    """1 when a segment among ``i - reach .. i + reach`` (wrapped) comes within
    ``limit`` of ``p``; searched outward from ``i``, stopping at the first."""
    found = int(0)
    for k in range(2 * reach + 1):
        offset = (k + 1) // 2
        if k % 2 == 1:
            offset = -offset
        j = ((i + offset) % n + n) % n
        a = xy(center[e, j])
        ab = xy(center[e, (j + 1) % n]) - a
        d = p - (a + segment_t(p, a, ab) * ab)
        if wp.dot(d, d) <= limit * limit:
            found = 1
            break
    return found


@wp.func
def _localize(
    p: wp.vec2,
    center: wp.array2d(dtype=wp.vec3),
    arc: wp.array2d(dtype=wp.float32),
    e: int,
    n: int,
    total: float,
    memory: wp.array(dtype=wp.int32),
    s_out: wp.array(dtype=wp.float32),
    n_out: wp.array(dtype=wp.float32),
) -> float:
    """Locate ``p`` on env ``e``'s course line: the nearest segment within the
    window around the remembered one (the whole line after a reset). Writes
    the frame ``(s, n)`` and the memory; returns ``s`` in ``[0, L)``."""
    if memory[e] < 0:
        found = _nearest(p, center, e, n, 0, n)
    else:
        found = _nearest(p, center, e, n, memory[e] - WINDOW, 2 * WINDOW + 1)
    i = int(found[0])
    seg = wp.where(i + 1 < n, arc[e, (i + 1) % n], total) - arc[e, i]
    s = arc[e, i] + found[1] * seg
    if s >= total:
        s = s - total
    memory[e] = i
    s_out[e] = s
    n_out[e] = found[2]
    return s


@wp.kernel
def reset_progress(
    active: wp.array(dtype=wp.int32),
    num_checkpoints: wp.array(dtype=wp.int32),
    memory: wp.array(dtype=wp.int32),
    s_prev: wp.array(dtype=wp.float32),
    next_checkpoint: wp.array(dtype=wp.int32),
    laps: wp.array(dtype=wp.int32),
):
    """Masked envs forget where the agent was and restart their progress
    (all four written only: outputs)."""
    e = wp.tid()
    if active[e] == 0:
        return
    memory[e] = -1
    s_prev[e] = NAN
    next_checkpoint[e] = 1 % wp.max(num_checkpoints[e], 1)
    laps[e] = 0


@wp.kernel
def track_step(
    valid: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    arc: wp.array2d(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    length: wp.array(dtype=wp.float32),
    width: wp.array(dtype=wp.float32),
    checkpoints: wp.array2d(dtype=wp.int32),
    num_checkpoints: wp.array(dtype=wp.int32),
    position: wp.array(dtype=wp.vec3),
    orientation: wp.array(dtype=wp.quatf),
    half_extents: wp.array(dtype=wp.vec2f),
    # in-out state: the progress
    memory: wp.array(dtype=wp.int32),
    s_prev: wp.array(dtype=wp.float32),
    next_checkpoint: wp.array(dtype=wp.int32),
    laps: wp.array(dtype=wp.int32),
    # outputs
    oob: wp.array(dtype=wp.int32),
    passed: wp.array(dtype=wp.int32),
    dist_to_next: wp.array(dtype=wp.float32),
    s_out: wp.array(dtype=wp.float32),
    n_out: wp.array(dtype=wp.float32),
):
    """One env's step: frame ``(s, n)``, out of bounds (a corner of the box off
    the track: farther than half a width from the course line within
    ``2 * (half width + box half diagonal)`` of arc around the agent's match),
    checkpoints passed in order, distance to the next, laps.
    An invalid env answers as an env with no course."""
    e = wp.tid()
    if valid[e] == 0:
        oob[e] = 1
        passed[e] = 0
        dist_to_next[e] = 0.0
        s_out[e] = NAN
        n_out[e] = NAN
        return
    n = count[e]
    total = length[e]
    p = xy(position[e])
    s = _localize(p, center, arc, e, n, total, memory, s_out, n_out)
    i = memory[e]
    # Out of bounds: any corner of the box farther than half a width from the
    # course line near the agent (the segments within the reach of its box).
    half = 0.5 * width[e]
    he = half_extents[e]
    spacing = total / float(n)  # a valid course line is uniform
    reach = wp.min(int(wp.ceil(2.0 * (half + wp.length(he)) / spacing)) + 1, n // 2)
    out = int(0)
    for c in range(4):
        sx = wp.where(c % 2 == 0, 1.0, -1.0)
        sy = wp.where(c < 2, 1.0, -1.0)
        corner = xy(wp.quat_rotate(orientation[e], wp.vec3(sx * he[0], sy * he[1], 0.0))) + p
        if _within(corner, center, e, n, i, reach, half) == 0:
            out = 1
    oob[e] = out
    # Progress: the checkpoints in (s_prev, s], forward only and in order.
    count_passed = int(0)
    k = next_checkpoint[e]
    cps = num_checkpoints[e]
    sp = s_prev[e]
    if sp == sp and cps > 0:  # not NaN: a previous position exists
        forward = s - sp
        if forward < -0.5 * total:
            forward = forward + total
        if forward > 0.5 * total:
            forward = forward - total
        if forward > 0.0:
            wrapped = s < sp  # crossed the start line
            going = int(1)
            for _ in range(cps):
                target = arc[e, checkpoints[e, k]]
                inside = target > sp and target <= s
                if wrapped:
                    inside = target > sp or target <= s
                if going != 0 and inside:
                    count_passed = count_passed + 1
                    if k == 0:
                        laps[e] = laps[e] + 1
                    k = (k + 1) % cps
                else:
                    going = 0
    next_checkpoint[e] = k
    passed[e] = count_passed
    s_prev[e] = s
    if cps > 0:
        dist_to_next[e] = wp.mod(arc[e, checkpoints[e, k]] - s + total, total)
    else:
        dist_to_next[e] = 0.0


@wp.func
def _box_distance(q: wp.vec2, p: wp.vec2, orientation: wp.quatf, half: wp.vec2f) -> float:
    """Distance (m) from point ``q`` to the agent's box (0 inside it)."""
    local = wp.quat_rotate_inv(orientation, wp.vec3(q[0] - p[0], q[1] - p[1], 0.0))
    dx = wp.max(wp.abs(local[0]) - half[0], 0.0)
    dy = wp.max(wp.abs(local[1]) - half[1], 0.0)
    return wp.sqrt(dx * dx + dy * dy)


@wp.func
def _through_gate(a: wp.vec2, b: wp.vec2, center: wp.vec3, left: wp.vec3, half: float) -> int:
    """How the step from ``a`` to ``b`` meets a gate: 1 through its opening,
    2 through its frame (up to a gate width beyond a post), 0 neither. A step
    meets the gate when it goes from strictly behind the gate's line to on or
    past it, in the travel direction."""
    c = xy(center)
    side = xy(left)
    ahead = wp.vec2(side[1], -side[0])
    fa = wp.dot(a - c, ahead)
    fb = wp.dot(b - c, ahead)
    result = int(0)
    if fa < 0.0 and fb >= 0.0:
        x = a + (fa / (fa - fb)) * (b - a)
        lateral = wp.abs(wp.dot(x - c, side))
        if lateral <= half:
            result = 1
        elif lateral <= 3.0 * half:
            result = 2
    return result


@wp.kernel
def gate_step(
    valid: wp.array(dtype=wp.int32),
    center: wp.array2d(dtype=wp.vec3),
    arc: wp.array2d(dtype=wp.float32),
    count: wp.array(dtype=wp.int32),
    length: wp.array(dtype=wp.float32),
    num_gates: wp.array(dtype=wp.int32),
    gate_arc: wp.array2d(dtype=wp.float32),
    gate_center: wp.array2d(dtype=wp.vec3),
    gate_normal: wp.array2d(dtype=wp.vec3),
    gate_width: wp.array(dtype=wp.float32),
    posts: wp.array3d(dtype=wp.vec3),
    post_radius: float,
    position: wp.array(dtype=wp.vec3),
    orientation: wp.array(dtype=wp.quatf),
    half_extents: wp.array(dtype=wp.vec2f),
    # in-out state: the progress
    memory: wp.array(dtype=wp.int32),
    p_prev: wp.array(dtype=wp.vec3),
    next_gate: wp.array(dtype=wp.int32),
    laps: wp.array(dtype=wp.int32),
    # outputs
    hit: wp.array(dtype=wp.int32),
    frames: wp.array(dtype=wp.int32),
    passed: wp.array(dtype=wp.int32),
    dist_to_next: wp.array(dtype=wp.float32),
    s_out: wp.array(dtype=wp.float32),
    n_out: wp.array(dtype=wp.float32),
):
    """One env's step on a gate course: frame ``(s, n)`` on the line through
    the gate centres; ``hit`` when the box touches a post disc of
    ``post_radius``; ``frames`` when the agent's step went through a gate's
    frame (up to a gate width beyond either post) instead of its opening;
    gates passed in order through their openings, distance to the next gate,
    laps. An invalid env has no contact, frozen progress and NaN ``s`` / ``n``."""
    e = wp.tid()
    if valid[e] == 0:
        hit[e] = 0
        frames[e] = 0
        passed[e] = 0
        dist_to_next[e] = 0.0
        s_out[e] = NAN
        n_out[e] = NAN
        return
    n = count[e]
    total = length[e]
    p = xy(position[e])
    s = _localize(p, center, arc, e, n, total, memory, s_out, n_out)
    g_count = num_gates[e]
    touching = int(0)
    if post_radius > 0.0:
        for g in range(g_count):
            for side in range(2):
                if _box_distance(xy(posts[e, g, side]), p, orientation[e], half_extents[e]) <= post_radius:
                    touching = 1
    hit[e] = touching
    half = 0.5 * gate_width[e]
    framed = int(0)
    count_passed = int(0)
    k = next_gate[e]
    prev = p_prev[e]
    if prev[0] == prev[0]:  # not NaN: a previous position exists
        a = xy(prev)
        going = int(1)
        for _ in range(g_count):
            if going != 0 and _through_gate(a, p, gate_center[e, k], gate_normal[e, k], half) == 1:
                count_passed = count_passed + 1
                if k == 0:
                    laps[e] = laps[e] + 1
                k = (k + 1) % g_count
            else:
                going = 0
        for g in range(g_count):
            if _through_gate(a, p, gate_center[e, g], gate_normal[e, g], half) == 2:
                framed = 1
    frames[e] = framed
    next_gate[e] = k
    passed[e] = count_passed
    p_prev[e] = wp.vec3(p[0], p[1], 0.0)
    dist_to_next[e] = wp.mod(gate_arc[e, k] - s + total, total)


@wp.kernel
def reset_gate_progress(active: wp.array(dtype=wp.int32), p_prev: wp.array(dtype=wp.vec3)):
    """Masked envs forget the agent's previous position."""
    e = wp.tid()
    if active[e] != 0:
        p_prev[e] = wp.vec3(NAN, NAN, NAN)


@wp.kernel
def clear_flag(flag: wp.array(dtype=wp.int32)):
    """``flag[0] = 0``: the first of the two kernels that reduce a mask to a flag."""
    flag[0] = 0


@wp.kernel
def raise_flag(mask: wp.array(dtype=wp.int32), flag: wp.array(dtype=wp.int32)):
    """``flag[0] = 1`` when any entry of ``mask`` is nonzero (a conditional node reads it)."""
    if mask[wp.tid()] != 0:
        flag[0] = 1
