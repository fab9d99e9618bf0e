"""The Runner: a controller plugin driven for N episodes through the vector
env, one fresh controller per episode, with a JSON result and a summary.

Every world of the env runs its own episodes: on ``mjx_warp`` many at once,
on ``cpu_reference`` one. Episodes are handed to worlds as they free up,
until N have ended; the env's NEXT_STEP autoreset starts each world's next
episode (the call after a terminal one returns the new initial observation,
and only then is the new controller built). A controller that raises is
recorded with its traceback, its world is sent an invalid (NaN) action so
that the env ends that episode (``invalid_action``), and the Runner goes on;
``sys.exit()`` in a controller (`SystemExit`, any code) is such an error.
A `KeyboardInterrupt` (Ctrl-C) stops the run: `run` raises `RunInterrupted`
(a `KeyboardInterrupt`) holding the result of the episodes ended so far,
marked ``interrupted``.
The Level, vehicle and benchmark values come from the env itself
(`challenge_values`).

In-process (the default), controllers are trusted code that can reach
anything in this process, the env and the results included. With
``isolation`` (`racing_env.isolation.Isolation`), each episode's controller
runs in its own child process behind the same interface, with a wall-clock
limit per call; the episodes are accounted here alike. The worlds' children
are called at once (a thread per world waits on each child's answer), so a
step costs about one controller call, not one per world; in-process
controllers are called one after another.

Batched (``batched=True``), the plugin's `racing_env.controller.BatchController`
drives every world at once: one instance for the run, one ``start`` call
for the episodes that begin after a call, one ``compute_controls`` call
for the actions of every world in an episode. The episodes are accounted
alike; a batched call that raises (or returns other than [K, 2] real
numbers) ends the episodes of every world it named, each recorded with the
error. It has no callbacks (a view draws world 0 without the controller's
drawing). With ``isolation`` it runs in one child process
(`racing_env.isolation.ChildBatchController`), each call under the
isolation's limits; a failed call kills that child, and the episodes it
held end with the error.

With a view (`racing_env.render.EpisodeView`), world 0's episodes are
drawn: at every frame the view wants, the controller's ``render_callback``
draws on a fresh `racing_env.render.DrawList` and the view paints its
commands over the latest public observation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import jax
import numpy as np

from racing_env import checks
from racing_env.controller import BatchController, Controller, checked_action, checked_actions
from racing_env.episodes import REASONS, EpisodeResult, summarize
from racing_env.isolation import TRACK_FIELDS, ChildBatchController, ChildControllers, ControllerFailed, Isolation
from racing_env.plugins import Plugin, PluginError
from racing_env.render import DrawList, EpisodeView
from racing_env.types import TRACK_CAPACITY
from racing_env.vector import VecCarRacingEnv

__all__ = ["REASONS", "EpisodeResult", "RunInterrupted", "RunResult", "challenge_values", "run", "summarize"]

#: What a controller may raise without stopping the run: its episode ends as
#: ``invalid_action`` with the traceback. `SystemExit` too (a plugin calling
#: ``sys.exit()`` ends its episode, not the Runner); `KeyboardInterrupt` is not.
_CONTROLLER_ERRORS = (Exception, SystemExit)
#: Builds an episode's controller: ``make(world, obs, info)`` (one world's values).
_Make = Callable[[int, Mapping[str, Any], Mapping[str, Any]], Controller]
#: The most threads that wait on isolated controllers at once.
MAX_CALLERS = 256
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class RunResult:
    """A run: its settings, every episode in the order they ended, the summary.
    ``plugin`` is the plugin's directory, ``plugin_name`` what titles call
    it (`racing_env.plugins.Plugin.name`). ``interrupted``: Ctrl-C stopped
    it; ``episodes`` are those that ended before (the episodes then running
    are left out)."""

    plugin: str
    plugin_name: str
    backend: str
    worlds: int
    seed: int
    challenge: Mapping[str, Any]
    episodes: list[EpisodeResult]
    summary: dict[str, Any]
    seconds: float
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "plugin": self.plugin,
            "plugin_name": self.plugin_name,
            "backend": self.backend,
            "worlds": self.worlds,
            "seed": self.seed,
            "challenge": self.challenge,
            "summary": self.summary,
            "seconds": self.seconds,
            "interrupted": self.interrupted,
            "episodes": [dataclasses.asdict(e) for e in self.episodes],
        }


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (a `KeyboardInterrupt`) stopped `run`: ``result`` is the
    `RunResult` of the episodes that had ended, ``interrupted=True``."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(f"interrupted after {len(result.episodes)} ended episodes")
        self.result = result


class _World:
    """One world's current episode: its controller (or the error that ended it)."""

    def __init__(self, controller: Controller | None, error: str | None) -> None:
        self.controller = controller
        self.error = error
        self.steps = 0
        self.progress = 0.0


