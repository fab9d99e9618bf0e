"""Seeds and epochs: what decides each env's course.

Env ``e``'s course is a function of its seed, its epoch and the generator's
parameters. Epoch 0 uses the seed as is; any other epoch uses a 32-bit hash
of the pair, ``effective_seed(seed, epoch)``, so a course of any episode can
be rebuilt in a fresh course, as env 0 at epoch 0::

    Course.track(spec, seeds=effective_seed(seed_e, epoch_e))

``seeds=`` may be an int ``s`` (env ``e`` gets ``(s + e) mod 2**32``), an
array of per-env seeds, or a ``PerEnvSeededRNG`` that owns them on the device.
"""

from __future__ import annotations

import numpy as np
import warp as wp
from numpy.typing import ArrayLike

#: Seeds are unsigned 32-bit integers.
SEED_MODULUS = 2**32
_GOLDEN = 0x9E3779B9
_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35
_MASK = SEED_MODULUS - 1


def _fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser (a bijection on 32-bit integers)."""
    h ^= h >> 16
    h = (h * _M1) & _MASK
    h ^= h >> 13
    h = (h * _M2) & _MASK
    h ^= h >> 16
    return h


def effective_seed(seed: int, epoch: int) -> int:
    """The seed that builds env ``e``'s course at ``(seed, epoch)`` at epoch 0.

    Args:
        seed: the env's seed, in ``[0, 2**32)``.
        epoch: the env's epoch, ``>= 0``.

    Returns:
        ``seed`` itself at epoch 0, else a 32-bit hash of ``(seed, epoch)``.

    Raises:
        TypeError: ``seed`` or ``epoch`` is not an int.
        ValueError: ``seed`` is outside ``[0, 2**32)`` or ``epoch`` is negative.
    """
    for name, value in (("seed", seed), ("epoch", epoch)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= seed < SEED_MODULUS:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    if epoch == 0:
        return int(seed)
    return _fmix32(int(seed) ^ _fmix32((int(epoch) * _M1 + _GOLDEN) & _MASK))


_M1_WP = wp.constant(wp.uint32(_M1))
_M2_WP = wp.constant(wp.uint32(_M2))
_GOLDEN_WP = wp.constant(wp.uint32(_GOLDEN))


@wp.func
def fmix32(h: wp.uint32) -> wp.uint32:
    h = h ^ (h >> wp.uint32(16))
    h = h * _M1_WP
    h = h ^ (h >> wp.uint32(13))
    h = h * _M2_WP
    h = h ^ (h >> wp.uint32(16))
    return h


@wp.func
def effective_seed_wp(seed: wp.uint32, epoch: wp.int32) -> wp.uint32:
    """``effective_seed`` inside Warp kernels (the same bits)."""
    if epoch == 0:
        return seed
    mixed = wp.uint32(epoch) * _M1_WP + _GOLDEN_WP
    return fmix32(seed ^ fmix32(mixed))


def per_env_seeds(seeds: int | ArrayLike, num_envs: int) -> np.ndarray:
    """Per-env seeds ``[num_envs]`` uint32 from an int or an array.

    An int ``s`` gives env ``e`` the seed ``(s + e) mod 2**32``; an array must
    hold ``num_envs`` integers in ``[0, 2**32)``.

    Raises:
        TypeError: ``seeds`` is neither an int nor an integer array.
        ValueError: wrong length, or a seed out of range.
    """
    if isinstance(seeds, bool):
        raise TypeError("seeds must be an int or an array of ints, got bool")
    if isinstance(seeds, (int, np.integer)):
        if not 0 <= seeds < SEED_MODULUS:
            raise ValueError(f"seeds must be in [0, 2**32), got {seeds}")
        return ((int(seeds) + np.arange(num_envs, dtype=np.uint64)) % SEED_MODULUS).astype(np.uint32)
    array = np.asarray(seeds)
    if array.dtype.kind not in "iu":
        raise TypeError(f"seeds must be an int or an array of ints, got dtype {array.dtype}")
    if array.shape != (num_envs,):
        raise ValueError(f"seeds must have shape [{num_envs}], got {list(array.shape)}")
    if array.size and (array.min() < 0 or array.max() >= SEED_MODULUS):
        raise ValueError("seeds must be in [0, 2**32)")
    return array.astype(np.uint32)


class PerEnvSeededRNG:
    """Per-env seeds and epochs on a Warp device.

    ``seeds`` as a Warp array is used by reference: it must be a contiguous
    ``[E]`` uint32 array on ``device``, and becomes ``seeds_warp``, so what
    you write into it later takes effect at the next regeneration that
    selects an env. An int or any other array (NumPy, a list, a tensor) is
    copied here: writing into it later changes nothing; write into
    ``seeds_warp`` instead.

    Attributes:
        seeds_warp: ``[E]`` uint32 seeds; write into it to choose seeds (they
            take effect at the next regeneration that selects an env).
        epochs: ``[E]`` int32 epochs of the next regeneration.
    """

    def __init__(self, seeds: int | ArrayLike | wp.array, num_envs: int,
                 device: str | wp.context.Device = "cpu"):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        self.num_envs = num_envs
        self.device = wp.get_device(device)
        if isinstance(seeds, wp.array):
            self.seeds_warp = _shared_seeds(seeds, num_envs, self.device)
        else:
            values = per_env_seeds(seeds, num_envs)
            self.seeds_warp = wp.array(values, dtype=wp.uint32, device=self.device)
        self.epochs = wp.zeros(num_envs, dtype=wp.int32, device=self.device)

    def reset_epoch(self) -> None:
        """Zero every env's epoch."""
        self.epochs.zero_()

    def effective_seeds(self) -> np.ndarray:
        """``effective_seed(seed_e, epoch_e)`` for every env, ``[E]`` uint32 (host)."""
        return np.array([effective_seed(int(s), int(e)) for s, e in
                         zip(self.seeds_warp.numpy(), self.epochs.numpy())], dtype=np.uint32)


def _shared_seeds(seeds: wp.array, num_envs: int, device: wp.context.Device) -> wp.array:
    """A Warp seed array fit to be used by reference, or the reason not."""
    if seeds.dtype != wp.uint32:
        raise TypeError(f"seeds as a warp array must have dtype uint32 (it is used by reference), "
                        f"got {wp.types.type_repr(seeds.dtype)}")
    if seeds.shape != (num_envs,):
        raise ValueError(f"seeds must have shape [{num_envs}], got {list(seeds.shape)}")
    if seeds.device != device:
        raise ValueError(f"seeds as a warp array must be on the course device {device} (it is used by "
                         f"reference), got {seeds.device}; pass a NumPy array to copy it")
    if not seeds.is_contiguous:
        raise ValueError("seeds must be contiguous")
    return seeds
