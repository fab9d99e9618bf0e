"""``evaluate``, the Runner's command line: a plugin on the first tracks of a
verified split, the JSON result on the pool's own rows, the picture, clear
errors for a bad level, split or count."""

import contextlib
import dataclasses
import io
import json
import re
import os
import select
import sys
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image
from plugin_dirs import CTRL_C_DROPPED_IN_GC, DROPPED_LINE, ctrl_c_on, write_plugin

from racing_stack import evaluate, pools


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    return tmp_path_factory.mktemp("recording") / "laps.gif"


@pytest.fixture(scope="module")
def first_two(cache, recording):
    """The pure-pursuit reference on Validation's first two tracks, recorded."""
    from racing_env import ProjectConfig
    from racing_env.render import EpisodeView

    with pytest.MonkeyPatch.context() as patch, \
            EpisodeView(ProjectConfig().control_dt_s, record=recording, size=(320, 240)) as view:
        patch.setenv("RACING_STACK_CACHE", str(cache))
        return evaluate.evaluate(backend="cpu_reference", tracks=2, view=view)


def test_it_drives_the_splits_first_tracks_once_each(first_two):
    committed = json.loads((pools.MANIFESTS / f"{pools.pool_name('validation')}.json").read_text())
    ids = [t["track_id"] for t in committed["tracks"][:2]]
    assert [e["track_id"] for e in first_two["episodes"]] == ids
    assert first_two["level"] == 1 and first_two["split"] == "validation"
    assert first_two["summary"]["success_rate"] == 1.0  # the reference laps them
    lengths = first_two["track_length_m"]
    assert sorted(lengths) == sorted(str(i) for i in ids)  # the driven tracks, no others
    assert all(300.0 < lengths[str(i)] < 1500.0 for i in ids)


def test_world_0s_episodes_are_recorded(first_two, recording):
    kept = offered = 0
    for episode in first_two["episodes"]:  # each episode's reset and steps: every 5th, and its terminal step
        for step in range(episode["steps"] + 1):
            kept += offered % 5 == 0 or step == episode["steps"]
            offered += 1
    with Image.open(recording) as gif:
        assert gif.n_frames == kept and gif.size == (320, 240)


