"""Controller plugins written by the tests: a folder with the controller's
source and an empty configuration."""

from __future__ import annotations

from pathlib import Path


def write_plugin(root: Path, name: str, body: str) -> Path:
    """The plugin folder ``root/name`` holding ``body`` as its ``controller.py``."""
    plugin = root / name
    plugin.mkdir()
    (plugin / "controller.py").write_text(body)
    (plugin / "config.toml").write_text("")
    return plugin
