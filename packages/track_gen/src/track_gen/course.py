"""The Course API: a batch of courses with masked regeneration and a runtime step.

``Course.track(spec, ...)`` and ``Course.gates(spec, ...)`` build a generator
and generate every env at epoch 0. ``course.regenerate(mask=..., advance=True)``
gives the masked envs new courses and leaves every other env bit for bit;
``course.generate(seeds=...)`` reseeds every env and rebuilds the batch at
epoch 0. ``course.bind(...)`` then ``course.step()`` locate the agents and
count their progress; ``course.reset(mask)`` respawns envs on the
course they have.

Every call after construction records into a capture: ``wp.ScopedCapture``
on cpu and cuda, or ``torch.cuda.graph`` (calls adopt torch's capture
stream). On CUDA a recorded masked regeneration goes behind a conditional
node where the capture allows one (``track_gen.exec``), and an eager one
replays the course's own CUDA graph, which holds the same node.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict

import warp as wp
from numpy.typing import ArrayLike

from track_gen import _capture
from track_gen._kernels import step as ks
from track_gen.errors import CaptureError
from track_gen.generator import GateGenerator, TrackGenerator
from track_gen.masks import check_mask
from track_gen.result import GateResult, TrackResult
from track_gen.runtime import Runtime, StepResult
from track_gen.seeds import PerEnvSeededRNG
from track_gen.spec import GateSpec, TrackSpec, check_length


class Course:
    """A batch of ``E`` courses on one Warp device.

    Attributes:
        generator: the generator (its ``params[...]`` are read by the next regeneration).
        inputs: stable zero-initialised ``[E]`` int32 masks, ``"regen_mask"``
            and ``"reset_mask"``: the library reads them and never clears them.
        rng: per-env seeds and epochs (``rng.seeds_warp``); ``seeds`` is a
            deprecated alias.
        runtime: the runtime step's state and launches (``Runtime``); the
            course decides where they run (stream, capture).
    """

    def __init__(self, generator: TrackGenerator | GateGenerator, collision: str | float,
                 stream: wp.Stream | None = None):
        _capture.release_dropped()
        self.generator = generator
        self.collision = collision
        e, device = generator.num_envs, generator.device
        self.stream = stream
        self._flag = wp.zeros(1, dtype=wp.int32, device=device)
        self._graphs: OrderedDict[tuple[int, bool, int], tuple[wp.Graph, wp.array | None]] = OrderedDict()
        self.inputs = {"regen_mask": generator.inputs["regen_mask"],
                       "reset_mask": wp.zeros(e, dtype=wp.int32, device=device)}
        self.runtime = Runtime(generator, collision)

    @classmethod
    def track(cls, spec: TrackSpec, checkpoint_spacing: float = 0.6, collision: str = "segments",
              seeds: int | ArrayLike | PerEnvSeededRNG = 0, stream: wp.Stream | None = None) -> Course:
        """A batch of closed-loop tracks, generated at epoch 0.

        Args:
            spec: the batch (``track_gen.pipeline.presets.track(...)``).
            checkpoint_spacing: arc length between checkpoints (m).
            collision: ``"segments"``: out of bounds when the agent leaves the track.
            seeds: an int ``s`` (env ``e`` gets ``s + e``), ``[E]`` ints, or a ``PerEnvSeededRNG``.
            stream: a CUDA stream every call runs on by default (a call
                recorded in a capture on another stream must then pass
                ``stream=``, or it raises ``CaptureError``).

        Raises:
            CaptureError: called while the device is capturing a graph.
            TypeError, ValueError: a bad argument.
        """
        if not isinstance(spec, TrackSpec):
            raise TypeError(f"spec must be a TrackSpec, got {type(spec).__name__}")
        if collision != "segments":
            raise ValueError(f"collision must be 'segments' for tracks, got {collision!r}")
        _outside_capture(spec.device)
        _check_stream(stream, spec.device)
        with _on(stream):
            return cls._built(TrackGenerator(spec, seeds, checkpoint_spacing), collision, stream)

    @classmethod
    def gates(cls, spec: GateSpec, collision: str | float = 0.02,
              seeds: int | ArrayLike | PerEnvSeededRNG = 0, stream: wp.Stream | None = None) -> Course:
        """A batch of gate courses, generated at epoch 0.

        Args:
            spec: the batch (``track_gen.pipeline.presets.gates(...)``).
            collision: a post radius (m, > 0) for disc contacts, or ``"frames"``
                for frame contacts.
            seeds: as for ``Course.track``.
            stream: as for ``Course.track``.

        Raises:
            CaptureError: called while the device is capturing a graph.
            TypeError, ValueError: a bad argument.
        """
        if not isinstance(spec, GateSpec):
            raise TypeError(f"spec must be a GateSpec, got {type(spec).__name__}")
        if not (isinstance(collision, str) and collision == "frames"):
            try:
                collision = check_length("collision", collision)
            except ValueError as error:
                raise ValueError(f"{error} (a post radius in m, or 'frames')") from None
        _outside_capture(spec.device)
        _check_stream(stream, spec.device)
        with _on(stream):
            return cls._built(GateGenerator(spec, seeds), collision, stream)

    @classmethod
    def _built(cls, generator: TrackGenerator | GateGenerator, collision: str | float,
               stream: wp.Stream | None) -> Course:
        course = cls(generator, collision, stream)
        generator.generate(advance=False)
        course.reset()
        return course

    @property
    def result(self) -> TrackResult | GateResult:
        return self.generator.result

    @property
    def rng(self) -> PerEnvSeededRNG:
        return self.generator.rng

    @property
    def seeds(self) -> PerEnvSeededRNG:
        """Deprecated alias of ``rng``."""
        warnings.warn("Course.seeds is deprecated: use Course.rng", DeprecationWarning, stacklevel=2)
        return self.generator.rng

    @property
    def num_envs(self) -> int:
        return self.generator.num_envs

    def regenerate(self, mask: wp.array | None = None, advance: bool = True,
                   stream: wp.Stream | None = None) -> TrackResult | GateResult:
        """New courses for the masked envs (every env without a mask), their
        progress and localizer reset.

        Recorded into a CUDA capture, a masked call goes behind a conditional
        node that skips it on device when no env is masked (where the capture
        allows one: ``track_gen.exec``); outside a capture on cuda it replays
        the course's own CUDA graph, which skips the same way. On cpu every
        call (and every replay of a cpu capture) runs a full generation.

        Args:
            mask: ``[E]`` int32 on the course device, nonzero selects an env;
                checked on the host before anything launches. Recorded by pointer.
            advance: ``True``: the next epoch (a new course); ``False``: rebuild
                from the current (seed, epoch), the same course unless seeds were written.
            stream: the CUDA stream to run on (default: the course's stream,
                torch's capture stream inside ``torch.cuda.graph``, else Warp's current one).

        Raises:
            CaptureError: the call would run outside the capture it is made
                in, or a side stream forked in the capture is still open.
            TypeError, ValueError: a bad mask or stream (nothing runs).
        """
        if mask is not None:
            check_mask("mask", mask, self.num_envs, self.generator.device)
        run_on = self._stream_for(stream)
        with _on(run_on):
            if run_on is None:
                self._regenerate(mask, advance)
            elif run_on.is_capturing:
                _capture.note_recorded(run_on, self)
                self._record_regenerate(mask, advance, run_on, _capture.records_conditional(run_on)
                                        if mask is not None else False)
            else:
                wp.capture_launch(self._own_graph(mask, advance, run_on), stream=run_on)
        return self.result

    def _regenerate(self, mask: wp.array | None, advance: bool) -> None:
        self.generator._enqueue(bool(advance), mask)
        self._reset_progress(mask)

    def _record_regenerate(self, mask: wp.array | None, advance: bool, stream: wp.Stream,
                           conditional: bool) -> None:
        """Record a regeneration on the capturing ``stream``; ``conditional``:
        behind a node that skips it when no entry of ``mask`` is set."""
        if not conditional:
            self._regenerate(mask, advance)
            return
        capturing = _capture.warp_capture(stream)[0]
        wp.launch(ks.clear_flag, 1, outputs=[self._flag], stream=capturing)
        wp.launch(ks.raise_flag, self.num_envs, inputs=[mask], outputs=[self._flag], stream=capturing)
        wp.capture_if(self._flag, on_true=lambda: self._regenerate(mask, advance), stream=capturing)

    def _own_graph(self, mask: wp.array | None, advance: bool, stream: wp.Stream) -> wp.Graph:
        """The course's CUDA graph of a regeneration with this mask (by
        pointer), captured on first use; the last few are kept."""
        key = (0 if mask is None else mask.ptr, bool(advance), stream.cuda_stream)
        if key not in self._graphs:
            conditional = mask is not None and wp.is_conditional_graph_supported()
            wp.capture_begin(stream=stream)
            try:
                self._record_regenerate(mask, advance, stream, conditional)
            finally:
                graph = wp.capture_end(stream=stream)
            self._graphs[key] = (graph, mask)
            if len(self._graphs) > _OWN_GRAPHS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        return self._graphs[key][0]

    def reset(self, mask: wp.array | None = None, stream: wp.Stream | None = None) -> None:
        """Respawn the masked envs (every env without a mask) on the course they
        have: their progress and the localizer's memory restart, nothing else
        changes (an invalid env stays invalid).

        Args:
            mask: ``[E]`` int32 on the course device, nonzero selects an env;
                checked on the host before anything launches.
            stream: as for ``regenerate``.
        """
        if mask is not None:
            check_mask("mask", mask, self.num_envs, self.generator.device)
        run_on = self._stream_for(stream)
        _capture.note_recorded(run_on, self)
        with _on(run_on):
            self._reset_progress(mask)

    def bind(self, position: wp.array, orientation: wp.array, half_extents: wp.array) -> None:
        """Bind the agents' stable buffers (``Runtime.bind``): keep writing
        into the same arrays; a recorded ``step()`` reads the ones bound when
        it was recorded."""
        self.runtime.bind(position, orientation, half_extents)

    def step(self, stream: wp.Stream | None = None) -> StepResult:
        """Locate every agent on its course, test its box against the track (or
        the gates' posts and frames) and count its progress; returns the same
        ``StepResult`` arrays every call.

        An agent may move up to ``track_gen._kernels.step.WINDOW`` (32)
        course-line spacings (``WINDOW * ds`` at most) along the course line
        per step (the localizer searches that far around its last match).

        Args:
            stream: as for ``regenerate``.

        Raises:
            RuntimeError: no buffers bound (``bind`` first).
            CaptureError: the call would run outside the capture it is made in.
        """
        self.runtime.check_bound()
        run_on = self._stream_for(stream)
        _capture.note_recorded(run_on, self)
        with _on(run_on):
            return self.runtime.step()

    def _stream_for(self, stream: wp.Stream | None) -> wp.Stream | None:
        """The CUDA stream a call runs on (``None`` on cpu)."""
        device = self.generator.device
        _check_stream(stream, device)
        if device.is_cpu or stream is not None:
            return stream
        if self.stream is not None:
            if not self.stream.is_capturing and (device.is_capturing
                                                 or _capture.torch_capture_stream(device) is not None):
                raise CaptureError("this course runs on the stream it was built with, which is not the "
                                   "capturing one: pass stream=<the capturing stream> to every call you "
                                   "record, or the call would run outside your graph")
            return self.stream
        return _capture.torch_capture_stream(device) or device.stream

    def _reset_progress(self, mask: wp.array | None) -> None:
        self.runtime.reset(self.generator.everyone if mask is None else mask)

    def generate(self, seeds: int | ArrayLike) -> TrackResult | GateResult:
        """Reseed every env, zero every epoch and rebuild the batch: the same
        courses as a fresh ``Course`` built with ``seeds`` (host to device:
        not recordable).

        Raises:
            CaptureError: called while the device is capturing a graph.
        """
        _outside_capture(self.generator.device)
        with _on(self._stream_for(None)):
            self.generator.reseed(seeds)
            self._regenerate(None, advance=False)
        return self.result


#: How many of its own graphs (one per mask pointer and ``advance``) a course keeps.
_OWN_GRAPHS = 8


def _outside_capture(device: str | wp.context.Device) -> None:
    device = wp.get_device(device)
    if device.is_capturing or (device.is_cuda and _capture.torch_capture_stream(device) is not None):
        raise CaptureError("build and reseed courses outside a graph capture: they allocate and copy from the host")


def _check_stream(stream: object, device: str | wp.context.Device) -> None:
    if stream is None:
        return
    if not isinstance(stream, wp.Stream):
        raise TypeError(f"stream must be a wp.Stream, got {type(stream).__name__}")
    if stream.device != wp.get_device(device):
        raise ValueError(f"stream must be on the course device {wp.get_device(device)}, got {stream.device}")


def _on(stream: wp.Stream | None) -> contextlib.AbstractContextManager[object]:
    """Warp's current stream set to ``stream`` (without a cross-stream wait,
    which would fork a capture) for the launches of a call."""
    if stream is None or stream is stream.device.stream:
        return contextlib.nullcontext()
    return wp.ScopedStream(stream, sync_enter=False)
