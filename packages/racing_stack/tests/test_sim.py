"""``sim``: one episode on track_gen seed 42, the JSON result, named errors."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from PIL import Image
from plugin_dirs import CTRL_C_DROPPED_IN_GC, DROPPED_LINE, ctrl_c_on, write_plugin

from racing_stack import sim


def test_sim_runs_the_template_on_seed_42_to_the_timeout(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert sim.main(["--out", str(out), "--seed", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    (episode,) = printed["episodes"]
    assert printed["track_gen_seed"] == 42 and episode["track_id"] == 42
    assert episode["termination_reason"] == "timeout"
    assert episode["steps"] == printed["challenge"]["level"]["max_episode_steps"]
    assert printed["backend"] == "cpu_reference" and printed["seed"] == 3


def test_a_rejected_track_seed_is_an_error_not_a_retry(monkeypatch):
    monkeypatch.setattr(sim, "TRACK_SEED", 151)  # invalid at the defaults (thickness)
    with pytest.raises(SystemExit, match="seed 151 was rejected"):
        sim.build_track("cpu_reference")


def test_a_bad_controller_directory_is_named(tmp_path, capsys):
    assert sim.main(["--controller", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err


def test_sim_with_the_pursuit_controller_completes_the_lap_and_records_it(tmp_path, capsys):
    from racing_env.plugins import PURSUIT

    gif = tmp_path / "lap.gif"
    assert sim.main(["--controller", str(PURSUIT), "--record", str(gif)]) == 0
    printed = json.loads(capsys.readouterr().out)
    (episode,) = printed["episodes"]
    assert episode["termination_reason"] == "success" and episode["lap_completed"]
    assert 20.0 < episode["lap_time_s"] < 60.0  # 376 m (measured 35.8 s)
    # Every 5th of the reset and the lap's steps, at 10 frames/s (real time), and the terminal step.
    frames = -(-(episode["steps"] + 1) // 5) + (episode["steps"] % 5 != 0)
    assert printed["recording"] == {"file": str(gif), "frames": frames, "fps": pytest.approx(10.0)}
    with Image.open(gif) as image:
        assert image.n_frames == frames and image.size == (800, 600) and image.info["duration"] == 100


@pytest.mark.parametrize("args, match", [
    (["--record", "lap.png"], "argument --record: must end in one of .gif, .mp4, got 'lap.png'"),
    (["--record", "new/lap.png"], "argument --record: must end in one of .gif, .mp4"),  # no folder made
    (["--record", "taken"], "argument --record: must end in one of .gif, .mp4, got 'taken'"),
    (["--out", "taken"], "argument --out: 'taken' is a folder, not a file"),
    (["--out", "file.txt/result.json"], "argument --out: "),
    (["--out", "/proc/sim/result.json"], "argument --out: cannot write in '/proc'"),
    (["--record", "file.txt/lap.gif"], "is a file, not a folder"),
    (["--seed", "-1"], "argument --seed: must be in [0, 2**32), got -1"),
    (["--seed", str(2**32)], "argument --seed: must be in [0, 2**32), got 4294967296"),
    (["--seed", "1.5"], "argument --seed: must be an integer, got '1.5'"),
    (["--record", "lap.gif", "--record-fps", "0"], "argument --record-fps: must be in [0.1, 60], got 0"),
    (["--record", "lap.gif", "--record-fps", "nan"], "argument --record-fps: must be in [0.1, 60], got nan"),
    (["--record", "lap.gif", "--record-fps", "0.05"], "argument --record-fps: must be in [0.1, 60], got 0.05"),
    (["--record-fps", "5"], "argument --record-fps: sets --record's frame rate; give --record FILE"),
])
def test_bad_options_are_usage_errors_naming_the_flag(tmp_path, monkeypatch, capsys, args, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "file.txt").write_text("")
    monkeypatch.setattr(sim, "build_track", None)  # nothing may run
    with pytest.raises(SystemExit) as stop:
        sim.main(args)
    assert stop.value.code == 2
    assert match in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "taken"]  # nothing written


@pytest.mark.parametrize("files, match", [
    (None, "does not exist or is not a directory"),
    ({"controller.py": ""}, "has no config.toml"),
    ({"controller.py": "", "config.toml": "speed = \n"}, "is not valid TOML"),
])
def test_a_bad_controller_is_named_by_its_flag(tmp_path, capsys, files, match):
    plugin = tmp_path / "plugin"
    if files is not None:
        plugin.mkdir()
        for name, text in files.items():
            (plugin / name).write_text(text)
    assert sim.main(["--controller", str(plugin)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim: argument --controller: ") and match in err, err


def test_an_episode_ended_by_a_controller_error_exits_1_after_the_result(tmp_path, capsys):
    plugin = tmp_path / "boom"
    plugin.mkdir()
    (plugin / "controller.py").write_text("from racing_env.controller import Controller\n\n\n"
                                          "class Boom(Controller):\n"
                                          "    def compute_control(self, obs, info=None):\n"
                                          "        raise RuntimeError('boom')\n")
    (plugin / "config.toml").write_text("")
    assert sim.main(["--controller", str(plugin)]) == 1
    printed = capsys.readouterr()
    assert json.loads(printed.out)["summary"]["controller_errors"] == 1  # the result still comes, first
    assert "sim: every episode (1) ended with a controller error; the first:" in printed.err
    assert "RuntimeError: boom" in printed.err


def test_output_folders_are_made_before_the_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "runs" / "today" / "result.json"
    summary = {"episodes": 1, "controller_errors": 0}
    monkeypatch.setattr(sim, "_simulate", lambda args: {"made": args.out.parent.is_dir(), "summary": summary})
    assert sim.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"made": True, "summary": summary}


def test_a_failed_result_write_is_one_line_and_exit_1_after_the_result(monkeypatch, capsys):
    ran = {"ran": True, "summary": {"episodes": 1, "controller_errors": 0}}
    monkeypatch.setattr(sim, "_simulate", lambda args: ran)
    assert sim.main(["--out", "/dev/full"]) == 1
    printed = capsys.readouterr()
    assert json.loads(printed.out) == ran
    assert printed.err.splitlines() == ["sim: could not write the result to '/dev/full' (No space left on device)"]


# Ctrl-C at the episode's fourth step.
STOPPED = """
import numpy as np
from racing_env.controller import Controller


