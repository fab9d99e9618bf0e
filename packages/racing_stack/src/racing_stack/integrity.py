"""The trainer's zero-copy rollout checked, slot by slot, against the same
rollout collected through the host (`racing_stack.interop.HostCopy`).

Both rollouts start from one state (the env's snapshot, the observation,
the pending resets and the random generator) and use one policy, so on a
deterministic env every buffer must agree bit for bit: a slot that differs
is data read before it was written or after its buffer was reused.
"""

from __future__ import annotations

from typing import Any

import torch

from racing_stack.interop import HostCopy

__all__ = ["check_rollout", "mismatches"]


def check_rollout(trainer) -> dict[str, Any]:
    """Collect one rollout through the host, rewind, and collect it again
    through the trainer's own crossings; the trainer then stands where its
    own `collect` leaves it, as if it had run once.

    Args:
        trainer: a `racing_stack.ppo.Trainer`.

    Returns:
        `mismatches` of the trainer's rollout against the host's.
    """
    start = (trainer.env.snapshot(), trainer.obs, trainer.pending.clone(), trainer.generator.get_state())
    own = trainer.crossing
    trainer.crossing = HostCopy(trainer.device)
    try:
        trainer.collect()
    finally:
        trainer.crossing = own
    reference = _rollout(trainer)
    snapshot, trainer.obs, trainer.pending, generator = start
    trainer.env.restore(snapshot)
    trainer.generator.set_state(generator)
    trainer.collect()
    return mismatches(_rollout(trainer), reference)


def _rollout(trainer) -> dict[str, torch.Tensor]:
    """Copies of a collected rollout's buffers, [T, E, ...] each, with the
    value after the rollout as a [1, E] field."""
    return {**{k: v.clone() for k, v in trainer.buf.items()}, "last_value": trainer.last_value[None].clone()}


def mismatches(rollout: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Where two rollouts differ: a slot (step, world) of a field differs
    when any of its values differs (NaN equals NaN).

    Returns:
        ``slots``: the (step, world) slots where any field differs, plus
        the worlds whose value after the rollout differs;
        ``fields``: per field, its differing slots and its largest absolute
        difference.
    """
    fields, any_slot = {}, None
    for key, mine in rollout.items():
        theirs = reference[key]
        a, b = mine.double(), theirs.double()
        same = (a == b) | (a.isnan() & b.isnan())
        differ = ~same.reshape(*same.shape[:2], -1).all(-1)  # [T, E]
        gap = (a - b).abs().nan_to_num(nan=float("inf"))[~same]
        fields[key] = {"slots": int(differ.sum()), "max_abs_diff": float(gap.max()) if gap.numel() else 0.0}
        if key != "last_value":
            any_slot = differ if any_slot is None else any_slot | differ
    return {"slots": int(any_slot.sum()) + fields["last_value"]["slots"], "fields": fields}