def challenge_values(env: Any) -> dict[str, Any]:
    """The Challenge-owned configuration, read from the env itself (a
    `VecCarRacingEnv`, or anything whose ``unwrapped.vector_env`` is one, as
    `CarRacingEnv` and its Gymnasium wrappers).

    Returns:
        ``{"vehicle": ProjectConfig fields, "action": {"low", "high"} (the
        single-world action bounds), "track": {"capacity"}, "level": Level
        fields, "benchmark": {"version"}}``.

    Raises:
        TypeError: ``env`` is neither.
    """
    vec = env if isinstance(env, VecCarRacingEnv) else getattr(getattr(env, "unwrapped", env), "vector_env", None)
    if not isinstance(vec, VecCarRacingEnv):
        raise TypeError(f"env must be a VecCarRacingEnv or a CarRacingEnv (wrapped or not), got {type(env).__name__}")
    space = vec.single_action_space
    return {
        "vehicle": dataclasses.asdict(vec.config),
        "action": {"low": [float(x) for x in space.low], "high": [float(x) for x in space.high]},
        "track": {"capacity": TRACK_CAPACITY},
        "level": dataclasses.asdict(vec.level),
        "benchmark": {"version": vec.benchmark_version},
    }


def run(plugin: Plugin, env: VecCarRacingEnv, episodes: int | None = None, seed: int = 0,
        progress: Callable[[int, int], None] | None = None, *,
        track_indices: Sequence[int] | None = None, view: EpisodeView | None = None,
        isolation: Isolation | None = None, record: Callable[[EpisodeResult], None] | None = None,
        batched: bool = False) -> RunResult:
    """Run ``plugin`` in ``env`` for ``episodes`` episodes, or once on each
    pool row of ``track_indices``.

    Args:
        plugin: a loaded plugin (`racing_env.plugins.load_plugin`).
        env: the vector env (either backend); its Level, vehicle and
            benchmark values are the controller's Challenge config.
        episodes: how many episodes to end, >= 1; the env's TrackPool
            choice (SeedSequence domain 2) picks their tracks, with
            replacement. Give this or ``track_indices``.
        seed: the root seed of the env's first reset.
        progress: called as ``progress(ended, total)`` after each ended episode.
        track_indices: pool rows to drive once each, in waves of
            ``env.num_envs`` worlds: each wave starts with an explicit
            reset (``options={"track_indices": ...}``; the first with
            ``seed``, the others continuing the episode counters) and ends
            when its last episode ends.
        view: draws world 0's episodes (the caller closes it).
        isolation: run each episode's controller in a child process with
            these limits (`racing_env.isolation`); None: in this process.
            The plugin may have been loaded with ``import_code=False``.
        record: called with each ended episode's `EpisodeResult`, as it
            ends (before ``progress``).
        batched: drive the plugin's `racing_env.controller.BatchController`
            (module docstring) instead of a `Controller` an episode (with
            ``isolation``, in one child process).

    Returns:
        The `RunResult`; episodes in the order they ended.

    Raises:
        PluginError: ``batched`` for a plugin without a BatchController,
            or one whose constructor raised (`ControllerFailed` in a child).
        RunInterrupted: a `KeyboardInterrupt` (Ctrl-C, or raised by the
            controller) stopped the run; it holds the partial result.
    """
    if not isinstance(env, VecCarRacingEnv):
        raise TypeError(f"env must be a VecCarRacingEnv, got {type(env).__name__}")
    if (episodes is None) == (track_indices is None):
        raise ValueError("give exactly one of episodes and track_indices")
    if episodes is not None:
        checks.integer_in(episodes, "episodes", 1)
    if track_indices is not None:
        rows = [_row(r, env) for r in track_indices]
        if not rows:
            raise ValueError("track_indices must name at least one pool row")
    if isolation is not None and not isinstance(isolation, Isolation):
        raise TypeError(f"isolation must be an Isolation or None, got {type(isolation).__name__}")
    if not isinstance(batched, bool):
        raise TypeError(f"batched must be a bool, got {type(batched).__name__}")
    challenge = challenge_values(env)
    config = plugin.config(challenge)
    start = time.perf_counter()
    ended: list[EpisodeResult] = []
    total = episodes if track_indices is None else len(rows)
    frames = None if view is None else _Frames(view, plugin.name, env.config.control_dt_s)

    def end(episode: EpisodeResult) -> None:
        ended.append(episode)
        if record is not None:
            record(episode)
        if progress is not None:
            progress(len(ended), total)

    def result(interrupted: bool) -> RunResult:
        return RunResult(plugin=str(plugin.directory), plugin_name=plugin.name, backend=env.backend,
                         worlds=env.num_envs, seed=seed, challenge=challenge, episodes=list(ended),
                         summary=summarize(ended), seconds=time.perf_counter() - start, interrupted=interrupted)

    try:
        with contextlib.ExitStack() as stack:
            batch = None  # built inside: a Ctrl-C while it starts is a run's too
            if batched and isolation is None:
                batch = _batch_controller(plugin, config, env.num_envs)
            elif batched:
                try:
                    batch = ChildBatchController(plugin.directory, challenge, isolation, env.num_envs)
                except ControllerFailed as error:
                    raise PluginError(f"{plugin.name}'s BatchController failed to start in its process: {error}") \
                        from None
                stack.callback(batch.close)
            pool = None
            if isolation is None:
                def make(world: int, obs: Mapping[str, Any], info: Mapping[str, Any]) -> Controller:
                    return plugin.load_class()(obs, info, config)
            else:
                # The pool is left after the children are killed (an exit stack
                # unwinds in reverse), so no thread still waits on a child then.
                pool = stack.enter_context(ThreadPoolExecutor(min(env.num_envs, MAX_CALLERS)))
                children = ChildControllers(plugin.directory, challenge, isolation, min(env.num_envs, total))
                make = stack.enter_context(children).start

            def drive(obs: Mapping[str, Any], info: Mapping[str, Any], count: int) -> None:
                if batch is None:
                    _drive(make, env, obs, info, count, ended, end, frames, pool)
                else:
                    _drive_batched(batch, env, obs, info, count, ended, end, frames)

            if track_indices is None:
                obs, info = env.reset(seed=seed)
                drive(obs, info, episodes)
            else:
                for first in range(0, total, env.num_envs):
                    wave = rows[first:first + env.num_envs]
                    # Idle worlds (a last, partial wave) drive wave[0] and are never read.
                    options = {"track_indices": wave + [wave[0]] * (env.num_envs - len(wave))}
                    obs, info = env.reset(seed=seed, options=options) if first == 0 else env.reset(options=options)
                    drive(obs, info, len(wave))
    except KeyboardInterrupt as stop:
        raise RunInterrupted(result(True)) from stop
    except SystemError as error:
        stop = _ctrl_c_in(error)
        if stop is None:
            raise
        raise RunInterrupted(result(True)) from stop
    return result(False)


