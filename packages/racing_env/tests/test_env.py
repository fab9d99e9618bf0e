"""The registered single-world adapter `CarRacingEnv`."""

from __future__ import annotations

import warnings

import gymnasium
import numpy as np
import pytest
from worlds import SHORT_LEVEL
from gymnasium.utils.env_checker import check_env
from racing_env import ENV_ID, LEVEL_0, CarRacingEnv, TerminationReason, level0_track
from racing_env.seeds import host_seed_word
from racing_env.types import INFO_FIELDS, OBSERVATION_FIELDS


@pytest.fixture()
def env(config) -> CarRacingEnv:
    return CarRacingEnv(config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())


def test_passes_gymnasiums_checker(env):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    # Expected: the action Box is in physical units, not [-1, 1], and the
    # unbounded observation fields (positions, velocities) have infinite bounds.
    expected = ("symmetric", "normalized", "infinity")
    unexpected = [w for w in caught if not any(word in str(w.message) for word in expected)]
    assert not unexpected, [str(w.message) for w in unexpected]


def test_registered_id(config):
    made = gymnasium.make(ENV_ID, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track())
    assert isinstance(made.unwrapped, CarRacingEnv)
    obs, info = made.reset(seed=0)
    assert set(obs) == set(OBSERVATION_FIELDS)


def test_render_mode_none_is_accepted_as_gymnasium_passes_it(config):
    made = gymnasium.make(ENV_ID, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track(),
                          render_mode=None)
    assert made.render_mode is None and made.unwrapped.metadata["render_modes"] == []


@pytest.mark.parametrize("mode", ["human", "rgb_array"])
def test_a_render_mode_is_refused_naming_the_way_to_watch(config, mode):
    with pytest.raises(ValueError, match=rf"render_mode must be None, got '{mode}'.*EpisodeView.*--render"):
        gymnasium.make(ENV_ID, config=config, level=LEVEL_0, backend="cpu_reference", track=level0_track(),
                       render_mode=mode)
    with pytest.raises(ValueError, match="render_mode must be None"):
        gymnasium.make_vec(ENV_ID, num_envs=1, vectorization_mode="vector_entry_point", config=config,
                           level=LEVEL_0, backend="cpu_reference", track=level0_track(), render_mode=mode)


def test_constructor_says_what_is_missing(config):
    with pytest.raises(TypeError, match="level, backend"):
        CarRacingEnv(config=config, track=level0_track())


def test_observation_and_info_are_fresh_numpy(env):
    obs, info = env.reset(seed=11)
    assert list(info) == list(INFO_FIELDS)
    for key, value in obs.items():
        assert isinstance(value, np.ndarray), key
    assert obs["yaw"].shape == () and obs["yaw"].dtype == np.float32
    assert obs["track_mask"].shape == (640,) and obs["track_mask"].dtype == np.int8
    assert isinstance(info["benchmark_version"], str)
    assert int(info["episode_seed"]) == host_seed_word(11, 0, 0, 0)
    again, _ = env.step(np.float32([0.0, 1.0]))[0], None
    for key in obs:
        assert not np.shares_memory(obs[key], again[key]), key


def test_terminal_step_requires_reset(env):
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(np.float32([np.nan, 0.0]))
    assert terminated and not truncated
    assert int(info["termination_reason"]) == TerminationReason.INVALID_ACTION
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.float32([0.0, 0.0]))
    env.reset()
    obs, reward, terminated, truncated, info = env.step(np.float32([0.0, 0.0]))
    assert not terminated and int(info["episode_seed"]) == host_seed_word(1, 0, 0, 1)


def test_step_before_reset_raises(env):
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.float32([0.0, 0.0]))


@pytest.mark.parametrize("action", [np.zeros(3), np.zeros((1, 2)), "go", None, [1.0, float("inf")]])
def test_bad_actions_end_the_episode(env, action):
    env.reset(seed=2)
    _, reward, terminated, truncated, info = env.step(action)
    assert terminated and int(info["termination_reason"]) == TerminationReason.INVALID_ACTION


def test_track_index_option(config, short_pool):
    env = CarRacingEnv(config=config, level=SHORT_LEVEL, backend="cpu_reference", track_pool=short_pool)
    for row in (2, 0):
        _, info = env.reset(seed=3, options={"track_index": row})
        assert int(info["track_id"]) == int(short_pool.track_id[row])
    with pytest.raises(ValueError, match="track_index"):
        env.reset(seed=3, options={"track_index": 3})
    with pytest.raises(TypeError, match="track_index"):
        env.reset(seed=3, options={"track_index": "1"})
    with pytest.raises(ValueError, match="unknown"):
        env.reset(seed=3, options={"track_indices": [1]})
