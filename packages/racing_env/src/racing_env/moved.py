"""Names that moved to another module and still import from their old
place for one release, with a `DeprecationWarning`."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for `module` (its ``__name__``) that gives
    each old name of `moved` (old name -> the new home's dotted path, such
    as ``"racing_env.runner.challenge_values"``) from its new home, with a
    `DeprecationWarning` naming both; any other name is an AttributeError."""

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, _, attribute = moved[name].rpartition(".")
        warnings.warn(f"{module}.{name} moved to {moved[name]}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(home), attribute)

    return __getattr__
