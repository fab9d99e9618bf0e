"""The Runner against a hand-built timeline: episodes handed to worlds as
they free up, a fresh controller per episode built from the NEXT_STEP reset
observation, errors recorded without stopping the run, the summary."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import numpy as np
import pytest

from racing_env import Level, ProjectConfig, VecCarRacingEnv, level0_track
from racing_env.isolation import Isolation
from racing_env.plugins import TEMPLATE, PluginError, load_plugin
from racing_env.runner import EpisodeResult, RunInterrupted, challenge_values, run, summarize

SHORT = Level(level_id=0, name="short", max_episode_steps=4)


def make_plugin(root, name, body):
    path = root / name
    path.mkdir()
    (path / "controller.py").write_text("import numpy as np\nfrom racing_env.controller import Controller\n"
                                        + textwrap.dedent(body))
    (path / "config.toml").write_text('name = "test"\n')
    return load_plugin(path)


@pytest.fixture(scope="module")
def env():
    return VecCarRacingEnv(1, config=ProjectConfig(), level=SHORT, backend="cpu_reference", track=level0_track())


def test_the_template_times_out_every_episode(env):
    result = run(load_plugin(TEMPLATE), env, episodes=3, seed=7)
    assert [e.termination_reason for e in result.episodes] == ["timeout"] * 3
    assert [e.steps for e in result.episodes] == [SHORT.max_episode_steps] * 3
    assert result.summary["timeout_rate"] == 1.0 and result.summary["success_rate"] == 0.0
    # Each episode is a new one: its own seeds, in the env's episode order.
    assert len({e.episode_seed for e in result.episodes}) == 3
    assert result.challenge["level"]["max_episode_steps"] == SHORT.max_episode_steps
    json.dumps(result.to_json())  # JSON-ready


class Captions:
    """A view that keeps the caption of every frame the Runner shows it."""

    def __init__(self) -> None:
        self.captions: list[str] = []

    def wants_frame(self, final: bool = False) -> bool:
        return True

    def show(self, obs, commands, caption):
        self.captions.append(caption)


def test_the_result_and_the_captions_call_the_plugin_by_its_name(tmp_path, env):
    """A plugin's name (its config.toml's ``name``; an exported policy's
    is its run's), not its directory's ("plugin" for every exported one)."""
    plugin = make_plugin(tmp_path, "plugin", """
        class Still(Controller):
            def compute_control(self, obs, info=None):
                return np.zeros(2, np.float32)
    """)
    view = Captions()
    result = run(plugin, env, episodes=1, seed=0, view=view)
    assert result.plugin == str(tmp_path / "plugin") and result.plugin_name == "test"
    assert result.to_json()["plugin_name"] == "test"
    assert view.captions and all(caption.startswith("test  episode 1 ") for caption in view.captions)


def test_a_fresh_controller_per_episode_built_from_the_reset_observation(tmp_path, env):
    plugin = make_plugin(tmp_path, "count", """
        BUILT = []
        class Counter(Controller):
            def __init__(self, obs, info, config):
                super().__init__(obs, info, config)
                BUILT.append(int(info["episode_seed"]))
                self.seen = 0
                self.progress0 = float(obs["track_progress"])
            def compute_control(self, obs, info=None):
                self.seen += 1
                assert self.seen <= 4 and self.progress0 == 0.0
                return np.zeros(2, np.float32)
    """)
    result = run(plugin, env, episodes=2, seed=3)
    assert result.summary["controller_errors"] == 0
    assert [e.steps for e in result.episodes] == [4, 4]


def test_a_raising_controller_is_recorded_and_the_run_goes_on(tmp_path, env):
    plugin = make_plugin(tmp_path, "boom", """
        class Boom(Controller):
            def compute_control(self, obs, info=None):
                raise RuntimeError("boom")
    """)
    result = run(plugin, env, episodes=2, seed=0)
    assert [e.termination_reason for e in result.episodes] == ["invalid_action"] * 2
    assert all("RuntimeError: boom" in e.error for e in result.episodes)
    assert result.summary["controller_errors"] == 2 and result.summary["invalid_action_rate"] == 1.0


def test_a_constructor_error_ends_its_episode_too(tmp_path, env):
    plugin = make_plugin(tmp_path, "ctor", """
        class Ctor(Controller):
            def __init__(self, obs, info, config):
                raise ValueError("no")
            def compute_control(self, obs, info=None):
                return np.zeros(2, np.float32)
    """)
    (episode,) = run(plugin, env, episodes=1).episodes
    assert episode.termination_reason == "invalid_action" and "ValueError: no" in episode.error


def test_the_summary_rates_and_lap_times():
    def ep(reason, lap=0.0):
        return EpisodeResult(0, 0, 0, 0, reason, reason == "success", lap, 1.0, 10, None)

    summary = summarize([ep("success", 60.0), ep("success", 80.0), ep("off_track"), ep("timeout")])
    assert summary["success_rate"] == 0.5 and summary["off_track_rate"] == 0.25
    assert summary["lap_time_s"]["median"] == 70.0 and summary["lap_time_s"]["min"] == 60.0
    assert summarize([ep("timeout")])["lap_time_s"]["median"] is None
    assert summarize([])["success_rate"] is None


@pytest.mark.parametrize("episodes, error", [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError),
                                             ("2", TypeError)])
def test_bad_episode_counts_are_refused(env, episodes, error):
    with pytest.raises(error, match="episodes"):
        run(load_plugin(TEMPLATE), env, episodes=episodes)


def test_many_worlds_take_the_next_episodes_as_they_free_up(mjx_pool_env, short_pool):
    """Three worlds, five 4-step episodes: calls 1-4 run episodes 0-2 (one per
    world), call 5 is every world's NEXT_STEP reset, and worlds 0 and 1 run
    episodes 3 and 4 on calls 6-9 while world 2 idles."""
    result = run(load_plugin(TEMPLATE), mjx_pool_env, episodes=5, seed=11)
    assert [e.world for e in result.episodes] == [0, 1, 2, 0, 1]
    assert all(e.steps == 4 and e.termination_reason == "timeout" for e in result.episodes)
    assert {e.track_id for e in result.episodes} <= set(np.asarray(short_pool.track_id).tolist())
    assert len({(e.world, e.episode_seed) for e in result.episodes}) == 5


def test_track_indices_drive_each_row_once_in_waves(mjx_pool_env, short_pool):
    """Five rows on three worlds: a wave of three from an explicit reset,
    then a wave of two (world 2 idles); every episode on its own row, the
    seeds continuing from the first wave's."""
    rows = [2, 0, 1, 1, 2]
    result = run(load_plugin(TEMPLATE), mjx_pool_env, seed=5, track_indices=rows)
    ids = np.asarray(short_pool.track_id).tolist()
    assert [e.world for e in result.episodes] == [0, 1, 2, 0, 1]
    assert [e.track_id for e in result.episodes] == [ids[r] for r in rows]
    assert all(e.steps == 4 and e.termination_reason == "timeout" for e in result.episodes)
    assert len({(e.world, e.episode_seed) for e in result.episodes}) == 5


