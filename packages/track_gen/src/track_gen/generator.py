"""Generators: seeds and params in, a result out, per env by mask.

Both course kinds start from a seeded closed spline (the centerline of a
track, or the line the gates stand on); ``_LoopGenerator`` holds that shared
part: seeds and epochs, dynamic params, the masks, the spline and its
arc-length table.
"""

from __future__ import annotations

import abc
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import warp as wp
from numpy.typing import ArrayLike

from track_gen._kernels import bakes, gates, loop, tracks
from track_gen.checks import PARAM_RANGES
from track_gen.masks import check_mask
from track_gen.result import GateResult, TrackResult
from track_gen.seeds import PerEnvSeededRNG, per_env_seeds
from track_gen.spec import GateSpec, TrackSpec, check_length, check_size

#: The dynamic per-env fields of the centerline, read by every regeneration.
LOOP_PARAMS = ("radius", "radius_jitter", "angle_jitter")


class Params(Mapping[str, wp.array]):
    """A generator's dynamic per-env fields: ``[E]`` float32 Warp arrays by
    name, written into (``params["width"].assign(values)``, or by a kernel)
    and never replaced, since every launch (and every recorded graph) reads
    the arrays the generator was built with."""

    def __init__(self, arrays: dict[str, wp.array]) -> None:
        self._arrays = arrays

    def __getitem__(self, name: str) -> wp.array:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __setitem__(self, name: str, value: object) -> None:
        self._known(name)
        raise TypeError(f"params[{name!r}] cannot be replaced, only written into: "
                        f"params[{name!r}].assign(values) with [E] float32 values")

    def __delitem__(self, name: str) -> None:
        self._known(name)
        raise TypeError(f"params[{name!r}] cannot be removed: every generation reads it")

    def _known(self, name: str) -> None:
        if name not in self._arrays:
            raise KeyError(f"no param {name!r}: the params are {', '.join(self._arrays)}")

    def __repr__(self) -> str:
        return f"Params({', '.join(self._arrays)})"


