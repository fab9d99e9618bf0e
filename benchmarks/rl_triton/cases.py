"""The benchmarked calls: inputs per op, the call itself, and the bytes it must move.

Every op is called in its common form (no interior truncations; GAE and
V-trace with ``last_value``; flags as float32, as the public API documents them).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

OPS = ("gae", "vtrace", "retrace", "lambda_returns", "discounted_returns",
       "eligibility_traces", "episodic_prefix_sum")
NUM_ACTIONS = 8
GAMMA, LAM = 0.99, 0.95

Inputs = dict[str, torch.Tensor]


def make_inputs(op: str, num_envs: int, seq_len: int, device: str, seed: int = 0) -> Inputs:
    """Random float32 inputs (flags 0/1 at a 2% rate) for ``op`` on ``device``."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (num_envs, seq_len)

    def normal(*s: int) -> torch.Tensor:
        return torch.randn(*(s or shape), generator=g, device=device)

    flags = (torch.rand(*shape, generator=g, device=device) < 0.02).float()
    if op in ("gae", "vtrace"):
        x = dict(rewards=normal(), values=normal(), terminateds=flags, last_value=normal(num_envs))
        if op == "vtrace":
            x.update(log_pi_target=0.3 * normal(), log_pi_behavior=0.3 * normal())
        return x
    if op == "retrace":
        probs = torch.softmax(normal(num_envs, seq_len, NUM_ACTIONS), dim=-1)
        return dict(action_probs_target=probs,
                    action_probs_behavior=0.1 + 0.9 * torch.rand(*shape, generator=g, device=device),
                    q_values=normal(), next_q_values_all=normal(num_envs, seq_len, NUM_ACTIONS),
                    actions=torch.randint(0, NUM_ACTIONS, shape, generator=g, device=device),
                    rewards=normal(), terminateds=flags, truncateds=torch.zeros_like(flags))
    if op == "lambda_returns":
        return dict(rewards=normal(), next_values=normal(), terminateds=flags)
    if op == "discounted_returns":
        return dict(rewards=normal(), terminateds=flags)
    return dict(x=normal(), dones=flags)


def call(op: str, lib: ModuleType, x: Inputs) -> Any:
    """Run ``op`` from ``lib`` (ours or the public rl-triton: the same API)."""
    if op == "gae":
        return lib.compute_gae(x["rewards"], x["values"], x["terminateds"],
                               gamma=GAMMA, lambda_=LAM, last_value=x["last_value"])
    if op == "vtrace":
        return lib.compute_vtrace(x["log_pi_target"], x["log_pi_behavior"], x["values"],
                                  x["rewards"], x["terminateds"], gamma=GAMMA,
                                  last_value=x["last_value"])
    if op == "retrace":
        return lib.compute_retrace(x["action_probs_target"], x["action_probs_behavior"],
                                   x["q_values"], x["next_q_values_all"], x["actions"],
                                   x["rewards"], x["terminateds"], x["truncateds"], GAMMA, LAM)
    if op == "lambda_returns":
        return lib.compute_lambda_returns(x["rewards"], x["next_values"], x["terminateds"],
                                          gamma=GAMMA, lambda_=LAM)
    if op == "discounted_returns":
        return lib.compute_discounted_returns(x["rewards"], x["terminateds"], gamma=GAMMA)
    if op == "eligibility_traces":
        return lib.compute_eligibility_traces(x["x"], x["dones"], GAMMA, LAM)
    return lib.compute_episodic_prefix_sum(x["x"], x["dones"])


def output_count(op: str) -> int:
    return 2 if op in ("vtrace", "retrace") else 1


def nbytes(op: str, x: Inputs) -> int:
    """Bytes the call must move: each input read once, each float32 output written once."""
    num_envs, seq_len = x["terminateds" if "terminateds" in x else "dones"].shape
    return sum(t.numel() * t.element_size() for t in x.values()) + \
        output_count(op) * num_envs * seq_len * 4
