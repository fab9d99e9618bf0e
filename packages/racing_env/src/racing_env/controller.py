"""The Controller interface every plugin implements, and the drawing surface
its ``render_callback`` writes to.

A controller sees only what a driver could: the public observation, the
public info fields and an immutable configuration. It never receives the
env, the TrackPool, row indices, reset options, the renderer or the
simulator. One instance lives for one episode.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, Protocol

import jax.numpy as jnp
import numpy as np

__all__ = ["BatchController", "Controller", "DebugDraw", "checked_action", "checked_actions"]


class DebugDraw(Protocol):
    """A write-only drawing surface in world coordinates (m). Commands are
    collected during ``render_callback`` and drawn once per frame with the
    latest public observation."""

    def line(self, points: Any, color: tuple[int, int, int] = (255, 255, 255), width: float = 1.0) -> None:
        """A polyline through ``points`` ([N, 2], m)."""

    def points(self, points: Any, color: tuple[int, int, int] = (255, 255, 255), size: float = 3.0) -> None:
        """Dots at ``points`` ([N, 2], m)."""

    def text(self, position: Any, text: str, color: tuple[int, int, int] = (255, 255, 255)) -> None:
        """``text`` at ``position`` ([2], m)."""


class Controller(abc.ABC):
    """The base class of a controller plugin (``controller.py`` defines
    exactly one concrete subclass).

    Args:
        obs: the episode's initial public observation (one world: a dict of
            NumPy arrays, the spaces of ``CarRacingEnv``).
        info: the public info fields of the reset.
        config: the immutable configuration: ``config["controller"]`` is the
            plugin's whole ``config.toml``; ``vehicle``, ``action``,
            ``level`` and ``benchmark`` are the Challenge's own values, read
            from the env the episode runs in.
    """

    def __init__(self, obs: Mapping[str, np.ndarray], info: Mapping[str, Any], config: Mapping[str, Any]) -> None:
        self.config = config

    @abc.abstractmethod
    def compute_control(self, obs: Mapping[str, np.ndarray], info: Mapping[str, Any] | None = None) -> np.ndarray:
        """The action for this observation: float32 [2], steering (rad) and
        longitudinal acceleration (m/s^2)."""

    def step_callback(self, action: np.ndarray, obs: Mapping[str, np.ndarray], reward: float, terminated: bool,
                      truncated: bool, info: Mapping[str, Any]) -> None:
        """After each step: the action applied and what it led to."""

    def episode_callback(self) -> None:
        """Once, when the episode has ended."""

    def render_callback(self, debug_draw: DebugDraw) -> None:
        """Once per rendered frame: draw on ``debug_draw`` (write-only)."""


class BatchController(abc.ABC):
    """The optional batched form of a plugin's controller (``controller.py``
    may define one concrete subclass beside its `Controller`): one
    instance drives every world's episodes of a run, with every acting
    world's observation in one call per step (`racing_env.runner.run`
    with ``batched=True``). It sees what a `Controller` sees, world by
    world; its episodes must be those its `Controller` drives, one world
    at a time (nothing may cross from one episode to the next, or from one
    world to another). It has no callbacks: the Runner calls `start` and
    `compute_controls` alone.

    Observations and infos come stacked: each field of the one-world
    dicts with a leading axis, one row a world, in the order of
    ``worlds``.

    Args:
        config: the immutable configuration (`Controller`'s).
        worlds: the env's worlds (world indices run from 0 to ``worlds`` - 1).
    """

    def __init__(self, config: Mapping[str, Any], worlds: int) -> None:
        self.config = config
        self.worlds = worlds

    @abc.abstractmethod
    def start(self, worlds: np.ndarray, obs: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> None:
        """Episodes start on ``worlds`` (int64 [K], distinct) from their
        initial observations ``obs`` and reset ``info`` (stacked, [K, ...]):
        whatever the controller keeps of each world starts afresh, as a new
        `Controller` would."""

    @abc.abstractmethod
    def compute_controls(self, worlds: np.ndarray, obs: Mapping[str, np.ndarray],
                         info: Mapping[str, Any]) -> np.ndarray:
        """The actions of ``worlds`` (int64 [K], distinct, each in an episode
        `start` began) for their observations (stacked, [K, ...]): [K, 2],
        steering (rad) and longitudinal acceleration (m/s^2) a row."""


def checked_action(returned: Any) -> np.ndarray:
    """What ``compute_control`` returned, as the action the env receives:
    float64 [2]. It must be two real numbers: an integer or floating dtype
    (bfloat16 included), never strings, complex, bool or object values,
    which a cast would coerce.

    Raises:
        TypeError: not an integer or floating dtype.
        ValueError: not shape [2].
    """
    returned = _real(returned, "compute_control must return 2 real numbers")
    if returned.shape != (2,):
        raise ValueError(f"compute_control must return 2 numbers (shape [2]), got shape {list(returned.shape)}")
    return returned.astype(np.float64)


def checked_actions(returned: Any, rows: int) -> np.ndarray:
    """What ``compute_controls`` returned for ``rows`` worlds, as the
    actions the env receives: float64 [rows, 2], two real numbers a row
    (`checked_action`'s types).

    Raises:
        TypeError: not an integer or floating dtype.
        ValueError: not shape [rows, 2].
    """
    returned = _real(returned, "compute_controls must return real numbers")
    if returned.shape != (rows, 2):
        raise ValueError(f"compute_controls must return [{rows}, 2] numbers, got shape {list(returned.shape)}")
    return returned.astype(np.float64)


def _real(returned: Any, rule: str) -> np.ndarray:
    """``returned`` as an array of an integer or floating dtype; a
    TypeError saying ``rule`` and the dtype otherwise."""
    returned = np.asarray(returned)
    if not (jnp.issubdtype(returned.dtype, jnp.floating) or jnp.issubdtype(returned.dtype, jnp.integer)):
        raise TypeError(f"{rule}, got dtype {returned.dtype}")
    return returned