def test_track_indices_on_one_world(env):
    result = run(load_plugin(TEMPLATE), env, seed=1, track_indices=[0, 0])
    assert len(result.episodes) == 2 and result.episodes[0].episode_seed != result.episodes[1].episode_seed


@pytest.mark.parametrize("kwargs,error,match", [
    ({}, ValueError, "exactly one"),
    ({"episodes": 2, "track_indices": [0]}, ValueError, "exactly one"),
    ({"track_indices": []}, ValueError, "at least one"),
    ({"track_indices": [1]}, ValueError, "outside the env's 1 pool rows"),
    ({"track_indices": [-1]}, ValueError, "outside"),
    ({"track_indices": [0.0]}, TypeError, "integers"),
    ({"track_indices": [True]}, TypeError, "integers"),
])
def test_bad_run_arguments_are_refused(env, kwargs, error, match):
    with pytest.raises(error, match=match):
        run(load_plugin(TEMPLATE), env, **kwargs)


@pytest.mark.parametrize("body,reason,error", [
    ("return np.zeros((1, 2))", "invalid_action", "shape [2]"),
    ("return 'ab'", "invalid_action", "TypeError: compute_control must return 2 real numbers, got dtype <U2"),
    ("return np.array(['0.1', '2.0'])", "invalid_action", "must return 2 real numbers, got dtype <U3"),
    ("return ['0.1', '2.0']", "invalid_action", "must return 2 real numbers, got dtype <U3"),
    ("return np.array([0.1 + 2j, 0.0])", "invalid_action", "must return 2 real numbers, got dtype complex128"),
    ("return [True, False]", "invalid_action", "must return 2 real numbers, got dtype bool"),
    ("return np.array([0.1, 0.0], dtype=object)", "invalid_action", "must return 2 real numbers, got dtype object"),
    ("return [0, 1]", "timeout", None),  # integers are real numbers
    ("import jax.numpy as jnp; return jnp.zeros(2, jnp.bfloat16)", "timeout", None),  # so is a JAX policy's bfloat16
    ("return np.full(2, np.inf)", "invalid_action", None),  # the env's own invalid action
    ("return np.array([0.0, 1e300])", "timeout", None),  # finite: the env clips it, as for any host action
])
def test_what_a_controller_returns_is_checked_as_the_env_checks_actions(tmp_path, env, body, reason, error):
    plugin = make_plugin(tmp_path, "ret", f"""
        class Ret(Controller):
            def compute_control(self, obs, info=None):
                {body}
    """)
    (episode,) = run(plugin, env, episodes=1).episodes
    assert episode.termination_reason == reason
    assert (episode.error is None) if error is None else (error in episode.error)