class _LoopGenerator(abc.ABC):
    """The seeded closed spline both course kinds are built on.

    Attributes:
        spec: the static specification.
        rng: per-env seeds and epochs.
        params: dynamic per-env fields (`Params`: ``[E]`` float32 Warp
            arrays by name); write into them to change what the next
            regeneration builds (curricula, domain randomisation).
        inputs: ``{"regen_mask": [E] int32}``, a stable zero-initialised mask.
        everyone: ``[E]`` int32 ones, the mask of a full generation.
        result: the course arrays, rewritten in place by each generation.
    """

    result: Any

    def __init__(self, spec: TrackSpec | GateSpec, seeds: int | ArrayLike | PerEnvSeededRNG,
                 params: tuple[str, ...]):
        self.spec = spec
        m = spec.n_control * spec.samples_per_segment
        own, largest = self._footprint()
        # Seeds, epochs, params, masks, control points, spline and arc table.
        check_size(spec, own + 16 + 4 * len(params) + 8 + 8 * spec.n_control + 12 * m + 4 + 16, max(largest, m + 1))
        device = wp.get_device(spec.device)
        self.device = device
        e = spec.num_envs
        if isinstance(seeds, PerEnvSeededRNG):
            if seeds.num_envs != e or seeds.device != device:
                raise ValueError(f"seeds must hold {e} envs on {device}, got {seeds.num_envs} on {seeds.device}")
            self.rng = seeds
        else:
            self.rng = PerEnvSeededRNG(seeds, e, device)
        self._params = Params({name: wp.full(e, float(getattr(spec, name)), dtype=wp.float32, device=device)
                               for name in params})
        self.inputs = {"regen_mask": wp.zeros(e, dtype=wp.int32, device=device)}
        self.everyone = wp.ones(e, dtype=wp.int32, device=device)
        self._ctrl = wp.zeros((e, spec.n_control), dtype=wp.vec2, device=device)
        self._dense = wp.zeros((e, m), dtype=wp.vec2, device=device)
        self._dense_points = wp.full(e, m, dtype=wp.int32, device=device)
        self._cum = wp.zeros((e, m + 1), dtype=wp.float32, device=device)
        self._truncated = wp.zeros(e, dtype=wp.int32, device=device)
        self._spacing = wp.zeros(e, dtype=wp.float32, device=device)
        self._bad_params = wp.zeros(e, dtype=wp.int32, device=device)
        self._tight = wp.zeros(e, dtype=wp.int32, device=device)

    @property
    def num_envs(self) -> int:
        return self.spec.num_envs

    @property
    def params(self) -> Params:
        return self._params

    @abc.abstractmethod
    def _footprint(self) -> tuple[int, int]:
        """(bytes per env of the subclass's arrays, elements per env of its
        largest array or launch), from ``self.spec`` before allocating."""

    def zeros(self, shape: int | tuple[int, ...], dtype: Any) -> wp.array:
        return wp.zeros(shape, dtype=dtype, device=self.device)

    def generate(self, mask: wp.array | None = None, *, advance: bool = True) -> Any:
        """Regenerate the masked envs (every env without a mask).

        Args:
            mask: ``[E]`` int32 on the course device; nonzero entries select
                envs. Read, never cleared. Unselected envs keep every array
                bit for bit; an all-zero mask changes nothing.
            advance: move the selected envs to their next epoch first (a new
                course); ``False`` rebuilds them from their current (seed, epoch).

        Returns:
            ``self.result``, updated in place.
        """
        self.enqueue(mask, advance=advance)
        return self.result

    def enqueue(self, mask: wp.array | None = None, *, advance: bool = True) -> None:
        """``generate`` without returning the result: launches only (records
        into a capture). ``mask`` is checked as in ``generate``.

        Raises:
            TypeError, ValueError: ``mask`` is not a contiguous ``[E]`` int32
                Warp array on the course device (nothing launched).
        """
        if mask is not None:
            check_mask("mask", mask, self.num_envs, self.device)
        self._enqueue(bool(advance), mask)

    def enqueue_generate(self, mask: wp.array | None = None, advance: bool = True) -> None:
        """Deprecated alias of ``enqueue(mask, advance=advance)``."""
        warnings.warn("enqueue_generate is deprecated: use enqueue(mask, advance=...)", DeprecationWarning,
                      stacklevel=2)
        self.enqueue(mask, advance=advance)

    @abc.abstractmethod
    def _enqueue(self, advance: bool, mask: wp.array | None) -> None:
        """The launches of a generation (``mask`` already checked)."""

    @property
    @abc.abstractmethod
    def progress_marks(self) -> wp.array:
        """``[E]`` int32: how many marks (checkpoints or gates) a lap has."""

    def reseed(self, seeds: int | ArrayLike) -> None:
        """Write new seeds for every env and zero every epoch (no generation)."""
        self.rng.seeds_warp.assign(per_env_seeds(seeds, self.num_envs))
        self.rng.reset_epoch()

    def _launch(self, kernel: Any, dim: int | tuple[int, ...], *, inputs: Sequence[Any],
                outputs: Sequence[Any] = ()) -> None:
        """Launch ``kernel`` on the course device: ``inputs``, its inputs then its
        in-out state; ``outputs``, what it only writes (``track_gen._kernels``)."""
        wp.launch(kernel, dim, inputs=inputs, outputs=outputs, device=self.device)

    def _check_params(self, active: wp.array) -> None:
        """Flag the active envs whose params are outside ``PARAM_RANGES``."""
        self._launch(loop.clear_where, self.num_envs, inputs=[active], outputs=[self._bad_params])
        for name, values in self.params.items():
            lowest, highest, lowest_allowed = PARAM_RANGES[name]
            self._launch(loop.check_param, self.num_envs,
                         inputs=[active, values, lowest, highest, int(lowest_allowed)], outputs=[self._bad_params])

    def _spline(self, active: wp.array, advance: bool, width: wp.array) -> None:
        """Epochs, control points, the spline (with its tight-curvature count
        against ``width``) and its arc-length table."""
        p, e = self.params, self.num_envs
        self._launch(loop.advance_epochs, e, inputs=[active, int(bool(advance)), self.rng.epochs])
        self._launch(loop.control_points, (e, self.spec.n_control),
                     inputs=[active, self.rng.seeds_warp, self.rng.epochs, p["radius"], p["radius_jitter"],
                             p["angle_jitter"]],
                     outputs=[self._ctrl])
        self._launch(loop.spline_samples, (e, self._dense.shape[1]),
                     inputs=[active, self._ctrl, self.spec.samples_per_segment, width, self._tight],
                     outputs=[self._dense])


