"""The drawing options ``sim`` and ``evaluate`` share: ``--render`` (a
window) and ``--record FILE`` (an animated GIF or MP4), of world 0's
episodes."""

from __future__ import annotations

import argparse
from pathlib import Path

from racing_stack._cli import float_in

__all__ = ["add_view_arguments", "check_view_arguments", "open_view"]

#: ``--record-fps``'s default, frames a second.
RECORD_FPS = 10.0


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--render``, ``--record FILE`` and ``--record-fps`` to ``parser``."""
    parser.add_argument("--render", action="store_true",
                        help="show the episode in a 2D window, in real time (needs a display)")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE",
                        help="write the episode as an animated .gif or .mp4 (no display needed)")
    parser.add_argument("--record-fps", type=_record_fps, default=None,
                        help=f"--record's frame rate, in [0.1, 60] (default {RECORD_FPS:g})")


def check_view_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--record-fps`` without ``--record`` (it would be ignored) as a
    usage error naming it; then give it its default."""
    if args.record_fps is not None and args.record is None:
        parser.error("argument --record-fps: sets --record's frame rate; give --record FILE")
    if args.record_fps is None:
        args.record_fps = RECORD_FPS


def _record_fps(text: str) -> float:
    """``--record-fps``'s type: a frame rate in `racing_env.render.RECORD_FPS`
    (imported when the flag is given: ``--help`` imports no JAX)."""
    from racing_env.render import RECORD_FPS

    low, high = RECORD_FPS
    return float_in(low, high, low_open=False)(text)


def open_view(args: argparse.Namespace, config):
    """The `racing_env.render.EpisodeView` the options ask for, or None.

    Raises:
        ValueError: a bad ``--record`` file (the message names ``--record``).
        RuntimeError: ``--render`` without a display (the message names ``--render``).
    """
    if not args.render and args.record is None:
        return None
    from racing_env.render import EpisodeView

    try:
        return EpisodeView(config.control_dt_s, window=args.render, record=args.record, record_fps=args.record_fps,
                           wheelbase_m=config.wheelbase_m, body_m=config.chassis_size_m[:2])
    except ValueError as error:
        raise ValueError(f"argument --record: {error}") from error
    except RuntimeError as error:
        raise RuntimeError(f"argument --render: {error}") from error