class Stopped(Controller):
    steps = 0

    def compute_control(self, obs, info=None):
        self.steps += 1
        if self.steps == 4:
            raise KeyboardInterrupt
        return np.zeros(2)
"""


def test_ctrl_c_prints_and_writes_the_partial_result_and_exits_130(tmp_path, capsys):
    plugin = write_plugin(tmp_path, "stopped", STOPPED)
    out, gif = tmp_path / "partial.json", tmp_path / "partial.gif"
    assert sim.main(["--controller", str(plugin), "--out", str(out), "--record", str(gif)]) == 130
    printed = capsys.readouterr()
    result = json.loads(printed.out)
    assert result == json.loads(out.read_text())
    assert result["interrupted"] is True and result["episodes"] == [] and result["summary"]["episodes"] == 0
    assert result["track_gen_seed"] == 42 and result["recording"]["frames"] >= 1 and gif.exists()
    assert 'sim: interrupted; the result holds the episodes that had ended, 0 ("interrupted": true)' in printed.err
    assert "130 after Ctrl-C" in sim.__doc__  # --help says so


DROPPED = CTRL_C_DROPPED_IN_GC + """

class Dropped(Controller):
    calls = 0

    def compute_control(self, obs, info=None):
        self.calls += 1
        if self.calls == 5:
            drop_a_ctrl_c()
        return np.zeros(2)
