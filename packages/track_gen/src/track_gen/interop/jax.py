"""A track course's arrays as JAX arrays, zero-copy, on the course's device.

Importing this module imports JAX (``pip install track-gen[jax]``); the rest
of track_gen does not need it::

    from track_gen.course import Course
    from track_gen.interop.jax import course_arrays
    from track_gen.pipeline import presets

    course = Course.track(presets.track(num_envs=1024, device="cuda:0"), seeds=42)
    arrays = course_arrays(course)      # arrays.center is result.center, as a jax.Array
    ids = arrays.track_id[arrays.valid != 0]

Each array is the Warp buffer itself, imported over DLPack
(``jax.dlpack.from_dlpack(..., copy=False)``): same device, same memory,
``x.unsafe_buffer_pointer() == warp_array.ptr``. The handshake runs on the
course's stream, so JAX's work is ordered after the Warp work enqueued
before the call.

Lifetime. The arrays are views of the course's live buffers: a regeneration
rewrites them in place, under JAX's feet. Take them right before use and do
not keep them across a regeneration; copy what must outlive one
(``jnp.array(x)``) and wait for the copy before regenerating.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import weakref
from typing import Any

import jax
import warp as wp

from track_gen.course import Course
from track_gen.generator import TrackGenerator

__all__ = ["CourseArrays", "course_arrays"]

#: The arrays `course_arrays` made that are still alive, by id (a jax.Array is not hashable).
_SHARED: dict[int, weakref.ref] = {}


def _release_shared() -> None:
    """At interpreter exit, give the Warp buffers still viewed by JAX
    arrays back while Warp can take them (later, in Python's teardown,
    Warp's DLPack deleter finds its module emptied and prints a traceback
    an array)."""
    for ref in list(_SHARED.values()):
        array = ref()
        if array is not None and not array.is_deleted():
            array.delete()


# Registered after Warp's and JAX's own exit handlers (imported above), so it runs before them.
atexit.register(_release_shared)


@dataclasses.dataclass(frozen=True)
class CourseArrays:
    """A track course's arrays as JAX arrays: zero-copy DLPack views of the
    course's Warp buffers, on the course's device (``E`` envs, ``N`` =
    ``N_max`` course-line points; lengths in track_gen metres).

    Attributes:
        center: ``[E, N, 3]`` float32 (m), ``result.center``: the closed
            course line (point ``count - 1`` joins point 0), z the height
            profile, NaN past ``count``.
        count: ``[E]`` int32, ``result.count``: course-line points used.
        valid: ``[E]`` int32, ``result.valid``: 1 when every check passed.
        width: ``[E]`` float32 (m), ``result.width``: the track width.
        generation: ``[E]`` int32, ``result.generation``: the epoch each
            env's course was built with.
        track_id: ``[E]`` uint32, ``result.track_id``: the effective seed
            each env's course was built with (``track_gen.seeds.effective_seed``).
    """

    center: jax.Array  # [E, N, 3] float32, m
    count: jax.Array  # [E] int32
    valid: jax.Array  # [E] int32
    width: jax.Array  # [E] float32, m
    generation: jax.Array  # [E] int32
    track_id: jax.Array  # [E] uint32

    @property
    def num_envs(self) -> int:
        """``E``."""
        return int(self.count.shape[0])

    @property
    def points(self) -> jax.Array:
        """``[E, N, 2]`` float32 (m): the course line's xy (a new array on the device)."""
        return self.center[..., :2]

    @property
    def half_width(self) -> jax.Array:
        """``[E]`` float32 (m): half the track width (a new array on the device)."""
        return 0.5 * self.width


def course_arrays(course: Course | TrackGenerator) -> CourseArrays:
    """The course line, counts, validity, widths, epochs and track ids of a
    track course, imported from Warp to JAX over DLPack without a copy.

    Args:
        course: a ``Course.track(...)`` (or its ``TrackGenerator``), on
            ``"cpu"`` or ``"cuda:N"``.

    Returns:
        The ``CourseArrays``: JAX arrays that share the Warp buffers, on the
        course's device.

    Raises:
        TypeError: ``course`` is not a track course (a gates course has no
            track width), or a buffer cannot be shared without a copy.
    """
    generator = _track_generator(course)
    stream = course.stream if isinstance(course, Course) else None
    result = generator.result
    buffers = dict(center=result.center, count=result.count, valid=result.valid, width=result.width,
                   generation=result.generation, track_id=result.track_id)
    # Warp's side of the DLPack handshake makes JAX's stream wait for Warp's
    # current one: make that the stream the course runs on.
    scoped = (wp.ScopedStream(stream, sync_enter=False) if stream is not None
              else contextlib.nullcontext())
    with scoped:
        arrays = {name: jax.dlpack.from_dlpack(array, copy=False) for name, array in buffers.items()}
    for array in arrays.values():
        key = id(array)
        _SHARED[key] = weakref.ref(array, lambda _, key=key: _SHARED.pop(key, None))
    return CourseArrays(**arrays)


def _track_generator(course: Any) -> TrackGenerator:
    if isinstance(course, Course):
        generator = course.generator
    elif isinstance(course, TrackGenerator):
        generator = course
    else:
        raise TypeError(f"course must be a track_gen Course (Course.track) or a TrackGenerator, "
                        f"got {type(course).__name__}")
    if not isinstance(generator, TrackGenerator):
        raise TypeError(f"course must be a track course (Course.track): a {type(generator).__name__}'s "
                        "course line has no track width")
    return generator
