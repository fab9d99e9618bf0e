"""The isolated mode: each episode's controller in a child process. A hang,
an exit, a crash or a memory blow-up of the child ends its episode as a
recorded controller error and the run goes on; the child reaches nothing of
the parent (the env, the results, its builtins); a deterministic controller
gives the same results in both modes, its drawing included; the worlds'
children are called at once; a child starts no JAX backend of its own."""

from __future__ import annotations

import builtins
import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from racing_env import Level, ProjectConfig, VecCarRacingEnv, level0_track
from racing_env.isolation import ChildControllers, ControllerFailed, Isolation, check_plugin
from racing_env.plugins import PURSUIT, PluginError, load_plugin
from racing_env.runner import challenge_values, run

SHORT = Level(level_id=0, name="short", max_episode_steps=4)
FAST = Isolation(call_timeout_s=1.0, start_timeout_s=60.0)


def make_plugin(root, name, body, import_code=True):
    path = root / name
    path.mkdir()
    (path / "controller.py").write_text("import numpy as np\nfrom racing_env.controller import Controller\n"
                                        + textwrap.dedent(body))
    (path / "config.toml").write_text('name = "test"\n')
    return load_plugin(path, import_code=import_code)


@pytest.fixture(scope="module")
def env():
    return VecCarRacingEnv(1, config=ProjectConfig(), level=SHORT, backend="cpu_reference", track=level0_track())


def test_a_hanging_controller_times_out_and_the_next_episode_gets_a_fresh_process(tmp_path, env):
    """The first episode's controller sleeps forever in compute_control: it
    ends as invalid_action with the timeout recorded; the second episode's
    controller, in a new process, drives to the Level's timeout."""
    mark = tmp_path / "hung"
    plugin = make_plugin(tmp_path, "hangs", f"""
        import time
        from pathlib import Path
        class Hangs(Controller):
            def compute_control(self, obs, info=None):
                if not Path({str(mark)!r}).exists():
                    Path({str(mark)!r}).write_text("")
                    time.sleep(3600)
                return np.zeros(2, np.float32)
    """)
    result = run(plugin, env, episodes=2, seed=0, isolation=FAST)
    first, second = result.episodes
    assert first.termination_reason == "invalid_action" and first.steps == 1
    assert "compute_control ran past its 1 s wall-clock limit" in first.error
    assert second.termination_reason == "timeout" and second.error is None
    assert not result.interrupted


@pytest.mark.parametrize("body,error", [
    ("import sys; sys.exit(0)", "SystemExit: 0"),
    ("import os; os._exit(3)", "the controller's process exited with status 3 during compute_control"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "killed by SIGSEGV during compute_control"),
])
def test_exits_crashes_and_interrupts_of_the_child_are_recorded_and_the_run_goes_on(tmp_path, env, body, error):
    plugin = make_plugin(tmp_path, "quits", f"""
        class Quits(Controller):
            def compute_control(self, obs, info=None):
                {body}
    """)
    result = run(plugin, env, episodes=2, seed=0, isolation=FAST)
    assert [e.termination_reason for e in result.episodes] == ["invalid_action"] * 2
    assert all(error in e.error for e in result.episodes), result.episodes[0].error
    assert result.summary["controller_errors"] == 2 and not result.interrupted


def test_a_memory_blow_up_is_stopped_by_the_limit_and_recorded(tmp_path, env):
    plugin = make_plugin(tmp_path, "greedy", """
        class Greedy(Controller):
            def compute_control(self, obs, info=None):
                blocks = []
                while True:
                    blocks.append(np.ones(2**24))  # 128 MiB each, touched
    """)
    result = run(plugin, env, episodes=1, isolation=Isolation(memory_limit_mb=1024))
    (episode,) = result.episodes
    assert episode.termination_reason == "invalid_action" and "MemoryError" in episode.error