"""


def test_a_ctrl_c_dropped_in_a_gc_callback_still_stops_the_episode(tmp_path):
    """A Ctrl-C whose KeyboardInterrupt Python drops (raised inside a garbage
    collector callback, as JAX has one) is raised again: the command stops
    with exit 130 instead of driving on to the episode's timeout."""
    plugin = write_plugin(tmp_path, "dropped", DROPPED)
    done = subprocess.run([sys.executable, "-m", "racing_stack.sim", "--controller", str(plugin)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, RACING_STACK_CACHE=str(tmp_path / "cache")),
                          preexec_fn=ctrl_c_on)
    # Dropped once, and not printed.
    assert DROPPED_LINE in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 130, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["interrupted"] is True and result["episodes"] == []


BOOM = """
from racing_env.controller import Controller


class Boom(Controller):
    def compute_control(self, obs, info=None):
        raise RuntimeError("boom")
"""


def need_xvfb(program: str) -> str:
    """The path of ``program`` (Xvfb's server or xvfb-run). Without it the
    window test skips, naming Xvfb, unless ``RACING_STACK_WINDOW_TESTS=required``
    (CI sets it, and installs Xvfb) makes the absence a failure."""
    path = shutil.which(program)
    if path is None:
        reason = f"the window test needs Xvfb's {program} (Debian: apt-get install xvfb; .ci/run installs it)"
        if os.environ.get("RACING_STACK_WINDOW_TESTS") == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def test_sim_render_opens_its_window_on_a_display(tmp_path):
    runner = need_xvfb("xvfb-run")
    plugin = write_plugin(tmp_path, "boom", BOOM)
    env = dict(os.environ, SDL_VIDEODRIVER="x11")
    out = subprocess.run([runner, "-a", "-s", "-screen 0 1024x768x24", sys.executable, "-m", "racing_stack.sim",
                          "--render", "--controller", str(plugin)], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 1, out.stderr[-3000:]  # the episode ended by the controller's error, said
    (episode,) = json.loads(out.stdout)["episodes"]
    assert episode["termination_reason"] == "invalid_action" and "RuntimeError: boom" in episode["error"]
    # Without a display the window is a clear error, before the track is built.
    env.pop("DISPLAY", None)
    out = subprocess.run([sys.executable, "-m", "racing_stack.sim", "--render"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 2 and "the window needs a display" in out.stderr


@pytest.mark.parametrize("verbose", [False, True])
def test_warp_says_nothing_unless_asked(tmp_path, verbose):
    """Warp's banner and its line per loaded module only with --verbose (a
    fresh process: Warp initialises, and loads its modules, once)."""
    plugin = write_plugin(tmp_path, "boom", BOOM)
    out = subprocess.run([sys.executable, "-m", "racing_stack.sim", "--controller", str(plugin)]
                         + ["--verbose"] * verbose, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-3000:]  # the controller raised (a short episode)
    json.loads(out.stdout)
    said = [line for line in out.stderr.splitlines() if line.startswith(("Warp 1.", "Module "))]
    assert bool(said) == verbose, out.stderr
    if not verbose:  # nor its line that a CPU machine has no NVIDIA driver
        assert "NVIDIA CUDA driver" not in out.stderr, out.stderr


@pytest.mark.parametrize("command", ["sim", "evaluate"])
def test_render_without_a_display_is_refused_before_any_work(tmp_path, command):
    """No DISPLAY, WAYLAND_DISPLAY or SDL_VIDEODRIVER: SDL would fall back to
    an invisible window and the episodes would run, paced to real time, for
    minutes; --render is the documented error instead, before a track is
    built (evaluate's pool cache stays empty)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER")}
    env["RACING_STACK_CACHE"] = str(tmp_path / "cache")
    out = subprocess.run([sys.executable, "-m", f"racing_stack.{command}", "--render"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and f"{command}: argument --render: the window needs a display" in out.stderr, \
        out.stderr[-3000:]
    assert out.stdout == "" and not (tmp_path / "cache").exists()