def _row(value: object, env: VecCarRacingEnv) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"track_indices must hold integers, got {value!r}")
    if not 0 <= int(value) < len(env.track_pool):
        raise ValueError(f"track_indices holds {int(value)}, outside the env's {len(env.track_pool)} pool rows")
    return int(value)


def _drive(make: _Make, env: VecCarRacingEnv, obs: Mapping[str, Any], info: Mapping[str, Any],
           count: int, ended: list[EpisodeResult], end: Callable[[EpisodeResult], None],
           frames: _Frames | None, pool: ThreadPoolExecutor | None) -> None:
    """End ``count`` more episodes from a fresh reset's ``obs``/``info``,
    handing each to ``end`` (which appends it to ``ended``, in world order
    within a call): worlds start episodes in world order and again as they
    free up, until ``count`` have started; the others idle. Without a
    ``pool`` the controllers are called world by world; with one (isolated
    controllers), every world's calls of a phase at once: the actions, then
    the callbacks (and the ended episodes handed on), then the starts."""
    target = len(ended) + count
    host_obs, host_info = _host(obs), _host(info)
    started = min(env.num_envs, count)
    worlds: list[_World | None] = [None] * env.num_envs
    worlds[:started] = _each(pool, lambda w: _start(make, host_obs, host_info, w), range(started))
    pending = np.zeros(env.num_envs, bool)  # the last call ended the world's episode
    if frames is not None:
        frames.offer(None, worlds[0], host_obs, None)
    while len(ended) < target:
        # float64: the env itself converts, clipping finite values beyond
        # float32's range as it does for any host action.
        actions = np.zeros((env.num_envs, 2), np.float64)
        acting = [w for w, world in enumerate(worlds) if world is not None and not pending[w]]
        for w, action in zip(acting, _each(pool, lambda w: _act(worlds[w], _one(host_obs, w), _one(host_info, w)),
                                           acting)):
            actions[w] = action
        obs, reward, terminated, truncated, info = env.step(actions)
        host_obs, host_info = _host(obs), _host(info)
        reward, terminated, truncated = (np.asarray(x) for x in (reward, terminated, truncated))
        done = terminated | truncated
        before, reason = worlds[0], None
        starting, stepped, started = _sorted_worlds(worlds, pending, started, count)

        def notify(w: int) -> None:
            world = worlds[w]
            world.steps += 1
            world.progress = float(host_obs["track_progress"][w])
            if world.controller is not None:
                _callback(world, "step_callback", actions[w], _one(host_obs, w), float(reward[w]),
                          bool(terminated[w]), bool(truncated[w]), _one(host_info, w))
            if done[w] and world.controller is not None:
                _callback(world, "episode_callback")

        def finish(w: int) -> None:
            if done[w]:
                end(_result(w, worlds[w], host_info))
                worlds[w] = None
                pending[w] = True

        if pool is None:  # world by world: a start, or the callbacks and the end
            starts = set(starting)
            for w in sorted(starting + stepped):
                if w in starts:
                    worlds[w] = _start(make, host_obs, host_info, w)
                else:
                    notify(w)
                    finish(w)
        else:
            _each(pool, notify, stepped)
            for w in stepped:
                finish(w)
            for w, world in zip(starting, _each(pool, lambda w: _start(make, host_obs, host_info, w), starting)):
                worlds[w] = world
        if pending[0] and 0 in stepped:  # world 0's episode ended in this call
            reason = next(e.termination_reason for e in reversed(ended) if e.world == 0)
        if frames is not None:
            frames.offer(before, worlds[0], host_obs, reason)


