"""Drawing episodes: the write-only DrawList, the painted frame (track, car,
commands) against hand-computed pixels, the Runner's per-frame
render_callback, GIF and MP4 recordings, and the window under a virtual
display (Xvfb) with a screenshot of the screen."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from racing_env import Level, ProjectConfig, VecCarRacingEnv, level0_track
from racing_env.plugins import PURSUIT, load_plugin
from racing_env.render import COLORS, MAX_FRAME_POINTS, DrawCommand, DrawList, EpisodeView, FramePainter
from racing_env.runner import run

SHORT = Level(level_id=0, name="short", max_episode_steps=60)
BLUE = (10, 20, 250)


@pytest.fixture(scope="module")
def env():
    return VecCarRacingEnv(1, config=ProjectConfig(), level=SHORT, backend="cpu_reference", track=level0_track())


@pytest.fixture(scope="module")
def obs(env):
    observation, _ = env.reset(seed=0)
    return {k: np.asarray(v)[0] for k, v in observation.items()}


def near(frame: np.ndarray, pixel, color, radius: int = 2) -> bool:
    """Whether ``color`` is within ``radius`` px of ``pixel`` (x, y)."""
    x, y = (int(round(v)) for v in pixel)
    patch = frame[max(y - radius, 0):y + radius + 1, max(x - radius, 0):x + radius + 1]
    return bool(np.any(np.all(patch == np.array(color, np.uint8), axis=-1)))


def share(frame: np.ndarray, color) -> float:
    return float(np.mean(np.all(frame == np.array(color, np.uint8), axis=-1)))


# -- DrawList ------------------------------------------------------------------


def test_commands_are_kept_in_order_and_drained_once():
    draw = DrawList()
    draw.line([[0, 0], [1, 1]], color=(1, 2, 3), width=2)
    draw.points(np.zeros((3, 2), np.float32), size=4.5)
    draw.text((5, 6), "hi")
    commands = draw.drain()
    assert [c.kind for c in commands] == ["line", "points", "text"]
    assert commands[0].color == (1, 2, 3) and commands[0].size == 2.0
    assert commands[1].points.shape == (3, 2) and commands[1].points.dtype == np.float64
    assert commands[2].text == "hi" and commands[2].points.tolist() == [[5.0, 6.0]]
    assert draw.drain() == []


@pytest.mark.parametrize("call, error, match", [
    (lambda d: d.line([[0, 0]]), ValueError, "points must have shape"),
    (lambda d: d.line([[0, 0], [1, np.nan]]), ValueError, "points must be finite"),
    (lambda d: d.points([[0, 0, 0]]), ValueError, r"points must have shape \[N, 2\]"),
    (lambda d: d.points([["a", "b"]]), TypeError, "points must be real numbers"),
    (lambda d: d.points([[0, 0]], color=(0, 0, 256)), ValueError, "color channels"),
    (lambda d: d.points([[0, 0]], color=(0, 0)), TypeError, "color must be three ints"),
    (lambda d: d.points([[0, 0]], color=(0.5, 0, 0)), TypeError, "color must be three ints"),
    (lambda d: d.points([[0, 0]], size=0), ValueError, "size must be in"),
    (lambda d: d.line([[0, 0], [1, 1]], width=float("inf")), ValueError, "width must be in"),
    (lambda d: d.line([[0, 0], [1, 1]], width=True), TypeError, "width must be a real number"),
    (lambda d: d.text((0, 0), 5), TypeError, "text must be a str"),
    (lambda d: d.text((0, 0), "x" * 201), ValueError, "at most 200"),
    (lambda d: d.text((0, 0), "a\x00b"), ValueError, "NUL"),
    (lambda d: d.text((0, 0), "\ud800"), ValueError, "UTF-8"),
    (lambda d: d.text([[0, 0], [1, 1]], "x"), ValueError, "position must have shape"),
    (lambda d: d.points(np.zeros((MAX_FRAME_POINTS + 1, 2))), ValueError, "at most 100000 points"),
])
def test_a_bad_command_is_refused_by_name_and_adds_nothing(call, error, match):
    draw = DrawList()
    draw.points([[1, 1]])
    with pytest.raises(error, match=match):
        call(draw)
    assert [c.kind for c in draw.drain()] == ["points"]


# -- FramePainter ------------------------------------------------------------


def test_the_frame_shows_the_track_the_car_and_the_commands_where_they_are(obs):
    painter = FramePainter((640, 480))
    line = np.array([obs["position"], obs["position"] + [30.0, 0.0]])
    frame = painter.paint(obs, [DrawCommand("line", line, BLUE, 3.0, "")], caption="hello")
    assert frame.shape == (480, 640, 3) and frame.dtype == np.uint8
    # One scale for both axes, the whole track inside the frame below the caption strip.
    count = int(obs["track_mask"].sum())
    edges = np.concatenate([obs["left_boundary"][:count], obs["right_boundary"][:count]]).astype(np.float64)
    pixels = painter.to_pixels(edges)
    assert pixels[:, 0].min() > 0 and pixels[:, 0].max() < 640 and pixels[:, 1].min() > 24 and pixels[:, 1].max() < 480
    a, b = painter.to_pixels(edges[[0, count // 3]])
    assert np.isclose(np.linalg.norm(a - b) / np.linalg.norm(edges[0] - edges[count // 3]),
                      painter._view[1], rtol=1e-9)
    # The asphalt lies between the boundaries: at the centerline, not at the bounding box's middle.
    center = painter.to_pixels(obs["centerline"][:count])
    on_asphalt = [near(frame, p, COLORS["asphalt"], 1) for p in center[5::20]]
    assert np.mean(on_asphalt) > 0.9
    assert share(frame, COLORS["grass"]) > 0.3 and share(frame, COLORS["asphalt"]) > 0.03
    # The car: red around the middle of its wheelbase; the blue command east of it.
    middle = obs["position"] + 1.3 * np.array([np.cos(obs["yaw"]), np.sin(obs["yaw"])])
    assert near(frame, painter.to_pixels(middle[None])[0], COLORS["car"])
    assert near(frame, painter.to_pixels([obs["position"] + [20.0, 0.0]])[0], BLUE)
    assert not near(frame, painter.to_pixels([obs["position"] + [0.0, 40.0]])[0], BLUE, 4)


def test_the_frame_follows_the_car_and_a_new_track(obs):
    painter = FramePainter((320, 240))
    moved = dict(obs, position=obs["centerline"][100].copy())
    first, second = painter.paint(obs), painter.paint(moved)
    assert not np.array_equal(first, second)
    assert near(second, painter.to_pixels([moved["position"] + 1.3 * np.array([np.cos(obs["yaw"]),
                                                                                np.sin(obs["yaw"])])])[0],
                COLORS["car"])
    scale = painter._view[1]
    small = dict(obs, centerline=obs["centerline"] * 0.5, left_boundary=obs["left_boundary"] * 0.5,
                 right_boundary=obs["right_boundary"] * 0.5)
    painter.paint(small)
    assert np.isclose(painter._view[1], 2 * scale)


@pytest.mark.parametrize("size, error", [((10, 10), ValueError), ((800, 5000), ValueError), ((800,), TypeError),
                                         ("big", TypeError), ((800.0, 600), TypeError), ((True, 600), TypeError)])
def test_a_bad_frame_size_is_refused(size, error):
    with pytest.raises(error, match=r"size(\[\d\])? must be"):
        FramePainter(size)


@pytest.mark.parametrize("field, value", [("position", [np.nan, 0.0]), ("yaw", np.inf),
                                          ("left_boundary", np.full((640, 2), np.nan))])
def test_a_non_finite_observation_is_refused_by_name(obs, field, value):
    with pytest.raises(ValueError, match=f"obs\\['{field}'\\] must be finite"):
        FramePainter((100, 100)).paint(dict(obs, **{field: np.asarray(value, np.float32)}))


def test_huge_but_finite_commands_are_drawn_off_screen(obs):
    draw = DrawList()
    draw.line([[0, 0], [1e300, 1e300]])
    draw.points([[1e30, -1e30]], size=100)
    draw.text([1e300, 0.0], "far")
    frame = FramePainter((100, 100)).paint(obs, draw.drain())
    assert frame.shape == (100, 100, 3)


def test_to_pixels_needs_a_painted_frame():
    with pytest.raises(RuntimeError, match="paint a frame first"):
        FramePainter((100, 100)).to_pixels([[0.0, 0.0]])


# -- the Runner's frames -----------------------------------------------------


class Sink:
    """A view that records what the Runner shows it."""

    def __init__(self, every: int = 1) -> None:
        self.every = every
        self.offered = 0
        self.shown: list[tuple[dict, list, str]] = []

    def wants_frame(self, final: bool = False) -> bool:
        self.offered += 1
        return (self.offered - 1) % self.every == 0

    def show(self, obs, commands, caption):
        self.shown.append((obs, commands, caption))


def make_plugin(root, body):
    path = root / "drawer"
    path.mkdir()
    (path / "controller.py").write_text("import numpy as np\nfrom racing_env.controller import Controller\n"
                                        + textwrap.dedent(body))
    (path / "config.toml").write_text("")
    return load_plugin(path)


def test_render_callback_draws_each_frame_with_the_latest_observation(tmp_path, env):
    plugin = make_plugin(tmp_path, """
        class Drawer(Controller):
            def __init__(self, obs, info, config):
                super().__init__(obs, info, config)
                self.calls = 0
            def compute_control(self, obs, info=None):
                self.position = np.asarray(obs["position"])
                return np.array([0.0, 1.0], np.float32)
            def render_callback(self, debug_draw):
                self.calls += 1
                debug_draw.text([0.0, 0.0], f"frame {self.calls}")
    """)
    sink = Sink(every=2)
    result = run(plugin, env, episodes=2, seed=1, view=sink)
    assert result.summary["controller_errors"] == 0
    # Two episodes of 60 steps: per episode its reset frame and 60 step frames, every 2nd shown.
    assert sink.offered == 2 * 61 and len(sink.shown) == 61
    texts = [c[0].text for _, c, _ in sink.shown]
    # Each controller counts its own frames: a fresh one at the second episode.
    assert texts[:3] == ["frame 1", "frame 2", "frame 3"] and "frame 1" in texts[31:]
    steps = [float(caption.split()[3]) for _, _, caption in sink.shown]
    assert steps[:3] == [0.0, 0.04, 0.08]
    assert "timeout" in sink.shown[30][2] and "episode 2" in sink.shown[31][2]
    # The frame's observation is the latest: its position moves as the car does.
    assert not np.array_equal(sink.shown[0][0]["position"], sink.shown[10][0]["position"])


def test_a_raising_render_callback_ends_its_episode_with_the_traceback(tmp_path, env):
    plugin = make_plugin(tmp_path, """
        class Drawer(Controller):
            def compute_control(self, obs, info=None):
                return np.zeros(2, np.float32)
            def render_callback(self, debug_draw):
                debug_draw.points([[0, 0, 0]])
    """)
    result = run(plugin, env, episodes=2, view=Sink())
    assert [e.termination_reason for e in result.episodes] == ["invalid_action"] * 2
    assert all("points must have shape" in e.error for e in result.episodes)


# -- recordings --------------------------------------------------------------


def test_a_gif_records_every_stride_th_step_in_real_time(tmp_path, env):
    config = ProjectConfig()
    path = tmp_path / "lap.gif"
    with EpisodeView(config.control_dt_s, record=path, record_fps=10, size=(320, 240)) as view:
        result = run(load_plugin(PURSUIT), env, episodes=1, view=view)
    assert view.stride == 5 and view.record_fps == pytest.approx(10.0)
    with Image.open(path) as gif:
        assert gif.size == (320, 240) and gif.n_frames == 13  # steps 0, 5, ..., 60
        assert gif.info["duration"] == 100
        gif.seek(0)
        first = np.asarray(gif.convert("RGB"))
        gif.seek(12)
        last = np.asarray(gif.convert("RGB"))
    assert result.episodes[0].steps == 60 and view.frames_recorded == 13
    # The last frame recorded is the last frame painted (to the GIF's palette); the car is in both.
    assert np.mean(np.abs(last.astype(int) - view.last_frame.astype(int))) < 2.0
    red = np.array(COLORS["car"])
    for frame in (first, last):
        assert np.sum(np.all(np.abs(frame.astype(int) - red) < 40, axis=-1)) >= 10
    assert not np.array_equal(first, last)


def test_a_recording_ends_on_the_terminal_frame_off_its_stride(tmp_path, env):
    """A stride of 7 keeps steps 0, 7, ..., 56 of a 60-step episode; the
    terminal step 60 is kept as well, with its reason in the caption."""
    config = ProjectConfig()
    path = tmp_path / "lap.gif"
    captions = []
    with EpisodeView(config.control_dt_s, record=path, record_fps=1 / (7 * config.control_dt_s),
                     size=(320, 240)) as view:
        paint = view.painter.paint
        view.painter.paint = lambda obs, commands, caption: captions.append(caption) or paint(obs, commands, caption)
        result = run(load_plugin(PURSUIT), env, episodes=1, view=view)
    assert view.stride == 7 and result.episodes[0].steps == 60
    assert view.frames_recorded == 10  # 0, 7, ..., 56 and the terminal 60
    assert captions[-1].endswith(result.episodes[0].termination_reason) and len(captions) == 10
    with Image.open(path) as gif:
        assert gif.n_frames == 10
        gif.seek(9)
        last = np.asarray(gif.convert("RGB"))
    assert np.mean(np.abs(last.astype(int) - view.last_frame.astype(int))) < 2.0


def test_an_mp4_streams_its_frames(tmp_path, env):
    import imageio_ffmpeg

    path = tmp_path / "lap.mp4"
    with EpisodeView(0.02, record=path, record_fps=25, size=(321, 241)) as view:
        run(load_plugin(PURSUIT), env, episodes=1, view=view)
    frames, seconds = imageio_ffmpeg.count_frames_and_secs(str(path))
    assert view.stride == 2 and frames == view.frames_recorded == 31
    assert seconds == pytest.approx(31 / 25, abs=0.05)


@pytest.mark.parametrize("kwargs, error, match", [
    ({}, ValueError, "give window=True, a record file, or both"),
    ({"record": "lap.png"}, ValueError, "record must be a .gif or .mp4"),
    ({"record": "/nowhere/at/all/lap.gif"}, ValueError, "record's folder"),
    ({"record": "lap.gif", "record_fps": 0}, ValueError, "record_fps must be in"),
    ({"record": "lap.gif", "record_fps": float("nan")}, ValueError, "record_fps must be in"),
    ({"record": "lap.gif", "record_fps": 61}, ValueError, "record_fps must be in"),
    ({"record": "lap.gif", "record_fps": 0.05}, ValueError, r"record_fps must be in \[0.1, 60\], got 0.05"),
    ({"record": "lap.gif", "control_dt_s": 0.0}, ValueError, "control_dt_s must be"),
    ({"record": "lap.gif", "control_dt_s": True}, TypeError, "control_dt_s must be"),
])
def test_bad_view_arguments_are_refused_by_name(tmp_path, monkeypatch, kwargs, error, match):
    monkeypatch.chdir(tmp_path)
    kwargs = {"control_dt_s": 0.02, **kwargs}
    with pytest.raises(error, match=match):
        EpisodeView(kwargs.pop("control_dt_s"), **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["lap.gif", "lap.mp4"])
def test_a_recording_replaces_its_file_whole_or_not_at_all(tmp_path, tmp_path_factory, env, monkeypatch, name):
    """A recording is written beside its file and renamed over it: a write
    that fails half way (an interrupt after part of the GIF is out, an
    encoder that writes part of the MP4 and fails) leaves the file as it
    was and nothing beside it; one that succeeds replaces it."""
    path = tmp_path / name
    path.write_bytes(b"an earlier recording")
    if name.endswith(".gif"):
        def half_written(image, fp, *args, **kwargs):
            Path(fp).write_bytes(b"GIF89a, half")
            raise KeyboardInterrupt

        monkeypatch.setattr(Image.Image, "save", half_written)
        failure = KeyboardInterrupt
    else:
        import imageio_ffmpeg

        encoder = tmp_path_factory.mktemp("encoder") / "ffmpeg"
        encoder.write_text('#!/bin/sh\ncat > /dev/null\nfor last; do :; done\nprintf half > "$last"\nexit 1\n')
        encoder.chmod(0o755)
        monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: str(encoder))
        failure = RuntimeError
    with pytest.raises(failure):
        with EpisodeView(0.02, record=path, size=(160, 120)) as view:
            run(load_plugin(PURSUIT), env, episodes=1, view=view)
    assert path.read_bytes() == b"an earlier recording" and sorted(tmp_path.iterdir()) == [path]
    monkeypatch.undo()
    with EpisodeView(0.02, record=path, size=(160, 120)) as view:
        run(load_plugin(PURSUIT), env, episodes=1, view=view)
    assert path.read_bytes() != b"an earlier recording" and sorted(tmp_path.iterdir()) == [path]


def test_a_recording_onto_a_link_writes_its_target_and_onto_a_device_fails_there(tmp_path, env):
    """A link to a file: the file is replaced, the link stays a link; a link
    to /dev/full: written there, so the full device's error reaches the
    caller instead of the link being replaced by a file."""
    target, link = tmp_path / "target.gif", tmp_path / "lap.gif"
    target.write_bytes(b"an earlier recording")
    link.symlink_to(target)
    with EpisodeView(0.02, record=link, size=(160, 120)) as view:
        run(load_plugin(PURSUIT), env, episodes=1, view=view)
    assert link.is_symlink() and target.read_bytes()[:6] == b"GIF89a"
    full = tmp_path / "full.gif"
    full.symlink_to("/dev/full")
    with pytest.raises(OSError):
        with EpisodeView(0.02, record=full, size=(160, 120)) as view:
            run(load_plugin(PURSUIT), env, episodes=1, view=view)
    assert full.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["full.gif", "lap.gif", "target.gif"]


def test_a_recording_onto_a_folder_is_refused(tmp_path):
    (tmp_path / "lap.gif").mkdir()
    with pytest.raises(ValueError, match="is a folder, not a file"):
        EpisodeView(0.02, record=tmp_path / "lap.gif")


def test_a_window_without_a_display_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "x11")
    monkeypatch.delenv("DISPLAY", raising=False)
    code = ("from racing_env.render import EpisodeView\n"
            "try:\n    EpisodeView(0.02, window=True)\n"
            "except RuntimeError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "refused: the window needs a display" in out.stdout, out.stderr


@pytest.mark.parametrize("display", [None, ":4242"], ids=["no-display", "an-unreachable-display"])
def test_a_window_sdl_would_hide_is_refused(tmp_path, display):
    """With SDL_VIDEODRIVER unset, SDL falls back to its invisible offscreen
    driver where it finds no display: the window is refused instead, before
    the recording is started."""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER")}
    if display is not None:
        env["DISPLAY"] = display
    code = ("import sys\nfrom racing_env.render import EpisodeView\n"
            "try:\n    EpisodeView(0.02, window=True, record=sys.argv[1])\n"
            "except RuntimeError as e:\n    print('refused:', e)\nelse:\n    print('opened')\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "lap.gif")], env=env, capture_output=True,
                         text=True, timeout=120)
    assert "refused: the window needs a display" in out.stdout, out.stdout + out.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_an_invisible_window_is_opened_only_when_named():
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["SDL_VIDEODRIVER"] = "dummy"
    code = ("from racing_env.render import EpisodeView\n"
            "view = EpisodeView(0.02, window=True)\nprint('open:', view.window_open)\nview.close()\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "open: True" in out.stdout, out.stderr[-2000:]


# -- the window, on a virtual display -----------------------------------------

WINDOW_SCRIPT = """
import json, sys
import numpy as np
from PIL import ImageGrab
from racing_env import Level, ProjectConfig, VecCarRacingEnv, level0_track
from racing_env.plugins import PURSUIT, load_plugin
from racing_env.render import EpisodeView
from racing_env.runner import run