class TrackGenerator(_LoopGenerator):
    """Generates, checks and bakes a batch of closed-loop tracks (params:
    ``radius``, ``radius_jitter``, ``angle_jitter``, ``width``, ``height_amplitude``)."""

    def __init__(self, spec: TrackSpec, seeds: int | ArrayLike | PerEnvSeededRNG = 0,
                 checkpoint_spacing: float = 0.6):
        self.checkpoint_spacing = check_length("checkpoint_spacing", checkpoint_spacing)
        super().__init__(spec, seeds, LOOP_PARAMS + ("width", "height_amplitude"))
        e, n, r = spec.num_envs, spec.n_max, spec.sdf_resolution
        self._crossings = self.zeros(e, wp.int32)
        self._too_close = self.zeros(e, wp.int32)
        chunks = (n + tracks.CHUNK - 1) // tracks.CHUNK
        self._chunk_lo = self.zeros((e, chunks), wp.vec2)
        self._chunk_hi = self.zeros((e, chunks), wp.vec2)
        self._phase = self.zeros(e, wp.vec2)
        capacity = self._checkpoint_capacity()
        z = self.zeros
        self.result = TrackResult(
            center=z((e, n), wp.vec3), count=z(e, wp.int32), arc=z((e, n), wp.float32),
            tangent=z((e, n), wp.vec3), normal=z((e, n), wp.vec3), left=z((e, n), wp.vec3),
            right=z((e, n), wp.vec3), length=z(e, wp.float32), width=z(e, wp.float32),
            checkpoints=z((e, capacity), wp.int32), num_checkpoints=z(e, wp.int32),
            sdf=z((e, r, r), wp.float32), sdf_origin=z(e, wp.vec2), sdf_cell=z(e, wp.float32),
            height=z((e, r, r), wp.float32), valid=z(e, wp.int32), fail_mask=z(e, wp.int32),
            generation=z(e, wp.int32), track_id=z(e, wp.uint32),
        )
        # The splat's fixed-point distances live in the SDF's own memory.
        self._sdf_steps = wp.array(ptr=self.result.sdf.ptr, shape=(e, r, r), dtype=wp.int32, device=self.device)

    def _checkpoint_capacity(self) -> int:
        return math.ceil(self.spec.n_max * self.spec.ds / self.checkpoint_spacing) + 1

    def _footprint(self) -> tuple[int, int]:
        n, r = self.spec.n_max, self.spec.sdf_resolution
        chunks = (n + tracks.CHUNK - 1) // tracks.CHUNK
        capacity = self._checkpoint_capacity()
        # Course line, frames and boundaries; checkpoints; SDF and height;
        # chunk boxes; per-env scalars.
        return 64 * n + 4 * capacity + 8 * r * r + 16 * chunks + 84, max(n, capacity, r * r)

    @property
    def progress_marks(self) -> wp.array:
        return self.result.num_checkpoints

    def _enqueue(self, advance: bool, mask: wp.array | None) -> None:
        active = self.everyone if mask is None else mask
        s, res, e, n = self.spec, self.result, self.num_envs, self.spec.n_max
        launch = self._launch
        launch(loop.copy_where, e, inputs=[active, self.params["width"]], outputs=[res.width])
        self._check_params(active)
        launch(tracks.reset_counts, e, inputs=[active], outputs=[self._crossings, self._too_close, self._tight])
        self._spline(active, advance, res.width)
        launch(loop.arc_lengths, e, inputs=[active, self._dense, self._dense_points, s.ds, n],
               outputs=[self._cum, res.length, res.count, self._spacing, self._truncated])
        launch(loop.resample, (e, n), inputs=[active, self._dense, self._dense_points, self._cum, res.count,
                                              self._spacing],
               outputs=[res.center, res.arc])
        launch(bakes.terrain_phases, e, inputs=[active, self.rng.seeds_warp, self.rng.epochs],
               outputs=[self._phase])
        launch(bakes.lift_course_line, (e, n), inputs=[active, res.count, self._phase,
                                                       self.params["height_amplitude"], s.height_wavelength,
                                                       res.center])
        launch(tracks.frames_and_boundaries, (e, n), inputs=[active, res.center, res.count, res.width],
               outputs=[res.tangent, res.normal, res.left, res.right])
        launch(tracks.boundary_checks, (e, n), inputs=[active, res.center, res.count, res.left, res.right,
                                                        self._tight])
        launch(tracks.chunk_bounds, (e, self._chunk_lo.shape[1]), inputs=[active, res.center, res.count],
               outputs=[self._chunk_lo, self._chunk_hi])
        launch(tracks.pair_checks, (e, n), inputs=[active, res.center, res.count, res.width, self._spacing,
                                                   self._chunk_lo, self._chunk_hi, self._crossings,
                                                   self._too_close])
        launch(tracks.loop_checks, e, inputs=[active, res.center, res.count, self._truncated, self._crossings,
                                              self._too_close, self._tight, self._bad_params, res.length,
                                              self.rng.seeds_warp, self.rng.epochs],
               outputs=[res.fail_mask, res.valid, res.generation, res.track_id])
        launch(bakes.checkpoint_indices, (e, res.checkpoints.shape[1]),
               inputs=[active, res.length, res.count, self.checkpoint_spacing, self._spacing],
               outputs=[res.checkpoints, res.num_checkpoints])
        launch(bakes.bake_bounds, e, inputs=[active, res.center, res.count, s.sdf_margin, s.sdf_resolution],
               outputs=[res.sdf_origin, res.sdf_cell])
        grid = (e * s.sdf_resolution * s.sdf_resolution,)
        launch(bakes.bake_grid, grid, inputs=[active, s.sdf_resolution, self._phase, self.params["height_amplitude"],
                                              s.height_wavelength, res.sdf_origin, res.sdf_cell],
               outputs=[res.height.reshape(grid), self._sdf_steps.reshape(grid)])
        launch(bakes.splat_sdf, (e, -(-n // bakes.SPLAT_SEGMENTS)),
               inputs=[active, res.center, res.count, res.width, res.sdf_origin, res.sdf_cell, self._sdf_steps])
        launch(bakes.finish_sdf, grid, inputs=[active, s.sdf_resolution, res.width, self._sdf_steps.reshape(grid)],
               outputs=[res.sdf.reshape(grid)])

class GateGenerator(_LoopGenerator):
    """Places and checks a batch of gate courses
    (params: ``radius``, ``radius_jitter``, ``angle_jitter``, ``gate_width``)."""

    def __init__(self, spec: GateSpec, seeds: int | ArrayLike | PerEnvSeededRNG = 0):
        super().__init__(spec, seeds, LOOP_PARAMS + ("gate_width",))
        e, g, n = spec.num_envs, spec.max_gates, spec.n_max
        self._gate_xy = self.zeros((e, g), wp.vec2)
        self._gate_cum = self.zeros((e, g + 1), wp.float32)
        self._line_truncated = self.zeros(e, wp.int32)
        z = self.zeros
        self.result = GateResult(
            num_gates=z(e, wp.int32), gate_center=z((e, g), wp.vec3), gate_normal=z((e, g), wp.vec3),
            posts=z((e, g, 2), wp.vec3), gate_width=z(e, wp.float32), gate_arc=z((e, g), wp.float32),
            center=z((e, n), wp.vec3),
            count=z(e, wp.int32), arc=z((e, n), wp.float32), length=z(e, wp.float32),
            valid=z(e, wp.int32), fail_mask=z(e, wp.int32), generation=z(e, wp.int32),
            track_id=z(e, wp.uint32),
        )

    def _footprint(self) -> tuple[int, int]:
        g, n = self.spec.max_gates, self.spec.n_max
        # Gates (centres, normals, posts, arcs, polyline, arc table); the
        # course line; per-env scalars.
        return 64 * g + 16 * n + 44, max(2 * g, n)

    @property
    def progress_marks(self) -> wp.array:
        return self.result.num_gates

    def _enqueue(self, advance: bool, mask: wp.array | None) -> None:
        active = self.everyone if mask is None else mask
        s, res, e, n = self.spec, self.result, self.num_envs, self.spec.n_max
        launch = self._launch
        launch(loop.copy_where, e, inputs=[active, self.params["gate_width"]], outputs=[res.gate_width])
        self._check_params(active)
        self._spline(active, advance, res.gate_width)
        launch(gates.gate_counts, e, inputs=[active, self.rng.seeds_warp, self.rng.epochs, s.min_gates, s.max_gates],
               outputs=[res.num_gates])
        launch(loop.arc_lengths, e, inputs=[active, self._dense, self._dense_points, s.ds, n],
               outputs=[self._cum, res.length, res.count, self._spacing, self._truncated])
        launch(gates.place_gates, (e, s.max_gates),
               inputs=[active, self._dense, self._dense_points, self._cum, res.num_gates, res.gate_width],
               outputs=[res.gate_center, res.gate_normal, res.posts, self._gate_xy])
        # The course line runs through the gate centres.
        launch(loop.arc_lengths, e, inputs=[active, self._gate_xy, res.num_gates, s.ds, n],
               outputs=[self._gate_cum, res.length, res.count, self._spacing, self._line_truncated])
        launch(loop.resample, (e, n), inputs=[active, self._gate_xy, res.num_gates, self._gate_cum, res.count,
                                              self._spacing],
               outputs=[res.center, res.arc])
        launch(gates.gate_arcs, (e, s.max_gates), inputs=[active, self._gate_cum, res.num_gates],
               outputs=[res.gate_arc])
        launch(gates.bar_checks, e, inputs=[active, res.posts, res.num_gates, self._line_truncated,
                                            self._bad_params, res.count, res.length,
                                            self.rng.seeds_warp, self.rng.epochs],
               outputs=[res.fail_mask, res.valid, res.generation, res.track_id])