@pytest.mark.parametrize("where", ["compute_control", "__init__", "step_callback"])
@pytest.mark.parametrize("code", [0, 3, "bye"])
def test_a_controller_calling_sys_exit_ends_its_episode_not_the_run(tmp_path, env, where, code):
    """sys.exit() in a plugin is a controller error like any exception: the
    episode ends as invalid_action with the traceback, the run goes on."""
    plugin = make_plugin(tmp_path, "quits", f"""
        import sys
        class Quits(Controller):
            def __init__(self, obs, info, config):
                super().__init__(obs, info, config)
                if {where!r} == "__init__":
                    sys.exit({code!r})
            def compute_control(self, obs, info=None):
                if {where!r} == "compute_control":
                    sys.exit({code!r})
                return np.zeros(2, np.float32)
            def step_callback(self, *args):
                sys.exit({code!r})
    """)
    result = run(plugin, env, episodes=2, seed=0)
    assert [e.termination_reason for e in result.episodes] == ["invalid_action"] * 2
    assert all("SystemExit" in e.error for e in result.episodes)
    assert result.summary["controller_errors"] == 2 and not result.interrupted


def test_ctrl_c_stops_the_run_with_the_episodes_ended_so_far(tmp_path, env):
    """A KeyboardInterrupt (here from the second episode's controller) still
    stops the run; RunInterrupted, itself a KeyboardInterrupt, holds the
    first episode's result, marked interrupted."""
    from racing_env.runner import RunInterrupted

    built = tmp_path / "built"
    built.write_text("")
    plugin = make_plugin(tmp_path, "stopped", f"""
        from pathlib import Path
        BUILT = Path({str(built)!r})
        class Stopped(Controller):
            def __init__(self, obs, info, config):
                super().__init__(obs, info, config)
                BUILT.write_text(BUILT.read_text() + "x")
            def compute_control(self, obs, info=None):
                if len(BUILT.read_text()) == 2:
                    raise KeyboardInterrupt
                return np.zeros(2, np.float32)
    """)
    with pytest.raises(KeyboardInterrupt) as stop:
        run(plugin, env, episodes=3, seed=0)
    assert isinstance(stop.value, RunInterrupted)
    result = stop.value.result
    assert result.interrupted and len(result.episodes) == 1 and result.summary["episodes"] == 1
    assert result.episodes[0].termination_reason == "timeout"
    assert result.to_json()["interrupted"] is True
    assert run(load_plugin(TEMPLATE), env, episodes=1).to_json()["interrupted"] is False



@pytest.mark.parametrize("where", ["__init__", "compute_control", "step_callback", "episode_callback"])
def test_ctrl_c_inside_a_c_callback_of_a_controller_still_stops_the_run(tmp_path, env, where):
    """A Ctrl-C that lands in a C callback during a controller's call (the
    SystemError CPython makes of it) stops the run, in the second episode
    here, with the first episode's result; it is not the controller's
    error. A SystemError with any other cause is: the episode ends as
    invalid_action and the run goes on."""
    from racing_env.runner import RunInterrupted

    built = tmp_path / "built"
    built.write_text("")
    plugin = make_plugin(tmp_path, "interrupted", f"""
        from pathlib import Path
        BUILT = Path({str(built)!r})
        class Interrupted(Controller):
            def __init__(self, obs, info, config):
                super().__init__(obs, info, config)
                BUILT.write_text(BUILT.read_text() + "x")
                self.where = {where!r} if len(BUILT.read_text()) == 2 else None
                self._fail("__init__")
            def _fail(self, here):
                if self.where == here:
                    cause = KeyboardInterrupt() if CTRL_C else ValueError("not a Ctrl-C")
                    raise SystemError("<function __numpy_dtype__> returned a result with an exception set") from cause
            def compute_control(self, obs, info=None):
                self._fail("compute_control")
                return np.zeros(2, np.float32)
            def step_callback(self, *args):
                self._fail("step_callback")
            def episode_callback(self):
                self._fail("episode_callback")
        CTRL_C = True
    """)
    with pytest.raises(RunInterrupted) as stop:
        run(plugin, env, episodes=3, seed=0)
    assert isinstance(stop.value.__cause__, KeyboardInterrupt)
    result = stop.value.result
    assert result.interrupted and [e.termination_reason for e in result.episodes] == ["timeout"]
    assert result.summary["controller_errors"] == 0

    built.write_text("")
    controller = plugin.directory / "controller.py"
    controller.write_text(controller.read_text().replace("CTRL_C = True", "CTRL_C = False"))
    result = run(load_plugin(plugin.directory), env, episodes=3, seed=0)
    assert not result.interrupted and len(result.episodes) == 3
    failed = [e for e in result.episodes if e.error is not None]
    assert len(failed) == 1 and "not a Ctrl-C" in failed[0].error
    assert result.summary["controller_errors"] == 1

