"""Drawing an episode in 2D: the public observation (the track, the car) and
what the controller draws in ``render_callback``, shown in a window, written
to an animated GIF or MP4, or both.

`DrawList` is what a controller's ``render_callback`` receives: a
write-only list of ``line``, ``points`` and ``text`` commands in world
metres, checked as they are given and drained once per frame. `FramePainter`
draws one frame (the latest public observation and the drained commands) as
an RGB image. `EpisodeView` is what the Runner shows frames to: it decides
which control steps become frames, paints them, shows them in a pygame
window (paced to real time) and records them.

Drawing needs the ``render`` extra (pygame and Pillow; ``imageio-ffmpeg``
for MP4); nothing here is imported by the env itself.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from racing_env import checks
from racing_env.config import ProjectConfig

__all__ = ["COLORS", "MAX_FRAME_POINTS", "RECORD_FPS", "RECORD_SUFFIXES", "DrawCommand", "DrawList", "EpisodeView",
           "FramePainter"]

#: The most points (over all commands) one frame's commands may hold.
MAX_FRAME_POINTS = 100_000
#: The longest ``text`` command, in characters.
MAX_TEXT = 200
#: The recordings `EpisodeView` writes: an animated GIF or an MP4.
RECORD_SUFFIXES = (".gif", ".mp4")
#: A recording's frame rates (frames/s, both ends included). Slower, it
#: shows less than a frame per 10 s of driving; far slower, a GIF frame's
#: duration no longer fits the format, and Pillow fails as the recording
#: is written, after the run.
RECORD_FPS = (0.1, 60.0)
#: SDL's video drivers that show nothing (its fallbacks where it finds no display).
HEADLESS_VIDEO_DRIVERS = ("offscreen", "dummy")
#: The car drawn by default (its wheelbase and body).
_VEHICLE = ProjectConfig()

_GRASS = (46, 102, 54)
_ASPHALT = (72, 72, 78)
_EDGE = (235, 235, 235)
_CENTER = (150, 140, 80)
_START = (250, 250, 250)
_CAR = (225, 35, 35)
_CAR_NOSE = (255, 220, 60)
_HUD = (255, 255, 255)
#: Colours the track and the car are drawn in (tests look for them).
COLORS = {"grass": _GRASS, "asphalt": _ASPHALT, "edge": _EDGE, "car": _CAR}
#: The car is drawn at least this long on screen (px), whatever the zoom.
_MIN_CAR_PX = 14.0


class DrawCommand(NamedTuple):
    """One drawing command: ``kind`` is ``"line"``, ``"points"`` or
    ``"text"``; ``points`` float64 [N, 2] (m); ``color`` RGB 0-255;
    ``size`` the line width or dot radius (px); ``text`` for text."""

    kind: str
    points: np.ndarray
    color: tuple[int, int, int]
    size: float
    text: str


def _points(value: Any, name: str, least: int) -> np.ndarray:
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be real numbers of shape [N, 2], got {type(value).__name__}") from error
    if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] < least:
        raise ValueError(f"{name} must have shape [N, 2] with N >= {least}, got {list(arr.shape)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


def _color(value: Any) -> tuple[int, int, int]:
    if (not isinstance(value, (tuple, list)) or len(value) != 3
            or not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in value)):
        raise TypeError(f"color must be three ints (RGB), got {value!r}")
    if not all(0 <= int(c) <= 255 for c in value):
        raise ValueError(f"color channels must be in [0, 255], got {value!r}")
    return tuple(int(c) for c in value)


def _size(value: Any, name: str) -> float:
    return checks.real_in(value, name, 0.0, 100.0, low_open=True, unit="px")


class DrawList:
    """The write-only surface a controller's ``render_callback`` draws on
    (a `racing_env.controller.DebugDraw`), in world coordinates (m). Each call is checked at once (a bad argument is a
    ``TypeError``/``ValueError`` naming it, and adds nothing); the commands
    are drained and drawn once per frame with the latest public observation.
    """

    def __init__(self) -> None:
        self._commands: list[DrawCommand] = []
        self._count = 0

    def _add(self, command: DrawCommand) -> None:
        if self._count + len(command.points) > MAX_FRAME_POINTS:
            raise ValueError(f"a frame's commands may hold at most {MAX_FRAME_POINTS} points")
        self._commands.append(command)
        self._count += len(command.points)

    def line(self, points: Any, color: tuple[int, int, int] = (255, 255, 255), width: float = 1.0) -> None:
        """A polyline through ``points`` ([N, 2], m, N >= 2), ``width`` px."""
        self._add(DrawCommand("line", _points(points, "points", 2), _color(color), _size(width, "width"), ""))

    def points(self, points: Any, color: tuple[int, int, int] = (255, 255, 255), size: float = 3.0) -> None:
        """Dots of radius ``size`` px at ``points`` ([N, 2], m, N >= 1)."""
        self._add(DrawCommand("points", _points(points, "points", 1), _color(color), _size(size, "size"), ""))

    def text(self, position: Any, text: str, color: tuple[int, int, int] = (255, 255, 255)) -> None:
        """``text`` (at most 200 characters) just right of ``position`` ([2], m)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if len(text) > MAX_TEXT:
            raise ValueError(f"text may hold at most {MAX_TEXT} characters, got {len(text)}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError("text must be encodable as UTF-8 (no lone surrogates)") from error
        if "\x00" in text:
            raise ValueError("text must not hold a NUL character")
        where = _points([position] if np.ndim(position) == 1 else position, "position", 1)
        if where.shape[0] != 1:
            raise ValueError(f"position must have shape [2], got {list(np.shape(position))}")
        self._add(DrawCommand("text", where, _color(color), 1.0, text))

    def drain(self) -> list[DrawCommand]:
        """The commands given since the last drain, in order; the list empties."""
        commands, self._commands, self._count = self._commands, [], 0
        return commands


def _import_pygame():
    import os

    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    try:
        import pygame
    except ImportError as error:
        raise ImportError("drawing needs pygame: pip install 'racing-env[render]'") from error
    return pygame


def _signed_area(points: np.ndarray) -> float:
    x, y = points[:, 0], points[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


class FramePainter:
    """Draws one frame: the track of the observation (asphalt between its
    boundaries, edges, centerline, start line), the car at its pose, the
    controller's commands and a caption, the whole track in view.

    Args:
        size: (width, height) in px, each in [64, 4096].
        wheelbase_m: the car's wheelbase (m), the drawn car's axle spacing.
        body_m: the car's (length, width) (m).
    """

    def __init__(self, size: tuple[int, int] = (800, 600), wheelbase_m: float = _VEHICLE.wheelbase_m,
                 body_m: tuple[float, float] = _VEHICLE.chassis_size_m[:2]) -> None:
        if not isinstance(size, (tuple, list)) or len(size) != 2:
            raise TypeError(f"size must be (width, height), ints in [64, 4096], got {size!r}")
        self.size = (checks.integer_in(size[0], "size[0]", 64, 4097), checks.integer_in(size[1], "size[1]", 64, 4097))
        self.wheelbase_m = float(wheelbase_m)
        self.body_m = (float(body_m[0]), float(body_m[1]))
        self._pygame = _import_pygame()
        self._pygame.font.init()
        self._font = self._pygame.font.Font(None, 20)
        self._surface = self._pygame.Surface(self.size)
        self._view: tuple[bytes, float, np.ndarray] | None = None

    def _fit(self, obs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The track's three polylines (m), fitted once per track."""
        count = int(np.asarray(obs["track_mask"]).astype(bool).sum())
        left = np.asarray(obs["left_boundary"], np.float64)[:count]
        right = np.asarray(obs["right_boundary"], np.float64)[:count]
        center = np.asarray(obs["centerline"], np.float64)[:count]
        key = center.tobytes()
        if self._view is None or self._view[0] != key:
            both = np.concatenate([left, right])
            low, high = both.min(axis=0), both.max(axis=0)
            margin = 0.06
            width, height = self.size
            scale = min(width * (1 - 2 * margin) / max(high[0] - low[0], 1e-6),
                        (height - 28) * (1 - 2 * margin) / max(high[1] - low[1], 1e-6))
            middle = 0.5 * (low + high)
            self._view = (key, scale, middle)
        return left, right, center

    def to_pixels(self, points: Any) -> np.ndarray:
        """World points ([N, 2], m) as pixel coordinates ([N, 2], x right, y
        down) of the last painted frame's view."""
        if self._view is None:
            raise RuntimeError("paint a frame first: the view follows the track")
        _, scale, middle = self._view
        p = (np.asarray(points, np.float64) - middle) * scale
        width, height = self.size
        return np.stack([width / 2 + p[..., 0], 28 + (height - 28) / 2 - p[..., 1]], axis=-1)

    def paint(self, obs: Mapping[str, Any], commands: Sequence[DrawCommand] = (), caption: str = "") -> np.ndarray:
        """The frame as uint8 [height, width, 3] (RGB).

        Args:
            obs: one world's public observation (NumPy fields).
            commands: drained `DrawList` commands, drawn over the track.
            caption: a line of text at the top.

        Raises:
            ValueError: the observation's pose or track is not finite.
        """
        for name in ("position", "yaw", "centerline", "left_boundary", "right_boundary"):
            if not np.all(np.isfinite(np.asarray(obs[name], np.float64))):
                raise ValueError(f"obs[{name!r}] must be finite to be drawn")
        pg = self._pygame
        surface = self._surface
        surface.fill(_GRASS)
        left, right, center = self._fit(obs)
        if len(center) >= 3:
            outer, inner = (left, right) if abs(_signed_area(left)) >= abs(_signed_area(right)) else (right, left)
            pg.draw.polygon(surface, _ASPHALT, self.to_pixels(outer).tolist())
            pg.draw.polygon(surface, _GRASS, self.to_pixels(inner).tolist())
            for edge in (left, right):
                pg.draw.lines(surface, _EDGE, True, self.to_pixels(edge).tolist(), 2)
            mid = self.to_pixels(center)
            for k in range(0, len(mid) - 1, 4):  # dashed
                pg.draw.line(surface, _CENTER, mid[k].tolist(), mid[k + 1].tolist(), 1)
            pg.draw.line(surface, _START, *self.to_pixels(np.stack([left[0], right[0]])).tolist(), 3)
        self._car(obs)
        for command in commands:
            pixels = self.to_pixels(command.points)
            if command.kind == "line":
                pg.draw.lines(surface, command.color, False, pixels.tolist(), max(1, round(command.size)))
            elif command.kind == "points":
                for p in pixels:
                    pg.draw.circle(surface, command.color, p.tolist(), max(1.0, command.size))
            else:
                surface.blit(self._font.render(command.text, True, command.color), (pixels[0] + (6, -6)).tolist())
        strip = pg.Surface((self.size[0], 24))
        strip.set_alpha(170)
        strip.fill((0, 0, 0))
        surface.blit(strip, (0, 0))
        surface.blit(self._font.render(caption, True, _HUD), (8, 5))
        return np.ascontiguousarray(pg.surfarray.array3d(surface).transpose(1, 0, 2))

    def _car(self, obs: Mapping[str, Any]) -> None:
        """The body as a rectangle around the wheelbase's middle, its nose marked."""
        _, scale, _ = self._view
        length, width = self.body_m
        grow = max(1.0, _MIN_CAR_PX / (length * scale))
        length, width = length * grow, width * grow
        yaw = float(obs["yaw"])
        forward = np.array([math.cos(yaw), math.sin(yaw)])
        side = np.array([-forward[1], forward[0]])
        middle = np.asarray(obs["position"], np.float64) + 0.5 * self.wheelbase_m * forward
        corners = [middle + a * 0.5 * length * forward + b * 0.5 * width * side
                   for a, b in ((1, 1), (1, -1), (-1, -1), (-1, 1))]
        self._pygame.draw.polygon(self._surface, _CAR, self.to_pixels(np.stack(corners)).tolist())
        nose = self.to_pixels(np.stack([corners[0], corners[1]]))
        self._pygame.draw.line(self._surface, _CAR_NOSE, *nose.tolist(), 2)


def _temporary(path: Path) -> Path:
    """Where a recording of ``path`` is written before it replaces ``path``."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _in_place(path: Path) -> bool:
    """Whether a recording of ``path`` is written where it is: its target
    (a link's followed) exists and is no regular file (a device, a pipe)."""
    target = Path(os.path.realpath(path))
    return target.exists() and not target.is_file()


@contextlib.contextmanager
def _replacing(path: Path, tmp: Path | None = None) -> Iterator[Path]:
    """Write the block's file at ``tmp`` (default `_temporary`), then let it
    replace ``path`` (a link's target) in one rename: an interrupted or
    failed write leaves it as it was and no temporary file behind. A
    ``path`` that `_in_place` says is no regular file is written as it is."""
    if _in_place(path):
        yield path
        return
    target = Path(os.path.realpath(path))
    tmp = _temporary(target) if tmp is None else tmp
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class _GifWriter:
    """Frames kept as palette images (about width x height bytes each),
    written as one animated GIF on close."""

    def __init__(self, path: Path, fps: float) -> None:
        from PIL import Image

        self._image = Image
        self.path = path
        self.duration_ms = 1000.0 / fps
        self.frames: list[Any] = []

    def add(self, frame: np.ndarray) -> None:
        image, pil = self._image.fromarray(frame), self._image
        self.frames.append(image.quantize(colors=64, method=pil.Quantize.FASTOCTREE, dither=pil.Dither.NONE))

    def close(self) -> None:
        if self.frames:
            first, *rest = self.frames
            with _replacing(self.path) as tmp:
                first.save(tmp, format="GIF", save_all=True, append_images=rest, duration=round(self.duration_ms),
                           loop=0)
        self.frames = []


class _Mp4Writer:
    """Frames piped to ffmpeg (H.264) as they come: constant memory."""

    def __init__(self, path: Path, fps: float, size: tuple[int, int]) -> None:
        try:
            import imageio_ffmpeg
        except ImportError as error:
            raise ImportError("recording MP4 needs imageio-ffmpeg: pip install 'racing-env[render]'") from error
        width, height = size
        self.path = path
        self._tmp = path if _in_place(path) else _temporary(Path(os.path.realpath(path)))
        command = [imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error", "-f", "rawvideo",
                   "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", f"{fps:.6g}", "-i", "-",
                   "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-pix_fmt", "yuv420p", "-vcodec", "libx264",
                   "-f", "mp4", str(self._tmp)]
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stderr=subprocess.PIPE)

    def add(self, frame: np.ndarray) -> None:
        self._process.stdin.write(frame.tobytes())

    def close(self) -> None:
        if self._process is None:
            return
        with _replacing(self.path, self._tmp):
            try:
                _, errors = self._process.communicate()
            except BaseException:  # an interrupt: the encoder must not outlive the recording
                self._process.kill()
                self._process.wait()
                self._process = None
                raise
            code, self._process = self._process.returncode, None
            if code != 0:
                raise RuntimeError(f"ffmpeg failed ({code}): {errors.decode(errors='replace')[-500:]}")


class EpisodeView:
    """What the Runner shows an episode to: paints frames of the observed
    world, shows them in a window, records them, or both.

    Every control step is offered (`wants_frame`, then `show`): the window
    shows every one, paced to real time (closing it, or Esc or Q, stops the
    showing; the run goes on); the recording keeps every ``stride``-th,
    ``stride = round(1 / (record_fps * control_dt_s))``, and every
    episode's final frame (so that it ends on the terminal step, its
    caption included), and plays at ``1 / (stride * control_dt_s)``
    frames/s, so it runs in real time (a final frame off the stride adds
    one frame's time).

    Args:
        control_dt_s: the env's control step (s), ``config.control_dt_s``.
        window: open an interactive pygame window.
        record: write the frames to this ``.gif`` or ``.mp4`` file on `close`.
        record_fps: the recording's target frame rate, in `RECORD_FPS` ([0.1, 60]).
        size: the frame's (width, height), px.
        realtime: pace the window to the control step (off: as fast as drawn).
        wheelbase_m, body_m: the car as drawn (the config's values).

    Raises:
        RuntimeError: ``window`` without a display to open it on: no
            ``DISPLAY`` or ``WAYLAND_DISPLAY`` (and no ``SDL_VIDEODRIVER``
            named), or SDL falling back to a driver that shows nothing
            (``HEADLESS_VIDEO_DRIVERS``) that ``SDL_VIDEODRIVER`` did not name.
            Refused before anything is opened or written.
        ValueError: nothing to do (no window, no recording), a recording
            that is not ``.gif``/``.mp4``, is a folder or whose folder does
            not exist, or a non-positive step or frame rate; each names the
            argument.
    """

    def __init__(self, control_dt_s: float, *, window: bool = False, record: str | Path | None = None,
                 record_fps: float = 10.0, size: tuple[int, int] = (800, 600), realtime: bool = True,
                 wheelbase_m: float = _VEHICLE.wheelbase_m,
                 body_m: tuple[float, float] = _VEHICLE.chassis_size_m[:2]) -> None:
        checks.positive(control_dt_s, "control_dt_s")
        checks.real_in(record_fps, "record_fps", *RECORD_FPS)
        if not window and record is None:
            raise ValueError("give window=True, a record file, or both")
        path = None if record is None else Path(record)
        if path is not None:
            if path.suffix.lower() not in RECORD_SUFFIXES:
                raise ValueError(f"record must be a .gif or .mp4 file, got {str(path)!r}")
            if not path.parent.is_dir():
                raise ValueError(f"record's folder {str(path.parent)!r} does not exist")
            if path.is_dir():
                raise ValueError(f"record {str(path)!r} is a folder, not a file")
        self.control_dt_s = float(control_dt_s)
        self.painter = FramePainter(size, wheelbase_m, body_m)
        self.stride = max(1, round(1.0 / (record_fps * self.control_dt_s)))
        self.record_fps = 1.0 / (self.stride * self.control_dt_s)
        self.record = path
        self.window_open = False
        if window:
            pg = self.painter._pygame
            asked_driver = os.environ.get("SDL_VIDEODRIVER", "")
            if not asked_driver and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
                raise RuntimeError("the window needs a display (neither DISPLAY nor WAYLAND_DISPLAY is set); "
                                   "record a file instead")
            try:
                pg.display.init()
                self._screen = pg.display.set_mode(self.painter.size)
            except pg.error as error:
                raise RuntimeError(f"the window needs a display ({error}); record a file instead") from error
            driver = pg.display.get_driver()
            # SDL falls back to an invisible window when it finds no display;
            # only a caller who names such a driver gets one.
            if driver in HEADLESS_VIDEO_DRIVERS and driver != asked_driver:
                pg.display.quit()
                raise RuntimeError(f"the window needs a display (SDL found none and chose its {driver!r} driver, "
                                   "which shows nothing); record a file instead")
            pg.display.set_caption("ControllerLearning/CarRacing-v0")
            self._clock = pg.time.Clock()
            self.window_open = True
        self._writer: _GifWriter | _Mp4Writer | None = None
        if path is not None:
            fps = self.record_fps
            self._writer = _GifWriter(path, fps) if path.suffix.lower() == ".gif" else _Mp4Writer(path, fps, size)
        self._realtime = realtime
        self._offered = 0
        self._final = False
        self.frames_recorded = 0
        self.last_frame: np.ndarray | None = None

    def wants_frame(self, final: bool = False) -> bool:
        """Whether the step being offered becomes a frame (the window's,
        or for the recording every ``stride``-th and every ``final`` one,
        an episode's terminal step). Each call is one step."""
        self._offered += 1
        self._final = bool(final)
        return self.window_open or self._records_this_step()

    def _records_this_step(self) -> bool:
        """The step last offered is one the recording keeps."""
        return self._writer is not None and (self._final or (self._offered - 1) % self.stride == 0)

    def show(self, obs: Mapping[str, Any], commands: Sequence[DrawCommand] = (), caption: str = "") -> None:
        """Paint the frame of ``obs`` and ``commands``; show and record it."""
        frame = self.painter.paint(obs, commands, caption)
        self.last_frame = frame
        if self._records_this_step():
            self._writer.add(frame)
            self.frames_recorded += 1
        if self.window_open:
            pg = self.painter._pygame
            for event in pg.event.get():
                if event.type == pg.QUIT or (event.type == pg.KEYDOWN and event.key in (pg.K_ESCAPE, pg.K_q)):
                    self._close_window()
                    return
            pg.surfarray.blit_array(self._screen, frame.transpose(1, 0, 2))
            pg.display.flip()
            if self._realtime:
                self._clock.tick(1.0 / self.control_dt_s)

    def _close_window(self) -> None:
        if self.window_open:
            self.painter._pygame.display.quit()
            self.window_open = False

    def close(self) -> None:
        """Close the window and write the recording."""
        self._close_window()
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def __enter__(self) -> EpisodeView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