config = ProjectConfig()
env = VecCarRacingEnv(1, config=config, level=Level(level_id=0, name="short", max_episode_steps=40),
                      backend="cpu_reference", track=level0_track())
view = EpisodeView(config.control_dt_s, window=True, realtime=False)
run(load_plugin(PURSUIT), env, episodes=1, view=view)
view.painter._pygame.event.pump()
shot = ImageGrab.grab(xdisplay=sys.argv[1])
shot.save(sys.argv[2])
np.save(sys.argv[3], view.last_frame)
print(json.dumps({"open": view.window_open}))
view.close()
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


def free_display() -> str:
    for number in range(90, 200):
        if not os.path.exists(f"/tmp/.X11-unix/X{number}") and not os.path.exists(f"/tmp/.X{number}-lock"):
            return f":{number}"
    raise RuntimeError("no free X display number")


def test_the_window_shows_the_track_and_the_car_on_a_virtual_display(tmp_path):
    xvfb = need_xvfb("Xvfb")
    display = free_display()
    server = subprocess.Popen([xvfb, display, "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(f"/tmp/.X11-unix/X{display[1:]}"):
            assert time.monotonic() < deadline and server.poll() is None, "Xvfb did not start"
            time.sleep(0.1)
        env = dict(os.environ, DISPLAY=display, SDL_VIDEODRIVER="x11", SDL_VIDEO_WINDOW_POS="0,0")
        shot, frame = tmp_path / "screen.png", tmp_path / "frame.npy"
        out = subprocess.run([sys.executable, "-c", WINDOW_SCRIPT, display, str(shot), str(frame)],
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == {"open": True}
    finally:
        server.terminate()
        server.wait(timeout=20)
    screen = np.asarray(Image.open(shot).convert("RGB"))
    last = np.load(frame)
    assert screen.shape == (768, 1024, 3)
    window = screen[:600, :800]
    # The screen shows the last frame: the track (asphalt, edges) and the car.
    assert np.mean(np.all(window == last, axis=-1)) > 0.99
    assert share(window, COLORS["asphalt"]) > 0.03 and share(window, COLORS["edge"]) > 0.002
    assert share(window, COLORS["car"]) > 0.0001
    assert share(screen[600:], COLORS["asphalt"]) == 0.0  # nothing drawn outside the window