def test_a_ctrl_c_a_controller_wraps_in_its_own_error_still_stops_the_run(tmp_path, env):
    """A controller that turns what it caught into an error of its own keeps
    the Ctrl-C among the causes: the run stops, it is not the controller's
    error."""
    from racing_env.runner import RunInterrupted

    plugin = make_plugin(tmp_path, "wraps", """
        class Wraps(Controller):
            def compute_control(self, obs, info=None):
                try:
                    try:
                        raise KeyboardInterrupt
                    except KeyboardInterrupt as stop:
                        raise SystemError("returned a result with an exception set") from stop
                except SystemError:
                    raise RuntimeError("the controller failed")  # its context: the SystemError
    """)
    with pytest.raises(RunInterrupted) as stop:
        run(plugin, env, episodes=2, seed=0)
    assert isinstance(stop.value.__cause__, KeyboardInterrupt)
    assert stop.value.result.interrupted and stop.value.result.episodes == []

def test_ctrl_c_inside_a_c_callback_of_the_env_still_stops_the_run(env, monkeypatch):
    """A Ctrl-C that lands in a C callback during the env's step surfaces as
    a SystemError caused by the KeyboardInterrupt (CPython's "returned a
    result with an exception set"): the run stops as for any Ctrl-C; any
    other SystemError is not swallowed."""
    from racing_env.runner import RunInterrupted

    real, calls = env.step, []

    def step(actions, cause):
        calls.append(1)
        if len(calls) == 3:
            raise SystemError("<function __numpy_dtype__> returned a result with an exception set") from cause
        return real(actions)

    monkeypatch.setattr(env, "step", lambda actions: step(actions, KeyboardInterrupt()))
    with pytest.raises(RunInterrupted) as stop:
        run(load_plugin(TEMPLATE), env, episodes=2, seed=0)
    assert stop.value.result.interrupted and isinstance(stop.value.__cause__, KeyboardInterrupt)
    calls.clear()
    monkeypatch.setattr(env, "step", lambda actions: step(actions, ValueError("not a Ctrl-C")))
    with pytest.raises(SystemError):
        run(load_plugin(TEMPLATE), env, episodes=2, seed=0)


def test_challenge_values_need_an_env():
    with pytest.raises(TypeError, match="env must be"):
        challenge_values(object())


#: A plugin whose Controller and BatchController drive by one row-wise law
#: (float64 NumPy, so a row's numbers do not depend on the others), each
#: world's step count its episode's state; ``{fail}`` breaks the batch.
BOTH = """
    from racing_env.controller import BatchController

    def law(velocity, progress, step):
        steer = np.clip(0.2 - 0.05 * velocity[:, 1] - 0.3 * progress, -0.4, 0.4)
        return np.stack([steer, np.where(step < 2, 2.0, 0.5 + 0.01 * velocity[:, 0])], -1)

    class One(Controller):
        def __init__(self, obs, info, config):
            super().__init__(obs, info, config)
            self.step = 0

        def compute_control(self, obs, info=None):
            velocity = np.asarray(obs["velocity_body"], np.float64)[None]
            action = law(velocity, np.asarray(obs["track_progress"], np.float64)[None], np.array([self.step]))[0]
            self.step += 1
            return action

    class Many(BatchController):
        def __init__(self, config, worlds):
            super().__init__(config, worlds)
            self.step = np.full(worlds, -10**6)  # a world acting before its start would show
            self.calls = 0

        def start(self, worlds, obs, info):
            assert obs["track_progress"].shape == (len(worlds),) and info["track_id"].shape == (len(worlds),)
            self.step[worlds] = 0

        def compute_controls(self, worlds, obs, info):
            self.calls += 1
            {fail}
            action = law(np.asarray(obs["velocity_body"], np.float64), np.asarray(obs["track_progress"], np.float64),
                         self.step[worlds])
            self.step[worlds] += 1
            return action
"""


def _episodes(result):
    return [dataclasses.asdict(e) for e in result.episodes]


@pytest.mark.parametrize("how", [dict(episodes=5, seed=11), dict(track_indices=[2, 0, 1, 1, 2], seed=5)])
def test_a_batched_controller_drives_the_episodes_its_controller_drives(tmp_path, mjx_pool_env, how):
    """Three worlds, five episodes: the BatchController, one call a step
    for every world in an episode, gives the per-episode Controllers'
    episodes bit for bit (the same worlds, tracks, seeds, steps, progress)."""
    plugin = make_plugin(tmp_path, "both", BOTH.format(fail="pass"))
    one = run(plugin, mjx_pool_env, **how)
    many = run(plugin, mjx_pool_env, batched=True, **how)
    assert _episodes(many) == _episodes(one) and len(one.episodes) == 5
    assert len({e["progress"] for e in _episodes(one)}) > 1  # the actions moved the cars, differently
    assert many.summary == one.summary


