"""The isolated evaluation mode: each controller in a child process.

`ChildControllers` (one per run) builds every episode's controller in a
fresh child process (``multiprocessing``'s ``spawn``: the parent runs JAX's
threads, so it never forks) and hands the Runner a `ChildController`,
which has the `Controller` interface: the Runner's episode accounting is
the same code in both modes. The parent sends each call's arguments (the
public observation, the public info fields, the step's action and reward:
NumPy arrays and plain Python values, pickled); the child answers in JSON
only (the action as two numbers, a batched call's actions as their
float64 bytes in one hexadecimal string, the draw commands as lists),
which the parent parses without running any code of the child's and checks again
(the action as `checked_action` does, every draw command through
`racing_env.render.DrawList`). The Runner, the env and the results stay in
the parent.

A child that raises (any `BaseException`: `SystemExit` and
`KeyboardInterrupt` too), exits, crashes, runs past a call's wall-clock
limit, exceeds its memory limit or answers out of protocol is
killed; the call raises `ControllerFailed` with what happened, and the
Runner records it as the episode's controller error.

Each child is a session and process group of its own: a signal the plugin
sends to its group (``os.killpg(0, ...)``) reaches its own processes, not
the run's or the caller's pipeline. A child is killed with its whole group
(the processes the plugin started and left in it), and on Linux the kernel
kills it when the evaluating process ends, however it ends (SIGKILL
included: ``PR_SET_PDEATHSIG``), and the run's reaper (`racing_env._reaper`)
then kills its group. On Linux (x86-64, aarch64) a seccomp
filter refuses the child's signals to the evaluating process, its
ancestors and its group, and its leaving its own group
(`racing_env._seccomp`); where it cannot be installed the parent says so
once. What a plugin can still do, as the user it runs as: signal
processes the filter does not know (those that join the evaluator's
group later, the run's other children). While the child of
an episode runs, the next one starts (a warm spare), so a new episode
rarely waits for a process to start.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import multiprocessing
import os
import resource
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from racing_env import checks
from racing_env._reaper import REAPER
from racing_env._seccomp import guard_signals, hide_memory
from racing_env.controller import BatchController, Controller, DebugDraw, checked_action, checked_actions
from racing_env.plugins import PluginError, load_plugin
from racing_env.render import DrawList

__all__ = ["DEFAULT_CALL_TIMEOUT_S", "DEFAULT_MEMORY_LIMIT_MB", "DEFAULT_START_TIMEOUT_S", "MAX_MEMORY_LIMIT_MB",
           "TRACK_FIELDS", "ChildController", "ChildControllers", "ControllerFailed", "Isolation", "check_plugin"]

#: The default wall-clock limit of one controller call (s).
DEFAULT_CALL_TIMEOUT_S = 5.0
#: The default limit of an episode's start (s): the process start-up, the
#: plugin's import and its constructor.
DEFAULT_START_TIMEOUT_S = 60.0
#: The default memory limit of a child (MiB; its own imports take a few hundred).
DEFAULT_MEMORY_LIMIT_MB = 4096
#: The end of the memory limits a child takes (MiB): 2**40 MiB in bytes is 2**60, within a C long.
MAX_MEMORY_LIMIT_MB = 2**40
#: The observation fields of a world's track, fixed for an episode: a batched child keeps them (`ChildBatchController`).
TRACK_FIELDS = ("centerline", "left_boundary", "right_boundary", "track_mask", "track_length")
#: The largest reply a child may send (bytes): a frame's 100,000 points as JSON fit.
_MAX_REPLY_BYTES = 64 << 20
_SPAWN = multiprocessing.get_context("spawn")


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The limits of the isolated mode.

    Attributes:
        call_timeout_s: wall-clock limit (s, > 0) of each call of a running
            controller (``compute_control``, a callback), from the request
            sent to the whole answer received.
        start_timeout_s: wall-clock limit (s, > 0) of an episode's start:
            the child's start-up where it is not ready yet, the plugin's
            import and its constructor.
        memory_limit_mb: the child's memory limit (``RLIMIT_DATA``: its
            heap and its private writable mappings, where its allocations
            go; MiB, in [1024, 2**40): in bytes a C long holds it), set
            once its own imports are done; None: none. Not its address
            space: libraries and reserved, untouched ranges (each thread's
            malloc arena, a CUDA context's) are not memory it uses, and an
            address-space limit refused threads on a machine of many
            cores. Shared mappings (``mmap`` of anonymous shared memory,
            ``/dev/shm``) and GPU memory are not counted.
    """

    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB

    def __post_init__(self) -> None:
        for name in ("call_timeout_s", "start_timeout_s"):
            object.__setattr__(self, name, checks.positive(getattr(self, name), name))
        if self.memory_limit_mb is not None:  # a NumPy int would overflow the child's shift to bytes
            limit = checks.integer_in(self.memory_limit_mb, "memory_limit_mb", 1024, MAX_MEMORY_LIMIT_MB, "2**40")
            object.__setattr__(self, "memory_limit_mb", limit)