# Looks for the parent's objects: the env (gc), the Runner's episode list
# (gc and the caller's frames) and a counter in builtins that would carry
# over from the previous episode. It rewrites what it finds.
SNOOP = """
    import builtins, gc, sys
    from racing_env.runner import EpisodeResult
    from racing_env.vector import VecCarRacingEnv
    class Snoop(Controller):
        def __init__(self, obs, info, config):
            super().__init__(obs, info, config)
            builtins.snoop_episodes = getattr(builtins, "snoop_episodes", 0) + 1
            if builtins.snoop_episodes > 1:
                raise RuntimeError("state survived the episode")
        def compute_control(self, obs, info=None):
            found = [o for o in gc.get_objects() if isinstance(o, VecCarRacingEnv)]
            frame = sys._getframe(1)
            while frame is not None:
                found += [v for v in frame.f_locals.values() if isinstance(v, list) and v
                          and isinstance(v[0], EpisodeResult)]
                frame = frame.f_back
            for lists in [o for o in gc.get_objects() if type(o) is list and o
                          and isinstance(o[0], EpisodeResult)]:
                lists[0] = lists[0].__class__(*[*vars(lists[0]).values()][:4], "success", True, 1.0, 1.0, 1, None)
            return np.full(2, np.nan) if found else np.zeros(2, np.float32)
"""


def test_an_isolated_controller_reaches_nothing_of_the_parent(tmp_path, env):
    """In-process, the snooping plugin finds the env and keeps a count in
    builtins across episodes (trusted code reaches anything); isolated, it
    finds neither, and the results are the env's own."""
    plugin = make_plugin(tmp_path, "snoop", SNOOP)
    trusted = run(plugin, env, episodes=3, seed=0)
    assert trusted.episodes[0].termination_reason == "invalid_action"  # it found the env
    assert "state survived the episode" in trusted.episodes[1].error
    del builtins.snoop_episodes
    isolated = run(plugin, env, episodes=3, seed=0, isolation=FAST)
    assert [e.termination_reason for e in isolated.episodes] == ["timeout"] * 3
    assert [e.error for e in isolated.episodes] == [None] * 3
    assert not hasattr(builtins, "snoop_episodes")


class Frames:
    """A view that wants every frame and keeps what it is shown."""

    def __init__(self):
        self.shown = []

    def wants_frame(self, final=False):
        return True

    def show(self, obs, commands, caption):
        self.shown.append((caption, [(c.kind, c.points.tolist(), c.color, c.size, c.text) for c in commands]))


def test_the_pursuit_reference_gives_the_same_results_and_drawings_in_both_modes():
    level = Level(level_id=0, name="first 1.2 s", max_episode_steps=60)
    env = VecCarRacingEnv(1, config=ProjectConfig(), level=level, backend="cpu_reference", track=level0_track())
    plugin = load_plugin(PURSUIT)
    trusted, isolated = Frames(), Frames()
    a = run(plugin, env, episodes=2, seed=4, view=trusted)
    b = run(plugin, env, episodes=2, seed=4, view=isolated, isolation=FAST)
    assert a.episodes == b.episodes and a.summary == b.summary
    assert trusted.shown == isolated.shown and len(trusted.shown) == 2 * 61
    assert sum(bool(commands) for _, commands in isolated.shown) >= 2 * 60  # its aim point, once it has one


NEEDS_A_BACKEND = """
    import jax.numpy as jnp
    class OnJax(Controller):
        def compute_control(self, obs, info=None):
            return np.asarray(jnp.zeros(2, jnp.float32))
"""


@pytest.mark.parametrize("name", ["pursuit", "on_jax"])
def test_a_child_never_starts_a_jax_backend_of_its_own(tmp_path, monkeypatch, env, name):
    """The child imports racing_env (so JAX), but neither it nor the
    pursuit reference makes a JAX array: on a GPU host a child's backend
    would claim the device, once per world. The children inherit a
    ``JAX_PLATFORMS`` that no backend can start on (this process's backend
    started before); a controller that does compute with JAX, the control,
    fails on it."""
    import jax

    jax.devices()
    monkeypatch.setenv("JAX_PLATFORMS", "no_such_platform")
    plugin = load_plugin(PURSUIT) if name == "pursuit" else make_plugin(tmp_path, name, NEEDS_A_BACKEND)
    (episode,) = run(plugin, env, episodes=1, seed=0, isolation=FAST).episodes
    if name == "pursuit":
        assert episode.error is None and episode.termination_reason == "timeout"
    else:
        assert episode.termination_reason == "invalid_action" and "no_such_platform" in episode.error


