"""Course specifications: the static shape of a generator and its defaults.

Units: metres, at small-robot scale (an agent box of 4 x 2 cm, gates of
10 cm): a default track's lap is about 10 m, its width 0.3 m.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os

import warp as wp

from track_gen.checks import PARAM_RANGES


def _check_fields(spec: object, ints: dict[str, int], positive: tuple[str, ...],
                  non_negative: tuple[str, ...]) -> None:
    """Ints (NumPy's too) at least their bound; real lengths in float32's
    safe range: positive ones in ``[MIN_LENGTH, MAX_LENGTH]``, non-negative
    ones 0 or in that range; the param defaults inside `PARAM_RANGES`; a
    device name Warp knows. Else ``ValueError`` naming the field."""
    for name, least in ints.items():
        value = getattr(spec, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    for name in positive + non_negative:
        check_length(name, getattr(spec, name), zero_allowed=name in non_negative)
    for name, (lowest, highest, lowest_allowed) in PARAM_RANGES.items():
        if hasattr(spec, name):
            value = getattr(spec, name)
            if not (value < highest and (value > lowest or (lowest_allowed and value == lowest))):
                bound = "[" if lowest_allowed else "("
                raise ValueError(f"{name} must be in {bound}{lowest:g}, {highest:g}), got {value!r}")
    # NumPy scalars pass as numbers and are stored as Python ones.
    for name in ints:
        object.__setattr__(spec, name, int(getattr(spec, name)))
    for name in positive + non_negative:
        object.__setattr__(spec, name, float(getattr(spec, name)))
    device = getattr(spec, "device")
    if not isinstance(device, str):
        raise ValueError(f"device must be a Warp device name such as 'cpu' or 'cuda:0', got {device!r}")
    wp.get_device(device)  # raises for an unknown device


#: The shortest and longest length (m) of a spec field: float32 keeps every
#: product of the generator finite and normal inside this range.
MIN_LENGTH = 1e-6
MAX_LENGTH = 1e6
#: Most gates per course (the bar check is quadratic in them).
MAX_GATES = 1024


def check_length(name: str, value: object, zero_allowed: bool = False) -> float:
    """``value`` as a float: a finite real (NumPy's too) in ``[MIN_LENGTH,
    MAX_LENGTH]``, or 0 when ``zero_allowed``. Else ``ValueError`` naming
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not (value <= MAX_LENGTH and (value >= MIN_LENGTH or (zero_allowed and value == 0))):
        zero = "0 or " if zero_allowed else ""
        raise ValueError(f"{name} must be {zero}in [{MIN_LENGTH:g}, {MAX_LENGTH:g}], got {value!r}")
    return float(value)


#: Warp indexes arrays and launches with 32-bit ints.
_MAX_ELEMENTS = 2**31 - 1


def check_size(spec: LoopSpec, bytes_per_env: int, largest_per_env: int) -> None:
    """Refuse a batch Warp cannot index or the device cannot hold, before
    anything is allocated.

    Args:
        spec: the specification.
        bytes_per_env: the generator's memory per env (bytes).
        largest_per_env: elements per env of its largest array or launch.

    Raises:
        ValueError: naming ``num_envs`` and the sizes.
    """
    e = spec.num_envs
    if e * largest_per_env > _MAX_ELEMENTS:
        raise ValueError(f"num_envs={e} with {largest_per_env} elements per env exceeds Warp's 2**31 - 1 "
                         f"array elements; lower num_envs or the per-env sizes")
    device = wp.get_device(spec.device)
    if device.is_cuda:
        available = device.total_memory
    else:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    needed = e * bytes_per_env
    if needed > available:
        raise ValueError(f"num_envs={e} needs {needed / 2**30:.1f} GiB ({bytes_per_env} bytes per env) on "
                         f"{device}, which has {available / 2**30:.1f} GiB")


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """The fields both course kinds share: the batch and the seeded closed
    spline every course stands on. Every field but ``num_envs`` is
    keyword-only.

    Static fields fix the array shapes; ``radius``, ``radius_jitter`` and
    ``angle_jitter`` are the defaults of the generator's dynamic per-env
    ``params`` (which a curriculum may change between regenerations).

    Attributes:
        num_envs: ``E``, envs in the batch.
        device: Warp device, ``"cpu"`` or ``"cuda:N"``.
        n_control: ``K``, control points of the closed spline.
        samples_per_segment: spline samples per control segment (arc-length table).
        ds: the course line's largest spacing (m): ``ceil(L / ds)`` points.
        n_max: ``N_max``, course-line capacity (points).
        radius: mean control-point radius (m).
        radius_jitter: control radii vary by up to this fraction.
        angle_jitter: control angles vary by up to this fraction of a step.
    """

    num_envs: int
    _: dataclasses.KW_ONLY
    device: str = "cpu"
    n_control: int = 8
    samples_per_segment: int = 32
    ds: float = 0.05
    n_max: int = 512
    radius: float = 1.5
    radius_jitter: float = 0.25
    angle_jitter: float = 0.3

    #: Int fields and their least values, positive and non-negative reals.
    _INTS = dict(num_envs=1, n_control=3, samples_per_segment=1, n_max=1)
    _POSITIVE = ("ds", "radius")
    _NON_NEGATIVE = ("radius_jitter", "angle_jitter")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrackSpec(LoopSpec):
    """A batch of closed-loop tracks: the ``LoopSpec`` fields, and

    Attributes:
        sdf_resolution: bake grid cells per side.
        sdf_margin: bake grid margin around the course line (m).
        width: track width (m); default of the dynamic ``width`` param.
        height_amplitude: terrain amplitude (m), 0 is flat; default of the
            dynamic ``height_amplitude`` param.
        height_wavelength: terrain wavelength (m).
    """

    sdf_resolution: int = 64
    sdf_margin: float = 0.5
    width: float = 0.3
    height_amplitude: float = 0.0
    height_wavelength: float = 3.0

    def __post_init__(self) -> None:
        _check_fields(self, {**self._INTS, "sdf_resolution": 1}, self._POSITIVE + ("width", "height_wavelength"),
                      self._NON_NEGATIVE + ("sdf_margin", "height_amplitude"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateSpec(LoopSpec):
    """A batch of gate courses, gates along a seeded closed centerline (the
    course line runs through the gate centres): the ``LoopSpec`` fields, and

    Attributes:
        min_gates, max_gates: each env's gate count is uniform in this range.
        gate_width: distance between a gate's two posts (m), > 0; default of
            the dynamic ``gate_width`` param.
    """

    min_gates: int = 8
    max_gates: int = 16
    gate_width: float = 0.1

    def __post_init__(self) -> None:
        _check_fields(self, {**self._INTS, "min_gates": 3, "max_gates": 3}, self._POSITIVE + ("gate_width",),
                      self._NON_NEGATIVE)
        if self.max_gates > MAX_GATES:
            raise ValueError(f"max_gates must be <= {MAX_GATES}, got {self.max_gates}")
        if self.max_gates < self.min_gates:
            raise ValueError(f"max_gates must be >= min_gates, got {self.max_gates} < {self.min_gates}")