_UNGUARDED_SAID = threading.Event()


def _say_unguarded(reason: str) -> None:
    """Say once a process, on stderr, that the isolated children run
    without the signal guard, and why."""
    if not _UNGUARDED_SAID.is_set():
        _UNGUARDED_SAID.set()
        warnings.warn(f"isolated controllers run without the signal guard ({reason}): a plugin can signal the "
                      f"evaluating process and its group by their ids (the Runner page says what is left open)",
                      RuntimeWarning, stacklevel=3)


class ControllerFailed(Exception):
    """A child's controller call failed: ``str(error)`` says how (the
    child's traceback, or what happened to its process)."""


class _Child:
    """One child process and the parent's end of its pipe."""

    def __init__(self, directory: Path, challenge: Mapping[str, Any], isolation: Isolation) -> None:
        self.isolation = isolation
        self._closing = threading.Lock()
        self._closed = False
        self._first = True  # the child says first whether its signal guard holds
        hide_memory()  # no child may open this process's memory
        self.conn, theirs = _SPAWN.Pipe()
        self.process = _SPAWN.Process(target=_serve, args=(theirs, directory, dict(challenge),
                                                            isolation.memory_limit_mb, os.getpid(), REAPER.pid()),
                                      daemon=True)
        self.process.start()
        REAPER.watch(self.process.pid)  # the child's group, killed if this process ends first
        theirs.close()
        # A child that stops reading or stalls mid-answer cannot block the parent past the call limit.
        seconds = int(isolation.call_timeout_s)
        micros = int((isolation.call_timeout_s - seconds) * 1e6)
        with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
            for option in (socket.SO_SNDTIMEO, socket.SO_RCVTIMEO):
                sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", seconds, micros))

    def call(self, method: str, args: tuple, timeout_s: float) -> Any:
        """The child's answer to ``method(*args)``; `ControllerFailed`
        (the child killed) when it raised or failed. The first call first
        reads the child's word on its signal guard, sent before any of the
        plugin's code ran (within the same limit)."""
        end = time.monotonic() + timeout_s
        if self._first:
            hello = self._receive(method, timeout_s, end, send=None)
            if set(hello) != {"guard"} or not isinstance(hello["guard"], (str, type(None))):
                self.close()
                raise ControllerFailed(f"the controller's process answered {method} out of protocol")
            self._first = False
            if hello["guard"] is not None:
                _say_unguarded(hello["guard"])
        reply = self._receive(method, timeout_s, end, send=(method, args))
        if set(reply) not in ({"ok"}, {"error"}):
            self.close()
            raise ControllerFailed(f"the controller's process answered {method} out of protocol")
        if "error" in reply:
            self.close()
            raise ControllerFailed(str(reply["error"]))
        return reply["ok"]

    def _receive(self, method: str, timeout_s: float, end: float, send: tuple | None) -> dict:
        """Send ``send`` (if any), then the child's next message, a JSON
        object, by the monotonic time ``end`` (``method``'s limit of
        ``timeout_s`` from its start)."""
        try:
            if send is not None:
                self.conn.send(send)
            ready = self.conn.poll(max(0.0, end - time.monotonic()))
            data = self.conn.recv_bytes(_MAX_REPLY_BYTES) if ready else b""
        except (EOFError, OSError) as error:
            raise ControllerFailed(self._died(method, error)) from None
        if not ready:
            self.close()
            raise ControllerFailed(f"{method} ran past its {timeout_s:g} s wall-clock limit; "
                                   "the controller's process was killed")
        try:
            reply = json.loads(data)
        except (ValueError, RecursionError):
            reply = None
        if not isinstance(reply, dict):
            self.close()
            raise ControllerFailed(f"the controller's process answered {method} out of protocol")
        return reply

    def _died(self, method: str, error: BaseException) -> str:
        self.process.join(1.0)
        code = self.process.exitcode
        self.close()
        if code is None:
            return f"the controller's process broke its pipe during {method} ({type(error).__name__}: {error})"
        if code < 0:
            return f"the controller's process was killed by {signal.Signals(-code).name} during {method}"
        return f"the controller's process exited with status {code} during {method}"

    def close(self) -> None:
        """Kill the process (if it still runs) and close the pipe; once,
        whichever thread asks first (a caller whose call failed, or the run
        ending), the others return at once."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        try:  # the child leads its own group: the processes it started and left there go with it
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone (a reaped child leads no group)
            pass
        REAPER.release(self.process.pid)  # the group is killed; its id may be given again once it is empty
        if self.process.exitcode is None:
            self.process.kill()
        self.process.join()
        self.conn.close()


class ChildController(Controller):
    """A controller that lives in a child process: each method sends its
    arguments there and returns what the child's controller returned
    (checked again here). Raises `ControllerFailed` when the call fails."""

    def __init__(self, child: _Child, obs: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> None:
        self.config = None  # the configuration lives in the child
        self._child = child
        child.call("__init__", (dict(obs), dict(info)), child.isolation.start_timeout_s)

    def _call(self, method: str, *args: Any) -> Any:
        return self._child.call(method, args, self._child.isolation.call_timeout_s)

    def compute_control(self, obs: Mapping[str, np.ndarray], info: Mapping[str, Any] | None = None) -> np.ndarray:
        """The child's action: float64 [2]."""
        value = self._call("compute_control", dict(obs), None if info is None else dict(info))
        if (not isinstance(value, list) or len(value) != 2
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)):
            self._child.close()
            raise ControllerFailed("the controller's process answered compute_control out of protocol")
        return np.array(value, np.float64)

    def step_callback(self, action: np.ndarray, obs: Mapping[str, np.ndarray], reward: float, terminated: bool,
                      truncated: bool, info: Mapping[str, Any]) -> None:
        self._call("step_callback", np.asarray(action), dict(obs), reward, terminated, truncated, dict(info))

    def episode_callback(self) -> None:
        self._call("episode_callback")

    def render_callback(self, debug_draw: DebugDraw) -> None:
        """The child's controller draws on its own surface; its commands are
        drawn again on ``debug_draw``, which checks each one."""
        commands = self._call("render_callback")
        if not isinstance(commands, list):
            self._child.close()
            raise ControllerFailed("the controller's process answered render_callback out of protocol")
        for command in commands:
            if not (isinstance(command, list) and len(command) == 5 and command[0] in ("line", "points", "text")):
                self._child.close()
                raise ControllerFailed("the controller's process answered render_callback out of protocol")
            kind, points, color, size, text = command
            if kind == "line":
                debug_draw.line(points, color=tuple(color), width=size)
            elif kind == "points":
                debug_draw.points(points, color=tuple(color), size=size)
            else:
                debug_draw.text(points, text, color=tuple(color))


