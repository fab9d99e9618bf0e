"""`CarRacingEnv`: the registered single-world Gymnasium env
(``ControllerLearning/CarRacing-v0``), a host/NumPy batch-one adapter over
`VecCarRacingEnv`.

It keeps the vector path's semantics for one world, except that after a
terminal step it requires an explicit `reset()` instead of autoresetting.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np

from racing_env.checks import integer_in, no_render_mode
from racing_env.config import Level, ProjectConfig
from racing_env.io import reset_option
from racing_env.tracks import Track, TrackPool
from racing_env.vector import VecCarRacingEnv

__all__ = ["CarRacingEnv"]


class CarRacingEnv(gymnasium.Env):
    """One world of the Challenge.

    Args:
        config: the car and clock (required).
        level: the Level (required).
        backend: ``"cpu_reference"`` or ``"mjx_warp"`` (required).
        track: one fixed Track, or
        track_pool: a TrackPool of this Level (exactly one of the two).
        render_mode: None only, what ``gymnasium.make(..., render_mode=)``
            passes on: the env renders nothing itself (``render_modes`` is
            empty); any other value is a ValueError naming the way to watch
            or record (`racing_env.render.EpisodeView` with the Runner).

    Observations are fresh NumPy arrays (scalars as 0-d float32 arrays);
    info holds the seven whitelisted fields, numeric ones as fresh 0-d
    arrays and ``benchmark_version`` as a str.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        *,
        config: ProjectConfig | None = None,
        level: Level | None = None,
        backend: str | None = None,
        track: Track | None = None,
        track_pool: TrackPool | None = None,
        render_mode: str | None = None,
    ) -> None:
        no_render_mode(render_mode, "CarRacingEnv")
        self.render_mode = None
        self._vec = VecCarRacingEnv(1, config=config, level=level, backend=backend, track=track, track_pool=track_pool)
        self.action_space = self._vec.single_action_space
        self.observation_space = self._vec.single_observation_space
        self._needs_reset = True

    @property
    def vector_env(self) -> VecCarRacingEnv:
        """The batch-one vector env this adapter drives."""
        return self._vec

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        """Start an episode.

        Args:
            seed: the root seed, an int in [0, 2**32) (``None`` continues
                with the next episode counter).
            options: ``{"track_index": i}`` picks TrackPool row i.
        """
        vec_options = _vector_options(options, len(self._vec.track_pool))
        super().reset(seed=seed)
        obs, info = self._vec.reset(seed=seed, options=vec_options)
        self._needs_reset = False
        return _first(obs), _first_info(info)

    def step(self, action):
        """One control step. An action that is not a finite float (2,)
        vector terminates the episode as ``invalid_action``."""
        if self._needs_reset:
            raise RuntimeError("the episode has ended (or never started): call reset() before step()")
        obs, reward, terminated, truncated, info = self._vec.step([action])
        terminated = bool(np.asarray(terminated)[0])
        truncated = bool(np.asarray(truncated)[0])
        self._needs_reset = terminated or truncated
        return _first(obs), float(np.asarray(reward)[0]), terminated, truncated, _first_info(info)


def _vector_options(options: dict | None, pool_size: int) -> dict | None:
    index = reset_option(options, "track_index")
    if index is None:
        return None
    return {"track_indices": [integer_in(index, "options['track_index']", 0, pool_size)]}


def _first(obs: dict[str, Any]) -> dict[str, np.ndarray]:
    return {key: np.array(value[0]) for key, value in obs.items()}


def _first_info(info: dict[str, Any]) -> dict[str, Any]:
    return {
        key: value if isinstance(value, str) else np.array(value[0]) for key, value in info.items()
    }