def test_worlds_called_at_once_give_the_in_process_results_and_drawings(mjx_pool_env):
    """Three mjx_warp worlds, seven episodes (the last wave partly idle):
    isolated, the worlds' children called at once, the episodes (their
    order included), the summary and world 0's frames are those of the
    in-process run, whose controllers are called one after another."""
    plugin = load_plugin(PURSUIT)
    trusted, isolated = Frames(), Frames()
    a = run(plugin, mjx_pool_env, episodes=7, seed=5, view=trusted)
    b = run(plugin, mjx_pool_env, episodes=7, seed=5, view=isolated, isolation=FAST)
    assert [e.world for e in a.episodes] == [0, 1, 2, 0, 1, 2, 0]
    assert a.episodes == b.episodes and a.summary == b.summary
    # World 0 drove episodes 1, 4 and 7: each its start's frame and one a call.
    assert trusted.shown == isolated.shown and len(trusted.shown) == 3 * (1 + 4)


def test_bad_draw_commands_from_the_child_are_checked_in_the_parent(tmp_path, env):
    plugin = make_plugin(tmp_path, "draws", """
        class Draws(Controller):
            def compute_control(self, obs, info=None):
                return np.zeros(2, np.float32)
            def render_callback(self, debug_draw):
                debug_draw.points([[0.0, 0.0]], color=(1, 2, 3))
                debug_draw.points([[0.0, float("nan")]])
    """)
    result = run(plugin, env, episodes=1, view=Frames(), isolation=FAST)
    (episode,) = result.episodes
    assert episode.termination_reason == "invalid_action" and "ValueError: points must be finite" in episode.error


def test_check_plugin_imports_in_a_child_only(tmp_path):
    plugin = make_plugin(tmp_path, "marks", """
        import builtins
        builtins.plugin_imported = True
        class Marks(Controller):
            def compute_control(self, obs, info=None):
                return np.zeros(2, np.float32)
    """, import_code=False)
    check_plugin(plugin.directory, FAST)
    assert not hasattr(builtins, "plugin_imported")
    broken = make_plugin(tmp_path, "broken", "raise ImportError('nope')\n", import_code=False)
    with pytest.raises(PluginError, match="failed to import: ImportError: nope"):
        check_plugin(broken.directory, FAST)


def test_a_batched_check_refuses_a_plugin_without_a_batch_controller(tmp_path):
    """Batched, the child's check also asks for the BatchController that
    a batched run's `ChildBatchController` needs, and the refusal is its."""
    one = """
        class One(Controller):
            def compute_control(self, obs, info=None):
                return np.zeros(2, np.float32)
    """
    single = make_plugin(tmp_path, "single", one, import_code=False)
    both = make_plugin(tmp_path, "both", one + """
        from racing_env.controller import BatchController
        class Many(BatchController):
            def start(self, worlds, obs, info):
                pass
            def compute_controls(self, worlds, obs, info):
                return np.zeros((len(worlds), 2), np.float32)
    """, import_code=False)
    check_plugin(single.directory, FAST)  # not batched: a Controller is enough
    check_plugin(both.directory, FAST, batched=True)
    with pytest.raises(PluginError) as refused:
        check_plugin(single.directory, FAST, batched=True)
    assert str(refused.value) == f"{single.directory / 'controller.py'} defines no racing_env.BatchController"
    with pytest.raises(PluginError, match="failed to import: ImportError: nope"):  # batched, the import is checked too
        check_plugin(make_plugin(tmp_path, "broken", "raise ImportError('nope')\n", import_code=False).directory,
                     FAST, batched=True)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"call_timeout_s": 0}, ValueError, "call_timeout_s must be finite and > 0"),
    ({"start_timeout_s": float("inf")}, ValueError, "start_timeout_s"),
    ({"call_timeout_s": "1"}, TypeError, "call_timeout_s must be a real number"),
    ({"memory_limit_mb": 100}, ValueError, r"memory_limit_mb must be in \[1024, 2\*\*40\), got 100"),
    ({"memory_limit_mb": 2**40}, ValueError, r"memory_limit_mb must be in \[1024, 2\*\*40\)"),
    ({"memory_limit_mb": 2048.0}, TypeError, "memory_limit_mb must be an int"),
])
def test_bad_limits_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        Isolation(**kwargs)


def test_run_refuses_an_isolation_of_the_wrong_type(env):
    with pytest.raises(TypeError, match="isolation must be an Isolation or None"):
        run(load_plugin(PURSUIT), env, episodes=1, isolation=5.0)


