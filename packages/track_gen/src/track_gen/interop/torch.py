"""Recording courses into ``torch.cuda.graph`` captures.

Importing this module does not import torch: its functions import it when
called.

Inside ``torch.cuda.graph(g)`` library calls adopt torch's capture stream on
their own. ``registered()`` also registers that capture with Warp, so a masked
regeneration can go behind a conditional node (``conditional=True``) and the
courses recorded inside it live as long as the graph. ``retain(g, course)``
ties a course to a graph explicitly.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import warp as wp

from track_gen import _capture
from track_gen import exec as exec_mode
from track_gen.errors import CaptureError

_MODES = {"global": wp.CaptureMode.GLOBAL, "thread_local": wp.CaptureMode.THREAD_LOCAL,
          "relaxed": wp.CaptureMode.RELAXED}


@contextlib.contextmanager
def registered(conditional: bool = False, capture_mode: str = "global") -> Iterator[wp.Stream]:
    """Register the running ``torch.cuda.graph`` capture with Warp.

    Yields torch's capture stream as a ``wp.Stream`` (pass it as ``stream=``
    to your own Warp launches). Courses recorded inside the block live as long
    as the torch graph.

    Args:
        conditional: ``True``: a masked regeneration recorded inside the block
            goes behind a conditional node (skipped on device when no env is
            masked, where ``wp.is_conditional_graph_supported()``); no torch
            allocation may follow it in the capture. ``False``: recorded
            unconditionally.
        capture_mode: the ``capture_error_mode`` the torch graph was captured
            with: ``"global"`` (torch's default), ``"thread_local"`` or ``"relaxed"``.

    Raises:
        CaptureError: torch is not capturing on its current stream.
        ValueError: an unknown ``capture_mode``.
    """
    if capture_mode not in _MODES:
        raise ValueError(f"capture_mode must be one of {sorted(_MODES)}, got {capture_mode!r}")
    torch = importlib.import_module("torch")
    if not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()):
        raise CaptureError("registered() works inside torch.cuda.graph(...): torch is not capturing "
                           "on its current stream")
    stream = wp.stream_from_torch(torch.cuda.current_stream())
    mode = exec_mode.conditional() if conditional else exec_mode.unconditional()
    with wp.ScopedStream(stream, sync_enter=False):
        wp.capture_begin(stream=stream, external=True, capture_mode=_MODES[capture_mode])
        try:
            with mode:
                yield stream
        finally:
            kept: list[Any] = []  # the Warp graph: the courses recorded, the kernels' modules
            try:
                _capture.keep_with_capture(stream, kept)
            finally:
                kept.append(wp.capture_end(stream=stream))


def retain(graph: Any, course: Any) -> None:
    """Keep ``course`` alive as long as ``graph`` (a ``torch.cuda.CUDAGraph``,
    a ``wp.Graph`` or any object with attributes).

    Raises:
        TypeError: ``graph`` cannot hold a reference.
    """
    try:
        kept = vars(graph).setdefault("_track_gen_courses", [])
    except TypeError:
        raise TypeError(f"graph must be an object with attributes (a torch.cuda.CUDAGraph or "
                        f"wp.Graph), got {type(graph).__name__}") from None
    if not any(c is course for c in kept):
        kept.append(course)