def _batch_controller(plugin: Plugin, config: Mapping[str, Any], worlds: int) -> BatchController:
    """The plugin's BatchController for a run of ``worlds`` worlds.

    Raises:
        PluginError: the plugin defines none, or its constructor raised.
    """
    cls = plugin.load_batch_class()
    if cls is None:
        raise PluginError(f"{plugin.directory / 'controller.py'} defines no racing_env.BatchController: "
                          f"drive {plugin.name} without batched")
    try:
        return cls(config, worlds)
    except _CONTROLLER_ERRORS as error:
        _raise_ctrl_c_in(error)
        raise PluginError(f"{plugin.name}'s {cls.__name__} failed to start: {type(error).__name__}: {error}") \
            from error


def _drive_batched(controller: BatchController, env: VecCarRacingEnv, obs: Mapping[str, Any],
                   info: Mapping[str, Any], count: int, ended: list[EpisodeResult],
                   end: Callable[[EpisodeResult], None], frames: _Frames | None) -> None:
    """`_drive` with one `BatchController`: the episodes that begin after
    a call start in one ``start`` call, every world in an episode acts
    through one ``compute_controls`` call; a world whose episode's start or
    a call naming it failed sends NaN (its episode ends ``invalid_action``
    with the error), the others go on."""
    target = len(ended) + count
    host_obs, host_info = _host(obs), _host(info)
    started = min(env.num_envs, count)
    worlds: list[_World | None] = [None] * env.num_envs
    _begin(controller, worlds, list(range(started)), host_obs, host_info)
    pending = np.zeros(env.num_envs, bool)  # the last call ended the world's episode
    if frames is not None:
        frames.offer(None, worlds[0], host_obs, None)
    while len(ended) < target:
        # float64, as `_drive`'s; idle and resetting worlds send zeros, as there, and failed ones NaN.
        actions = np.zeros((env.num_envs, 2), np.float64)
        live = [w for w, world in enumerate(worlds) if world is not None and not pending[w]]
        acting = [w for w in live if worlds[w].error is None]
        if acting:
            named = np.asarray(acting, np.int64)
            try:
                info_rows = _rows(host_info, acting)
                # The tracks an isolated child keeps are not gathered (16 MB a call at 1,000 worlds).
                kept = isinstance(controller, ChildBatchController) and controller.keeps_tracks(named, host_obs,
                                                                                                info_rows)
                actions[named] = checked_actions(controller.compute_controls(
                    named, _rows(host_obs, acting, TRACK_FIELDS if kept else ()), info_rows), len(acting))
            except _CONTROLLER_ERRORS as error:
                _raise_ctrl_c_in(error)
                text = _error_text(error)
                for w in acting:
                    worlds[w].error = text
        for w in live:
            if worlds[w].error is not None:
                actions[w] = np.nan
        obs, reward, terminated, truncated, info = env.step(actions)
        host_info = _host(info)
        done = np.asarray(terminated) | np.asarray(truncated)
        before, reason = worlds[0], None
        starting, stepped, started = _sorted_worlds(worlds, pending, started, count)
        # A world's track changes only when an episode starts: the stepped
        # worlds' track rows (nearly all of the bytes) are the last read's.
        host_obs = _host(obs, None if starting else host_obs)
        for w in stepped:
            world = worlds[w]
            world.steps += 1
            world.progress = float(host_obs["track_progress"][w])
            if done[w]:
                end(_result(w, world, host_info))
                worlds[w] = None
                pending[w] = True
                if w == 0:
                    reason = ended[-1].termination_reason
        _begin(controller, worlds, starting, host_obs, host_info)
        if frames is not None:
            frames.offer(before, worlds[0], host_obs, reason)


