"""Warp, imported for the MJX-Warp backend without its banner on stdout."""

from __future__ import annotations

from types import ModuleType


def warp() -> ModuleType:
    """The ``warp`` module, its log level lowered from Warp's default
    (info: the banner at initialisation and a line per loaded module, on
    stdout, where a library's user would find them in their own output) to
    warnings while Warp is not initialised. Another level, or a Warp
    already initialised (``warp.init()`` at the info level before the
    first env shows the banner and keeps the lines), is the user's choice."""
    import warp as wp

    context = getattr(getattr(wp, "_src", None), "context", None)  # Warp's runtime: None until warp.init()
    if wp.config.log_level == wp.LOG_INFO and getattr(context, "runtime", None) is None:
        wp.config.log_level = wp.LOG_WARNING
    return wp
