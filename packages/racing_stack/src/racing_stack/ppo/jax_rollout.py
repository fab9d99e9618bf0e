"""A rollout as one JAX program (`PPOConfig.act_in_jax`): the policy's
acting half (the feature normaliser, the mean network, the noise, the
log probability and the env's action) inside the env's jitted step, and
the rollout's ``steps`` calls one `jax.lax.scan` of `racing_env.core.step`
and the training wrappers (`racing_stack.ppo.env_step.after_step`). Torch
keeps the policy: the actor's weights and the normaliser's statistics
cross to JAX once a rollout (one flat float32 vector), the noise once
([T, E, 2], drawn by Torch's generator), and the rollout's rows cross back
once ([T, E, features + 15]). No host work between the env's calls.

The maths is `ActorCritic.act`'s (the value is computed after the rollout,
in Torch, over all its rows at once); the products are XLA's: other
roundings, so other numbers than the Torch rollout's (within float32's
rounding at ``"highest"``; at ``"bf16"`` the products' inputs and the
hidden activations are rounded to bfloat16, their sums kept in float32,
as autocast does).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import torch

from racing_env import core
from racing_stack.features import LocalTrack
from racing_stack.ppo.env_step import Clock, after_step
from racing_stack.ppo.networks import ActorCritic
from racing_stack.reward import Endings, ShapedReward

__all__ = ["ActingSpec", "Carry", "act", "acting_vector", "scan_rollout", "spec_of"]


class ActingSpec(NamedTuple):
    """What the scanned rollout's program is compiled for (static):
    the layer shapes of the mean network ((out, in) each), the features,
    the reward wrapper, the matmul precision (`PPOConfig.matmul_precision`),
    the residual share (0: none) and the rollout's calls."""

    layers: tuple[tuple[int, int], ...]
    features: LocalTrack
    reward: ShapedReward
    precision: str
    residual: float
    steps: int


def acting_vector(policy: ActorCritic) -> torch.Tensor:
    """What the scanned rollout reads of ``policy``, as one float32 vector on
    its device: each layer of the mean network (weight [out, in], then
    bias [out]), the log standard deviation [2], the normaliser's mean and
    scale ``(var + 1e-8) ** -0.5`` [features] (as `Normalizer` applies
    them, in float32), then the action's middle, half range, low and high
    bounds [2 each]."""
    norm = policy.normalizer
    parts = [p.detach().reshape(-1) for layer in _linears(policy) for p in (layer.weight, layer.bias)]
    parts += [policy.log_std.detach(), norm.mean.float(), (norm.var + 1e-8).rsqrt().float(),
              policy.action_middle.float(), policy.action_half.float(), policy.action_low, policy.action_high]
    return torch.cat(parts)


def spec_of(policy: ActorCritic, features: LocalTrack, reward: ShapedReward, precision: str, residual: float,
            steps: int) -> ActingSpec:
    """The `ActingSpec` of ``policy`` (its mean network's layers), trained
    with ``residual`` (the config's, which the policy's buffer holds: no
    read of the device)."""
    layers = tuple((layer.out_features, layer.in_features) for layer in _linears(policy))
    return ActingSpec(layers, features, reward, precision, float(residual), steps)


def _linears(policy: ActorCritic) -> list[torch.nn.Linear]:
    """The mean network's affine layers, in order."""
    return [layer for layer in policy.actor if isinstance(layer, torch.nn.Linear)]


def _unpack(spec: ActingSpec, vector: jax.Array):
    """`acting_vector`'s parts: ([(weight, bias)], log_std, mean, scale, middle, half, low, high)."""
    at = 0

    def take(*shape: int) -> jax.Array:
        nonlocal at
        size = math.prod(shape)
        part = vector[at:at + size].reshape(shape)
        at += size
        return part

    layers = [(take(out, width), take(out)) for out, width in spec.layers]
    d = spec.layers[0][1]
    parts = [take(2), take(d), take(d), take(2), take(2), take(2), take(2)]
    return layers, *parts


