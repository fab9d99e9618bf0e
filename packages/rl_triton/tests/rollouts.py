"""Random rollouts and a table of every op, called the same way on any path.

``OPS[name](batch, device)`` runs the library op on tensors moved to
``device`` and returns its output tensors (``run`` returns them as arrays);
``REFERENCES[name](batch)`` runs the NumPy reference. Both return a tuple
of arrays, so tests can treat the seven ops (and both prefix-sum boundary
modes) alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

import rl_triton
from rl_triton import reference as ref

NUM_ACTIONS = 5


@dataclasses.dataclass
class Rollout:
    """One random batch of every input an op may take (NumPy, float32/int64)."""

    rewards: np.ndarray
    values: np.ndarray
    next_values: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    bootstrap_values: np.ndarray
    last_value: np.ndarray
    log_pi_target: np.ndarray
    log_pi_behavior: np.ndarray
    probs_target: np.ndarray
    probs_behavior: np.ndarray
    q_values: np.ndarray
    next_q_all: np.ndarray
    actions: np.ndarray
    seeds: np.ndarray
    gamma: float
    lam: float
    tensors: dict[tuple[str, str], torch.Tensor] = dataclasses.field(default_factory=dict)

    def t(self, name: str, device: str) -> torch.Tensor:
        """Input ``name`` on ``device``: made once, then the same tensor (a stable buffer)."""
        key = (name, device)
        if key not in self.tensors:
            self.tensors[key] = torch.from_numpy(np.ascontiguousarray(getattr(self, name))).to(device)
        return self.tensors[key]

    def arrays(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), np.ndarray)]


def rollout(num_envs: int, seq_len: int, seed: int = 0, p_term: float = 0.1,
            p_trunc: float = 0.1, last_truncated: bool = False,
            gamma: float = 0.97, lam: float = 0.9, num_actions: int = NUM_ACTIONS) -> Rollout:
    """Random inputs with terminations and truncations at rates ``p_term`` and
    ``p_trunc`` (never both at one step), bootstrap values exactly where the
    conventions put them (truncated steps and ``t = T-1``) and ``num_actions``
    actions."""
    rng = np.random.default_rng(seed)
    shape = (num_envs, seq_len)
    f32 = np.float32
    term = rng.random(shape) < p_term
    trunc = (rng.random(shape) < p_trunc) & ~term
    if last_truncated:
        trunc[:, -1] = True
        term[:, -1] = False
    boot = np.where(trunc, rng.normal(size=shape), 0.0)
    boot[:, -1] = rng.normal(size=num_envs)
    probs = rng.random((*shape, num_actions)) + 0.05
    probs /= probs.sum(-1, keepdims=True)
    return Rollout(
        rewards=rng.normal(size=shape).astype(f32),
        values=rng.normal(size=shape).astype(f32),
        next_values=np.where(trunc, 0.0, rng.normal(size=shape)).astype(f32),
        terminateds=term.astype(f32),
        truncateds=trunc.astype(f32),
        bootstrap_values=boot.astype(f32),
        last_value=boot[:, -1].astype(f32),
        log_pi_target=(0.5 * rng.normal(size=shape)).astype(f32),
        log_pi_behavior=(0.5 * rng.normal(size=shape)).astype(f32),
        probs_target=probs.astype(f32),
        probs_behavior=(0.1 + 0.9 * rng.random(shape)).astype(f32),
        q_values=rng.normal(size=shape).astype(f32),
        next_q_all=rng.normal(size=(*shape, num_actions)).astype(f32),
        actions=rng.integers(0, num_actions, size=shape),
        seeds=rng.normal(size=num_envs).astype(f32),
        gamma=gamma,
        lam=lam,
    )


def _outs(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return xs


def run(op: str, batch: Rollout, device: str) -> tuple[np.ndarray, ...]:
    """``OPS[op]`` with its outputs as NumPy arrays."""
    return tuple(x.detach().cpu().numpy() for x in OPS[op](batch, device))


Op = Callable[[Rollout, str], tuple[torch.Tensor, ...]]
Reference = Callable[[Rollout], tuple[np.ndarray, ...]]

OPS: dict[str, Op] = {
    "gae": lambda b, d: _outs(rl_triton.compute_gae(
        b.t("rewards", d), b.t("values", d), b.t("terminateds", d), b.t("truncateds", d),
        b.gamma, b.lam, bootstrap_values=b.t("bootstrap_values", d))),
    "gae_last_value": lambda b, d: _outs(rl_triton.compute_gae(
        b.t("rewards", d), b.t("values", d), b.t("terminateds", d), gamma=b.gamma,
        lambda_=b.lam, last_value=b.t("last_value", d))),
    "vtrace": lambda b, d: _outs(*rl_triton.compute_vtrace(
        b.t("log_pi_target", d), b.t("log_pi_behavior", d), b.t("values", d), b.t("rewards", d),
        b.t("terminateds", d), b.t("truncateds", d), b.gamma, 1.0, 0.9,
        bootstrap_values=b.t("bootstrap_values", d))),
    "vtrace_last_value": lambda b, d: _outs(*rl_triton.compute_vtrace(
        b.t("log_pi_target", d), b.t("log_pi_behavior", d), b.t("values", d), b.t("rewards", d),
        b.t("terminateds", d), gamma=b.gamma, last_value=b.t("last_value", d))),
    "retrace": lambda b, d: _outs(*rl_triton.compute_retrace(
        b.t("probs_target", d), b.t("probs_behavior", d), b.t("q_values", d), b.t("next_q_all", d),
        b.t("actions", d), b.t("rewards", d), b.t("terminateds", d), b.t("truncateds", d),
        b.gamma, b.lam, 1.0, 0.8)),
    "lambda_returns": lambda b, d: _outs(rl_triton.compute_lambda_returns(
        b.t("rewards", d), b.t("next_values", d), b.t("terminateds", d), b.t("truncateds", d),
        b.gamma, b.lam, b.t("bootstrap_values", d))),
    "discounted_returns": lambda b, d: _outs(rl_triton.compute_discounted_returns(
        b.t("rewards", d), b.t("terminateds", d), b.t("truncateds", d), b.gamma,
        b.t("bootstrap_values", d))),
    "eligibility_traces": lambda b, d: _outs(rl_triton.compute_eligibility_traces(
        b.t("rewards", d), b.t("terminateds", d), b.gamma, b.lam, b.t("seeds", d))),
    "prefix_sum_ends_at": lambda b, d: _outs(rl_triton.compute_episodic_prefix_sum(
        b.t("rewards", d), b.t("terminateds", d), b.t("seeds", d), "ends_at")),
    "prefix_sum_starts_at": lambda b, d: _outs(rl_triton.compute_episodic_prefix_sum(
        b.t("rewards", d), b.t("terminateds", d), b.t("seeds", d), "starts_at")),
}

REFERENCES: dict[str, Reference] = {
    "gae": lambda b: (ref.gae(b.rewards, b.values, b.terminateds, b.truncateds, b.gamma, b.lam,
                              b.bootstrap_values),),
    "gae_last_value": lambda b: (ref.gae(b.rewards, b.values, b.terminateds, None, b.gamma, b.lam,
                                         last_value=b.last_value),),
    "vtrace": lambda b: ref.vtrace(b.log_pi_target, b.log_pi_behavior, b.values, b.rewards,
                                   b.terminateds, b.truncateds, b.gamma, 1.0, 0.9, b.bootstrap_values),
    "vtrace_last_value": lambda b: ref.vtrace(b.log_pi_target, b.log_pi_behavior, b.values,
                                              b.rewards, b.terminateds, None, b.gamma,
                                              last_value=b.last_value),
    "retrace": lambda b: ref.retrace(b.probs_target, b.probs_behavior, b.q_values, b.next_q_all,
                                     b.actions, b.rewards, b.terminateds, b.truncateds, b.gamma,
                                     b.lam, 1.0, 0.8),
    "lambda_returns": lambda b: (ref.lambda_returns(b.rewards, b.next_values, b.terminateds,
                                                    b.truncateds, b.gamma, b.lam,
                                                    b.bootstrap_values),),
    "discounted_returns": lambda b: (ref.discounted_returns(b.rewards, b.terminateds, b.truncateds,
                                                            b.gamma, b.bootstrap_values),),
    "eligibility_traces": lambda b: (ref.eligibility_traces(b.rewards, b.terminateds, b.gamma,
                                                            b.lam, b.seeds),),
    "prefix_sum_ends_at": lambda b: (ref.episodic_prefix_sum(b.rewards, b.terminateds, b.seeds,
                                                             "ends_at"),),
    "prefix_sum_starts_at": lambda b: (ref.episodic_prefix_sum(b.rewards, b.terminateds, b.seeds,
                                                               "starts_at"),),
}


def assert_matches(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...], rtol: float = 3e-5) -> None:
    """float32 results against float64 references, scaled to the outputs' size."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.float32 and g.shape == w.shape
        assert np.isfinite(g).all()
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)
