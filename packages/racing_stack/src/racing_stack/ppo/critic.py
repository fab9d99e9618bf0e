"""The critic's minibatch steps apart from the actor's
(`PPOConfig.critic_beside_rollout`), and on the graph path beside the next
rollout.

Why the numbers are the joint update's: the actor (with the log standard
deviation) and the critic share no parameter; the loss is the actor's terms
plus ``value_coef`` x the value loss, so each network's gradients are those
of its own terms; their gradients are clipped apart; and Adam steps each
parameter on its own moments, at the update's one step size. So the critic's
steps over every minibatch, apart from the actor's steps over the same
minibatches, leave each network the parameters and moments the joint steps
leave it (over three or more processes, where the two networks' gradients
are all-reduced apart, the sums may be taken in another order). The critic
reads the features as the update found them, normalised by the feature
statistics the update started from.

On the graph path (`racing_stack.ppo.graphs.captured`), from the update
that captures the optimisation on, those inputs are copied on the current
stream (the next rollout writes the buffers, the actor's steps update the
statistics) and the critic's steps replay as a CUDA graph of their own on a
stream of their own: the next rollout waits for the actor's steps only, and
takes its values after the critic's (`racing_stack.ppo.rollout.Rollout.values`).
"""

from __future__ import annotations

import torch
from torch import nn

from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group
from racing_stack.ppo.losses import value_losses
from racing_stack.ppo.networks import ActorCritic, Normalizer
from racing_stack.ppo.graphs import capture_stream, capturing, moments, warm_up

__all__ = ["CriticSteps", "part"]


