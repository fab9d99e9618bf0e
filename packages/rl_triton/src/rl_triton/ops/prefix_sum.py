"""Episodic prefix sums: cumulative sums that restart at episode boundaries."""

from __future__ import annotations

import torch

from rl_triton import _checks, reference
from rl_triton._launch import PATH_REFERENCE, on_reference, select_path
from rl_triton.ops.returns import forward_inputs, forward_scan


def compute_episodic_prefix_sum(
    inputs: torch.Tensor,
    dones: torch.Tensor,
    seed_values: torch.Tensor | None = None,
    boundary: str = "ends_at",
) -> torch.Tensor:
    """Cumulative sum that restarts at episode (or segment) boundaries.

    ``boundary="ends_at"`` (default; the convention of every other op):
    ``done[t] = 1`` means the segment ends at ``t`` and the restart lands at ``t+1``:

    ```text
    C[t] = x[t] + (1 - done[t-1]) C[t-1],   C[-1] = seed,  done[-1] := 0
    ```

    ``boundary="starts_at"`` (sequence packing: a flag marks a segment's first
    element): the restart lands at ``t`` itself:

    ```text
    C[t] = x[t] + (1 - done[t]) C[t-1],     C[-1] = seed
    ```

    Never pre-shift ``dones`` yourself. No length limit.

    Args:
        inputs: values to accumulate, ``[E, T]``.
        dones: boundary flags, ``[E, T]``, nonzero = flagged.
        seed_values: initial carry ``C[-1]`` per env, ``[E]``; zeros when ``None``.
        boundary: ``"ends_at"`` or ``"starts_at"``.

    Returns:
        Prefix sums ``C``, ``[E, T]`` float32.

    Raises:
        TypeError: an argument has the wrong type or dtype.
        ValueError: shapes, devices or ``boundary`` are inconsistent.
    """
    _checks.sequence("inputs", inputs)
    boundary = _checks.boundary_mode(boundary)
    inputs, dones, seed_values = forward_inputs("inputs", inputs, dones, seed_values)
    if select_path(inputs.device) == PATH_REFERENCE:
        return on_reference(reference.episodic_prefix_sum, inputs.device, inputs, dones,
                            seed_values, boundary)
    return forward_scan(inputs, dones, seed_values, 1.0, shift=int(boundary == "ends_at"))
