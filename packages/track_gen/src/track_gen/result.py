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
        track_id: ``[E]`` uint32, the course's id: the effective seed it was
            built with, ``effective_seed(seed_e, generation_e)`` (the seed
            itself at epoch 0), so ``Course.track(spec, seeds=track_id)``
            builds it again as env 0 at epoch 0. Written with ``generation``:
            a new seed counts from the next regeneration.
    """

    center: wp.array2d(dtype=wp.vec3)
    count: wp.array(dtype=wp.int32)
    arc: wp.array2d(dtype=wp.float32)
    tangent: wp.array2d(dtype=wp.vec3)
    normal: wp.array2d(dtype=wp.vec3)
    left: wp.array2d(dtype=wp.vec3)
    right: wp.array2d(dtype=wp.vec3)
    length: wp.array(dtype=wp.float32)
    width: wp.array(dtype=wp.float32)
    checkpoints: wp.array2d(dtype=wp.int32)
    num_checkpoints: wp.array(dtype=wp.int32)
    sdf: wp.array3d(dtype=wp.float32)
    sdf_origin: wp.array(dtype=wp.vec2)
    sdf_cell: wp.array(dtype=wp.float32)
    height: wp.array3d(dtype=wp.float32)
    valid: wp.array(dtype=wp.int32)
    fail_mask: wp.array(dtype=wp.int32)
    generation: wp.array(dtype=wp.int32)
    track_id: wp.array(dtype=wp.uint32)


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
        valid, fail_mask, generation, track_id: as for tracks (fail bit: crossing bars).
    """

    num_gates: wp.array(dtype=wp.int32)
    gate_center: wp.array2d(dtype=wp.vec3)
    gate_normal: wp.array2d(dtype=wp.vec3)
    posts: wp.array3d(dtype=wp.vec3)
    gate_width: wp.array(dtype=wp.float32)
    gate_arc: wp.array2d(dtype=wp.float32)
    center: wp.array2d(dtype=wp.vec3)
    count: wp.array(dtype=wp.int32)
    arc: wp.array2d(dtype=wp.float32)
    length: wp.array(dtype=wp.float32)
    valid: wp.array(dtype=wp.int32)
    fail_mask: wp.array(dtype=wp.int32)
    generation: wp.array(dtype=wp.int32)
    track_id: wp.array(dtype=wp.uint32)