class ChildBatchController(BatchController):
    """A plugin's `BatchController` in one child process, under the same
    limits as an episode's controller: its construction and each `start`
    within ``start_timeout_s``, each `compute_controls` within
    ``call_timeout_s``, the child's memory within ``memory_limit_mb``. A
    failed call (`ControllerFailed`) kills the child, and with it what it
    kept of every world: a later call naming a world whose episode began
    in a dead child fails too, and the next `start` begins a fresh child.
    `close` kills the child.

    A world's track (`TRACK_FIELDS`, nearly all of an observation's
    bytes) crosses to the child once, with its episode's `start`: a
    `compute_controls` call leaves the track fields out where every world
    it names is on the track its episode began on (its info's track id;
    the fields' shapes and types as the child keeps them), and the child
    fills in each world's rows from what it kept, a fresh copy a call;
    otherwise it sends them whole. The plugin gets the same observation
    either way. A caller that asks `keeps_tracks` first may pass those
    fields as None (the Runner does: it gathers no rows the child keeps).

    Raises:
        PluginError: the plugin defines no BatchController.
        ControllerFailed: its construction failed in the child.
    """

    def __init__(self, directory: Path, challenge: Mapping[str, Any], isolation: Isolation, worlds: int) -> None:
        super().__init__(None, worlds)  # the configuration lives in the child
        self._args = (Path(directory), dict(challenge), isolation)
        self._started: set[int] = set()  # the worlds whose episodes began in the current child
        self._tracks = np.full(worlds, -1, np.int64)  # the track id the child keeps for each world (-1: none)
        self._layout: tuple | None = None  # the track fields' shapes and types the child keeps
        self._child: _Child | None = None
        self._child = self._new_child()

    def _new_child(self) -> _Child:
        child = _Child(*self._args)
        try:
            defined = child.call("batch_init", (self.worlds,), child.isolation.start_timeout_s)
        except ControllerFailed:
            child.close()
            raise
        if not defined:
            child.close()
            raise PluginError(_no_batch_controller(self._args[0]))
        return child

    def _call(self, method: str, args: tuple, timeout_s: float) -> Any:
        try:
            return self._child.call(method, args, timeout_s)
        except ControllerFailed:
            self._started.clear()  # the child is dead: what it kept of every world is gone
            self._tracks[:] = -1
            self._layout = None
            self._child = None
            raise

    def start(self, worlds: np.ndarray, obs: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> None:
        if self._child is None:
            self._child = self._new_child()
        self._tracks[np.asarray(worlds, np.int64)] = -1  # kept anew by the call below, or by none
        layout = _layout(obs)
        if layout != self._layout:  # the child keeps these anew: what it kept of the other worlds is gone
            self._tracks[:] = -1
        self._call("batch_start", (worlds, dict(obs), dict(info)), self._child.isolation.start_timeout_s)
        self._started.update(int(w) for w in worlds)
        self._layout = layout
        ids = _track_ids(info, len(worlds))
        if ids is not None and layout is not None:
            self._tracks[np.asarray(worlds, np.int64)] = ids

    def keeps_tracks(self, worlds: np.ndarray, obs: Mapping[str, Any], info: Mapping[str, Any]) -> bool:
        """Whether the child keeps the track of each of ``worlds`` (int64
        [K]) that ``info`` (stacked, [K, ...]) names, in the shapes and
        types of ``obs``'s track fields (a row a world, of these worlds or
        of all): then a `compute_controls` call for them leaves the fields
        out, and its caller may pass them as None without gathering them."""
        return self._layout is not None and _layout(obs) == self._layout and self._kept(worlds, info)

    def _kept(self, worlds: np.ndarray, info: Mapping[str, Any]) -> bool:
        ids = _track_ids(info, len(worlds))
        return ids is not None and np.array_equal(self._tracks[np.asarray(worlds, np.int64)], ids)

    def compute_controls(self, worlds: np.ndarray, obs: Mapping[str, np.ndarray],
                         info: Mapping[str, Any]) -> np.ndarray:
        lost = [int(w) for w in worlds if int(w) not in self._started]
        if self._child is None or lost:
            raise ControllerFailed(f"worlds {lost} began their episodes in a controller process that failed since")
        sent = dict(obs)
        left_out = [k for k in TRACK_FIELDS if k in sent and sent[k] is None]
        if left_out:  # by a caller that asked `keeps_tracks`: all of them, for worlds whose tracks the child keeps
            if len(left_out) < len(TRACK_FIELDS) or self._layout is None or not self._kept(worlds, info):
                raise ValueError(f"compute_controls: the track fields {left_out} of worlds "
                                 f"{np.asarray(worlds).tolist()} are None, but the controller's process keeps no "
                                 "track of theirs to fill them in (or only some are None)")
        elif self.keeps_tracks(worlds, sent, info):
            sent.update(dict.fromkeys(TRACK_FIELDS))  # the child's own copy of each world's track fills them in
        value = self._call("compute_controls", (worlds, sent, dict(info)), self._child.isolation.call_timeout_s)
        try:
            return checked_actions(_actions(value, len(worlds)), len(worlds))
        except (TypeError, ValueError):
            self.close()
            raise ControllerFailed("the controller's process answered compute_controls out of protocol") from None

    def close(self) -> None:
        """Kill the child, if one runs."""
        child, self._child = self._child, None
        self._started.clear()
        self._tracks[:] = -1
        self._layout = None
        if child is not None:
            child.close()


class ChildControllers:
    """The children of one run (a context manager: leaving it kills every
    child still running). `start` and `release` may be called from several
    threads at once, for different worlds; once `close` has run, `start`
    raises `ControllerFailed`.

    Args:
        directory: the plugin directory (`racing_env.plugins.Plugin.directory`).
        challenge: the Challenge values (`racing_env.runner.challenge_values`);
            each child builds the controller's configuration from them.
        isolation: the limits.
        spares: children kept started ahead of need (the worlds that run at once).
    """

    def __init__(self, directory: Path, challenge: Mapping[str, Any], isolation: Isolation, spares: int) -> None:
        if not isinstance(isolation, Isolation):
            raise TypeError(f"isolation must be an Isolation, got {type(isolation).__name__}")
        self._args = (Path(directory), dict(challenge), isolation)
        self._spares: list[_Child] = []
        self._spare_count = spares
        self._worlds: dict[int, _Child] = {}
        self._lock = threading.Lock()  # guards the three above and _closed
        self._closed = False

    def __enter__(self) -> ChildControllers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, world: int, obs: Mapping[str, np.ndarray], info: Mapping[str, Any]) -> ChildController:
        """``world``'s next episode's controller, in a fresh child (the
        world's previous child is killed)."""
        self.release(world)
        with self._lock:  # starting a process returns at once; its import runs in the child
            if self._closed:
                raise ControllerFailed("the run has ended; no controller starts")
            child = self._spares.pop(0) if self._spares else _Child(*self._args)
            self._worlds[world] = child
            while len(self._spares) < self._spare_count:
                self._spares.append(_Child(*self._args))
        return ChildController(child, obs, info)

    def release(self, world: int) -> None:
        """Kill ``world``'s child, if it has one."""
        with self._lock:
            child = self._worlds.pop(world, None)
        if child is not None:
            child.close()

    def close(self) -> None:
        """Kill every child."""
        with self._lock:
            self._closed = True
            children = [*self._worlds.values(), *self._spares]
            self._worlds.clear()
            self._spares.clear()
        errors = []
        for child in children:  # every child is killed, whatever one of them raises
            try:
                child.close()
            except OSError as error:
                errors.append(error)
        if errors:
            raise errors[0]


