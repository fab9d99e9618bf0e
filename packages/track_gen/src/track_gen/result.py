"""What a generator produces: the per-env course arrays (Warp, on the course device)."""

from __future__ import annotations

import dataclasses

import warp as wp


@dataclasses.dataclass
class TrackResult:
    """A batch of tracks. Shapes use ``E`` envs, ``N`` = ``N_max`` course-line
    points, ``C`` checkpoints, ``R`` bake cells per side; lengths in metres.

    Attributes:
        center: ``[E, N]`` vec3, the course line (closed: point ``count - 1``
            joins point 0), NaN past ``count``; z from the height profile (0 flat).
        count: ``[E]`` int32, course-line points used, ``ceil(length / ds)``
            capped at ``N``.
        arc: ``[E, N]`` float32, arc length of each point, ``i * length / count``
            (even spacing of at most ``ds`` all round, the closing segment
            included; ``i * ds`` on a truncated course), NaN past ``count``.
        tangent: ``[E, N]`` vec3, unit tangents; ``normal``: unit normals to the left.
        left: ``[E, N]`` vec3, the left boundary (``center + width/2 * normal``);
            ``right`` the right one.
        length: ``[E]`` float32, lap length.
        width: ``[E]`` float32, track width of the course (the ``width`` param it was built with).
        checkpoints: ``[E, C]`` int32, course-line index of checkpoint ``k``
            (every ``checkpoint_spacing`` of arc), -1 past ``num_checkpoints``.
        num_checkpoints: ``[E]`` int32.
        sdf: ``[E, R, R]`` float32, signed distance to the track region at
            cell centres (negative on the track), exact up to half a width
            outside the track and clamped at ``+width / 2`` beyond;
            ``sdf_origin`` ``[E]`` vec2 is the grid's lower corner and
            ``sdf_cell`` ``[E]`` float32 its cell size.
        height: ``[E, R, R]`` float32, ground height on the same grid (0 flat).
        valid: ``[E]`` int32, 1 when ``fail_mask`` is 0.
        fail_mask: ``[E]`` int32, the bits of ``track_gen.checks``.
        generation: ``[E]`` int32, the epoch the env's course was built with.
    """

    center: wp.array
    count: wp.array
    arc: wp.array
    tangent: wp.array
    normal: wp.array
    left: wp.array
    right: wp.array
    length: wp.array
    width: wp.array
    checkpoints: wp.array
    num_checkpoints: wp.array
    sdf: wp.array
    sdf_origin: wp.array
    sdf_cell: wp.array
    height: wp.array
    valid: wp.array
    fail_mask: wp.array
    generation: wp.array


@dataclasses.dataclass
class GateResult:
    """A batch of gate courses (``G`` = ``max_gates``; lengths in metres).

    Attributes:
        num_gates: ``[E]`` int32, gates of each env.
        gate_center: ``[E, G]`` vec3, gate centres in travel order (NaN past ``num_gates``).
        gate_normal: ``[E, G]`` vec3, unit vector from the right post to the left one.
        posts: ``[E, G, 2]`` vec3, the left and right posts; the bar joins them.
        gate_width: ``[E]`` float32, the post distance the course was built with.
        gate_arc: ``[E, G]`` float32, arc length of each gate centre along the course line.
        center, count, arc: the course line through the gate centres (as for tracks).
        length: ``[E]`` float32, the course line's lap length.
        valid, fail_mask, generation: as for tracks (fail bit: crossing bars).
    """

    num_gates: wp.array
    gate_center: wp.array
    gate_normal: wp.array
    posts: wp.array
    gate_width: wp.array
    gate_arc: wp.array
    center: wp.array
    count: wp.array
    arc: wp.array
    length: wp.array
    valid: wp.array
    fail_mask: wp.array
    generation: wp.array
