"""The controllers we ship: the template waits for the timeout, the
pursuit reference completes a lap of Level 0 on the MuJoCo C backend."""

import numpy as np
import pytest

from racing_env import LEVEL_0, ProjectConfig, VecCarRacingEnv, level0_track
from racing_env.plugins import PURSUIT, load_plugin
from racing_env.runner import run


@pytest.fixture(scope="module")
def level0():
    return VecCarRacingEnv(1, config=ProjectConfig(), level=LEVEL_0, backend="cpu_reference", track=level0_track())


def test_pursuit_completes_a_lap_of_level_0(level0):
    (episode,) = run(load_plugin(PURSUIT), level0, episodes=1, seed=0).episodes
    assert episode.termination_reason == "success" and episode.lap_completed and episode.error is None
    assert episode.progress == pytest.approx(1.0)
    # 742 m: a lap well under the 79.4 s timeout (measured 43.4 s).
    assert 20.0 < episode.lap_time_s < 60.0
    assert episode.lap_time_s == pytest.approx(episode.steps * ProjectConfig().control_dt_s)


def test_pursuit_actions_stay_in_the_action_space(level0):
    plugin = load_plugin(PURSUIT)
    from racing_env.plugins import challenge_values

    obs, info = level0.reset(seed=1)
    one = {k: np.asarray(v)[0] for k, v in obs.items()}
    controller = plugin.load_class()(one, {}, plugin.config(challenge_values(level0)))
    action = controller.compute_control(one)
    space = level0.single_action_space
    assert action.dtype == np.float32 and action.shape == (2,)
    assert np.all(action >= space.low) and np.all(action <= space.high)
