"""The trainer's guard: every update's data checked on the device, read
once with the update's other statistics.

Each guarded field is reduced on the device to two numbers, the count of
its values outside their bounds (a NaN or an infinity is always outside)
and its worst value (the first non-finite one, else the one furthest
outside), so an update's whole check is one small tensor that the host
reads once, at the end of the update, where it already waits for the
update's losses: no host wait per step.
"""

from __future__ import annotations

import math

import torch

__all__ = ["GuardError", "Violation", "check", "violations"]


class GuardError(RuntimeError):
    """An update produced values that the env, the reward wrapper and the
    networks cannot produce when the data is sound: the run stops, and its
    last checkpoint is its last good state."""


class Violation:
    """One field's bounds, for `violations`.

    Args:
        name: the field's name, as the error says it.
        values: the field's values (any shape; a list of tensors is one field).
        low, high: the bounds (inclusive; infinite for a finiteness check).
    """

    def __init__(self, name: str, values: torch.Tensor | list[torch.Tensor], low: float = -math.inf,
                 high: float = math.inf) -> None:
        self.name, self.low, self.high = name, float(low), float(high)
        parts = values if isinstance(values, list) else [values]
        self.values = torch.cat([p.detach().reshape(-1).float() for p in parts])


def violations(fields: list[Violation]) -> torch.Tensor:
    """float32 [F, 2] on the fields' device: per field, the count of values
    outside [low, high] or not finite, and the worst value (0 when none)."""
    rows = []
    for field in fields:
        x = field.values
        finite = torch.isfinite(x)
        outside = torch.maximum(field.low - x, x - field.high)  # > 0 outside the bounds
        score = torch.where(finite, outside, torch.full_like(x, math.inf))
        bad = ~finite | (outside > 0)
        worst = x[torch.argmax(score)] if x.numel() else x.new_zeros(())
        rows.append(torch.stack([bad.sum().float(), torch.where(bad.any(), worst, 0.0)]))
    return torch.stack(rows)


def check(fields: list[Violation], read: list[list[float]], update: int, last_good: str, processes: int = 1) -> None:
    """Raise for the first field of ``read`` (`violations`'s rows, read on
    the host) with values outside its bounds.

    Args:
        update: the update that produced them (1-based).
        last_good: what the caller can resume from, for the message.
        processes: how many processes' fields ``read`` counts (each
            holding as many values as ``fields``).

    Raises:
        GuardError: naming the update, the field, the count, the bounds
            and the worst value.
    """
    for field, (count, worst) in zip(fields, read):
        if count:
            bounds = "finite" if math.isinf(field.low) and math.isinf(field.high) else \
                f"in [{field.low:.6g}, {field.high:.6g}]"
            raise GuardError(f"update {update}: {int(count)} of {field.values.numel() * processes} {field.name} "
                             f"values are not {bounds}; the worst is {worst!r}. The run stopped; {last_good}.")