def check_plugin(directory: Path, isolation: Isolation, batched: bool = False) -> None:
    """Import the plugin in a child, as `racing_env.plugins.load_plugin`
    does in this process, so that its code never runs here.

    Args:
        directory: the plugin directory.
        isolation: the child's limits (the check within ``start_timeout_s``).
        batched: also check that it defines a BatchController (a batched
            run's `ChildBatchController` needs one).

    Raises:
        PluginError: it does not import, or does not define exactly one
            concrete Controller subclass (nor more than one BatchController);
            batched, it defines no BatchController (`ChildBatchController`'s
            message); or the child failed within its limits.
    """
    child = _Child(directory, {}, isolation)
    try:
        refused = child.call("check", (batched,), isolation.start_timeout_s)
    except ControllerFailed as error:
        raise PluginError(f"plugin {directory} could not be checked in a child process: {error}") from None
    finally:
        child.close()
    if refused is not None:
        raise PluginError(str(refused))


def _no_batch_controller(directory: Path) -> str:
    """Why a batched isolated run cannot drive the plugin in ``directory``."""
    return f"{Path(directory) / 'controller.py'} defines no racing_env.BatchController"


def _detach(parent: int, reaper: int) -> str | None:
    """Make this child a session and process group of its own and, on
    Linux, have the kernel kill it when ``parent`` (the evaluating process)
    ends (a child whose parent ended before that exits at once), and
    refuse its signals to ``parent`` and those around it, ``reaper``
    (`racing_env._reaper`) included (`racing_env._seccomp.guard_signals`).
    None, or why the signal guard does not hold."""
    os.setsid()
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    return guard_signals(parent, (reaper,))


