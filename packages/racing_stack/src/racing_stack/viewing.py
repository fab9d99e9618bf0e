"""The drawing options ``sim`` and ``evaluate`` share: ``--render`` (a
window) and ``--record FILE`` (an animated GIF or MP4), of world 0's
episodes."""

from __future__ import annotations

import argparse
from pathlib import Path

from racing_stack._cli import float_in

__all__ = ["add_view_arguments", "open_view"]


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--render``, ``--record FILE`` and ``--record-fps`` to ``parser``."""
    parser.add_argument("--render", action="store_true",
                        help="show the episode in a 2D window, in real time (needs a display)")
    parser.add_argument("--record", type=Path, default=None, metavar="FILE",
                        help="write the episode as an animated .gif or .mp4 (no display needed)")
    parser.add_argument("--record-fps", type=float_in(0.0, 60.0), default=10.0,
                        help="the recording's frame rate, in (0, 60] (default 10)")


def open_view(args: argparse.Namespace, config):
    """The `racing_env.render.EpisodeView` the options ask for, or None.

    Raises:
        ValueError: a bad ``--record`` file.
        RuntimeError: ``--render`` without a display.
    """
    if not args.render and args.record is None:
        return None
    from racing_env.render import EpisodeView

    return EpisodeView(config.control_dt_s, window=args.render, record=args.record, record_fps=args.record_fps,
                       wheelbase_m=config.wheelbase_m, body_m=config.chassis_size_m[:2])