def _affine(x: jax.Array, weight: jax.Array, bias: jax.Array, precision: str) -> jax.Array:
    """``x @ weight.T + bias`` at ``precision``: float32 at ``"highest"``,
    XLA's default float32 products (TF32 on GPUs that have it) at
    ``"high"``; at ``"bf16"`` inputs, weight and bias in bfloat16, the
    products and the bias summed in float32 and the result rounded to
    bfloat16 once."""
    if precision == "bf16":  # the bias added to the float32 sums, one rounding, as autocast's addmm does
        out = jnp.dot(x.astype(jnp.bfloat16), weight.astype(jnp.bfloat16).T, preferred_element_type=jnp.float32)
        return (out + bias.astype(jnp.bfloat16).astype(jnp.float32)).astype(jnp.bfloat16)
    level = jax.lax.Precision.HIGHEST if precision == "highest" else jax.lax.Precision.DEFAULT
    return jnp.dot(x, weight.T, precision=level) + bias


def act(spec: ActingSpec, vector: jax.Array, x: jax.Array, noise: jax.Array, held: jax.Array,
        brake: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`ActorCritic.act` and `ActorCritic.env_action` in JAX, on features
    ``x`` [E, D] and standard normal ``noise`` [E, 2]: the normalised action
    ``u`` [E, 2], its log probability [E] and the env's action [E, 2]
    (``brake`` [2] where ``held`` [E])."""
    layers, log_std, mean, scale, middle, half, low, high = _unpack(spec, vector)
    h = jnp.clip((x - mean) * scale, -10.0, 10.0)
    for i, (weight, bias) in enumerate(layers):
        h = _affine(h, weight, bias, spec.precision)
        if i + 1 < len(layers):
            h = jnp.tanh(h)
    u = h.astype(jnp.float32) + jnp.exp(log_std) * noise
    logp = -0.5 * jnp.sum(noise * noise, -1) - (jnp.sum(log_std) + math.log(2.0 * math.pi))
    clipped = jnp.clip(u, -1.0, 1.0)
    if spec.residual:
        action = jnp.clip(x[:, -2:] + jnp.float32(spec.residual) * half * clipped, low, high)
    else:
        action = middle + half * clipped
    return u, logp, jnp.where(held[:, None], brake, action)


class Carry(NamedTuple):
    """What one call hands the next: the env's core state and physics state,
    the reward wrapper's memory, the `Clock`, the
    previous action [E, 2], the observation and the next call's features
    [E, D]."""

    state: object
    data: object
    endings: Endings
    clock: Clock
    previous: jax.Array
    obs: dict
    x: jax.Array


@functools.partial(jax.jit, static_argnums=(0, 2), donate_argnums=(3,))
def scan_rollout(spec: ActingSpec, params: core.EnvParams, physics, env_state: tuple, carry: Carry,
                 vector: jax.Array, noise: jax.Array, brake: jax.Array, weight: jax.Array) -> tuple[Carry, jax.Array]:
    """One rollout of ``spec.steps`` calls from the env's ``env_state``
    ((state, physics state) as `racing_env.VecCarRacingEnv.core_state`
    gives them, donated) and the rest of ``carry`` (its state and data
    unused; not donated: a caller may keep them), the policy of ``vector``
    (`acting_vector`) acting on ``noise`` [T, E, 2] (``weight``: the crash
    weight, `ShapedReward`): (the carry after it, rows float32
    [T, E, D + len(PACK) + 5]: each call's features, its pack's columns
    after the features (`racing_stack.ppo.env_step.PACK`), the normalised
    action, its log probability and the env's action)."""

    def call(c: Carry, noise_t: jax.Array) -> tuple[Carry, jax.Array]:
        u, logp, action = act(spec, vector, c.x, noise_t, c.clock.hold > 0, brake)
        state, data, obs, reward, terminated, truncated, info = core.step(params, physics, c.state, c.data, action)
        pack, endings, clock, previous = after_step(spec.reward, spec.features, c.endings, c.clock, reward, obs,
                                                    info["termination_reason"], info["lap_time_s"], terminated,
                                                    truncated, action, weight)
        d = spec.features.size
        row = jnp.concatenate([c.x, pack[:, d:], u, logp[:, None], action], axis=1)
        return Carry(state, data, endings, clock, previous, obs, pack[:, :d]), row

    return jax.lax.scan(call, carry._replace(state=env_state[0], data=env_state[1]), noise)