def _sorted_worlds(worlds: list[_World | None], pending: np.ndarray, started: int,
                   count: int) -> tuple[list[int], list[int], int]:
    """After a call: the worlds for which it was their NEXT_STEP reset
    (their ``pending`` mark and episode cleared) that start the next
    episodes, while fewer than ``count`` have started, and the worlds in an
    episode that it stepped, each in world order; and how many have
    started since."""
    starting: list[int] = []
    stepped: list[int] = []
    for w in range(len(worlds)):
        if pending[w]:  # this call was the world's NEXT_STEP reset
            pending[w] = False
            worlds[w] = None
            if started < count:
                starting.append(w)
                started += 1
        elif worlds[w] is not None:
            stepped.append(w)
    return starting, stepped, started


def _begin(controller: BatchController, worlds: list[_World | None], starting: list[int],
           obs: Mapping[str, Any], info: Mapping[str, Any]) -> None:
    """Start the episodes of the ``starting`` worlds in one ``start`` call
    (a raise is each one's error)."""
    if not starting:
        return
    for w in starting:
        worlds[w] = _World(None, None)
    try:
        controller.start(np.asarray(starting, np.int64), _rows(obs, starting), _rows(info, starting))
    except _CONTROLLER_ERRORS as error:
        _raise_ctrl_c_in(error)
        text = _error_text(error)
        for w in starting:
            worlds[w].error = text


