"""A `racing_stack.ppo.algorithm.PPOUpdate`'s optimisation captured as
one CUDA graph (`PPOConfig.update_path` ``"graph"``)."""

from __future__ import annotations

from typing import Any

import torch

from racing_stack.ppo.graphs import capture_stream, capturing, moments, warm_up

__all__ = ["CapturedUpdate"]


class CapturedUpdate:
    """A `PPOUpdate`'s whole optimisation (`PPOUpdate.steps`: every
    minibatch's loss, backward pass, clipping and optimizer step, then the
    statistics and the feature statistics' update) captured as one CUDA
    graph over static buffers: the rollout's flat buffers (views: a
    rollout writes them in place), the update's advantages and returns and
    its minibatches' rows (copied in before each replay), the parameters'
    gradients (allocated once, zeroed inside the graph), and the
    optimizer's moments, step counts and step size (on the device:
    `PPOUpdate.new_optimizer`). A replay launches the kernels the eager
    update would, on the same data: the same numbers.

    Captured once the optimizer holds its moments (an eager update made
    them), so that the capture allocates none of the optimizer's state.

    Args:
        update: the `racing_stack.ppo.algorithm.PPOUpdate` whose policy it steps (its device is CUDA).
        flat: the rollout's buffers as [N, ...] rows ("x", "u", "logp", "value", "valid").
    """

    def __init__(self, update: Any, flat: dict[str, torch.Tensor]) -> None:
        cfg, device = update.config, update.device
        n = flat["x"].shape[0]
        self.flat, self.policy, self.optimizer = flat, update.policy, update.optimizer
        self._pointers = self._buffers(flat)
        #: The update's advantages and returns [N], and each epoch's minibatches' rows [epochs, minibatches, B].
        self.advantage, self.returns = torch.zeros(n, device=device), torch.zeros(n, device=device)
        self.rows = torch.zeros((cfg.epochs, cfg.minibatches, n // cfg.minibatches), dtype=torch.int64,
                                device=device)
        update.optimizer.zero_grad(set_to_none=False)
        for p in update.policy.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._grads = [p.grad for p in update.policy.parameters()]
        self._rates = [g["lr"] for g in update.optimizer.param_groups]
        self._moments = moments(update.optimizer)
        for group in update.optimizer.param_groups:
            group["capturable"] = True  # its steps are captured (it was made with its moments: nothing to allocate)
        parts = [list(epoch) for epoch in self.rows]
        # cuBLAS and autograd set themselves up outside the capture: a minibatch's gradients (no step).
        i = parts[0][0]
        warm_up(device, lambda: update.gradients(flat["x"][i], flat["u"][i], flat["logp"][i], self.advantage[i],
                                                 self.returns[i], flat["valid"][i], flat["valid"].sum(),
                                                 flat["logp"][i] if cfg.policy_lag else None))
        self.graph = torch.cuda.CUDAGraph()
        with capturing(self.graph, device, capture_stream(self, device)):
            self.stats = update.steps(flat, self.advantage, self.returns, parts)

    @staticmethod
    def _buffers(flat: dict[str, torch.Tensor]) -> tuple[int, ...]:
        return tuple(flat[k].data_ptr() for k in ("x", "u", "logp", "value", "valid"))

    def fits(self, update: Any, flat: dict[str, torch.Tensor]) -> bool:
        """Whether this capture steps ``update``'s policy with its optimizer
        (its step size, moments and step counts where they were) over these
        buffers, into the gradients it holds."""
        return (update.policy is self.policy and update.optimizer is self.optimizer
                and self._buffers(flat) == self._pointers and moments(update.optimizer) == self._moments
                and all(p.grad is g for p, g in zip(update.policy.parameters(), self._grads))
                and all(g["lr"] is r for g, r in zip(update.optimizer.param_groups, self._rates)))

    def replay(self, advantage: torch.Tensor, returns: torch.Tensor, parts: list[list[torch.Tensor]]) -> torch.Tensor:
        """The optimisation of ``advantage`` and ``returns`` [N] over the
        minibatches ``parts`` (`PPOUpdate._minibatches` of each epoch);
        returns its statistics (a static buffer: read it before the next
        replay)."""
        self.advantage.copy_(advantage)
        self.returns.copy_(returns)
        self.rows.copy_(torch.stack([torch.stack(epoch) for epoch in parts]))
        self.graph.replay()
        return self.stats
