"""How a masked regeneration records into a CUDA graph.

Inside ``wp.ScopedCapture`` on CUDA (when ``wp.is_conditional_graph_supported()``)
``course.regenerate(mask=...)`` records two small kernels that reduce the
mask to a flag and puts the generation behind a conditional node, so a
replay whose mask is all zero skips it on device. Two context managers
override that choice for the calls recorded inside them:

- ``unconditional()``: record the generation as plain nodes (a full
  generation per replay). Use it when the graph will be a CUDA child graph,
  or while a side stream forked inside the capture is still open.
- ``conditional()``: put it behind a conditional node even on torch's
  current stream, where a capture records no conditional node by default
  (under ``torch.cuda.graph`` use
  ``track_gen.interop.torch.registered(conditional=True)`` instead).

The innermost context wins; both are per thread and per async task.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Literal

Mode = Literal["default", "conditional", "unconditional"]

_mode: contextvars.ContextVar[Mode] = contextvars.ContextVar("track_gen_exec_mode", default="default")


def mode() -> Mode:
    """The recording mode in effect: ``"default"``, ``"conditional"`` or ``"unconditional"``."""
    return _mode.get()


@contextlib.contextmanager
def _scoped(value: Mode) -> Iterator[None]:
    token = _mode.set(value)
    try:
        yield
    finally:
        _mode.reset(token)


def conditional() -> contextlib.AbstractContextManager[None]:
    """Record masked regenerations behind a conditional node (skipped on
    device when no env is masked) wherever the capture allows one."""
    return _scoped("conditional")


def unconditional() -> contextlib.AbstractContextManager[None]:
    """Record masked regenerations as plain nodes: a full generation per replay."""
    return _scoped("unconditional")
