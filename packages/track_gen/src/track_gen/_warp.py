"""Warp's output in library use: its banner and its line per loaded module
off stdout, and its line that a machine has no NVIDIA driver off stderr,
unless the user chose Warp's log level (README, "Warp's output").

racing_env keeps the same few lines (`racing_env._warp`): it does not
depend on track_gen."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from types import ModuleType

#: What Warp's native library prints on stderr when it initialises on a machine where no NVIDIA driver loads:
#: a CPU machine's normal state, which no Warp setting silences.
NO_DRIVER = "Could not find or load the NVIDIA CUDA driver"


def quiet(wp: ModuleType) -> None:
    """While Warp is not initialised and at its default level (info), lower
    the level to warnings, and have Warp's initialisation (however it is
    reached) leave out its no-driver line while the level stays that one.
    A level set before or after, or a Warp initialised before, is the user's."""
    context = getattr(getattr(wp, "_src", None), "context", None)  # Warp's runtime: None until warp.init()
    if wp.config.log_level != wp.LOG_INFO or getattr(context, "runtime", None) is not None:
        return
    wp.config.log_level = wp.LOG_WARNING
    original = getattr(context, "init", None)
    if original is None or getattr(original, "without_no_driver", False):
        return

    def init() -> None:
        if context.runtime is None and wp.config.log_level == wp.LOG_WARNING:
            init_without(NO_DRIVER, original)
        else:
            original()

    init.without_no_driver = True
    context.init = init  # Warp's own calls (a first array, a first launch) initialise through this name


def init_without(line: str, init: Callable[[], None]) -> None:
    """Call ``init`` with file descriptor 2 (stderr, where a native library
    prints) caught, then pass on what it printed, less the lines holding
    ``line``."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as caught:
            os.dup2(caught.fileno(), 2)
            try:
                init()
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
            caught.seek(0)
            printed = caught.read().decode(errors="replace")
    finally:
        os.close(saved)
    kept = "".join(text for text in printed.splitlines(keepends=True) if line not in text)
    if kept:
        sys.stderr.write(kept)
        sys.stderr.flush()
