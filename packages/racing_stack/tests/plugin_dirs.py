"""Controller plugins written by the tests: a folder with the controller's
source and an empty configuration; the source of a Ctrl-C that Python drops."""

from __future__ import annotations

import signal
from pathlib import Path


def write_plugin(root: Path, name: str, body: str) -> Path:
    """The plugin folder ``root/name`` holding ``body`` as its ``controller.py``."""
    plugin = root / name
    plugin.mkdir()
    (plugin / "controller.py").write_text(body)
    (plugin / "config.toml").write_text("")
    return plugin


#: What `DROP_A_CTRL_C` prints on stderr as its KeyboardInterrupt leaves the
#: collector callback: the evidence that the Ctrl-C was dropped.
DROPPED_LINE = "test: a KeyboardInterrupt leaves a gc callback"

#: Source that defines ``drop_a_ctrl_c()``: a garbage collection during
#: which SIGINT arrives inside a collector callback (JAX registers one),
#: where Python reports the KeyboardInterrupt to `sys.unraisablehook`
#: (its own prints "Exception ignored ...") and drops it. The first call
#: only; it says so on stderr (`DROPPED_LINE`).
DROP_A_CTRL_C = """
import gc
import os
import signal
import sys

fired = []


def swallow(phase, info):
    if not fired:
        fired.append(phase)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(10))  # the handler runs here, inside the callback
        except KeyboardInterrupt:
            print(""" + repr(DROPPED_LINE) + """, file=sys.stderr, flush=True)
            raise


def drop_a_ctrl_c():
    gc.callbacks.append(swallow)
    gc.collect()
"""

#: Controller source that defines ``drop_a_ctrl_c()`` (`DROP_A_CTRL_C`).
CTRL_C_DROPPED_IN_GC = """
import numpy as np
from racing_env.controller import Controller
""" + DROP_A_CTRL_C


def ctrl_c_on() -> None:
    """A command's Ctrl-C as a terminal gives it (SIGINT's default), whatever
    the tests inherited (a job started in the background by a shell without
    job control ignores SIGINT, and so do its children): a ``preexec_fn``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
