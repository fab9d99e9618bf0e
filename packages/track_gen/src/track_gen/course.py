"""The Course API: a batch of courses with masked regeneration.

``Course.track(spec, ...)`` and ``Course.gates(spec, ...)`` build a generator
and generate every env at epoch 0. ``course.regenerate(mask=..., advance=True)`` gives the masked envs
new courses and leaves every other env bit for bit; ``course.generate(seeds=...)``
reseeds every env and rebuilds the batch at epoch 0.
"""

from __future__ import annotations

import warp as wp
from numpy.typing import ArrayLike

from track_gen.errors import CaptureError
from track_gen.generator import GateGenerator, TrackGenerator
from track_gen.result import GateResult, TrackResult
from track_gen.seeds import PerEnvSeededRNG
from track_gen.spec import GateSpec, TrackSpec


class Course:
    """A batch of ``E`` courses on one Warp device.

    Attributes:
        generator: the generator (its ``params[...]`` are read by the next regeneration).
        inputs: stable zero-initialised ``[E]`` int32 masks, ``"regen_mask"``
            and ``"reset_mask"``: the library reads them and never clears them.
        rng: per-env seeds and epochs (``rng.seeds_warp``); ``seeds`` is the same object.
    """

    def __init__(self, generator: TrackGenerator | GateGenerator, collision: str | float):
        self.generator = generator
        self.collision = collision
        self.inputs = {"regen_mask": generator.inputs["regen_mask"],
                       "reset_mask": wp.zeros(generator.num_envs, dtype=wp.int32, device=generator.device)}

    @classmethod
    def track(cls, spec: TrackSpec, checkpoint_spacing: float = 0.6, collision: str = "segments",
              seeds: int | ArrayLike | PerEnvSeededRNG = 0) -> Course:
        """A batch of closed-loop tracks, generated at epoch 0.

        Args:
            spec: the batch (``track_gen.pipeline.presets.track(...)``).
            checkpoint_spacing: arc length between checkpoints (m).
            collision: ``"segments"``: out of bounds when the agent leaves the track.
            seeds: an int ``s`` (env ``e`` gets ``s + e``), ``[E]`` ints, or a ``PerEnvSeededRNG``.

        Raises:
            CaptureError: called while the device is capturing a graph.
            TypeError, ValueError: a bad argument.
        """
        if not isinstance(spec, TrackSpec):
            raise TypeError(f"spec must be a TrackSpec, got {type(spec).__name__}")
        if collision != "segments":
            raise ValueError(f"collision must be 'segments' for tracks, got {collision!r}")
        _outside_capture(spec.device)
        return cls._built(TrackGenerator(spec, seeds, checkpoint_spacing), collision)

    @classmethod
    def gates(cls, spec: GateSpec, collision: str | float = 0.02,
              seeds: int | ArrayLike | PerEnvSeededRNG = 0) -> Course:
        """A batch of gate courses, generated at epoch 0.

        Args:
            spec: the batch (``track_gen.pipeline.presets.gates(...)``).
            collision: a post radius (m, > 0) for disc contacts, or ``"frames"``
                for frame contacts.
            seeds: as for ``Course.track``.

        Raises:
            CaptureError: called while the device is capturing a graph.
            TypeError, ValueError: a bad argument.
        """
        if not isinstance(spec, GateSpec):
            raise TypeError(f"spec must be a GateSpec, got {type(spec).__name__}")
        if collision != "frames" and (isinstance(collision, (bool, str)) or not collision > 0):
            raise ValueError(f"collision must be a post radius > 0 or 'frames', got {collision!r}")
        _outside_capture(spec.device)
        return cls._built(GateGenerator(spec, seeds), collision)

    @classmethod
    def _built(cls, generator: TrackGenerator | GateGenerator, collision: str | float) -> Course:
        course = cls(generator, collision)
        generator.generate(advance=False)
        return course

    @property
    def result(self) -> TrackResult | GateResult:
        return self.generator.result

    @property
    def rng(self) -> PerEnvSeededRNG:
        return self.generator.rng

    @property
    def seeds(self) -> PerEnvSeededRNG:
        return self.generator.rng

    @property
    def num_envs(self) -> int:
        return self.generator.num_envs

    def regenerate(self, mask: wp.array | None = None, advance: bool = True) -> TrackResult | GateResult:
        """New courses for the masked envs (every env without a mask).

        Args:
            mask: ``[E]`` int32 on the course device, nonzero selects an env;
                checked on the host before anything launches.
            advance: ``True``: the next epoch (a new course); ``False``: rebuild
                from the current (seed, epoch), the same course unless seeds were written.
        """
        return self.generator.generate(advance=advance, mask=mask)

    def generate(self, seeds: int | ArrayLike) -> TrackResult | GateResult:
        """Reseed every env, zero every epoch and rebuild the batch: the same
        courses as a fresh ``Course`` built with ``seeds``."""
        self.generator.reseed(seeds)
        return self.generator.generate(advance=False)


def _outside_capture(device: str) -> None:
    if wp.get_device(device).is_capturing:
        raise CaptureError("build courses outside a graph capture: construction allocates")
