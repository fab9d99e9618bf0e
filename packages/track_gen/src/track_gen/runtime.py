"""The runtime step: what ``course.step()`` returns, and the state behind it.

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

    oob: wp.array


@dataclasses.dataclass
class Events:
    """Progress along the course.

    Attributes:
        passed: ``[E]`` int32, checkpoints crossed in order this step
            (forward only; the start line is checkpoint 0).
        dist_to_next: ``[E]`` float32, arc length to the next checkpoint (m);
            0 for an invalid env.
        laps: ``[E]`` int32, laps completed since the last reset (frozen for
            an invalid env).
    """

    passed: wp.array
    dist_to_next: wp.array
    laps: wp.array


@dataclasses.dataclass
class Frame:
    """The agent located on the course line.

    Attributes:
        s: ``[E]`` float32, arc length in ``[0, L)`` (m); NaN for an invalid env.
        n: ``[E]`` float32, signed offset, positive to the left (m); NaN for an invalid env.
    """

    s: wp.array
    n: wp.array


@dataclasses.dataclass
class StepResult:
    """What ``course.step()`` returns (the same arrays every step).

    Attributes:
        valid: ``[E]`` int32, the result's ``valid``: live, a regeneration
            rewrites it (read it before regenerating).
        contacts: ``TrackContacts``.
        events: ``Events``.
        frame: ``Frame``.
    """

    valid: wp.array
    contacts: TrackContacts
    events: Events
    frame: Frame


@dataclasses.dataclass
class Progress:
    """The localizer's memory and each env's progress (reset by ``reset``
    and by regeneration)."""

    memory: wp.array
    s_prev: wp.array
    next_checkpoint: wp.array
    laps: wp.array

    @classmethod
    def zeros(cls, num_envs: int, device: wp.context.Device) -> Progress:
        z = lambda dtype: wp.zeros(num_envs, dtype=dtype, device=device)  # noqa: E731
        return cls(memory=z(wp.int32), s_prev=z(wp.float32), next_checkpoint=z(wp.int32), laps=z(wp.int32))