# Every call waits at a gate until the same call of every world's controller
# has reached it (a fresh process per episode, so a name's arrivals come in
# threes: the n-th arrival waits for 3 x ceil(n / 3)); alone for 20 s, it fails.
GATE = """
    import math, os, time
    from pathlib import Path
    def meet(name):
        gate = Path({gate!r}) / name
        gate.mkdir(parents=True, exist_ok=True)
        (gate / str(os.getpid())).write_text("")
        need = 3 * math.ceil(len(list(gate.iterdir())) / 3)
        deadline = time.monotonic() + 20.0
        while len(list(gate.iterdir())) < need:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{{name}}: alone at the gate")
            time.sleep(0.005)
    class Gate(Controller):
        def __init__(self, obs, info, config):
            super().__init__(obs, info, config)
            self.calls = 0
            meet("init")
        def compute_control(self, obs, info=None):
            self.calls += 1
            meet(f"act-{{self.calls}}")
            return np.zeros(2, np.float32)
        def step_callback(self, action, obs, reward, terminated, truncated, info):
            meet(f"step-{{self.calls}}")
        def episode_callback(self):
            meet("episode")
"""


def test_isolated_worlds_are_called_at_once(tmp_path, mjx_pool_env):
    """Three worlds, two episodes each: every start, action, step callback
    and episode callback of a world's controller waits until the other two
    worlds' controllers have made the same call, which can only happen when
    the Runner calls the children at once (called one after another, the
    first would wait past its 5 s limit). Every episode ends at the Level's
    timeout with no controller error."""
    plugin = make_plugin(tmp_path, "gate", GATE.format(gate=str(tmp_path / "gates")))
    result = run(plugin, mjx_pool_env, episodes=6, seed=0,
                 isolation=Isolation(call_timeout_s=5.0, start_timeout_s=60.0))
    assert [e.error for e in result.episodes] == [None] * 6
    assert [e.termination_reason for e in result.episodes] == ["timeout"] * 6
    assert sorted(p.name for p in (tmp_path / "gates").iterdir()) == ["act-1", "act-2", "act-3", "act-4", "episode",
                                                                       "init", "step-1", "step-2", "step-3", "step-4"]
    assert all(len(list(d.iterdir())) == 6 for d in (tmp_path / "gates").iterdir())


def test_no_child_starts_once_the_children_are_closed(env):
    """A start that races the end of a run (a caller thread still starting a
    world when the run is left) gets an error, not a process nobody kills
    (it is refused before the observation is read)."""
    children = ChildControllers(PURSUIT, challenge_values(env), FAST, spares=0)
    children.close()
    with pytest.raises(ControllerFailed, match="the run has ended"):
        children.start(0, {}, {})
    assert children._worlds == {} and children._spares == []


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


