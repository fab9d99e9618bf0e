"""Warp, imported for the MJX-Warp backend without its banner on stdout
and without its no-driver line on stderr.

track_gen keeps the same few lines (`track_gen._warp`): racing_env does
not depend on track_gen."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from types import ModuleType

#: What Warp's native library prints on stderr when it initialises on a machine where no NVIDIA driver loads:
#: a CPU machine's normal state, which no Warp setting silences.
NO_DRIVER = "Could not find or load the NVIDIA CUDA driver"


def warp() -> ModuleType:
    """The ``warp`` module, its log level lowered from Warp's default
    (info: the banner at initialisation and a line per loaded module, on
    stdout, where a library's user would find them in their own output) to
    warnings while Warp is not initialised, and its initialisation (however
    it is reached) leaving out its no-driver line while the level stays
    that one. Another level, or a Warp already initialised
    (``warp.init()`` at the info level before the first env shows the
    banner and keeps the lines), is the user's choice."""
    import warp as wp

    context = getattr(getattr(wp, "_src", None), "context", None)  # Warp's runtime: None until warp.init()
    if wp.config.log_level != wp.LOG_INFO or getattr(context, "runtime", None) is not None:
        return wp
    wp.config.log_level = wp.LOG_WARNING
    original = getattr(context, "init", None)
    if original is None or getattr(original, "without_no_driver", False):  # track_gen's, say
        return wp

    def init() -> None:
        if context.runtime is None and wp.config.log_level == wp.LOG_WARNING:
            _init_without(NO_DRIVER, original)
        else:
            original()

    init.without_no_driver = True
    context.init = init  # Warp's own calls (a first array, a first launch) initialise through this name
    return wp


def _init_without(line: str, init: Callable[[], None]) -> None:
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