class CriticSteps:
    """The critic's part of every update of one policy.

    Args:
        config: the run's settings (``critic_beside_rollout`` on).
        device: the policy's.
        group: the processes training it together.
    """

    def __init__(self, config: PPOConfig, device: torch.device, group: Group = Group()) -> None:
        self.config, self.device, self.group = config, device, group
        #: The stream the critic's steps are captured and replay on (`capture_stream`; None until the first capture).
        self.stream: torch.cuda.Stream | None = None
        #: Recorded on `stream` after the last replay (None: nothing in flight beside the current stream).
        self.done: torch.cuda.Event | None = None
        self._inputs: dict[str, torch.Tensor] | None = None
        self._normalizer: Normalizer | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._held: tuple = ()
        self._stats: torch.Tensor | None = None

    def launch(self, policy: ActorCritic, optimizer: torch.optim.Adam, flat: dict[str, torch.Tensor],
               returns: torch.Tensor, parts: list[list[torch.Tensor]], beside: bool) -> None:
        """The critic's steps over a rollout's ``flat`` buffers ("x",
        "valid": [N, ...]), its ``returns`` [N] and each epoch's
        minibatches' rows ``parts``, with ``optimizer`` (over every
        parameter of ``policy``; it steps the critic's): before the actor's
        steps, on the current stream; or, ``beside`` (a CUDA device, the
        optimizer holding every moment, one process), replayed on `stream`
        after the inputs are copied. No host read; `result` gives the
        statistics."""
        self.wait()
        if not beside:
            self._stats = self.steps(policy, optimizer, flat["x"], flat["valid"], returns, parts,
                                     policy.normalizer)
            return
        inputs = self._staged(policy, flat, returns, parts)
        if self._graph is None or not self._fits(policy, optimizer, inputs):
            self._capture(policy, optimizer, inputs)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self._graph.replay()
        self.done = torch.cuda.Event()
        self.done.record(self.stream)

    def result(self) -> torch.Tensor:
        """The last launch's statistics, float32 [2] (the mean value loss and
        the critic's mean gradient norm before clipping), after `wait`."""
        self.wait()
        return self._stats

    def wait(self) -> None:
        """Make the current stream wait for the critic's steps in flight, if any."""
        if self.done is not None:
            torch.cuda.current_stream(self.device).wait_event(self.done)
            self.done = None

    def steps(self, policy: ActorCritic, optimizer: torch.optim.Adam, x: torch.Tensor, valid: torch.Tensor,
              returns: torch.Tensor, parts: list[list[torch.Tensor]], normalizer: Normalizer) -> torch.Tensor:
        """The arithmetic of the critic's steps (what the graph captures):
        for each epoch's minibatch rows of ``parts``, `value_losses` of
        features ``x`` [N, D] normalised by ``normalizer``, ``returns``
        [N] and ``valid`` [N] (its mean over the whole minibatch's valid
        rows, in every process), the gradients summed over the processes,
        clipped to ``max_grad_norm`` and stepped by `part` of
        ``optimizer``. Returns float32 [2] as `result`. No host read."""
        cfg, group = self.config, self.group
        params = list(policy.critic.parameters())
        adam = part(optimizer, params)
        stats = torch.zeros(2, device=x.device)
        for epoch in parts:
            counts = group.sum(torch.stack([valid[i].sum() for i in epoch]))
            for i, count in zip(epoch, counts):
                adam.zero_grad(set_to_none=False)
                loss, value_loss = value_losses(policy, cfg, x[i], returns[i], valid[i], count, normalizer)
                loss.backward()
                group.sum_gradients(params)
                norm = nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                stats += torch.stack([value_loss, norm.detach()])
                adam.step()
        stats /= cfg.epochs * cfg.minibatches
        group.sum(stats[:1])  # each process's part of the minibatches' means
        return stats

    def _staged(self, policy: ActorCritic, flat: dict[str, torch.Tensor], returns: torch.Tensor,
                parts: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
        """The critic's inputs copied on the current stream into its own
        buffers (made at the first call): the features, the valid mask,
        the returns, the minibatches' rows and the feature statistics."""
        rows = torch.stack([torch.stack(epoch) for epoch in parts])
        if self._inputs is None or self._inputs["x"].shape != flat["x"].shape:
            self._inputs = {"x": torch.empty_like(flat["x"]), "valid": torch.empty_like(flat["valid"]),
                            "returns": torch.empty_like(returns), "rows": torch.empty_like(rows)}
            self._normalizer = Normalizer(flat["x"].shape[1]).to(self.device)
        inputs = self._inputs
        torch._foreach_copy_([inputs["x"], inputs["valid"], inputs["returns"], inputs["rows"]],
                             [flat["x"], flat["valid"], returns, rows])
        torch._foreach_copy_(list(self._normalizer.buffers()), list(policy.normalizer.buffers()))
        return inputs

    def _capture(self, policy: ActorCritic, optimizer: torch.optim.Adam, inputs: dict[str, torch.Tensor]) -> None:
        """Capture `steps` over the staged inputs (the parameters' gradients
        allocated, the optimizer's groups capturable)."""
        self._graph = None  # its memory pool goes before the next capture takes one
        for p in policy.critic.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for group in optimizer.param_groups:
            group["capturable"] = True
        parts = [list(epoch) for epoch in inputs["rows"]]
        x, valid, returns = inputs["x"], inputs["valid"], inputs["returns"]
        i = parts[0][0]
        # cuBLAS and autograd set themselves up outside the capture: a minibatch's gradients (no step).
        warm_up(self.device, lambda: value_losses(policy, self.config, x[i], returns[i], valid[i], valid.sum(),
                                                  self._normalizer)[0].backward())
        graph = torch.cuda.CUDAGraph()
        self.stream = self.stream or capture_stream(self, self.device)
        with capturing(graph, self.device, self.stream):
            self._stats = self.steps(policy, optimizer, x, valid, returns, parts, self._normalizer)
        self._graph, self._held = graph, (policy, optimizer, optimizer.param_groups[0]["lr"],
                                          _pointers(policy, optimizer, inputs))

    def _fits(self, policy: ActorCritic, optimizer: torch.optim.Adam, inputs: dict[str, torch.Tensor]) -> bool:
        """Whether the capture steps ``policy``'s critic with ``optimizer`` (its
        step size, the critic's moments and gradients where they were) over these inputs."""
        held_policy, held_optimizer, rate, pointers = self._held
        return (held_policy is policy and held_optimizer is optimizer and optimizer.param_groups[0]["lr"] is rate
                and _pointers(policy, optimizer, inputs) == pointers)


def part(optimizer: torch.optim.Adam, params: list[nn.Parameter]) -> torch.optim.Adam:
    """An Adam over ``params`` (some of ``optimizer``'s, on one device)
    whose step is ``optimizer``'s step of them: the same moments and step
    counts (its state is ``optimizer``'s) and the same settings and step
    size (its group's values are ``optimizer``'s first group's)."""
    settings = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    # Made with a number for the step size: Adam checks a tensor's sign on the host (a wait, and no capture).
    adam = torch.optim.Adam(params, **{**settings, "lr": 0.0})
    adam.state = optimizer.state
    adam.param_groups[0].update(settings)  # the very step size tensor, which set_learning_rate fills
    return adam


def _pointers(policy: ActorCritic, optimizer: torch.optim.Adam, inputs: dict[str, torch.Tensor]) -> tuple:
    """Where a capture of the critic's steps reads and writes: the
    optimizer's moments and step counts, the critic's gradients, and the
    staged inputs."""
    return (tuple(moments(optimizer)),
            tuple(p.grad.data_ptr() if p.grad is not None else 0 for p in policy.critic.parameters()),
            tuple(v.data_ptr() for v in inputs.values()))