def _actions(reply: Any, rows: int) -> np.ndarray:
    """A batched child's actions for ``rows`` worlds from its reply: the
    float64 [rows, 2] bytes (little-endian) in hexadecimal, exact, and
    about ten times faster to write and read than a JSON list of 2,000
    numbers (1-2 ms of a call). ValueError: not that."""
    if not isinstance(reply, str) or len(reply) != rows * 32:
        raise ValueError(f"expected {rows * 32} hexadecimal digits")
    return np.frombuffer(bytes.fromhex(reply), "<f8").reshape(rows, 2)


def _layout(obs: Mapping[str, Any]) -> tuple | None:
    """Each of `TRACK_FIELDS`' shape a row and type in ``obs``, or None where one is missing."""
    if not all(k in obs for k in TRACK_FIELDS):
        return None
    return tuple((np.shape(obs[k])[1:], np.asarray(obs[k]).dtype.str) for k in TRACK_FIELDS)


def _track_ids(info: Mapping[str, Any], rows: int) -> np.ndarray | None:
    """The track id [rows] of each row of ``info``, or None where it names
    none: not integers, another shape, or an id outside [0, 2**63) (-1
    marks a world whose track the child does not keep)."""
    ids = info.get("track_id") if isinstance(info, Mapping) else None
    if ids is None:
        return None
    ids = np.asarray(ids)
    if ids.shape != (rows,) or ids.dtype.kind not in "ui":
        return None
    if rows and (int(ids.min()) < 0 or int(ids.max()) >= 2**63):
        return None
    return ids.astype(np.int64)


