"""Exceptions of track_gen."""


class CaptureError(RuntimeError):
    """A call that cannot run inside (or outside) the current graph capture."""
