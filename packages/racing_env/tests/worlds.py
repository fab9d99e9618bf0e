"""Worlds the tests share: a short Level and circle tracks (imported by
the tests and by conftest.py; a module of its own, so that `pytest` from the
repository root, where several packages have a conftest, finds it)."""

from __future__ import annotations

import numpy as np

from racing_env import Level, Track

#: A Level whose episodes time out after a few steps, for NEXT_STEP timelines.
SHORT_LEVEL = Level(level_id=7, name="short", max_episode_steps=4)


def circle_track(radius: float, points: int, half_width: float, track_id: int) -> Track:
    """A counter-clockwise circle starting at (radius, 0)."""
    theta = np.linspace(0.0, 2 * np.pi, points, endpoint=False)
    centerline = np.stack([radius * np.cos(theta), radius * np.sin(theta)], axis=1)
    return Track.from_centerline(centerline, half_width, track_id)


def check_donated_buffers_keep_their_addresses(env) -> None:
    """Donation updates an ``mjx_warp`` env's state in place: every physics
    buffer stays where it is across steps and resets (a reset must not hand
    a physics field's buffer to a Challenge output of its shape), every
    Challenge-state buffer across steps."""
    import jax
    import jax.numpy as jnp

    def addresses(tree):
        jax.block_until_ready(tree)
        return [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(tree) if leaf.size]

    env.reset(seed=2)
    action = jnp.zeros((env.num_envs, 2), jnp.float32)
    env.step(action)
    state, data = (addresses(part) for part in env.core_state())
    for _ in range(5):
        env.step(action)
    assert addresses(env.core_state()[0]) == state
    env.reset(seed=3)
    env.step(action.at[0].set(jnp.nan))
    env.step(action)
    assert addresses(env.core_state()[1]) == data