class _KeptTracks:
    """In a batched child: each of its ``worlds`` worlds' `TRACK_FIELDS`
    as its episode's start gave them, to fill in the calls that leave
    them out (None)."""

    def __init__(self, worlds: int) -> None:
        self.worlds = worlds
        self._rows: dict[str, np.ndarray] = {}

    def keep(self, worlds: np.ndarray, obs: Mapping[str, Any]) -> None:
        """Keep the track rows of ``obs`` (one a world of ``worlds``); a
        field of another shape or type than those kept starts anew (the
        parent then sends the other worlds' tracks whole)."""
        for k in TRACK_FIELDS:
            if k in obs:
                value = np.asarray(obs[k])
                kept = self._rows.get(k)
                if kept is None or kept.shape[1:] != value.shape[1:] or kept.dtype != value.dtype:
                    kept = self._rows[k] = np.zeros((self.worlds, *value.shape[1:]), value.dtype)
                kept[np.asarray(worlds, np.int64)] = value

    def fill(self, worlds: np.ndarray, obs: dict[str, Any]) -> dict[str, Any]:
        """``obs`` with each left-out track field (None) filled in with the kept rows of ``worlds`` (copies)."""
        return {k: self._rows[k][np.asarray(worlds, np.int64)] if v is None and k in TRACK_FIELDS else v
                for k, v in obs.items()}


def _serve(conn: Connection, directory: Path, challenge: dict[str, Any], memory_limit_mb: int | None,
           parent: int, reaper: int) -> None:
    """The child: says whether its signal guard holds, then answers the
    parent's calls until its pipe closes."""
    conn.send_bytes(json.dumps({"guard": _detach(parent, reaper)}).encode())  # before any of the plugin's code
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it ends the run and kills the children
    os.dup2(2, 1)  # what the controller prints goes to stderr, as evaluate's own stdout does
    if memory_limit_mb is not None:
        limit = memory_limit_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    controller, tracks = None, _KeptTracks(0)
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        try:
            value = None
            if method == "check":
                batched = args[0]
                try:
                    # Batched, `load_batch_class` imports the code once, as `load_class` would.
                    plugin = load_plugin(directory, import_code=not batched)
                    if batched and plugin.load_batch_class() is None:
                        value = _no_batch_controller(directory)
                except PluginError as error:
                    value = str(error)
            elif method == "__init__":
                plugin = load_plugin(directory, import_code=False)
                controller = plugin.load_class()(*args, plugin.config(challenge))
            elif method == "compute_control":
                value = checked_action(controller.compute_control(*args)).tolist()
            elif method == "batch_init":
                plugin = load_plugin(directory, import_code=False)
                cls = plugin.load_batch_class()
                if cls is not None:
                    controller, tracks = cls(plugin.config(challenge), *args), _KeptTracks(*args)
                value = cls is not None
            elif method == "batch_start":
                tracks.keep(args[0], args[1])
                controller.start(*args)
            elif method == "compute_controls":
                worlds, obs, info = args
                value = checked_actions(controller.compute_controls(worlds, tracks.fill(worlds, obs), info),
                                        len(worlds)).astype("<f8").tobytes().hex()  # `_actions` reads it
            elif method == "render_callback":
                draw = DrawList()
                controller.render_callback(draw)
                value = [[c.kind, c.points.tolist(), list(c.color), c.size, c.text] for c in draw.drain()]
            else:
                getattr(controller, method)(*args)
            reply = {"ok": value}
        except BaseException:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are the controller's errors too
            reply = {"error": traceback.format_exc()}
        conn.send_bytes(json.dumps(reply).encode())
