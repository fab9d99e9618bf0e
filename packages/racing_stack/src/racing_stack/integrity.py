"""The trainer's zero-copy rollout checked, slot by slot, against the same
rollout collected through the host (`racing_stack.interop.HostCopy`).

`check_rollout`: both rollouts start from one state (the env's snapshot,
the observation, the pending resets and the random generator) and use one
policy, so on a deterministic env (the CPU) every buffer must agree bit
for bit. `tapped`: each crossing's written and read bytes compared, which
needs no determinism (the check on a GPU).
`stressed` injects delays on both sides of every crossing, which widens
any such race from microseconds to milliseconds (on CUDA).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from racing_stack.interop import Handover, HostCopy

__all__ = ["check_rollout", "jax_busy", "mismatches", "stressed", "tapped", "torch_sleep_cycles_per_us"]


def check_rollout(trainer) -> dict[str, Any]:
    """Collect one rollout through the trainer's own crossings (when and as
    its training loop would), rewind, and collect it again through the
    host. A bitwise check only where the env is deterministic from a
    snapshot (the CPU); on an H200 two rollouts from one state differ by
    rounding that grows with the steps, so there `tapped` is the check.
    The trainer then stands where the host rollout left it: its buffers
    hold the reference, which is what its own rollout gave when the two
    agree.

    Args:
        trainer: a `racing_stack.ppo.Trainer`.

    Returns:
        `mismatches` of the trainer's rollout against the host's, and
        ``rollout``: the trainer's own rollout (its buffers, [T, E, ...]).
    """
    rollout = trainer.rollout
    start = (trainer.env.snapshot(), rollout.state(), rollout.obs, trainer.generator.get_state())
    trainer.collect()
    own = _rollout(trainer)
    snapshot, state, obs, generator = start
    trainer.env.restore(snapshot)
    rollout.restore(state, obs)
    trainer.generator.set_state(generator)
    crossing = trainer.crossing
    trainer.crossing = HostCopy(trainer.device)
    try:
        trainer.collect()
    finally:
        trainer.crossing = crossing
    return {**mismatches(own, _rollout(trainer)), "rollout": own}


def _rollout(trainer) -> dict[str, torch.Tensor]:
    """Copies of a collected rollout's buffers, [T, E, ...] each, with the
    value after the rollout as a [1, E] field."""
    return {**{k: v.clone() for k, v in trainer.buf.items()}, "last_value": trainer.rollout.last_value[None].clone()}


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


def stressed(base: type[Handover], sleep_cycles: int, busy: Callable[[], Any] | None) -> type[Handover]:
    """``base`` with delays injected: Torch's stream sleeps ``sleep_cycles``
    after each view of a JAX array is made, and ``busy`` (a JAX call)
    occupies JAX's stream before each action crosses to JAX."""

    class Stressed(base):
        def to_torch(self, array: jax.Array) -> torch.Tensor:
            view = super().to_torch(array)
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            return view

        def to_jax(self, tensor: torch.Tensor) -> jax.Array:
            if busy is not None:
                busy()
            return super().to_jax(tensor)

    return Stressed


def torch_sleep_cycles_per_us() -> float:
    """GPU clock cycles per microsecond of `torch.cuda._sleep`, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1e3)


def jax_busy(milliseconds: float) -> tuple[Callable[[], jax.Array], float]:
    """A JAX call of about ``milliseconds`` on JAX's stream (one executable
    of chained matrix products; its result dropped, so nothing waits for
    it on the host), and its measured time (ms)."""
    x = jnp.full((2048, 2048), 1e-3, jnp.float32)

    def chain(n: int) -> Callable[[], jax.Array]:
        def body(a: jax.Array) -> jax.Array:
            b = a
            for _ in range(n):
                b = jnp.tanh(b @ a)
            return b
        call = jax.jit(body)
        jax.block_until_ready(call(x))  # compiled
        return lambda: call(x)

    def timed(call: Callable[[], jax.Array]) -> float:
        start = time.perf_counter()
        for _ in range(5):
            out = call()
        jax.block_until_ready(out)
        return (time.perf_counter() - start) / 5 * 1e3

    per = timed(chain(8)) / 8
    busy = chain(max(1, min(256, round(milliseconds / per))))
    return busy, timed(busy)


def tapped(base: type[Handover]) -> type[Handover]:
    """``base`` with every crossing recorded on both sides: a copy of what
    the producer wrote, made on the producer's own stream (its framework
    orders it after the write and keeps the source alive for it), and a
    copy of what the consumer read, made on the consumer's stream at its
    read. `compare` then holds each pair bit for bit: any difference is a
    crossing that delivered other bytes than were written. The copies are
    new buffers; the crossings' own buffers live exactly as ``base`` lets
    them."""

    class Tapped(base):
        def __init__(self, device: torch.device | str) -> None:
            super().__init__(device)
            self.pairs: list[tuple[str, Any, Any]] = []

        def to_torch(self, array: jax.Array) -> torch.Tensor:
            written = jnp.copy(array)
            view = super().to_torch(array)
            self.pairs.append(("to_torch", written, view.clone()))
            return view

        def to_jax(self, tensor: torch.Tensor) -> jax.Array:
            written = tensor.detach().clone()
            view = super().to_jax(tensor)
            self.pairs.append(("to_jax", jnp.copy(view), written))
            return view

        def compare(self) -> dict[str, int]:
            """Wait for the device, compare every recorded pair, forget them.

            Returns:
                ``crossings`` compared, ``mismatched_crossings`` and
                ``mismatched_bytes``.
            """
            jax.block_until_ready([jax_side for _, jax_side, _ in self.pairs])
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            crossings = mismatched = wrong = 0
            for _, jax_side, torch_side in self.pairs:
                a = np.asarray(jax_side).reshape(-1).view(np.uint8)
                b = torch_side.cpu().numpy().reshape(-1).view(np.uint8)
                differ = int(np.count_nonzero(a != b)) if a.shape == b.shape else max(a.size, b.size)
                crossings += 1
                mismatched += bool(differ)
                wrong += differ
            self.pairs.clear()
            return {"crossings": crossings, "mismatched_crossings": mismatched, "mismatched_bytes": wrong}

    return Tapped
