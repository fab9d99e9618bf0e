"""The envs of a training run: the training env (this process's share of
Level 1's Train pool) and the validation env (Level 1's Validation
split), both built by `racing_stack.levels.level_env`."""

from __future__ import annotations

from racing_env import VecCarRacingEnv
from racing_stack import levels
from racing_stack.ppo.config import PPOConfig
from racing_stack.ppo.distributed import Group

__all__ = ["make_env", "make_validation_env"]


def make_env(config: PPOConfig, group: Group | None = None) -> VecCarRacingEnv:
    """The training env: ``config.worlds`` ``mjx_warp`` worlds on Level 1's
    Train pool (its first ``config.tracks`` rows, verified against the
    committed manifest), with ``config.max_episode_steps`` episodes; in a
    `Group` (default: the current one), this process's share of all the
    processes' worlds (`racing_stack.levels.level_env`)."""
    group = Group.current() if group is None else group
    return levels.level_env(config.worlds, levels.timed("ppo-train", config.max_episode_steps), split="train",
                            tracks=config.tracks, first_world=group.first_world(config.worlds))


def make_validation_env(config: PPOConfig, worlds: int | None = None,
                        max_episode_steps: int | None = None) -> VecCarRacingEnv:
    """The validation env: ``worlds`` (default ``config.validation_tracks``)
    ``mjx_warp`` worlds on Level 1's Validation split (its first 2 x
    ``worlds`` rows, at most the whole split; verified against the
    committed manifest), under Level 1 itself (its timeout: the episodes
    the Runner drives), or with ``max_episode_steps`` (control steps)
    Level 1 under that shorter timeout (a CPU smoke's: no lap it drives is
    the Runner's)."""
    from racing_stack.pools import SPLITS

    worlds = config.validation_tracks if worlds is None else worlds
    size = SPLITS["validation"].size
    if worlds > size:
        raise ValueError(f"the Validation split has {size} tracks, fewer than {worlds} worlds")
    level = levels.LEVEL_1 if max_episode_steps is None else levels.timed("ppo-validation", max_episode_steps)
    return levels.level_env(worlds, level, split="validation", tracks=min(2 * worlds, size))