def _rows(tree: Mapping[str, Any], worlds: list[int], left_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of ``worlds`` (in that order), stacked; strings as they
    are; the fields named in ``left_out`` None."""
    return {k: None if k in left_out else v if isinstance(v, str) else v[worlds] for k, v in tree.items()}


def _each(pool: ThreadPoolExecutor | None, function: Callable[[int], _T], worlds: Sequence[int]) -> list[_T]:
    """``function`` on each world, one after another without a pool (or for
    one world), else at once on ``pool``; the results in the worlds' order."""
    if pool is None or len(worlds) < 2:
        return [function(w) for w in worlds]
    return list(pool.map(function, worlds))


class _Frames:
    """World 0's frames for a view: which controller draws, and the caption."""

    def __init__(self, view: EpisodeView, name: str, control_dt_s: float) -> None:
        self.view = view
        self.name = name
        self.dt = control_dt_s
        self.episode = 0

    def offer(self, before: _World | None, after: _World | None, obs: Mapping[str, Any],
              reason: str | None) -> None:
        """Offer world 0's frame after a call: ``before``/``after`` are its
        episode before and after the call (an episode that just ended is
        drawn once more, with its ``reason``); an idle world is not drawn."""
        world = after if after is not None else before
        if after is not None and after is not before:
            self.episode += 1
        if world is None or not self.view.wants_frame(final=reason is not None):
            return
        draw = DrawList()
        if world.controller is not None:
            _callback(world, "render_callback", draw)
        one = _one(obs, 0)
        speed = float(np.hypot(*np.asarray(one["velocity_body"], np.float64)))
        caption = (f"{self.name}  episode {self.episode}  {world.steps * self.dt:6.2f} s  {speed:5.1f} m/s  "
                   f"progress {100 * float(one['track_progress']):5.1f}%")
        if reason is not None:
            caption += f"  {reason}"
        self.view.show(one, draw.drain(), caption)


def _host(tree: Mapping[str, Any], kept: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One device-to-host read of every numeric field; with ``kept`` (an
    earlier read of the same env's observation), its `TRACK_FIELDS` are
    taken from there instead of read (the worlds on another track since
    must not be read from it)."""
    numeric = {k: v for k, v in tree.items() if not isinstance(v, str) and (kept is None or k not in TRACK_FIELDS)}
    host = jax.device_get(numeric)
    if kept is not None:
        host.update({k: kept[k] for k in TRACK_FIELDS if k in kept and k in tree})
    return {**{k: np.asarray(v) for k, v in host.items()}, **{k: v for k, v in tree.items() if isinstance(v, str)}}


def _one(tree: Mapping[str, Any], w: int) -> dict[str, Any]:
    return {k: v if isinstance(v, str) else v[w] for k, v in tree.items()}


def _start(make: _Make, obs: Mapping[str, Any], info: Mapping[str, Any], w: int) -> _World:
    try:
        return _World(make(w, _one(obs, w), _one(info, w)), None)
    except _CONTROLLER_ERRORS as error:
        _raise_ctrl_c_in(error)
        return _World(None, _error_text(error))


def _act(world: _World, obs: Mapping[str, Any], info: Mapping[str, Any]) -> np.ndarray:
    """The controller's action (`checked_action`), or NaN (an invalid
    action that ends the episode) once it has raised or returned something
    that is not two real numbers."""
    if world.controller is not None:
        try:
            return checked_action(world.controller.compute_control(obs, info))
        except _CONTROLLER_ERRORS as error:
            _raise_ctrl_c_in(error)
            world.error = _error_text(error)
            world.controller = None
    return np.full(2, np.nan)


def _callback(world: _World, name: str, *args: Any) -> None:
    try:
        getattr(world.controller, name)(*args)
    except _CONTROLLER_ERRORS as error:
        _raise_ctrl_c_in(error)
        world.error = _error_text(error)
        world.controller = None


def _ctrl_c_in(error: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C behind ``error``, if any: a `KeyboardInterrupt` among its
    causes and contexts. A Ctrl-C that lands in a C callback (NumPy's dtype
    lookup, say), in the env's step or in a controller's call, surfaces as
    a SystemError caused by it, which a controller may wrap in an error of
    its own; it stops the run, it is not the controller's error."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _raise_ctrl_c_in(error: BaseException) -> None:
    """Raise the Ctrl-C behind a controller's ``error`` (`_ctrl_c_in`), if any."""
    stop = _ctrl_c_in(error)
    if stop is not None:
        raise stop


def _error_text(error: BaseException) -> str:
    """The recorded error: a child's own account (`ControllerFailed`), else
    the traceback being handled."""
    return str(error) if isinstance(error, ControllerFailed) else traceback.format_exc()


def _result(w: int, world: _World, info: Mapping[str, Any]) -> EpisodeResult:
    return EpisodeResult.ended(w, info, world.progress, world.steps, world.error)
