"""Ready-made course specifications (``presets``)."""
