"""What a rollout keeps of one env step (`after_step`): the training
wrappers' reward and endings, the start-up holds and pending resets
(`Clock`), and one pack of the next call's features and the step's
columns (`PACK`), made in one jitted call after the env's step (the Torch
rollout calls it after each `racing_env.VecCarRacingEnv.step`; the JAX one,
`racing_stack.ppo.jax_rollout`, inside its scan)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from racing_stack.features import LocalTrack
from racing_stack.reward import Endings, ShapedReward

__all__ = ["PACK", "Clock", "after_step"]

#: The pack's columns after the features (`after_step`), in order.
PACK = ("reward", "progress", "lap_time", "speed", "ending", "reason", "terminated", "truncated", "driven", "held")


class Clock(NamedTuple):
    """Which worlds the next call drives, kept in JAX beside the reward's
    memory (`after_step` reads and advances it): int32 [E] calls each
    world is still held braked at the start, bool [E] whether the next
    call only resets the world (NEXT_STEP, after a terminal call)."""

    hold: jax.Array
    pending: jax.Array


@functools.partial(jax.jit, static_argnums=(0, 1))
def after_step(reward_wrapper: ShapedReward, features: LocalTrack, endings: Endings, clock: Clock, reward, obs,
                reason, lap_time, terminated, truncated, sent, weight):
    """What a rollout keeps of one env step, in one dispatch: one float32
    pack [E, features + len(`PACK`)] (the next call's features, then the
    shaped reward, the progress, the lap time, the speed, the reward
    wrapper's ending, the termination reason, terminated, truncated,
    whether this call drove the world and whether the next call holds it:
    the last six small integers, exact in float32), the reward wrapper's
    memory, the `Clock` of the next call and the previous action of the
    next call. One pack a step: one crossing to Torch (`Rollout.keep`
    reads it).

    A call drives a world that is neither held (``clock.hold`` > 0) nor
    only reset (``clock.pending``: the env ignores its action); the next
    call's holds count one down, and it only resets the worlds this call
    ended.

    The previous action is a copy of ``sent`` where the world was driven;
    zero where this call only reset it or held it, so that an episode's
    first driven call sees zero, as the plugin's first does (a terminal
    call keeps its action: the reset slot's input, which bootstraps a
    timeout or a lap, is the terminal state as it was driven)."""
    done = terminated | truncated
    driven = ((clock.hold == 0) & ~clock.pending).astype(jnp.float32)
    ahead = Clock(jnp.maximum(clock.hold - 1, 0), done)
    shaped, ending, endings = reward_wrapper(endings, reward, obs, {"termination_reason": reason}, done, driven,
                                             weight)
    previous = jnp.where((driven == 0)[:, None], 0.0, sent).astype(jnp.float32)
    speed = jnp.linalg.norm(obs["velocity_body"], axis=-1)
    columns = jnp.stack([shaped, obs["track_progress"], lap_time, speed, ending, reason, terminated, truncated,
                         driven, ahead.hold > 0], 1)
    pack = jnp.concatenate([features(obs, previous), columns.astype(jnp.float32)], axis=1)
    return pack, endings, ahead, previous