#: Runs of isolated plugins in a process of its own (a session of its own, so that a signal to the
#: run's group, on a build without the isolation, cannot reach the tests): for each plugin folder in
#: ``argv[1:]``, two episodes with a call limit of 600 s; prints each episode's ending and error.
RUN_SCRIPT = textwrap.dedent("""
    import sys
    from racing_env import Level, ProjectConfig, VecCarRacingEnv, level0_track
    from racing_env.isolation import Isolation
    from racing_env.plugins import load_plugin
    from racing_env.runner import run

    if __name__ == "__main__":  # a spawned child imports this file too
        env = VecCarRacingEnv(1, config=ProjectConfig(), level=Level(level_id=0, name="short", max_episode_steps=4),
                              backend="cpu_reference", track=level0_track())
        for folder in sys.argv[1:]:
            result = run(load_plugin(folder), env, episodes=2, seed=0,
                         isolation=Isolation(call_timeout_s=600.0, start_timeout_s=60.0))
            for episode in result.episodes:
                print("episode", episode.termination_reason, episode.error is not None, flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc as on Linux")
def test_a_plugin_reaches_no_process_of_the_run_and_its_own_end_with_its_child(tmp_path, env):
    """``os.killpg(0, SIGKILL)`` from the controller kills its own group,
    not the evaluating process: both episodes are recorded controller
    errors. What the controller started (and left in its group) is killed
    with its child at the episode's end; when the evaluating process is
    killed (SIGKILL: nothing of the run's code runs), the kernel kills its
    child and the run's reaper what the child started."""
    pids = tmp_path / "pids"
    spawner = make_plugin(tmp_path, "spawner", f"""
        import os, subprocess, time
        class Spawner(Controller):
            def __init__(self, obs, info, config):
                sleeper = subprocess.Popen(["sleep", "600"])
                with open({str(pids)!r}, "a") as f:
                    f.write(f"{{os.getpid()}} {{sleeper.pid}}\\n")
            def compute_control(self, obs, info=None):
                if os.environ.get("HANG_IN_CONTROL"):
                    time.sleep(3600)
                return np.zeros(2, np.float32)
    """)
    run(spawner, env, episodes=1, seed=0, isolation=FAST)
    (child, sleeper), = [map(int, line.split()) for line in pids.read_text().splitlines()][:1]
    assert _gone_within(child, 5.0) and _gone_within(sleeper, 5.0)
    pids.unlink()
    killer = make_plugin(tmp_path, "group_killer", """
        import os, signal
        class GroupKiller(Controller):
            def compute_control(self, obs, info=None):
                os.killpg(0, signal.SIGKILL)
    """, import_code=False)
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)
    evaluating = subprocess.Popen([sys.executable, str(script), str(killer.directory), str(spawner.directory)],
                                  env={**os.environ, "HANG_IN_CONTROL": "1"}, start_new_session=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        end = time.monotonic() + 180
        while not pids.exists() or not pids.read_text().endswith("\n"):
            assert time.monotonic() < end and evaluating.poll() is None, "the evaluating process ended"
            time.sleep(0.1)
        time.sleep(0.5)  # into the hanging call
    finally:
        evaluating.kill()
        printed, _ = evaluating.communicate()
    assert printed.splitlines() == ["episode invalid_action True"] * 2  # the group killer's, the run went on
    for line in pids.read_text().splitlines():
        child, sleeper = map(int, line.split())
        try:
            assert _gone_within(child, 5.0), f"the child {child} outlived the evaluating process"
            assert _gone_within(sleeper, 5.0), f"what the child started ({sleeper}) outlived the evaluating process"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child, signal.SIGKILL)


def _seen(plugin, env, path) -> dict:
    """Run ``plugin`` for one isolated episode, which its controller ends
    without an error, and read what it saw (the JSON it wrote to ``path``)."""
    result = run(plugin, env, episodes=1, seed=0, isolation=FAST)
    assert result.episodes[0].error is None
    return json.loads(path.read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the signal guard is Linux's seccomp")
def test_a_plugin_cannot_signal_the_evaluating_process_its_group_or_ancestors(tmp_path, env):
    """Probed with signal 0 (which only checks): the child's signals to the
    evaluating process, its group, another of its threads, its parent,
    the run's reaper and every process at once, a process handle on it
    (from pidfd_open and from /proc), its limits, a file's events aimed
    at it are refused with EPERM, its memory with EPERM or EACCES; the
    child's signals to itself and to what it started, and its own limits,
    are not."""
    from racing_env._reaper import REAPER

    probes = tmp_path / "probes.json"
    reaper = REAPER.pid()
    prober = make_plugin(tmp_path, "prober", f"""
        import fcntl, json, os, resource, signal, subprocess
        class Prober(Controller):
            def __init__(self, obs, info, config):
                parent, child = os.getppid(), subprocess.Popen(["sleep", "60"])
                threads = [int(t) for t in os.listdir(f"/proc/{{parent}}/task") if int(t) != parent] or [parent]
                read, _ = os.pipe()
                grandparent = int(open(f"/proc/{{parent}}/stat").read().rsplit(")", 1)[1].split()[1])
                tries = {{"parent": lambda: os.kill(parent, 0),
                         "parent group": lambda: os.killpg(os.getpgid(parent), 0),
                         "grandparent": lambda: os.kill(grandparent, 0), "everyone": lambda: os.kill(-1, 0),
                         "parent handle": lambda: os.close(os.pidfd_open(parent)),
                         "the run's reaper": lambda: os.kill({reaper}, 0),
                         "a thread of the parent": lambda: os.kill(threads[0], 0),
                         "a handle from /proc": lambda: signal.pidfd_send_signal(
                             os.open(f"/proc/{{parent}}", os.O_RDONLY), 0),
                         "the parent's events": lambda: fcntl.fcntl(read, fcntl.F_SETOWN, parent),
                         "the parent's limits": lambda: resource.prlimit(parent, resource.RLIMIT_CPU),
                         "the parent's memory": lambda: os.close(os.open(f"/proc/{{parent}}/mem", os.O_RDWR)),
                         "its own limits": lambda: resource.prlimit(0, resource.RLIMIT_CPU),
                         "itself": lambda: os.kill(os.getpid(), 0), "its own group": lambda: os.killpg(0, 0),
                         "what it started": lambda: os.kill(child.pid, 0)}}
                seen = {{}}
                for name, attempt in tries.items():
                    try:
                        attempt()
                        seen[name] = 0
                    except OSError as error:
                        seen[name] = error.errno
                child.kill()
                with open({str(probes)!r}, "w") as f:
                    json.dump(seen, f)
            def compute_control(self, obs, info=None):
                return np.zeros(2, np.float32)
    """)
    seen = _seen(prober, env, probes)
    refused = ("parent", "parent group", "grandparent", "everyone", "parent handle", "the run's reaper",
               "a thread of the parent", "a handle from /proc", "the parent's events", "the parent's limits")
    assert {name: seen[name] for name in refused} == dict.fromkeys(refused, errno.EPERM)
    assert seen["the parent's memory"] in (errno.EPERM, errno.EACCES)  # the kernel's check: it is not dumpable
    allowed = ("itself", "its own group", "what it started", "its own limits")
    assert {name: seen[name] for name in allowed} == dict.fromkeys(allowed, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the signal guard is Linux's seccomp")
def test_signals_a_plugin_sends_the_evaluating_process_neither_end_stop_nor_interrupt_the_run(tmp_path, env):
    """A controller that sends the evaluating process SIGKILL, SIGSTOP,
    SIGTERM and SIGINT (and its group SIGKILL) on every call, and ignores
    the refusals: the run, in a process and session of its own, drives
    both episodes to their end and exits 0."""
    attacker = make_plugin(tmp_path, "attacker", """
        import os, signal
        class Attacker(Controller):
            def compute_control(self, obs, info=None):
                parent = os.getppid()
                for sig in (signal.SIGSTOP, signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
                    for attempt in (lambda: os.kill(parent, sig), lambda: os.killpg(os.getpgid(parent), sig)):
                        try:
                            attempt()
                        except OSError:
                            pass
                return np.zeros(2, np.float32)
    """, import_code=False)
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)
    evaluating = subprocess.run([sys.executable, str(script), str(attacker.directory)], start_new_session=True,
                                capture_output=True, text=True, timeout=300)
    assert evaluating.returncode == 0, evaluating.stderr[-2000:]
    assert evaluating.stdout.splitlines() == ["episode timeout False"] * 2
    assert "signal guard" not in evaluating.stderr  # it held: nothing said


def test_a_missing_signal_guard_is_said_once_a_process(monkeypatch):
    """Where the guard cannot hold, the parent warns once, naming why."""
    from racing_env import isolation

    monkeypatch.setattr(isolation, "_UNGUARDED_SAID", isolation.threading.Event())
    with pytest.warns(RuntimeWarning, match=r"without the signal guard \(no seccomp filter on test\)") as caught:
        isolation._say_unguarded("no seccomp filter on test")
        isolation._say_unguarded("no seccomp filter on test")
    assert len(caught) == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc as on Linux")
def test_the_guard_protects_the_parent_its_group_and_ancestors_not_the_caller():
    """From a child in a session of its own (as an isolated child is): its
    parent, the parent's group (negated), -1, the parent's ancestors up to
    init; not the child itself nor its own group; nothing for a process
    that does not exist."""
    probe = textwrap.dedent("""
        import json, os
        from racing_env._seccomp import protected
        print(json.dumps({"targets": protected(os.getppid()), "me": os.getpid(), "group": os.getpgrp(),
                          "missing": protected(2**22 + 12345)}))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         start_new_session=True, check=True)
    seen = json.loads(out.stdout)
    wanted = {t & 0xFFFFFFFF for t in (os.getpid(), -os.getpgrp(), -1, os.getppid(), 1)}
    assert wanted <= set(seen["targets"])
    assert seen["me"] not in seen["targets"] and (-seen["group"]) & 0xFFFFFFFF not in seen["targets"]
    assert seen["missing"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the signal guard is Linux's seccomp")
def test_a_plugin_cannot_leave_its_group_so_its_daemons_end_with_its_episode(tmp_path, env):
    """``setsid`` (a daemon's double fork, ``start_new_session``) and
    ``setpgid`` are refused in the child, so whatever the plugin starts
    stays in its group and is killed with it at the episode's end."""
    seen_file = tmp_path / "seen.json"
    daemon = make_plugin(tmp_path, "daemon", f"""
        import errno, json, os, subprocess, time
        class Daemon(Controller):
            def __init__(self, obs, info, config):
                seen = {{}}
                try:
                    subprocess.Popen(["sleep", "600"], start_new_session=True)
                    seen["new_session"] = "started"
                except (OSError, subprocess.SubprocessError) as error:
                    seen["new_session"] = type(error).__name__
                try:
                    os.setpgid(0, 0)
                    seen["setpgid"] = 0
                except OSError as error:
                    seen["setpgid"] = error.errno
                read, write = os.pipe()
                first = os.fork()
                if first == 0:  # the classic daemon: fork, setsid, fork
                    try:
                        os.setsid()
                        code = 0
                    except OSError as error:
                        code = error.errno
                    if os.fork() == 0:
                        os.write(write, f"{{os.getpid()}} {{code}}\\n".encode())
                        time.sleep(600)
                    os._exit(0)
                os.waitpid(first, 0)
                pid, code = map(int, os.read(read, 100).split())
                seen.update(daemon=pid, setsid=code)
                with open({str(seen_file)!r}, "w") as f:
                    json.dump(seen, f)
            def compute_control(self, obs, info=None):
                return np.zeros(2, np.float32)
    """)
    seen = _seen(daemon, env, seen_file)
    assert seen["new_session"] in ("PermissionError", "SubprocessError") and seen["setpgid"] == errno.EPERM
    assert seen["setsid"] == errno.EPERM
    try:
        assert _gone_within(seen["daemon"], 5.0), "the plugin's daemon outlived its episode"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(seen["daemon"], signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc as on Linux")
def test_the_reaper_kills_the_groups_still_watched_when_its_process_is_killed(tmp_path):
    """A process killed outright (SIGKILL) leaves its reaper to kill the
    process groups it still watched; one it released is left alone."""
    script = textwrap.dedent("""
        import os, signal, subprocess
        from racing_env._reaper import REAPER
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        kept, dropped = subprocess.Popen(["sleep", "60"], **quiet), subprocess.Popen(["sleep", "60"], **quiet)
        REAPER.watch(kept.pid)
        REAPER.watch(dropped.pid)
        REAPER.release(dropped.pid)
        print(kept.pid, dropped.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    kept, dropped = map(int, out.stdout.split())
    try:
        assert _gone_within(kept, 5.0), "a watched group outlived its process"
        assert _alive(dropped), "a released group was killed"
    finally:
        for pid in (kept, dropped):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc as on Linux")
def test_a_forked_copy_does_not_keep_the_reaper_waiting(tmp_path):
    """A fork of the watching process closes its copy of the reaper's pipe:
    the watcher killed while the fork lives on, the reaper still kills the
    groups at once."""
    script = textwrap.dedent("""
        import os, signal, subprocess, time
        from racing_env._reaper import REAPER
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        kept = subprocess.Popen(["sleep", "60"], **quiet)
        REAPER.watch(kept.pid)
        fork = os.fork()
        if fork == 0:  # lives on, holding nothing of the test's output
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            time.sleep(30)
            os._exit(0)
        print(kept.pid, fork, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    kept, fork = map(int, out.stdout.split())
    try:
        assert _alive(fork) and _gone_within(kept, 5.0), "the reaper waited for the fork"
    finally:
        for pid in (kept, fork):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("info", [{}, {"track_id": None}, {"track_id": np.array([np.nan, 1.0])},
                                  {"track_id": np.array([1])}, {"track_id": np.array([[1, 2]])},
                                  {"track_id": "ab"}, {"track_id": np.array([-1, 3])},
                                  {"track_id": np.array([2**64 - 1, 3], np.uint64)}, []])
def test_a_batched_call_trusts_only_track_ids_it_can_compare(info):
    """No id that is not a non-negative integer a row (a wrapped uint64 would read as -1, "none kept") lets
    a call leave the track fields out."""
    from racing_env.isolation import _track_ids

    assert _track_ids(info, 2) is None
    np.testing.assert_array_equal(_track_ids({"track_id": np.array([7, 2**40], np.uint64)}, 2), [7, 2**40])