@pytest.mark.parametrize("fail, reason, error", [
    ("if self.calls == 2: raise RuntimeError('boom')", "invalid_action", "RuntimeError: boom"),
    ("if self.calls == 2: return np.zeros((len(worlds), 3))", "invalid_action", "must return [1, 2] numbers"),
    ("if self.calls == 2: return np.full((len(worlds), 2), 'x')", "invalid_action", "real numbers"),
])
def test_a_failed_batched_call_ends_the_episodes_it_named_and_the_run_goes_on(tmp_path, env, fail, reason, error):
    plugin = make_plugin(tmp_path, "fails", BOTH.format(fail=fail))
    result = run(plugin, env, episodes=3, seed=2, batched=True)
    first, *others = result.episodes
    assert first.termination_reason == reason and error in first.error and first.steps == 2
    assert all(e.termination_reason == "timeout" and e.error is None for e in others)


def test_a_failed_batched_start_ends_that_episode(tmp_path, env):
    plugin = make_plugin(tmp_path, "start", BOTH.format(fail="pass").replace(
        "self.step[worlds] = 0", "self.step[worlds] = 0\n            if self.calls: raise ValueError('no')"))
    result = run(plugin, env, episodes=3, seed=2, batched=True)
    assert [e.termination_reason for e in result.episodes] == ["timeout", "invalid_action", "invalid_action"]
    assert all("ValueError: no" in e.error for e in result.episodes[1:])


def test_ctrl_c_in_a_batched_call_stops_the_run(tmp_path, env):
    plugin = make_plugin(tmp_path, "stop", BOTH.format(fail="if self.calls == 6: raise KeyboardInterrupt"))
    with pytest.raises(RunInterrupted) as stopped:
        run(plugin, env, episodes=3, seed=2, batched=True)
    assert stopped.value.result.interrupted and len(stopped.value.result.episodes) == 1


def test_batched_runs_refuse_what_they_cannot_drive(tmp_path, env):
    with pytest.raises(PluginError, match="defines no racing_env.BatchController"):
        run(load_plugin(TEMPLATE), env, episodes=1, batched=True)
    both = make_plugin(tmp_path, "both", BOTH.format(fail="pass"))
    with pytest.raises(TypeError, match="batched must be a bool"):
        run(both, env, episodes=1, batched=1)
    broken = make_plugin(tmp_path, "ctor", BOTH.format(fail="pass").replace(
        "self.calls = 0", "self.calls = 0\n            raise OSError('no model')"))
    with pytest.raises(PluginError, match="Many failed to start: OSError: no model"):
        run(broken, env, episodes=1, batched=True)
    with pytest.raises(PluginError, match="at most one concrete subclass of racing_env.BatchController"):
        make_plugin(tmp_path, "twice", BOTH.format(fail="pass") + "\n    class More(Many):\n        pass\n")
    assert both.load_batch_class().__name__ == "Many" and load_plugin(TEMPLATE).load_batch_class() is None


def test_ctrl_c_while_a_batched_controller_starts_is_an_interrupted_run(tmp_path, env):
    plugin = make_plugin(tmp_path, "ctor", BOTH.format(fail="pass").replace(
        "self.calls = 0", "self.calls = 0\n            raise KeyboardInterrupt"))
    with pytest.raises(RunInterrupted) as stopped:
        run(plugin, env, episodes=2, batched=True)
    assert stopped.value.result.interrupted and stopped.value.result.episodes == []


def test_an_isolated_batched_controller_drives_the_same_episodes_in_one_child(tmp_path, env):
    """Isolated, the BatchController lives in one child: the in-process
    batched episodes; a call past its limit kills the child and ends the
    episode it held, and the next episode starts a fresh child."""
    plugin = make_plugin(tmp_path, "both", BOTH.format(fail="pass"))
    limits = Isolation(call_timeout_s=2.0, start_timeout_s=60.0)
    here = run(plugin, env, episodes=2, seed=3, batched=True)
    there = run(plugin, env, episodes=2, seed=3, batched=True, isolation=limits)
    assert _episodes(there) == _episodes(here)
    marker = tmp_path / "hung"  # the first child hangs, the next one does not
    hangs = make_plugin(tmp_path, "hangs", BOTH.format(
        fail=f"if self.calls == 2 and not os.path.exists({str(marker)!r}): open({str(marker)!r}, 'w').close(); "
             "time.sleep(60)").replace("from racing_env.controller import BatchController",
                                       "import os, time\n    from racing_env.controller import BatchController"))
    result = run(hangs, env, episodes=2, seed=3, batched=True, isolation=limits)
    first, second = result.episodes
    assert first.termination_reason == "invalid_action" and "wall-clock limit" in first.error
    assert second.termination_reason == "timeout" and second.error is None
    with pytest.raises(PluginError, match="defines no racing_env.BatchController"):
        run(load_plugin(TEMPLATE), env, episodes=1, batched=True, isolation=limits)
    broken = make_plugin(tmp_path, "ctor", BOTH.format(fail="pass").replace(
        "self.calls = 0", "self.calls = 0\n            raise OSError('no model')"))
    with pytest.raises(PluginError, match="failed to start in its process"):
        run(broken, env, episodes=1, batched=True, isolation=limits)


