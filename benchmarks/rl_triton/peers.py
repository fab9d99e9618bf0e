"""The peers each op is compared with in the same run: a PyTorch Python loop and
``jax.lax.associative_scan``, both over the op's affine recurrence
``y[t] = a[t] + b[t] y[t∓1]`` with the same prologue and epilogue as ours.

``coefficients`` and ``finish`` are written once against an array namespace
(``torch`` or ``jax.numpy``), so both peers compute the same function.
"""

from __future__ import annotations

from typing import Any

from cases import GAMMA, LAM

BACKWARD = ("gae", "vtrace", "retrace", "lambda_returns", "discounted_returns")


def _concat(xp: Any, parts: list[Any]) -> Any:
    return xp.concatenate(parts, axis=1)


def _next(xp: Any, y: Any, fill: Any) -> Any:
    """``y[:, t+1]`` with ``fill`` ([E]) past the end."""
    return _concat(xp, [y[:, 1:], fill[:, None]])


def _prev(xp: Any, y: Any) -> Any:
    """``y[:, t-1]`` with 0 before the start."""
    return _concat(xp, [0 * y[:, :1], y[:, :-1]])


def _taken(xp: Any, probs: Any, actions: Any) -> Any:
    if xp.__name__ == "torch":
        return probs.gather(2, actions[..., None])[..., 0]
    return xp.take_along_axis(probs, actions[..., None], axis=2)[..., 0]


def coefficients(xp: Any, op: str, x: dict[str, Any]) -> tuple[Any, Any]:
    """``(a, b)`` of the op's recurrence, each ``[E, T]``."""
    if op in ("gae", "vtrace"):
        keep = 1 - x["terminateds"]
        v_next = _next(xp, x["values"], x["last_value"])
        step = x["rewards"] + GAMMA * keep * v_next - x["values"]
        if op == "gae":
            return step, GAMMA * LAM * keep
        ratio = xp.exp(x["log_pi_target"] - x["log_pi_behavior"])
        return xp.clip(ratio, max=1.0) * step, GAMMA * xp.clip(ratio, max=1.0) * keep
    if op == "retrace":
        keep = 1 - x["terminateds"]
        pi = _taken(xp, x["action_probs_target"], x["actions"])
        c = LAM * xp.clip(pi / x["action_probs_behavior"], max=1.0)
        expected = (x["action_probs_target"] * x["next_q_values_all"]).sum(-1)
        a = x["rewards"] + GAMMA * expected * keep - x["q_values"]
        return a, GAMMA * _next(xp, c, 0 * c[:, 0]) * keep
    if op == "lambda_returns":
        keep = 1 - x["terminateds"]
        return x["rewards"] + GAMMA * keep * (1 - LAM) * x["next_values"], GAMMA * LAM * keep
    if op == "discounted_returns":
        return x["rewards"], GAMMA * (1 - x["terminateds"])
    decay = GAMMA * LAM if op == "eligibility_traces" else 1.0
    return x["x"], decay * (1 - _prev(xp, x["dones"]))


def finish(xp: Any, op: str, x: dict[str, Any], y: Any) -> Any:
    """The op's outputs from the scanned ``y``."""
    if op == "vtrace":
        keep = 1 - x["terminateds"]
        rho = xp.clip(xp.exp(x["log_pi_target"] - x["log_pi_behavior"]), max=1.0)
        vs = y + x["values"]
        next_vs = _next(xp, vs, x["last_value"])
        return vs, rho * (x["rewards"] + GAMMA * next_vs * keep - x["values"])
    if op == "retrace":
        keep = 1 - x["terminateds"]
        pi = _taken(xp, x["action_probs_target"], x["actions"])
        rho = xp.clip(pi / x["action_probs_behavior"], max=1.0)
        q_ret = x["q_values"] + y
        q_ret_next = _next(xp, q_ret, 0 * q_ret[:, 0])
        return q_ret, rho * (x["rewards"] + GAMMA * q_ret_next * keep - x["q_values"])
    return y


def torch_loop(op: str, x: dict[str, Any]) -> Any:
    """The op as a PyTorch Python loop over time (vectorised over envs)."""
    import torch

    a, b = coefficients(torch, op, x)
    y = torch.empty_like(a)
    carry = torch.zeros_like(a[:, 0])
    steps = range(a.shape[1] - 1, -1, -1) if op in BACKWARD else range(a.shape[1])
    for t in steps:
        carry = torch.addcmul(a[:, t], b[:, t], carry)
        y[:, t] = carry
    return finish(torch, op, x, y)


def jax_scan(op: str) -> Any:
    """A jitted function of the op's inputs built on ``jax.lax.associative_scan``."""
    import jax
    import jax.numpy as jnp

    def compose(inner: tuple[Any, Any], outer: tuple[Any, Any]) -> tuple[Any, Any]:
        return outer[0] + outer[1] * inner[0], inner[1] * outer[1]

    def fn(x: dict[str, Any]) -> Any:
        a, b = coefficients(jnp, op, x)
        y, _ = jax.lax.associative_scan(compose, (a, b), reverse=op in BACKWARD, axis=1)
        return finish(jnp, op, x, y)

    return jax.jit(fn)
