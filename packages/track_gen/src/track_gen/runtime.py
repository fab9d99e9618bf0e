"""The runtime step: what ``course.step()`` returns, the state behind it
(the localizer's memory and each env's progress), and ``Runtime``, which
holds them and launches the step's kernels.

Every array is allocated once, with the course, and rewritten in place by
each step, so a step records into a graph.
"""

from __future__ import annotations

import dataclasses

import warp as wp

from track_gen._kernels import step as ks
from track_gen.generator import GateGenerator, TrackGenerator
from track_gen.masks import check_mask


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


class Runtime:
    """The runtime step of one batch: the agents' bound buffers, the
    localizer's memory and progress, and the ``StepResult`` arrays. Its
    methods launch on Warp's current stream; ``Course`` chooses it.

    Attributes:
        result: the ``StepResult`` every ``step()`` rewrites.
        progress: the localizer's memory and each env's progress.
    """

    def __init__(self, generator: TrackGenerator | GateGenerator, collision: str | float) -> None:
        self.generator = generator
        self.collision = collision
        e, device = generator.num_envs, generator.device
        self.progress = Progress.zeros(e, device)
        z = lambda dtype: wp.zeros(e, dtype=dtype, device=device)  # noqa: E731
        if isinstance(generator, TrackGenerator):
            contacts: TrackContacts | DiscContact | FrameContact = TrackContacts(oob=z(wp.int32))
        elif collision == "frames":
            contacts = FrameContact(frames=z(wp.int32))
        else:
            contacts = DiscContact(posts=generator.result.posts, hit=z(wp.int32))
        # The gate kernel writes both hit arrays; the one not returned is scratch.
        self._frames_hit = contacts.frames if isinstance(contacts, FrameContact) else z(wp.int32)
        self._posts_hit = contacts.hit if isinstance(contacts, DiscContact) else z(wp.int32)
        self.result = StepResult(valid=generator.result.valid, contacts=contacts,
                                 events=Events(passed=z(wp.int32), dist_to_next=z(wp.float32),
                                               laps=self.progress.laps),
                                 frame=Frame(s=z(wp.float32), n=z(wp.float32)))
        self._bound: tuple[wp.array, wp.array, wp.array] | None = None

    def bind(self, position: wp.array, orientation: wp.array, half_extents: wp.array) -> None:
        """Bind the agents' stable buffers (one oriented box per env), read by
        every step. Allocates and copies nothing.

        Args:
            position: ``[E]`` vec3, box centres (m).
            orientation: ``[E]`` quatf, box orientations.
            half_extents: ``[E]`` vec2f, half length and half width of the box (m).

        Raises:
            TypeError, ValueError: a buffer of the wrong type, dtype, length or device.
        """
        e, device = self.generator.num_envs, self.generator.device
        for name, array, dtype in (("position", position, wp.vec3), ("orientation", orientation, wp.quatf),
                                   ("half_extents", half_extents, wp.vec2f)):
            if not isinstance(array, wp.array):
                raise TypeError(f"{name} must be a warp array, got {type(array).__name__}")
            if array.dtype != dtype:
                raise TypeError(f"{name} must have dtype {wp.types.type_repr(dtype)}, "
                                f"got {wp.types.type_repr(array.dtype)}")
            if array.shape != (e,):
                raise ValueError(f"{name} must have shape [{e}], got {list(array.shape)}")
            if array.device != device:
                raise ValueError(f"{name} must be on the course device {device}, got {array.device}")
        self._bound = (position, orientation, half_extents)

    def check_bound(self) -> None:
        """Raises ``RuntimeError`` when no buffers are bound."""
        if self._bound is None:
            raise RuntimeError("bind the agents' buffers first: course.bind(position=, orientation=, half_extents=)")

    def step(self) -> StepResult:
        """Launch one step of every env (buffers bound: ``check_bound``)."""
        self.check_bound()
        r, p, out = self.generator.result, self.progress, self.result
        position, orientation, half_extents = self._bound
        # Inputs: the course and the agents; in-out state: the progress;
        # outputs: the contacts, the events and the frame.
        if isinstance(self.generator, TrackGenerator):
            kernel = ks.track_step
            inputs = [r.valid, r.center, r.arc, r.count, r.length, r.width, r.checkpoints, r.num_checkpoints,
                      position, orientation, half_extents,
                      p.memory, p.s_prev, p.next_checkpoint, p.laps]
            contacts = [out.contacts.oob]
        else:
            kernel = ks.gate_step
            radius = 0.0 if self.collision == "frames" else float(self.collision)
            inputs = [r.valid, r.center, r.arc, r.count, r.length, r.num_gates, r.gate_arc, r.gate_center,
                      r.gate_normal, r.gate_width, r.posts, radius, position, orientation, half_extents,
                      p.memory, p.p_prev, p.next_checkpoint, p.laps]
            contacts = [self._posts_hit, self._frames_hit]
        wp.launch(kernel, self.generator.num_envs, inputs=inputs,
                  outputs=contacts + [out.events.passed, out.events.dist_to_next, out.frame.s, out.frame.n],
                  device=self.generator.device)
        return out

    def reset(self, active: wp.array) -> None:
        """Restart the progress and the localizer's memory of the envs
        selected by ``active`` (``[E]`` int32 on the course device, nonzero
        selects an env).

        Raises:
            TypeError, ValueError: ``active`` is not a contiguous ``[E]``
                int32 Warp array on the course device (nothing launched).
        """
        p, e, device = self.progress, self.generator.num_envs, self.generator.device
        check_mask("active", active, e, device)
        wp.launch(ks.reset_progress, e, inputs=[active, self.generator.progress_marks],
                  outputs=[p.memory, p.s_prev, p.next_checkpoint, p.laps], device=device)
        wp.launch(ks.reset_gate_progress, e, inputs=[active], outputs=[p.p_prev], device=device)