def test_the_command_line_writes_the_result_and_draws_it(first_two, tmp_path, capsys):
    result = tmp_path / "result.json"
    result.write_text(json.dumps(first_two))
    picture = tmp_path / "result.png"
    assert evaluate.main(["--from-result", str(result), "--plot", str(picture), "--reference", str(result)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["summary"] == first_two["summary"]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000


@pytest.mark.parametrize("argv,message", [
    (["--seed", "-1"], "argument --seed: must be in [0, 2**32), got -1"),
    (["--tracks", "0"], "argument --tracks: must be >= 1, got 0"),
    (["--episodes", "0"], "argument --episodes: must be >= 1, got 0"),
    (["--worlds", "0"], "argument --worlds: must be >= 1, got 0"),
    (["--worlds", "two"], "argument --worlds: must be an integer, got 'two'"),
    (["--record", "laps.gif", "--record-fps", "61"], "argument --record-fps: must be in [0.1, 60], got 61"),
    (["--record", "laps.gif", "--record-fps", "1e-5"], "argument --record-fps: must be in [0.1, 60], got 1e-5"),
    (["--out", "taken"], "argument --out: 'taken' is a folder, not a file"),
    (["--out", "/proc/evaluate/result.json"], "argument --out: cannot write in '/proc'"),
    (["--plot", "file.txt/result.png"], "argument --plot: "),
    (["--plot", "result.xyz"], "argument --plot: must end in one of "),
    (["--record", "taken/sub/laps.mp4", "--out", "file.txt/x.json"], "argument --out: "),  # no folder made
    (["--record", "new/laps.png"], "argument --record: must end in one of .gif, .mp4"),
    (["--reference", "missing.json"], "argument --reference: cannot read a JSON result from 'missing.json'"),
    (["--reference", "file.txt"], "argument --reference: cannot read a JSON result from 'file.txt'"),
    (["--from-result", "taken"], "argument --from-result: cannot read a JSON result from 'taken'"),
    (["--call-timeout", "0"], "argument --call-timeout: must be in (0, 3600], got 0"),
    (["--start-timeout", "nan"], "argument --start-timeout: must be in (0, 3600], got nan"),
    (["--memory-limit", "512"], "argument --memory-limit: must be >= 1024, got 512"),
    (["--memory-limit", str(2**40)], "argument --memory-limit: memory_limit_mb must be in [1024, 2**40)"),
    (["--out", "taken.json"], "argument --out's episodes: 'taken.episodes.jsonl' is a folder, not a file"),
    (["--out", "same.png", "--plot", "same.png"], "arguments --out and --plot name one file, 'same.png'"),
    (["--record", "x.gif", "--plot", "./x.gif"], "arguments --plot and --record name one file, 'x.gif'"),
    (["--out", "a" * 300 + ".json"], "argument --out: 'aaaa"),
    (["--reference", "fifo"], "argument --reference: cannot read a JSON result from 'fifo' ('fifo' is not a regular"),
    (["--out", "fifo"], "argument --out: 'fifo' is a pipe that no process reads"),
    (["--plot", "fifo.png"], "argument --plot: 'fifo.png' is a pipe; --plot is written to a file only"),
    (["--out", "loop.json"], "argument --out: 'loop.json' cannot be used (Too many levels of symbolic links)"),
    (["--from-result", "no_episodes.json"], "argument --from-result: 'no_episodes.json' is not an evaluate result "
                                            "(episodes must be a list of objects with track_id"),
    (["--reference", "no_lap.json"], "argument --reference: 'no_lap.json' is not an evaluate result (episodes must "
                                     "be a list of objects with track_id, termination_reason, lap_completed, "
                                     "lap_time_s (a lap time where lapped))"),
    (["--from-result", "no_length.json"], "'no_length.json' is not an evaluate result (track_length_m must give "
                                          "each episode's track length)"),
    (["--level", "1", "--split", "nope"], "argument --split: must be one of train, validation, test, got 'nope'"),
    (["--split", "test", "--tracks", "1001"], "argument --tracks: the test split holds 1000 tracks, got 1001"),
    (["--tracks", "10001"], "argument --tracks: the train split holds 10000 tracks, got 10001"),
    (["--controller", "/nonexistent/plugin"],
     "argument --controller: plugin directory /nonexistent/plugin does not exist"),
    (["--tracks", "2", "--worlds", "3"], "argument --worlds: at most one world an episode (2 in this run), got 3"),
    (["--backend", "cpu_reference", "--worlds", "4"], "argument --worlds: cpu_reference runs one world, got 4"),
    (["--no-isolate", "--call-timeout", "3"],
     "argument --call-timeout: limits an isolated controller, and this run is not isolated (--no-isolate)"),
    (["--level", "0", "--memory-limit", "2048"], "argument --memory-limit: limits an isolated controller, and this "
                                                 "run is not isolated (Level 0 runs unisolated unless --isolate)"),
    (["--record-fps", "5"], "argument --record-fps: sets --record's frame rate; give --record FILE"),
    (["--controller", "bad_toml"], "argument --controller: "),
])
def test_bad_options_are_usage_errors_naming_the_flag(argv, message, cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("RACING_STACK_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken.episodes.jsonl").mkdir()
    (tmp_path / "file.txt").write_text("")
    os.mkfifo(tmp_path / "fifo")
    os.mkfifo(tmp_path / "fifo.png")
    (tmp_path / "bad_toml").mkdir()
    (tmp_path / "bad_toml" / "controller.py").write_text("")
    (tmp_path / "bad_toml" / "config.toml").write_text("speed = \n")
    (tmp_path / "loop.json").symlink_to("loop2.json")
    (tmp_path / "loop2.json").symlink_to("loop.json")
    episode = {"track_id": 7, "termination_reason": "success", "lap_completed": True, "lap_time_s": 30.0}
    result = {"plugin": "p", "backend": "cpu_reference", "worlds": 1, "level": 1, "split": "test",
              "summary": {"success_rate": 1.0, "lap_time_s": {"median": 30.0}}, "seconds": 1.0,
              "track_length_m": {"7": 500.0}, "episodes": [episode]}
    for name, changed in (("no_episodes", {"episodes": [{}]}),
                          ("no_lap", {"episodes": [{**episode, "lap_time_s": None}]}),
                          ("no_length", {"track_length_m": {"8": 500.0}})):
        (tmp_path / f"{name}.json").write_text(json.dumps({**result, **changed}))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    monkeypatch.setattr(evaluate, "evaluate", None)  # nothing may run
    with pytest.raises(SystemExit) as stop:
        evaluate.main(["--split", "train", *argv])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_cache_variable_is_a_usage_error_before_any_work(empty, tmp_path, monkeypatch, capsys):
    """An empty ``$RACING_STACK_CACHE`` would build the pools into the
    working folder: refused as `materialize-track-pool` refuses it."""
    monkeypatch.setenv("RACING_STACK_CACHE", empty)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(evaluate, "evaluate", None)  # nothing may run
    with pytest.raises(SystemExit) as stop:
        evaluate.main(["--backend", "cpu_reference", "--tracks", "1"])
    assert stop.value.code == 2
    assert "evaluate: error: $RACING_STACK_CACHE is set but empty: it must name a folder (or be unset)" in \
        capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["--split", "bogus"], ["--tracks", "5000"], ["--level", "0", "--worlds", "2"],
                                  ["--level", "0", "--controller", "/nonexistent/plugin"]])
def test_a_refused_run_leaves_an_earlier_runs_episodes_as_they_were(argv, cache, tmp_path, monkeypatch, capsys):
    """The episodes file beside ``--out`` is written from the first ended
    episode on: a run refused before any (exit 2) leaves the one an
    earlier run wrote, or none, as it was."""
    monkeypatch.setenv("RACING_STACK_CACHE", str(cache))
    kept = tmp_path / "kept.json"
    evaluate.episodes_file(kept).write_text('{"earlier": "run"}\n')
    for out in (kept, tmp_path / "new.json"):
        with pytest.raises(SystemExit) as stop:
            evaluate.main(["--backend", "cpu_reference", *argv, "--out", str(out)])
        assert stop.value.code == 2
    assert evaluate.episodes_file(kept).read_text() == '{"earlier": "run"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.episodes.jsonl"]
    capsys.readouterr()


def test_a_from_result_without_a_summary_is_named(tmp_path, capsys):
    sim_result = tmp_path / "sim.json"
    sim_result.write_text(json.dumps({"plugin": "x", "episodes": []}))
    with pytest.raises(SystemExit) as stop:
        evaluate.main(["--from-result", str(sim_result)])
    assert stop.value.code == 2 and "is not an evaluate result (no backend, worlds, level" in capsys.readouterr().err


def test_the_picture_s_folder_is_made(first_two, tmp_path, capsys):
    result = tmp_path / "result.json"
    result.write_text(json.dumps(first_two))
    picture = tmp_path / "new" / "folder" / "result.png"
    assert evaluate.main(["--from-result", str(result), "--plot", str(picture)]) == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


BOOM = """
from racing_env.controller import Controller


class Boom(Controller):
    def compute_control(self, obs, info=None):
        raise RuntimeError("boom")
"""


def test_a_run_where_every_episode_failed_with_a_controller_error_exits_1(tmp_path, capsys):
    plugin = tmp_path / "boom"
    plugin.mkdir()
    (plugin / "controller.py").write_text(BOOM)
    (plugin / "config.toml").write_text("")
    out = tmp_path / "boom.json"
    argv = ["--controller", str(plugin), "--level", "0", "--episodes", "2", "--backend", "cpu_reference"]
    assert evaluate.main([*argv, "--out", str(out)]) == 1
    printed = capsys.readouterr()
    assert json.loads(printed.out)["summary"]["controller_errors"] == 2  # the summary still comes
    assert "every episode (2) ended with a controller error" in printed.err and "RuntimeError: boom" in printed.err
    assert [e["termination_reason"] for e in json.loads(out.read_text())["episodes"]] == ["invalid_action"] * 2
    assert "1 when every" in evaluate.__doc__  # --help says so


@pytest.mark.parametrize("verbose", [False, True])
def test_warp_s_info_messages_only_with_verbose(first_two, tmp_path, capsys, verbose):
    import warp as wp

    result = tmp_path / "result.json"
    result.write_text(json.dumps(first_two))
    before = wp.config.log_level
    try:
        assert evaluate.main(["--from-result", str(result)] + ["--verbose"] * verbose) == 0
        assert wp.config.log_level == (wp.LOG_INFO if verbose else wp.LOG_WARNING)
    finally:
        wp.config.log_level = before


_plugin = write_plugin


QUITS = """
import sys
from racing_env.controller import Controller


class Quits(Controller):
    def compute_control(self, obs, info=None):
        sys.exit(0)
"""


def test_a_controller_calling_sys_exit_is_a_controller_error(tmp_path, capsys):
    """sys.exit(0) in a plugin ended evaluate with status 0, no output and
    no result file; it is a controller error ending its episode instead."""
    plugin = _plugin(tmp_path, "quits", QUITS)
    out = tmp_path / "quits.json"
    argv = ["--controller", str(plugin), "--level", "0", "--episodes", "2", "--backend", "cpu_reference"]
    assert evaluate.main([*argv, "--out", str(out)]) == 1
    printed = capsys.readouterr()
    assert json.loads(printed.out)["summary"]["controller_errors"] == 2
    assert "SystemExit: 0" in printed.err
    episodes = json.loads(out.read_text())["episodes"]
    assert [e["termination_reason"] for e in episodes] == ["invalid_action"] * 2
    assert all("SystemExit" in e["error"] for e in episodes)


# The first episode ends at once (a NaN action), the second one's controller is interrupted.
STOPPED = """
import numpy as np
from racing_env.controller import Controller


class Stopped(Controller):
    def compute_control(self, obs, info=None):
        if int(info["episode_seed"]) == SECOND:
            raise KeyboardInterrupt
        return np.full(2, np.nan)
"""


def test_ctrl_c_writes_the_partial_result_and_exits_130(tmp_path, capsys):
    from racing_env import LEVEL_0, ProjectConfig, VecCarRacingEnv, level0_track

    seeds = VecCarRacingEnv(1, config=ProjectConfig(), level=LEVEL_0, backend="cpu_reference",
                            track=level0_track())
    seeds.reset(seed=0)
    _, _, _, _, info = seeds.step([[float("nan")] * 2])  # the first episode ends
    _, _, _, _, info = seeds.step([[0.0, 0.0]])  # the NEXT_STEP reset: the second episode
    second = int(info["episode_seed"][0])
    plugin = _plugin(tmp_path, "stopped", STOPPED.replace("SECOND", str(second)))
    out = tmp_path / "partial.json"
    argv = ["--controller", str(plugin), "--level", "0", "--episodes", "5", "--backend", "cpu_reference"]
    assert evaluate.main([*argv, "--out", str(out)]) == 130
    printed = capsys.readouterr()
    summary = json.loads(printed.out)
    assert summary["interrupted"] is True and summary["summary"]["episodes"] == 1
    assert 'evaluate: interrupted; the result holds the episodes that had ended, 1 ("interrupted": true)' in printed.err
    result = json.loads(out.read_text())
    assert result["interrupted"] is True
    assert [e["termination_reason"] for e in result["episodes"]] == ["invalid_action"]
    assert "130 after Ctrl-C" in evaluate.__doc__  # --help says so


STARTED = """
import numpy as np
from pathlib import Path
from racing_env.controller import Controller


class Started(Controller):
    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        with Path(MARK).open("a") as built:  # one mark per episode started
            built.write("x")

    def compute_control(self, obs, info=None):
        return np.full(2, np.nan)  # each episode ends at its first step
"""


def _long_run(tmp_path, out, started, sig, controller=STARTED):
    """A Level 0 run of 100,000 one-step episodes (of ``controller``, whose
    MARK file gets a mark per episode started), sent ``sig`` once
    ``started`` episodes have been started (None: no signal); its stdout,
    stderr, return code and the episodes started by then."""
    import os
    import subprocess
    import sys
    import time

    mark = tmp_path / "episodes_started.txt"
    plugin = _plugin(tmp_path, "started", controller.replace("MARK", repr(str(mark))))
    command = [sys.executable, "-m", "racing_stack.evaluate", "--controller", str(plugin), "--level", "0",
               "--episodes", "100000", "--backend", "cpu_reference", "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, RACING_STACK_CACHE=str(tmp_path / "cache")), preexec_fn=ctrl_c_on)
    try:
        deadline = time.monotonic() + 300
        while not mark.exists() or len(mark.read_text()) < started:
            assert process.poll() is None and time.monotonic() < deadline, "evaluate did not start its run"
            time.sleep(0.1)
        if sig is not None:
            process.send_signal(sig)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return stdout, stderr, process.returncode, len(mark.read_text())


def test_sigint_stops_the_command_with_the_partial_result(tmp_path):
    """A real Ctrl-C (SIGINT) during a long run: exit 130, the result file
    holds the episodes that had ended and says it was interrupted."""
    import signal

    out = tmp_path / "partial.json"
    stdout, stderr, code, _ = _long_run(tmp_path, out, 3, signal.SIGINT)  # two episodes have ended
    assert code == 130, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["interrupted"] is True and 0 < len(result["episodes"]) < 100000
    assert result["summary"]["episodes"] == len(result["episodes"])
    assert json.loads(stdout)["interrupted"] is True and "evaluate: interrupted" in stderr
    appended = [json.loads(line) for line in evaluate.episodes_file(out).read_text().splitlines()]
    assert appended == result["episodes"]  # each ended episode was appended as it ended


DROPPED = CTRL_C_DROPPED_IN_GC + """
from pathlib import Path


class Dropped(Controller):
    def __init__(self, obs, info, config):
        super().__init__(obs, info, config)
        with Path(MARK).open("a") as built:
            built.write("x")
        if len(Path(MARK).read_text()) == 3:
            drop_a_ctrl_c()

    def compute_control(self, obs, info=None):
        return np.full(2, np.nan)
"""


def test_a_ctrl_c_dropped_in_a_gc_callback_still_stops_the_command(tmp_path):
    """A Ctrl-C whose KeyboardInterrupt Python drops (raised inside a garbage
    collector callback, as JAX has one) is raised again: the command stops
    with the partial result and exit 130, not after 100,000 episodes."""
    out = tmp_path / "dropped.json"
    stdout, stderr, code, _ = _long_run(tmp_path, out, 3, None, DROPPED)
    assert DROPPED_LINE in stderr and "Traceback" not in stderr, stderr[-3000:]  # dropped once, not printed
    assert code == 130, stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["interrupted"] is True and 2 <= len(result["episodes"]) < 100000


def test_a_killed_run_leaves_its_ended_episodes_on_disk(tmp_path):
    """SIGKILL (no handler runs, no --out written): the .episodes.jsonl
    sibling holds every episode that had ended, one complete line each."""
    import signal

    out = tmp_path / "killed.json"
    _, _, code, started = _long_run(tmp_path, out, 4, signal.SIGKILL)  # three episodes have ended
    assert code == -signal.SIGKILL
    lines = evaluate.episodes_file(out).read_text().splitlines()
    assert 3 <= len(lines) <= started and not out.exists()
    assert all(json.loads(line)["termination_reason"] == "invalid_action" for line in lines)


HANGS = """
import time
from racing_env.controller import Controller


class Hangs(Controller):
    def compute_control(self, obs, info=None):
        time.sleep(3600)
"""


def test_an_isolated_hanging_controller_is_timed_out_and_the_run_completes(tmp_path, capsys):
    plugin = _plugin(tmp_path, "hangs", HANGS)
    out = tmp_path / "hangs.json"
    argv = ["--controller", str(plugin), "--level", "0", "--episodes", "2", "--backend", "cpu_reference",
            "--isolate", "--call-timeout", "0.5", "--out", str(out)]
    assert evaluate.main(argv) == 1  # every episode ended with a controller error
    assert "ran past its 0.5 s wall-clock limit" in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert [e["termination_reason"] for e in result["episodes"]] == ["invalid_action"] * 2
    assert result["interrupted"] is False
    assert [json.loads(line) for line in evaluate.episodes_file(out).read_text().splitlines()] == result["episodes"]


def test_isolation_is_on_by_default_for_level_1_and_its_plugin_check_runs_in_a_child(tmp_path, capsys, cache,
                                                                                     monkeypatch):
    """A plugin that does not import is still a usage error (exit 2) when
    checked in a child; its module code never runs in evaluate's process."""
    import builtins

    monkeypatch.setenv("RACING_STACK_CACHE", str(cache))
    plugin = _plugin(tmp_path, "broken", "import builtins\nbuiltins.broken_ran = True\nraise ImportError('nope')\n")
    assert evaluate.main(["--controller", str(plugin), "--backend", "cpu_reference", "--tracks", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evaluate: argument --controller: ") and "failed to import: ImportError: nope" in err
    assert not hasattr(builtins, "broken_ran")


def test_an_out_that_is_no_file_of_its_own_gets_no_episodes_file(tmp_path, monkeypatch, capsys):
    """``--out /dev/null`` writes the result there and no episodes file
    beside it (none can live in /dev)."""
    monkeypatch.chdir(tmp_path)
    assert evaluate.main(["--level", "0", "--backend", "cpu_reference", "--out", os.devnull]) == 0
    assert not os.path.exists(os.devnull + ".episodes.jsonl") and os.listdir(tmp_path) == []
    assert json.loads(capsys.readouterr().out)["level"] == 0


# Each episode ends at its first step (a NaN action, no controller error): a run of a few takes milliseconds.
NAN = """
import numpy as np
from racing_env.controller import Controller


class Nan(Controller):
    def compute_control(self, obs, info=None):
        return np.full(2, np.nan)
"""


def _nan_run(tmp_path, episodes=2):
    """evaluate's arguments for a run of ``episodes`` one-step episodes on Level 0."""
    plugin = _plugin(tmp_path, "nan", NAN)
    return ["--controller", str(plugin), "--level", "0", "--episodes", str(episodes), "--backend", "cpu_reference"]


def test_each_written_file_is_said_on_stderr(tmp_path, capsys):
    """The result with its episodes file, the picture and the recording
    with its frames: one line each, after the summary; the summary alone
    on stdout."""
    out, plot, record = tmp_path / "r.json", tmp_path / "r.png", tmp_path / "r.gif"
    assert evaluate.main(_nan_run(tmp_path) + ["--out", str(out), "--plot", str(plot), "--record", str(record)]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["summary"]["episodes"] == 2
    frames = int(re.search(r"\((\d+) frames at 10 frames/s\)", printed.err).group(1))
    assert printed.err.splitlines()[-3:] == [
        f"evaluate: wrote the result to {str(out)!r} (its episodes, one a line, in "
        f"{str(evaluate.episodes_file(out))!r})",
        f"evaluate: wrote the picture to {str(plot)!r}",
        f"evaluate: wrote the recording to {str(record)!r} ({frames} frames at 10 frames/s)"]
    assert frames >= 1 and out.exists() and plot.exists() and record.exists()


def test_a_failed_result_write_is_one_line_and_exit_1_after_the_summary(tmp_path, capsys):
    """``--out /dev/full``: the summary is printed, the failed write is one
    line naming the file (no traceback), exit status 1."""
    assert evaluate.main([*_nan_run(tmp_path), "--out", "/dev/full"]) == 1
    printed = capsys.readouterr()
    assert json.loads(printed.out)["summary"]["episodes"] == 2
    last = printed.err.splitlines()[-1]
    assert last == "evaluate: could not write the result to '/dev/full' (No space left on device)"
    assert "1 when every" in evaluate.__doc__ and "could not be written" in evaluate.__doc__  # --help says so


def test_a_failed_picture_write_is_one_line_and_exit_1_after_the_summary(tmp_path, capsys):
    episode = {"track_id": 7, "termination_reason": "success", "lap_completed": True, "lap_time_s": 30.0}
    summary = {"success_rate": 1.0, "lap_time_s": {"median": 30.0}}
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"plugin": "p", "backend": "cpu_reference", "worlds": 1, "level": 1, "split": "test",
                                  "summary": summary, "seconds": 1.0, "track_length_m": {"7": 500.0},
                                  "episodes": [episode]}))
    (tmp_path / "full.png").symlink_to("/dev/full")
    assert evaluate.main(["--from-result", str(result), "--plot", str(tmp_path / "full.png")]) == 1
    printed = capsys.readouterr()
    assert json.loads(printed.out)["summary"] == summary
    assert printed.err.splitlines()[-1].startswith(f"evaluate: could not write the picture to '{tmp_path}/full.png' (")


def test_a_failed_episodes_file_warns_once_and_the_run_goes_on(tmp_path, capsys):
    """The episodes file on a full disk: one warning naming it, every
    episode still run, the result complete, exit status 0."""
    out = tmp_path / "run.json"
    evaluate.episodes_file(out).symlink_to("/dev/full")
    assert evaluate.main([*_nan_run(tmp_path, 3), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    warnings = [line for line in printed.err.splitlines() if "could not write" in line]
    assert warnings == [f"evaluate: could not write the episodes file '{tmp_path}/run.episodes.jsonl' (No space left "
                        "on device); the run goes on without it, its result holds every episode"]
    assert json.loads(printed.out)["summary"]["episodes"] == 3
    assert len(json.loads(out.read_text())["episodes"]) == 3


@contextlib.contextmanager
def _reader(pipe, stdout):
    """A process reading the named pipe ``pipe`` as ``cat pipe`` does: open
    before the command starts, it reads until the end of the file (no
    writer has it open any more) and leaves. Yields what it got: its
    ``"text"`` and what ``stdout`` held when its first bytes came."""
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # without waiting for a writer, as cat's open would
    got = {"text": "", "stdout_then": None}

    def read():
        chunks, poll, deadline = [], select.poll(), time.monotonic() + 60
        poll.register(fd, select.POLLIN)
        while time.monotonic() < deadline:
            poll.poll(1000)  # data, or the end: a writer opened it and none has it open now
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                break
            if not chunks:
                got["stdout_then"] = stdout.getvalue()
            chunks.append(chunk)
        got["text"] = b"".join(chunks).decode()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        yield got
    finally:
        thread.join(60)
        os.close(fd)


def test_an_out_pipe_with_a_reader_is_written_once_after_the_summary(tmp_path, monkeypatch):
    """``--out`` a named pipe that a process reads: the check does not open
    it only to close it (its reader would see the end of the file and
    leave, and the write after the run would wait for another forever);
    the reader gets the whole result, after the summary is printed."""
    pipe = tmp_path / "result.pipe"
    os.mkfifo(pipe)
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    with _reader(pipe, stdout) as got:
        assert evaluate.main([*_nan_run(tmp_path), "--out", str(pipe)]) == 0
    result = json.loads(got["text"])  # all of it, in one go
    assert [e["termination_reason"] for e in result["episodes"]] == ["invalid_action"] * 2
    assert json.loads(got["stdout_then"])["summary"] == result["summary"]


def test_an_episodes_file_that_is_a_pipe_gets_each_episode_once(tmp_path, monkeypatch):
    out = tmp_path / "run.json"
    os.mkfifo(evaluate.episodes_file(out))
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    with _reader(evaluate.episodes_file(out), sys.stdout) as got:
        assert evaluate.main([*_nan_run(tmp_path), "--out", str(out)]) == 0
    assert [json.loads(line) for line in got["text"].splitlines()] == json.loads(out.read_text())["episodes"]


def _learned_plugin(tmp_path):
    """A freshly initialised PPO policy of the CPU preset, exported (its mean action drives: it moves the car)."""
    from racing_env.plugins import load_plugin

    from racing_stack.ppo import PRESETS
    from racing_stack.ppo.export import export_plugin
    from racing_stack.ppo.networks import ActorCritic

    config = PRESETS["cpu"]
    torch.manual_seed(3)
    low, high = np.array([-0.6, -8.0], np.float32), np.array([0.6, 4.0], np.float32)
    policy = ActorCritic(config.features.size, config.hidden, config.init_log_std, low, high)
    with torch.no_grad():
        policy.actor[-1].bias.copy_(torch.tensor([0.05, 0.6]))  # steer a little, accelerate
    return load_plugin(export_plugin(policy, config, tmp_path / "learned"))


def test_the_learned_plugin_drives_batched_as_it_drives_an_episode_at_a_time(tmp_path):
    """An exported PPO plugin's BatchController on three worlds, its
    network on the CPU: the per-episode controllers' episodes bit for bit."""
    from racing_env import LEVEL_0, Level, ProjectConfig, VecCarRacingEnv, level0_track
    from racing_env.runner import run

    plugin = _learned_plugin(tmp_path)
    assert plugin.load_batch_class().__name__ == "LearnedBatchController"
    short = Level(level_id=0, name="short", max_episode_steps=40)
    env = VecCarRacingEnv(3, config=ProjectConfig(), level=short, backend="mjx_warp", track=level0_track())
    one = run(plugin, env, episodes=5, seed=4)
    many = run(plugin, env, episodes=5, seed=4, batched=True)
    assert [dataclasses.asdict(e) for e in many.episodes] == [dataclasses.asdict(e) for e in one.episodes]
    assert min(e.progress for e in one.episodes) > 0 and LEVEL_0.max_episode_steps > 40


def test_the_learned_plugin_runs_its_network_in_float64_on_one_cpu_thread(tmp_path, monkeypatch):
    """On the CPU both of the learned plugin's controllers run the network
    with Torch on one thread (its numbers then do not depend on the cores;
    many threads on a tiny network wait on each other), and leave Torch's
    thread count as it was; the network computes in float64 (its action's
    rounding then depends on no call's row count) and acts in float32."""
    from racing_env import LEVEL_0, ProjectConfig, VecCarRacingEnv, level0_track
    from racing_env.runner import challenge_values

    from racing_stack.ppo.networks import ActorCritic

    plugin = _learned_plugin(tmp_path)
    env = VecCarRacingEnv(2, config=ProjectConfig(), level=LEVEL_0, backend="mjx_warp", track=level0_track())
    obs, info = env.reset(seed=0)
    obs = {k: v if isinstance(v, str) else np.asarray(v) for k, v in obs.items()}
    config = plugin.config(challenge_values(env))
    seen = []
    real = ActorCritic.mean_action

    def mean_action(self, x):
        seen.append((torch.get_num_threads(), x.dtype, self.log_std.dtype))
        action = real(self, x)
        assert action.dtype == torch.float32
        return action

    monkeypatch.setattr(ActorCritic, "mean_action", mean_action)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        one = plugin.load_class()({k: v if isinstance(v, str) else v[0] for k, v in obs.items()}, {}, config)
        one.compute_control({k: v if isinstance(v, str) else v[0] for k, v in obs.items()})
        many = plugin.load_batch_class()(config, 2)
        many.start(np.arange(2), obs, {})
        many.compute_controls(np.arange(2), obs, {})
        assert seen == [(1, torch.float64, torch.float64)] * 3 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("how", ["gpu preset", "interpolated with a prior"])
def test_a_batched_call_computes_its_features_in_blocks_on_threads_to_the_same_bits(monkeypatch, how):
    """`batch_features` over 700 rows (each car on its own scaled copy of
    the track, with its own count of points, placed and moving otherwise)
    on `FEATURE_THREADS` threads: `LocalTrack.host` over all rows at once,
    bit for bit; below two blocks' rows it computes here."""
    from concurrent.futures import ThreadPoolExecutor

    from racing_env import LEVEL_0, ProjectConfig, VecCarRacingEnv, level0_track

    from racing_stack.features import LocalTrack
    from racing_stack.learned.controller import FEATURE_BLOCK_ROWS, FEATURE_THREADS, batch_features
    from racing_stack.ppo import PRESETS
    from racing_stack.prior import PursuitPrior

    env = VecCarRacingEnv(1, config=ProjectConfig(), level=LEVEL_0, backend="cpu_reference", track=level0_track())
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(5)
    rows = 700
    many = {k: v if isinstance(v, str) else np.repeat(np.asarray(v), rows, axis=0) for k, v in obs.items()}
    scale = rng.uniform(0.8, 1.25, rows).astype(np.float32)
    for key in ("centerline", "left_boundary", "right_boundary"):
        many[key] = many[key] * scale[:, None, None]
    many["track_length"] = many["track_length"] * scale
    count = int(many["track_mask"][0].sum())
    cut = rng.integers(count - 40, count + 1, rows)
    many["track_mask"] = (np.arange(many["track_mask"].shape[1])[None, :] < cut[:, None]).astype(np.int8)
    many["position"] = many["position"] * scale[:, None] + rng.normal(0, 3, (rows, 2)).astype(np.float32)
    for key in ("yaw", "yaw_rate", "steering_angle"):
        many[key] = many[key] + rng.normal(0, 1, rows).astype(np.float32)
    many["velocity_body"] = rng.normal(5, 5, (rows, 2)).astype(np.float32)
    previous = rng.normal(0, 1, (rows, 2)).astype(np.float32)
    features = PRESETS["gpu"].features if how == "gpu preset" else LocalTrack(interpolate=True, prior=PursuitPrior())
    whole = features.host(many, previous)
    assert len(np.unique(whole, axis=0)) == rows
    calls = []
    host = LocalTrack.host
    monkeypatch.setattr(LocalTrack, "host", lambda self, o, p: calls.append(len(p)) or host(self, o, p))
    with ThreadPoolExecutor(FEATURE_THREADS) as pool:
        blocked = batch_features(features, many, previous, pool)
        few = 2 * FEATURE_BLOCK_ROWS - 1
        alone = batch_features(features, {k: v if isinstance(v, str) else v[:few] for k, v in many.items()},
                               previous[:few], pool)
    np.testing.assert_array_equal(blocked, whole)
    np.testing.assert_array_equal(alone, whole[:few])
    assert calls == [175] * 4 + [few]
    with ThreadPoolExecutor(FEATURE_THREADS) as pool, pytest.raises(ValueError, match="same shape"):
        batch_features(features, many, previous[:500], pool)  # as one call over all rows: refused


def test_evaluate_batched_runs_in_process(tmp_path, capsys):
    """--batched drives in this process (Level 1 isolates by default);
    a plugin without a BatchController is a usage error naming it."""
    plugin = _learned_plugin(tmp_path)
    out = tmp_path / "result.json"
    assert evaluate.main(["--level", "0", "--episodes", "2", "--backend", "cpu_reference", "--batched",
                          "--controller", str(plugin.directory), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["episodes"]) == 2 and result["summary"]["controller_errors"] == 0
    assert evaluate.main(["--level", "0", "--backend", "cpu_reference", "--batched"]) == 2  # pure pursuit: none
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("evaluate: argument --batched: ") and "defines no racing_env.BatchController" in last


def test_an_isolated_batched_run_of_a_plugin_without_a_batch_controller_is_refused_before_any_pool(
        tmp_path, monkeypatch, capsys):
    """Level 1 isolates: the plugin's check in a child asks for its
    BatchController, so the usage error (exit 2) comes at once, before
    the split's pool is built into an empty cache (minutes)."""
    from racing_env.plugins import PURSUIT, load_plugin

    def no_pool(*args, **kwargs):
        raise AssertionError("a pool was built before the plugin's check")

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("RACING_STACK_CACHE", str(cache))
    monkeypatch.setattr(pools, "build_pool", no_pool)
    start = time.monotonic()
    assert evaluate.main(["--backend", "cpu_reference", "--batched"]) == 2  # pure pursuit: none
    assert time.monotonic() - start < 60  # the check's child, not the validation split's 1,000 tracks
    err = capsys.readouterr().err
    assert "building" not in err and not any(cache.iterdir())
    controller = load_plugin(PURSUIT, import_code=False).directory / "controller.py"
    assert err.splitlines()[-1] == f"evaluate: argument --batched: {controller} defines no racing_env.BatchController"


def test_an_isolated_batched_evaluation_drives_a_world_a_track(tmp_path, monkeypatch):
    """Isolated one episode at a time, a world is a process: 16 worlds at
    once by default. Batched, one child serves every world, so isolated or
    not it drives as many worlds as tracks (at most 1,024), not 16 waves."""
    import racing_stack.levels

    plugin = _learned_plugin(tmp_path).directory  # a BatchController, which a batched plugin's check asks for

    class Built(Exception):
        pass

    worlds = []

    def level_env(count, *args, **kwargs):
        worlds.append(count)
        raise Built

    monkeypatch.setattr(racing_stack.levels, "level_env", level_env)
    for batched, isolate in ((False, None), (True, None), (False, False), (True, False)):
        with pytest.raises(Built):
            evaluate.evaluate(plugin, level=1, split="test", tracks=40, batched=batched, isolate=isolate)
    with pytest.raises(Built):
        evaluate.evaluate(plugin, level=1, split="test", batched=True)
    assert worlds == [evaluate.ISOLATED_WORLDS, 40, 40, 40, 1000] and evaluate.ISOLATED_WORLDS == 16  # Test: 1,000


def test_an_isolated_plugins_check_runs_beside_the_engines_import_and_comes_first(monkeypatch):
    """Isolated, the plugin's check in a child process overlaps the
    backend's imports (`preload`), and a plugin its check refuses is
    refused before any env is built."""
    from racing_env import isolation
    from racing_env.backends import MjxWarpBackend
    from racing_env.plugins import PluginError

    from racing_stack import levels

    spans = {}

    def timed(name, error=None):
        def work(*args):
            spans[name] = [time.monotonic()]
            time.sleep(0.5)
            spans[name].append(time.monotonic())
            if error is not None:
                raise error
        return work

    def no_env(*args, **kwargs):
        raise AssertionError("an env was built before the check")

    monkeypatch.setattr(isolation, "check_plugin", timed("check", PluginError("refused by its check")))
    monkeypatch.setattr(MjxWarpBackend, "preload", staticmethod(timed("preload")))
    monkeypatch.setattr(levels, "level_env", no_env)
    with pytest.raises(PluginError, match="refused by its check"):
        evaluate.evaluate(backend="mjx_warp", tracks=1, isolate=True)
    (check_start, check_end), (import_start, import_end) = spans["check"], spans["preload"]
    assert check_start < import_end and import_start < check_end  # at once, not one after the other
