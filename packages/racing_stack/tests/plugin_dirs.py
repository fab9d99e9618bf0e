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


#: Source that defines ``drop_a_ctrl_c()``: a garbage collection during
#: which SIGINT arrives inside a collector callback (JAX registers one),
#: where Python prints the KeyboardInterrupt ("Exception ignored ...") and
#: drops it. The first call only.
DROP_A_CTRL_C = """
import gc
import os
import signal

fired = []


def swallow(phase, info):
    if not fired:
        fired.append(phase)
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(10))  # the handler runs here, inside the callback


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
