"""The known-good set of the three packages, and the joins between them."""

import sys
from importlib.metadata import PackageNotFoundError, version

if sys.argv[:1] == ["-m"]:  # being imported to run `python -m racing_stack.<command>`: before its imports
    from racing_stack._cli import keep_early_ctrl_c

    keep_early_ctrl_c()

try:  # the installed distribution's version: pyproject.toml is the one place it is written
    __version__ = version("racing-stack")
except PackageNotFoundError:  # a source tree on the path, not installed
    __version__ = "0+unknown"

#: Distribution name -> the exact version known to work with the others.
PINS: dict[str, str] = {
    "track-gen": "0.1.4",
    "racing-env": "0.3.0",
    "rl-triton": "0.1.0",
}


def installed_versions() -> dict[str, str]:
    """The installed version of each pinned distribution."""
    return {name: version(name) for name in PINS}