#: A BatchController whose every action reads every observation field of
#: its world's row (the track's arrays included), and keeps what it saw.
TRACK_READER = """
    from racing_env.controller import BatchController

    class Reader(BatchController):
        def start(self, worlds, obs, info):
            pass

        def compute_controls(self, worlds, obs, info):
            rows = np.zeros(len(worlds))
            for value in obs.values():
                array = np.asarray(value, np.float64).reshape(len(worlds), -1)
                rows = rows + np.sin(array).sum(axis=1) * 1e-3
            return np.stack([np.clip(rows, -0.4, 0.4), np.full(len(worlds), 1.0)], -1)

    class One(Controller):
        def compute_control(self, obs, info=None):
            return np.zeros(2)
"""


@pytest.mark.parametrize("how, isolated", [(dict(episodes=7, seed=3), False), (dict(episodes=7, seed=3), True),
                                           (dict(track_indices=[2, 0, 1, 1, 2, 0, 1], seed=5), False)])
def test_every_batched_call_gets_the_observation_the_env_gave(tmp_path, mjx_pool_env, monkeypatch, how, isolated):
    """Each ``start`` and ``compute_controls`` call gets, for each world it
    names, that world's rows of the env's last observation, every field
    (the track's too, which the Runner reads from the device only when an
    episode starts), on worlds that change tracks between episodes, in
    this process and isolated (what the child's proxy is handed: there a
    call leaves out, as None, exactly the track fields the child keeps,
    which the Runner then does not gather)."""
    from racing_env import isolation, runner

    plugin = make_plugin(tmp_path, "reader", TRACK_READER)
    given, calls = [], []
    step, reset = mjx_pool_env.step, mjx_pool_env.reset

    def keep(out):
        given.append({k: np.array(v) for k, v in out[0].items() if not isinstance(v, str)})
        return out

    def seen(worlds, obs):
        calls.append((len(given), np.array(worlds),
                      {k: None if v is None else np.array(v) for k, v in obs.items() if not isinstance(v, str)}))

    monkeypatch.setattr(mjx_pool_env, "step", lambda *a, **k: keep(step(*a, **k)))
    monkeypatch.setattr(mjx_pool_env, "reset", lambda *a, **k: keep(reset(*a, **k)))
    if isolated:
        class Spy(isolation.ChildBatchController):
            def start(self, worlds, obs, info):
                seen(worlds, obs)
                return super().start(worlds, obs, info)

            def compute_controls(self, worlds, obs, info):
                seen(worlds, obs)
                return super().compute_controls(worlds, obs, info)

        monkeypatch.setattr(runner, "ChildBatchController", Spy)
    else:
        make = runner._batch_controller

        def spied(*args):
            controller = make(*args)
            for name in ("start", "compute_controls"):
                def call(worlds, obs, info, method=getattr(controller, name)):
                    seen(worlds, obs)
                    return method(worlds, obs, info)
                setattr(controller, name, call)
            return controller

        monkeypatch.setattr(runner, "_batch_controller", spied)
    result = run(plugin, mjx_pool_env, batched=True, isolation=Isolation() if isolated else None, **how)
    assert len(result.episodes) == 7 and len({e.track_id for e in result.episodes}) == 3
    assert all(e.error is None for e in result.episodes)  # no call refused on the way
    assert len(calls) > 10
    left_out = 0
    for count, worlds, obs in calls:
        env_obs = given[count - 1]
        assert obs.keys() == env_obs.keys()
        missing = {k for k, v in obs.items() if v is None}
        assert missing in (set(), set(isolation.TRACK_FIELDS) if isolated else set())
        left_out += bool(missing)
        for k, v in obs.items():
            if v is not None:
                np.testing.assert_array_equal(v, env_obs[k][worlds], err_msg=k)
    assert (left_out > 10) if isolated else left_out == 0


