"""Validity checks: the fail bits of ``result.fail_mask``.

An env is valid (``result.valid[e] == 1``) when its ``fail_mask`` is 0. The
"Invalid envs" page gives each bit's rate at default settings and the knob
that lowers it.
"""

import warp as wp

#: Tracks: the loop's total turning is not ±2π, or two non-adjacent segments
#: of the course line cross.
FAIL_TURNING = wp.constant(1)
#: Tracks: a radius of curvature below the half-width, or two
#: non-neighbouring course-line points closer than the width (the boundaries
#: would overlap).
FAIL_THICKNESS = wp.constant(2)
#: Tracks: the course needs more than ``N_max`` course-line points.
FAIL_TRUNCATION = wp.constant(4)
#: Gates: two gates' bars intersect.
FAIL_CROSSING_BARS = wp.constant(8)
#: Both: a dynamic param of the env (``generator.params``) outside its
#: documented range (``PARAM_RANGES``), NaN and infinities included, or a
#: course line too short to be one (fewer than 3 points, or no length).
FAIL_PARAMS = wp.constant(16)

NAMES = {1: "turning", 2: "thickness", 4: "truncation", 8: "crossing bars", 16: "params"}

#: The documented range of each dynamic param: (lowest, highest, is the
#: lowest allowed). Every bound is finite, so NaN and infinities are out.
PARAM_RANGES = {
    "radius": (1.0e-6, 1.0e6, True),
    "radius_jitter": (0.0, 1.0, True),
    "angle_jitter": (0.0, 1.0e3, True),
    "width": (1.0e-6, 1.0e6, True),
    "height_amplitude": (0.0, 1.0e6, True),
    "gate_width": (1.0e-6, 1.0e6, True),
}


def describe(fail_mask: int) -> list[str]:
    """The names of the bits set in one env's ``fail_mask``."""
    return [name for bit, name in NAMES.items() if fail_mask & bit]
