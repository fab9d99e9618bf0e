"""Host-side checks of the masks that select envs."""

from __future__ import annotations

import warp as wp


def check_mask(name: str, mask: object, num_envs: int, device: wp.context.Device) -> wp.array:
    """``mask`` is a contiguous ``[num_envs]`` int32 Warp array on ``device``.

    Raises:
        TypeError: not a Warp array, or not int32.
        ValueError: wrong shape, device, or not contiguous.
    """
    if not isinstance(mask, wp.array):
        raise TypeError(f"{name} must be a warp array, got {type(mask).__name__}")
    if mask.dtype != wp.int32:
        raise TypeError(f"{name} must have dtype int32, got {wp.types.type_repr(mask.dtype)}")
    if mask.shape != (num_envs,):
        raise ValueError(f"{name} must have shape [{num_envs}], got {list(mask.shape)}")
    if mask.device != device:
        raise ValueError(f"{name} must be on the course device {device}, got {mask.device}")
    if not mask.is_contiguous:
        raise ValueError(f"{name} must be contiguous")
    return mask
