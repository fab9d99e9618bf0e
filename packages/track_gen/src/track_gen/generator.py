"""The track generator: seeds and params in, a ``TrackResult`` out, per env by mask."""

from __future__ import annotations

import math

import numpy as np
import warp as wp
from numpy.typing import ArrayLike

from track_gen._kernels import tracks as k
from track_gen.masks import check_mask
from track_gen.result import TrackResult
from track_gen.seeds import PerEnvSeededRNG
from track_gen.spec import TrackSpec

#: The generator's dynamic per-env fields, read by every regeneration.
PARAMS = ("radius", "radius_jitter", "angle_jitter", "width")


class TrackGenerator:
    """Generates, checks and bakes a batch of closed-loop tracks.

    Attributes:
        spec: the static specification.
        rng: per-env seeds and epochs.
        params: dynamic per-env fields (``[E]`` float32 Warp arrays: ``radius``,
            ``radius_jitter``, ``angle_jitter``, ``width``); write into them to
            change what the next regeneration builds (curricula, domain
            randomisation).
        inputs: ``{"regen_mask": [E] int32}``, a stable zero-initialised mask.
        result: the course arrays, rewritten in place by each generation.
    """

    def __init__(self, spec: TrackSpec, seeds: int | ArrayLike | PerEnvSeededRNG = 0,
                 checkpoint_spacing: float = 0.6):
        if not checkpoint_spacing > 0:
            raise ValueError(f"checkpoint_spacing must be > 0, got {checkpoint_spacing!r}")
        self.spec = spec
        self.checkpoint_spacing = float(checkpoint_spacing)
        device = wp.get_device(spec.device)
        self.device = device
        e, n, r = spec.num_envs, spec.n_max, spec.sdf_resolution
        if isinstance(seeds, PerEnvSeededRNG):
            if seeds.num_envs != e or seeds.device != device:
                raise ValueError(f"seeds must hold {e} envs on {device}, got {seeds.num_envs} on {seeds.device}")
            self.rng = seeds
        else:
            self.rng = PerEnvSeededRNG(seeds, e, device)
        self.params = {name: wp.full(e, float(getattr(spec, name)), dtype=wp.float32, device=device)
                       for name in PARAMS}
        self.inputs = {"regen_mask": wp.zeros(e, dtype=wp.int32, device=device)}
        self._everyone = wp.ones(e, dtype=wp.int32, device=device)
        m = spec.n_control * spec.samples_per_segment
        self._ctrl = wp.zeros((e, spec.n_control), dtype=wp.vec2, device=device)
        self._dense = wp.zeros((e, m), dtype=wp.vec2, device=device)
        self._cum = wp.zeros((e, m + 1), dtype=wp.float32, device=device)
        self._truncated = wp.zeros(e, dtype=wp.int32, device=device)
        self._crossings = wp.zeros(e, dtype=wp.int32, device=device)
        self._too_close = wp.zeros(e, dtype=wp.int32, device=device)
        self._tight = wp.zeros(e, dtype=wp.int32, device=device)
        chunks = (n + k.CHUNK - 1) // k.CHUNK
        self._chunk_lo = wp.zeros((e, chunks), dtype=wp.vec2, device=device)
        self._chunk_hi = wp.zeros((e, chunks), dtype=wp.vec2, device=device)
        capacity = math.ceil(n * spec.ds / self.checkpoint_spacing) + 1

        def line(dtype: type) -> wp.array:
            return wp.zeros((e, n), dtype=dtype, device=device)

        self.result = TrackResult(
            center=line(wp.vec3), count=wp.zeros(e, dtype=wp.int32, device=device),
            arc=line(wp.float32), tangent=line(wp.vec3), normal=line(wp.vec3),
            left=line(wp.vec3), right=line(wp.vec3),
            length=wp.zeros(e, dtype=wp.float32, device=device),
            width=wp.zeros(e, dtype=wp.float32, device=device),
            checkpoints=wp.zeros((e, capacity), dtype=wp.int32, device=device),
            num_checkpoints=wp.zeros(e, dtype=wp.int32, device=device),
            sdf=wp.zeros((e, r, r), dtype=wp.float32, device=device),
            sdf_origin=wp.zeros(e, dtype=wp.vec2, device=device),
            sdf_cell=wp.zeros(e, dtype=wp.float32, device=device),
            height=wp.zeros((e, r, r), dtype=wp.float32, device=device),
            valid=wp.zeros(e, dtype=wp.int32, device=device),
            fail_mask=wp.zeros(e, dtype=wp.int32, device=device),
            generation=wp.zeros(e, dtype=wp.int32, device=device),
        )

    @property
    def num_envs(self) -> int:
        return self.spec.num_envs

    def generate(self, advance: bool = True, mask: wp.array | None = None) -> TrackResult:
        """Regenerate the masked envs (every env without a mask).

        Args:
            advance: move the selected envs to their next epoch first (a new
                course); ``False`` rebuilds them from their current (seed, epoch).
            mask: ``[E]`` int32 on the course device; nonzero entries select
                envs. Read, never cleared. Unselected envs keep every array
                bit for bit; an all-zero mask changes nothing.

        Returns:
            ``self.result``, updated in place.
        """
        active = self._everyone if mask is None else check_mask("mask", mask, self.num_envs, self.device)
        self.enqueue(advance=advance, mask=active)
        return self.result

    def enqueue(self, advance: bool = True, mask: wp.array | None = None) -> None:
        """Launch a generation without the host-side checks of ``generate``
        (``mask`` must already be a valid ``[E]`` int32 array on the device)."""
        active = self._everyone if mask is None else mask
        s, res, p, d = self.spec, self.result, self.params, self.device
        e, n = s.num_envs, s.n_max
        launch = lambda kernel, dim, args: wp.launch(kernel, dim, args, device=d)  # noqa: E731
        launch(k.advance_epochs, e, [active, int(bool(advance)), self.rng.epochs])
        launch(k.control_points, (e, s.n_control),
               [active, self.rng.seeds_warp, self.rng.epochs, p["radius"], p["radius_jitter"],
                p["angle_jitter"], self._ctrl])
        launch(k.copy_where, e, [active, p["width"], res.width])
        launch(k.reset_counts, e, [active, self._crossings, self._too_close, self._tight])
        launch(k.spline_samples, (e, self._dense.shape[1]),
               [active, self._ctrl, s.samples_per_segment, res.width, self._dense, self._tight])
        launch(k.arc_lengths, e, [active, self._dense, s.ds, n, self._cum, res.length, res.count, self._truncated])
        launch(k.resample, (e, n), [active, self._dense, self._cum, res.count, s.ds, res.center, res.arc])
        launch(k.frames_and_boundaries, (e, n),
               [active, res.center, res.count, res.width, res.tangent, res.normal, res.left, res.right])
        launch(k.chunk_bounds, (e, self._chunk_lo.shape[1]),
               [active, res.center, res.count, self._chunk_lo, self._chunk_hi])
        launch(k.pair_checks, (e, n), [active, res.center, res.count, res.width, s.ds, self._chunk_lo,
                                       self._chunk_hi, self._crossings, self._too_close])
        launch(k.loop_checks, e, [active, res.center, res.count, self._truncated, self._crossings,
                                  self._too_close, self._tight, self.rng.epochs, res.fail_mask, res.valid,
                                  res.generation])
        launch(k.checkpoint_indices, (e, res.checkpoints.shape[1]),
               [active, res.length, res.count, self.checkpoint_spacing, s.ds, res.checkpoints,
                res.num_checkpoints])
        launch(k.bake_bounds, e, [active, res.center, res.count, s.sdf_margin, s.sdf_resolution,
                                  res.sdf_origin, res.sdf_cell])
        grid = (e, s.sdf_resolution, s.sdf_resolution)
        launch(k.fill_sdf, grid, [active, res.width, res.sdf])
        launch(k.splat_sdf, (e, n), [active, res.center, res.count, res.width, res.sdf_origin, res.sdf_cell,
                                     res.sdf])

    def reseed(self, seeds: int | ArrayLike) -> None:
        """Write new seeds for every env and zero every epoch (no generation)."""
        self.rng.seeds_warp.assign(np.asarray(PerEnvSeededRNG(seeds, self.num_envs, "cpu").seeds_warp.numpy()))
        self.rng.reset_epoch()
