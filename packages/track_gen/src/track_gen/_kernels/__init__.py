"""Warp kernels: ``geometry`` (shared functions), ``loop`` (the seeded closed
spline), ``tracks`` (frames and checks), ``gates`` (placement and bar checks),
``bakes`` (checkpoints, SDF, height field), ``step`` (the runtime step,
progress resets, the flag a conditional regeneration reads).

Every kernel takes an ``active`` ``[E]`` int32 array and leaves the envs whose
entry is 0 untouched, so a masked regeneration rebuilds only the masked envs
and every other env keeps its arrays bit for bit. Lengths are metres, angles
radians.

Parameters come in three groups, in this order:

1. inputs, read only; ``active`` (or, in the kernels that run over every
   env, ``valid``) is the first of them;
2. in-out state, read and written: a counter a kernel adds to (zeroed by
   another kernel), an array it updates in place, the runtime's progress;
3. outputs, written only (a masked kernel writes only its active envs).

A kernel's docstring or a comment in its signature names the group of a
parameter where it is not obvious. Every launch passes the first two groups
as ``inputs=[...]`` and the outputs as ``outputs=[...]``.

RNG streams: a kernel that draws numbers starts its state with
``wp.rand_init(seed, offset)`` from the env's effective seed
(``track_gen.seeds.effective_seed_wp``); the offset names the stream. The
streams must never overlap (two draws on one offset would repeat each other's
numbers): control point ``k`` of the spline uses offset ``k``
(``0 .. K - 1``, and ``K`` is far below ``2**20``), the others use the
offsets below. Changing a value changes every course a seed builds.
"""

import warp as wp

from track_gen._warp import quiet

# Warp prints its banner and a line per loaded module on stdout at its
# default log level (info), and a line on stderr where no NVIDIA driver
# loads: a library's user would find them in their output. Left at that
# default with Warp not initialised yet, the level is lowered to warnings
# and the no-driver line left out; another level, one set after this
# import, or a Warp already initialised is the user's choice (README,
# "Warp's output").
quiet(wp)

#: RNG stream of each env's gate count (``gates.gate_counts``).
GATE_COUNT_STREAM = wp.constant(1 << 20)
#: RNG stream of each env's terrain phases (``bakes.terrain_phases``).
TERRAIN_PHASE_STREAM = wp.constant(1 << 21)