def test_an_isolated_batched_child_sees_each_track_it_was_sent_once(tmp_path, mjx_pool_env, monkeypatch):
    """Isolated, a world's track fields cross to the batched child with
    its episode's start only, and the child fills them in: the episodes
    are the in-process ones bit for bit, on worlds that change tracks
    between episodes, while every call after a start leaves them out."""
    from racing_env import isolation

    plugin = make_plugin(tmp_path, "reader", TRACK_READER)
    how = dict(track_indices=[2, 0, 1, 1, 2, 0], seed=5, batched=True)
    here = run(plugin, mjx_pool_env, **how)
    sent = []
    call = isolation._Child.call

    def spy(self, method, args, timeout_s):
        if method in ("batch_start", "compute_controls"):
            sent.append((method, {k: args[1][k] is None for k in isolation.TRACK_FIELDS}))
        return call(self, method, args, timeout_s)

    monkeypatch.setattr(isolation._Child, "call", spy)
    there = run(plugin, mjx_pool_env, isolation=Isolation(), **how)
    assert _episodes(there) == _episodes(here) and len(here.episodes) == 6
    assert len({e["track_id"] for e in _episodes(here)}) == 3
    starts = [left for method, left in sent if method == "batch_start"]
    calls = [left for method, left in sent if method == "compute_controls"]
    assert starts and not any(any(left.values()) for left in starts)  # a start sends the whole track
    assert calls and all(all(left.values()) for left in calls)  # every later call leaves it out


def track_rows(rng: np.random.Generator, rows: int, points: int) -> dict[str, np.ndarray]:
    """A stacked observation of ``rows`` worlds: a velocity and random track
    fields of ``points`` points each (what `TRACK_READER` reads)."""
    lines = {k: rng.normal(size=(rows, points, 2)) for k in ("centerline", "left_boundary", "right_boundary")}
    return {"velocity_body": rng.normal(size=(rows, 2)), **lines, "track_mask": np.ones((rows, points), bool),
            "track_length": rng.uniform(100, 200, rows)}


def test_an_isolated_batched_proxy_takes_left_out_tracks_only_where_its_child_keeps_them(tmp_path, env):
    """`ChildBatchController.keeps_tracks` says whether a call may leave the
    track fields out (None): only for worlds whose episodes' tracks the
    child keeps, in the layout it keeps. Such a call is answered as one
    with the whole fields; left out elsewhere (a world on another track,
    no track ids, only some of the fields) it is refused by name, and the
    child answers on; a new child keeps nothing until its own starts."""
    from racing_env import isolation

    plugin = make_plugin(tmp_path, "reader", TRACK_READER)
    rng = np.random.default_rng(8)
    obs = track_rows(rng, 3, 6)
    info = {"track_id": np.array([4, 2, 6], np.uint32)}
    there = isolation.ChildBatchController(plugin.directory, challenge_values(env), Isolation(), 3)
    try:
        two = np.array([0, 1])
        assert not there.keeps_tracks(two, obs, {"track_id": info["track_id"][:2]})  # nothing started yet
        there.start(two, {k: v[:2] for k, v in obs.items()}, {"track_id": info["track_id"][:2]})
        rows = {k: v[:2] for k, v in obs.items()}
        assert there.keeps_tracks(two, obs, {"track_id": info["track_id"][:2]})  # every world's fields: their layout
        assert not there.keeps_tracks(two, rows, {"track_id": np.array([4, 5], np.uint32)})  # world 1 elsewhere
        assert not there.keeps_tracks(two, {**rows, "centerline": rows["centerline"][:, :5]},
                                      {"track_id": info["track_id"][:2]})  # another layout
        whole = there.compute_controls(two, rows, {"track_id": info["track_id"][:2]})
        left = {**rows, **dict.fromkeys(isolation.TRACK_FIELDS)}
        np.testing.assert_array_equal(there.compute_controls(two, left, {"track_id": info["track_id"][:2]}), whole)
        with pytest.raises(ValueError, match=r"of worlds \[0, 1\] are None"):
            there.compute_controls(two, left, {"track_id": np.array([4, 5], np.uint32)})
        with pytest.raises(ValueError, match="or only some are None"):  # a part left out: never filled from memory
            there.compute_controls(two, {**rows, "centerline": None}, {"track_id": info["track_id"][:2]})
        there.start(np.array([2]), {k: v[2:] for k, v in obs.items()}, {"track_id": np.array([6], np.uint32)})
        with pytest.raises(ValueError, match="keeps no track"):
            there.compute_controls(np.array([2]), {**{k: v[2:] for k, v in obs.items()},
                                                   **dict.fromkeys(isolation.TRACK_FIELDS)}, {})
        np.testing.assert_array_equal(there.compute_controls(two, left, {"track_id": info["track_id"][:2]}), whole)
        there.close()  # a new child keeps nothing until its starts
        assert not there.keeps_tracks(two, obs, {"track_id": info["track_id"][:2]})
        there.start(np.array([1]), {k: v[1:2] for k, v in obs.items()}, {"track_id": info["track_id"][1:2]})
        assert there.keeps_tracks(np.array([1]), obs, {"track_id": info["track_id"][1:2]})
        assert not there.keeps_tracks(two, obs, {"track_id": info["track_id"][:2]})
    finally:
        there.close()


