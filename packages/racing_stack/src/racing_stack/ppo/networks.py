"""The policy and value networks, in Torch alone (the exported plugin
imports this module and nothing of the trainer)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from racing_stack import checkpoints
from racing_stack.ppo.distributed import Group

__all__ = ["MIN_RESIDUAL", "ActorCritic", "Linear", "Normalizer", "clipped_mean", "prior_alone"]

#: The smallest residual share above 0 (smaller ones round to 0 in float32's buffer, or nearly).
MIN_RESIDUAL = 1e-6


class Linear(nn.Linear):
    """`torch.nn.Linear`, the same parameters and forward, whose backward
    under bfloat16 autocast (`racing_stack.ppo.algorithm.matmul_precision`
    ``"bf16"``) takes the bias's gradient as a matrix product, ``ones
    [1, B] @ grad [B, out]``, instead of a sum over the rows: the same sum
    (float32 accumulation, a bfloat16 result, as autocast's own), which
    the GPU's matrix units read at full bandwidth where Torch's column
    reduction of a bfloat16 [65,536, 256] gradient reads it at a fraction.
    Anywhere else (float32, no gradient, other shapes, no bias) it is
    `torch.nn.Linear` itself. Its backward is not differentiable again."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [..., in] -> [..., out]."""
        kind = x.device.type
        if (x.dim() == 2 and self.bias is not None and torch.is_grad_enabled() and torch.is_autocast_enabled(kind)
                and torch.get_autocast_dtype(kind) == torch.bfloat16):
            return _BiasByProduct.apply(x, self.weight, self.bias)
        return super().forward(x)


class _BiasByProduct(torch.autograd.Function):
    """A bfloat16 affine map, [B, in] -> [B, out], as autocast runs it
    (input, weight and bias cast to bfloat16, one ``addmm``), whose
    backward sums the bias's gradient by a matrix product."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            x, weight = x.to(torch.bfloat16), weight.to(torch.bfloat16)
            ctx.save_for_backward(x, weight)
            return nn.functional.linear(x, weight, bias.to(torch.bfloat16))

    @staticmethod
    @torch.autograd.function.once_differentiable  # no second derivative through the bfloat16 copies
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        grad = grad.to(torch.bfloat16)
        wants_x, wants_weight, wants_bias = ctx.needs_input_grad
        # The engine casts each gradient to its input's type (float32 for the parameters).
        return (grad.mm(weight) if wants_x else None, grad.t().mm(x) if wants_weight else None,
                grad.new_ones(1, grad.shape[0]).mm(grad)[0] if wants_bias else None)


class Normalizer(nn.Module):
    """Running mean and variance of the input features (all the data seen,
    weighted equally), applied as ``clamp((x - mean) / sqrt(var + 1e-8), -10, 10)``.
    Its statistics are buffers: they travel with the weights into checkpoints
    and exported plugins.

    Args:
        size: features per row.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., size] normalised (float32)."""
        scale = (self.var + 1e-8).rsqrt().float()
        return ((x - self.mean.float()) * scale).clamp(-10.0, 10.0)

    @torch.no_grad()
    def update(self, x: torch.Tensor, weight: torch.Tensor, group: Group = Group()) -> None:
        """Fold in the rows of ``x`` [N, size] whose ``weight`` [N] is 1 (0:
        left out) in every process of ``group``, on the device (Chan's
        parallel combination of moments). A weight is a mask, not a share:
        any positive weight counts the row once (no check, which would wait
        for the device)."""
        keep = weight[:, None] > 0
        w = keep.double()
        x = torch.where(keep, x.double(), 0.0)  # a left-out row holds anything, NaN too: it must not reach a sum
        sums = group.sum(torch.cat([w.sum()[None], (x * w).sum(0)]))
        n = sums[0]
        mean = sums[1:] / n.clamp(min=1.0)
        var = group.sum((((x - mean) ** 2) * w).sum(0)) / n.clamp(min=1.0)
        total = self.count + n
        delta = mean - self.mean
        share = n / total.clamp(min=1.0)
        combined = (self.var * self.count + var * n) / total.clamp(min=1.0) + delta**2 * share * (1 - share)
        seen = n > 0
        self.mean.copy_(torch.where(seen, self.mean + delta * share, self.mean))
        self.var.copy_(torch.where(seen, combined, self.var))
        self.count.copy_(total)


class ActorCritic(nn.Module):
    """A Gaussian policy over the action normalised to [-1, 1] (a mean
    network and a learned log standard deviation per dimension) and a value
    network, each an MLP of ``hidden`` tanh layers on the normalised
    features (one `Normalizer` for both). The initial mean action is the
    neutral one (zero steering and acceleration).

    With a ``residual`` the policy corrects a prior instead: the last two
    input features are the prior's action (env units: `LocalTrack` with a
    prior puts them there), the env's action is that plus ``residual`` x
    the half range x the normalised action clipped to [-1, 1], clipped to
    the bounds, and the initial mean action is the prior's.

    Args:
        features: input features per world.
        hidden: hidden layer widths.
        init_log_std: the initial log standard deviation, per action
            dimension (a number: the same for both).
        low, high: the env's action bounds ([2] each), which [-1, 1] maps onto.
        residual: 0 (the policy acts alone) or the residual's share of the
            half range, in [1e-6, 2] (then a buffer: its weights carry it).

    Raises:
        TypeError: a ``residual`` that is not a real number.
        ValueError: an ``init_log_std``, bounds or ``residual`` other than
            these (bounds with low >= high would mirror the actions).
    """

    def __init__(self, features: int, hidden: tuple[int, ...], init_log_std: float | Sequence[float],
                 low: np.ndarray, high: np.ndarray, residual: float = 0.0) -> None:
        super().__init__()

        def mlp(out: int, gain: float) -> nn.Sequential:
            layers: list[nn.Module] = []
            width = features
            for h in hidden:
                layers += [Linear(width, h), nn.Tanh()]
                width = h
            layers.append(Linear(width, out))
            for layer in layers:
                if isinstance(layer, nn.Linear):
                    nn.init.orthogonal_(layer.weight, gain=np.sqrt(2.0))
                    nn.init.zeros_(layer.bias)
            nn.init.orthogonal_(layers[-1].weight, gain=gain)
            return nn.Sequential(*layers)

        std = np.asarray(init_log_std, np.float64)
        if std.shape not in ((), (2,)) or not np.isfinite(std).all():
            raise ValueError(f"init_log_std must be a finite number or a pair of them, got {init_log_std!r}")
        low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
        if low.shape != (2,) or high.shape != (2,) or not (np.isfinite(low).all() and np.isfinite(high).all()
                                                           and (low < high).all()):
            raise ValueError(f"low and high must be finite action bounds [2] each, low < high, got {low} and {high}")
        middle, half = (low + high) / 2, (high - low) / 2
        # Checked here, not by racing_env.checks: an exported plugin loads this module without JAX.
        if isinstance(residual, bool) or not isinstance(residual, numbers.Real):
            raise TypeError(f"residual must be a real number, got {type(residual).__name__} {residual!r}")
        if not (residual == 0.0 or MIN_RESIDUAL <= residual <= 2.0):
            raise ValueError(f"residual must be 0 or a number in [1e-6, 2], got {residual!r}")
        if residual and features < 3:
            raise ValueError(f"a residual policy needs the prior's action among its features, got {features}")
        self.normalizer = Normalizer(features)
        self.actor = mlp(2, 0.01)
        if residual:
            self.register_buffer("residual", torch.tensor(float(residual)))
        else:
            with torch.no_grad():  # the initial mean action is the neutral one (no steering, no acceleration)
                self.actor[-1].bias.copy_(torch.as_tensor(np.clip(-middle / half, -1.0, 1.0)))
        self.critic = mlp(1, 1.0)
        self.log_std = nn.Parameter(torch.as_tensor(np.broadcast_to(std.astype(np.float32), (2,)).copy()))
        self.register_buffer("action_middle", torch.as_tensor(middle))
        self.register_buffer("action_half", torch.as_tensor(half))
        self.register_buffer("action_low", torch.as_tensor(low), persistent=False)
        self.register_buffer("action_high", torch.as_tensor(high), persistent=False)

    @property
    def residual_share(self) -> float:
        """The residual's share of the half range (0: the policy acts alone)."""
        return float(self.residual) if "residual" in self._buffers else 0.0

    def actor_parameters(self) -> list[nn.Parameter]:
        """The policy's parameters (the mean network and the log standard deviation)."""
        return [*self.actor.parameters(), self.log_std]

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """V(x): [E]."""
        return self.critic(self.normalizer(x)).squeeze(-1)

    def distribution(self, x: torch.Tensor) -> torch.distributions.Normal:
        """The policy over the normalised action, [E, 2]."""
        # No argument validation: it would wait for the GPU at every step.
        return torch.distributions.Normal(self.actor(self.normalizer(x)), self.log_std.exp(), validate_args=False)

    def act(self, x: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A rollout step's policy work, the features normalised once: the
        normalised action ``u = mean + std * noise`` [E, 2] (``noise``
        [E, 2] standard normal), its log probability under `distribution`
        [E] (summed over the two dimensions; (u - mean) / std is the noise)
        and V(x) [E]."""
        z = self.normalizer(x)
        u = torch.addcmul(self.actor(z), self.log_std.exp(), noise)
        logp = -0.5 * noise.square().sum(-1) - (self.log_std.sum() + math.log(2.0 * math.pi))
        return u, logp, self.critic(z).squeeze(-1)

    def env_action(self, u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The env's action (float32 [..., 2], physical units) of normalised
        ``u`` [..., 2] (clipped to [-1, 1]) in the worlds of features ``x``
        [..., features] (read by a residual policy alone: its prior's action)."""
        return self._to_env(u.clamp(-1.0, 1.0), x)

    def _to_env(self, clipped: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The env's action of a normalised action already in [-1, 1]."""
        if "residual" not in self._buffers:
            return (self.action_middle + self.action_half * clipped).float()
        action = x[..., -2:] + self.residual * self.action_half * clipped
        return torch.minimum(torch.maximum(action, self.action_low), self.action_high).float()

    def mean_action(self, x: torch.Tensor) -> torch.Tensor:
        """The env's mean action (no sampling): float32 [E, 2], the mean of
        the actions the env gets from the policy, whose normalised draws are
        clipped to [-1, 1] (`clipped_mean`). Where the policy's mean lies
        near or past a bound (full throttle on a straight) this is what
        training drove with on average; the clipped mean itself would
        drive harder than any training episode did.

        A residual policy's action is clipped twice: its draw to [-1, 1],
        and the sum with the prior's action to the bounds. For a prior
        within the bounds (as `PursuitPrior` keeps it) both clips are one,
        of the draw to [-1, 1] narrowed to where the sum stays within the
        bounds, so this is the mean of the draws clipped there."""
        mean, std = self.actor(self.normalizer(x)), self.log_std.exp()
        if "residual" not in self._buffers:
            return self._to_env(clipped_mean(mean, std), x)
        prior, scale = x[..., -2:], self.residual * self.action_half
        low = ((self.action_low - prior) / scale).clamp(-1.0, 1.0)
        high = ((self.action_high - prior) / scale).clamp(-1.0, 1.0)
        return self._to_env(clipped_mean(mean, std, low, high), x)

    def load_checked(self, weights: Any, source: str) -> None:
        """Load a state dict that must fit this network exactly (its layers,
        shapes, action bounds and residual) and hold finite values only;
        nothing changes otherwise.

        Raises:
            racing_stack.checkpoints.CorruptFile: ``source`` (where the
                weights came from) does not fit or is not finite.
        """
        if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
            raise checkpoints.CorruptFile(f"{source} is not a dict of tensors")
        if not all(v.isfinite().all() for v in weights.values() if v.is_floating_point()):
            raise checkpoints.CorruptFile(f"{source} holds values that are not finite")
        mine = self.state_dict()
        if set(weights) != set(mine) or any(weights[k].shape != v.shape or weights[k].dtype != v.dtype
                                            for k, v in mine.items()):
            raise checkpoints.CorruptFile(f"{source} does not fit the network: its layers, shapes or types differ")
        if bool((weights["normalizer.var"] < 0).any()) or float(weights["normalizer.count"]) < 0:
            raise checkpoints.CorruptFile(f"{source} holds a negative variance or count")
        if not all(torch.equal(weights[k].cpu(), mine[k].cpu()) for k in ("action_middle", "action_half")):
            raise checkpoints.CorruptFile(f"{source} was trained for other action bounds than the env's "
                                          f"(middle {weights['action_middle'].tolist()}, half range "
                                          f"{weights['action_half'].tolist()})")
        if "residual" in mine and not torch.equal(weights["residual"], mine["residual"]):
            raise checkpoints.CorruptFile(f"{source} was trained as a residual of {float(weights['residual']):g}, "
                                          f"not of {float(mine['residual']):g}")
        self.load_state_dict(weights)


def prior_alone(features: int, low: np.ndarray, high: np.ndarray) -> ActorCritic:
    """A residual policy (of 1) whose correction is 0: its mean action is
    exactly the prior's, the last two of ``features`` (the actor's last
    layer is zeroed, so its mean is 0, and its deviation is e^-100, which
    `clipped_mean` takes as float32's smallest normal number: the clipped
    draws' mean is 0, or, with the prior on a bound, far below float32's
    resolution of the prior's action). It drives the prior through
    anything that drives a policy."""
    policy = ActorCritic(features, (1,), -100.0, low, high, 1.0)
    with torch.no_grad():
        policy.actor[-1].weight.zero_()
        policy.actor[-1].bias.zero_()
    return policy


def clipped_mean(mean: torch.Tensor, std: torch.Tensor, low: float | torch.Tensor = -1.0,
                 high: float | torch.Tensor = 1.0) -> torch.Tensor:
    """E[clip(u, low, high)] for u ~ Normal(``mean``, ``std``), elementwise
    (broadcast; ``std`` >= 0, ``low`` <= ``high``, each bound a number or a
    tensor), in closed form: with a = (low - mean) / std and
    b = (high - mean) / std, mean (Φ(b) - Φ(a)) + std (φ(a) - φ(b))
    + low Φ(a) + high (1 - Φ(b)). It tends to clip(mean, low, high) as
    ``std`` shrinks; a deviation below the dtype's smallest normal number
    (one that underflowed to 0 among them) counts as that number (so a
    mean exactly on a bound gives the bound, not 0 / 0)."""
    std = std.clamp(min=torch.finfo(std.dtype).tiny)
    if isinstance(low, torch.Tensor) != isinstance(high, torch.Tensor):  # clamp takes two numbers or two tensors
        low, high = (b if isinstance(b, torch.Tensor) else torch.full_like(mean, b) for b in (low, high))
    a, b = (low - mean) / std, (high - mean) / std
    cdf_a, cdf_b = torch.special.ndtr(a), torch.special.ndtr(b)
    density = (torch.exp(-0.5 * a * a) - torch.exp(-0.5 * b * b)) / math.sqrt(2.0 * math.pi)
    return (mean * (cdf_b - cdf_a) + std * density + low * cdf_a + high * (1.0 - cdf_b)).clamp(low, high)
