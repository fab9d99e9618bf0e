"""The runtime step: what ``course.step()`` returns, and the state behind it
(the localizer's memory and each env's progress).

Every array is allocated once, when the agents' buffers are bound, and
rewritten in place by each step, so a step records into a graph.
"""

from __future__ import annotations

import dataclasses

import warp as wp


@dataclasses.dataclass
class TrackContacts:
    """Contacts of agents on tracks (``collision="segments"``).

    Attributes:
        oob: ``[E]`` int32, 1 when a corner of the agent's box is off the track
            (farther than half a width from the course line); 1 for an invalid env.
    """

    oob: wp.array(dtype=wp.int32)


@dataclasses.dataclass
class DiscContact:
    """Contacts of agents with gate posts (``collision=<post radius>``).

    Attributes:
        posts: ``[E, G, 2]`` vec3, the post discs' centres (the result's ``posts``).
        hit: ``[E]`` int32, 1 when the agent's box touches a post disc; 0 for
            an invalid env.
    """

    posts: wp.array3d(dtype=wp.vec3)
    hit: wp.array(dtype=wp.int32)


@dataclasses.dataclass
class FrameContact:
    """Contacts of agents with gate frames (``collision="frames"``).

    Attributes:
        frames: ``[E]`` int32, 1 when the agent's step went through a gate's
            frame (its line, up to a gate width beyond either post) instead of
            its opening; 0 for an invalid env.
    """

    frames: wp.array(dtype=wp.int32)


@dataclasses.dataclass
class Events:
    """Progress along the course.

    Attributes:
        passed: ``[E]`` int32, checkpoints crossed in order this step (forward
            only; the start line is checkpoint 0); on gate courses, gates
            passed in order through their openings (a step from behind a
            gate's line to on or past it, between its posts).
        dist_to_next: ``[E]`` float32, arc length to the next checkpoint or
            gate (m); 0 for an invalid env.
        laps: ``[E]`` int32, laps completed since the last reset (frozen for
            an invalid env).
    """

    passed: wp.array(dtype=wp.int32)
    dist_to_next: wp.array(dtype=wp.float32)
    laps: wp.array(dtype=wp.int32)


@dataclasses.dataclass
class Frame:
    """The agent located on the course line.

    Attributes:
        s: ``[E]`` float32, arc length in ``[0, L)`` (m); NaN for an invalid env.
        n: ``[E]`` float32, signed offset, positive to the left (m); NaN for an invalid env.
    """

    s: wp.array(dtype=wp.float32)
    n: wp.array(dtype=wp.float32)


@dataclasses.dataclass
class StepResult:
    """What ``course.step()`` returns (the same arrays every step).

    Attributes:
        valid: ``[E]`` int32, the result's ``valid``: live, a regeneration
            rewrites it (read it before regenerating).
        contacts: ``TrackContacts`` (tracks), ``DiscContact`` or ``FrameContact`` (gates).
        events: ``Events``.
        frame: ``Frame``.
    """

    valid: wp.array(dtype=wp.int32)
    contacts: TrackContacts | DiscContact | FrameContact
    events: Events
    frame: Frame


@dataclasses.dataclass
class Progress:
    """The localizer's memory and each env's progress (reset by ``reset``
    and by regeneration)."""

    memory: wp.array(dtype=wp.int32)
    s_prev: wp.array(dtype=wp.float32)
    p_prev: wp.array(dtype=wp.vec3)
    next_checkpoint: wp.array(dtype=wp.int32)
    laps: wp.array(dtype=wp.int32)

    @classmethod
    def zeros(cls, num_envs: int, device: wp.context.Device) -> Progress:
        z = lambda dtype: wp.zeros(num_envs, dtype=dtype, device=device)  # noqa: E731
        return cls(memory=z(wp.int32), s_prev=z(wp.float32), p_prev=z(wp.vec3), next_checkpoint=z(wp.int32),
                   laps=z(wp.int32))