def test_an_isolated_batched_childs_actions_cross_exactly_and_a_malformed_reply_kills_it(tmp_path, env, monkeypatch):
    """The batched child's actions cross as their float64 bytes: bit for
    bit the in-process controller's, extreme values and NaN included (the
    env ends a NaN's episode, not the crossing); a reply of another length
    or not hexadecimal is out of protocol: `ControllerFailed`, the child
    killed."""
    from racing_env import isolation

    code = """
    from racing_env.controller import BatchController

    class Odd(BatchController):
        def start(self, worlds, obs, info):
            pass

        def compute_controls(self, worlds, obs, info):
            values = np.array([0.1, -0.0, 1e-310, 1.7976931348623157e308, np.nan, 2.0 / 3.0])
            return np.stack([values[worlds % 6], np.asarray(obs["speed"], np.float64)], -1)

    class One(Controller):
        def compute_control(self, obs, info=None):
            return np.zeros(2)
"""
    plugin = make_plugin(tmp_path, "odd", code)
    challenge = challenge_values(env)
    here = plugin.load_batch_class()(plugin.config(challenge), 6)
    there = isolation.ChildBatchController(plugin.directory, challenge, Isolation(), 6)
    try:
        worlds = np.arange(6)
        obs = {"speed": np.float32([0.5, 3.25, -1e-7, 7.0, 1e30, 0.1])}
        for controller in (here, there):
            controller.start(worlds, obs, {})
        got, want = there.compute_controls(worlds, obs, {}), here.compute_controls(worlds, obs, {})
        assert got.dtype == np.float64 and got.tobytes() == want.astype(np.float64).tobytes()
        call = isolation._Child.call
        for reply in ("00" * 16 * 5, "zz" * 16 * 6, [[0.0, 0.0]] * 6):
            monkeypatch.setattr(isolation._Child, "call", lambda self, method, args, timeout_s, r=reply: (
                r if method == "compute_controls" else call(self, method, args, timeout_s)))
            with pytest.raises(isolation.ControllerFailed, match="out of protocol"):
                there.compute_controls(worlds, obs, {})
            assert there._child is None  # killed
            monkeypatch.setattr(isolation._Child, "call", call)
            there.start(worlds, obs, {})  # a new child
    finally:
        there.close()


def test_an_isolated_batched_child_is_sent_whole_tracks_when_their_layout_changes(tmp_path, env, monkeypatch):
    """A start whose track fields have another shape makes the child keep
    them anew: the other worlds' tracks are then sent whole, so every
    answer is the in-process controller's (a world whose track was
    forgotten would read zeros)."""
    from racing_env import isolation

    plugin = make_plugin(tmp_path, "reader", TRACK_READER)
    rng = np.random.default_rng(4)

    challenge = challenge_values(env)
    here = plugin.load_batch_class()(plugin.config(challenge), 2)
    there = isolation.ChildBatchController(plugin.directory, challenge, Isolation(), 2)
    sent = []
    call = isolation._Child.call

    def spy(self, method, args, timeout_s):
        sent.append(method == "compute_controls" and args[1]["centerline"] is None)
        return call(self, method, args, timeout_s)

    monkeypatch.setattr(isolation._Child, "call", spy)
    try:
        first = track_rows(rng, 2, 8)
        info = {"track_id": np.array([7, 9], np.uint32)}
        for controller in (here, there):
            controller.start(np.array([0, 1]), first, info)
        step = {**first, "velocity_body": rng.normal(size=(2, 2))}
        np.testing.assert_array_equal(there.compute_controls(np.array([0, 1]), step, info),
                                      here.compute_controls(np.array([0, 1]), step, info))
        assert sent[-1]  # the tracks stayed in the child
        for points, track in ((12, 3), (8, 5)):  # world 1 begins on a track of another layout, then of the first
            other = track_rows(rng, 1, points)
            for controller in (here, there):
                controller.start(np.array([1]), other, {"track_id": np.array([track], np.uint32)})
        world0 = {k: v[:1] for k, v in step.items()}
        np.testing.assert_array_equal(there.compute_controls(np.array([0]), world0, {"track_id": info["track_id"][:1]}),
                                      here.compute_controls(np.array([0]), world0, {"track_id": info["track_id"][:1]}))
        assert not sent[-1]  # world 0's track went whole
    finally:
        there.close()
