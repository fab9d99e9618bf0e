"""`racing_stack.levels`: the one place that builds a Level's env, and the
trainer's old names that moved (each still imported from its old place,
with a warning, for one release)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from racing_env import LEVEL_0, LEVEL_1, Level, level0_track
from racing_stack import levels


def test_a_fixed_track_env_is_the_levels_own():
    env = levels.level_env(1, LEVEL_0, track=level0_track(), backend="cpu_reference")
    assert env.num_envs == 1 and env.level == LEVEL_0 and env.first_world == 0
    np.testing.assert_array_equal(np.asarray(env.track_pool.track_length), [level0_track().track_length])


def test_a_split_env_draws_the_splits_first_rows():
    env = levels.level_env(3, levels.timed("short", 40), split="validation", tracks=2, first_world=5)
    assert env.level == Level(LEVEL_1.level_id, "short", 40) and env.first_world == 5
    assert env.track_pool.split == "validation" and len(env.track_pool.track_id) == 2


@pytest.mark.parametrize("source", [{}, {"split": "train", "track": "both"}])
def test_one_source_exactly(source):
    with pytest.raises(ValueError, match="give one of split and track"):
        levels.level_env(1, **source)


def test_a_split_out_of_range_is_refused():
    with pytest.raises(ValueError, match="split must be one of"):
        levels.level_env(1, split="dev")
    with pytest.raises(ValueError, match=r"size \(None or an int, for split 'test'\) must be in"):
        levels.level_env(1, split="test", tracks=0)


@pytest.mark.parametrize(("name", "home"), [("finish", "racing_stack.ppo.cli"),
                                            ("make_env", "racing_stack.ppo.envs"),
                                            ("make_validation_env", "racing_stack.ppo.envs"),
                                            ("resume_problem", "racing_stack.ppo.checkpoint"),
                                            ("whole_config", "racing_stack.ppo.checkpoint")])
def test_a_moved_name_still_comes_from_its_old_place_with_a_warning(name, home):
    train = importlib.import_module("racing_stack.ppo.train")
    with pytest.warns(DeprecationWarning, match=f"racing_stack.ppo.train.{name} moved to {home}.{name}"):
        moved = getattr(train, name)
    assert moved is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        train.nothing  # noqa: B018
