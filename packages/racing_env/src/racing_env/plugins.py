"""Controller plugins: a trusted local directory holding

    controller.py   exactly one concrete subclass of `Controller`
    config.toml     the plugin's settings (all of it becomes config["controller"])
    *.py            optional helpers, imported relatively (``from .helpers import f``)

`load_plugin` checks a directory once; `Plugin.load_class` imports a fresh
copy of its code (every episode gets new module objects, so no state
survives from one episode to the next through module globals; other
process-wide state, such as ``builtins``, does survive). Each directory's
modules live under their own package name,
``racing_env_plugins.<name>_<hash of the path>``, so two plugins that both
have a ``helpers.py`` never see each other's. Loaded here, plugins are
trusted code: they run in this process, unsandboxed, and can reach anything
in it; the Runner's isolated mode (`racing_env.isolation`) runs each
episode's controller in a child process instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import inspect
import re
import sys
import tomllib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from racing_env.controller import BatchController, Controller
from racing_env.moved import moved_names

__all__ = ["PLUGIN_PACKAGE", "CHALLENGE_KEYS", "CONTROLLERS", "PURSUIT", "RACELINE", "TEMPLATE", "Plugin",
           "PluginError", "freeze", "load_plugin"]

#: `challenge_values` reads the env, so it lives where env and plugin meet: `racing_env.runner`.
__getattr__ = moved_names(__name__, {"challenge_values": "racing_env.runner.challenge_values"})

#: The package every plugin's modules are imported under.
PLUGIN_PACKAGE = "racing_env_plugins"
#: The controller plugins shipped with the package.
CONTROLLERS = Path(__file__).parent / "controllers"
#: The neutral template (copy it to start a plugin): reaches the timeout.
TEMPLATE = CONTROLLERS / "template"
#: The reference controller: pure pursuit and a curvature speed profile.
PURSUIT = CONTROLLERS / "pursuit"
#: The racing-line controller: the lap at the car's measured limit (`racing_env.raceline`), tracked.
RACELINE = CONTROLLERS / "raceline"
#: The top-level config keys the Challenge owns (the plugin's TOML cannot set them).
CHALLENGE_KEYS = ("vehicle", "action", "track", "level", "benchmark")


class PluginError(ValueError):
    """A plugin directory that cannot be used: the message names the file and
    what was expected."""


def freeze(value: Any) -> Any:
    """An immutable copy: mappings become read-only mappings, lists tuples."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({key: freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    return value


@dataclasses.dataclass(frozen=True)
class Plugin:
    """A checked plugin directory.

    Attributes:
        directory: the resolved directory.
        package: the package name its modules are imported under.
        settings: the parsed ``config.toml`` (read-only).
    """

    directory: Path
    package: str
    settings: Mapping[str, Any]

    @property
    def name(self) -> str:
        """What captions and titles call the plugin: ``config.toml``'s
        top-level ``name`` where it is a non-empty string, else the
        directory's name."""
        name = self.settings.get("name")
        return name if isinstance(name, str) and name.strip() else self.directory.name

    def load_class(self) -> type[Controller]:
        """A freshly imported copy of the plugin's Controller subclass.

        Raises:
            PluginError: ``controller.py`` fails to import (it raises or
                calls ``sys.exit()``; the cause is chained), or does not
                define exactly one concrete subclass (nor more than one of
                `racing_env.controller.BatchController`).
        """
        return self._classes()[0]

    def load_batch_class(self) -> type[BatchController] | None:
        """A freshly imported copy of the plugin's BatchController subclass
        (None: it defines none).

        Raises:
            PluginError: as `load_class`.
        """
        return self._classes()[1]

    def _classes(self) -> tuple[type[Controller], type[BatchController] | None]:
        """``controller.py`` imported afresh: its concrete Controller and BatchController subclasses."""
        for name in [m for m in sys.modules if m == self.package or m.startswith(self.package + ".")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        _ensure_root()
        package = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(self.package, None, is_package=True))
        package.__path__ = [str(self.directory)]
        sys.modules[self.package] = package
        path = self.directory / "controller.py"
        spec = importlib.util.spec_from_file_location(f"{self.package}.controller", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except SystemExit as error:  # a plugin's sys.exit() at import must not end the caller in silence
            raise PluginError(f"{path} failed to import: it called sys.exit({error.code!r})") from error
        except Exception as error:
            raise PluginError(f"{path} failed to import: {type(error).__name__}: {error}") from error

        def concrete(base: type) -> list[type]:
            return [obj for obj in vars(module).values()
                    if inspect.isclass(obj) and issubclass(obj, base) and obj.__module__ == module.__name__
                    and not inspect.isabstract(obj)]

        found, batched = concrete(Controller), concrete(BatchController)
        if len(found) != 1:
            names = ", ".join(sorted(cls.__name__ for cls in found)) or "none"
            raise PluginError(f"{path} must define exactly one concrete subclass of racing_env.Controller, "
                              f"found {len(found)} ({names})")
        if len(batched) > 1:
            names = ", ".join(sorted(cls.__name__ for cls in batched))
            raise PluginError(f"{path} may define at most one concrete subclass of racing_env.BatchController, "
                              f"found {len(batched)} ({names})")
        return found[0], (batched[0] if batched else None)

    def config(self, challenge: Mapping[str, Any]) -> Mapping[str, Any]:
        """The immutable configuration a controller receives: the plugin's
        settings under ``"controller"``, the Challenge's own values (from the
        env: `racing_env.runner.challenge_values`) under `CHALLENGE_KEYS`."""
        if set(challenge) != set(CHALLENGE_KEYS):
            raise ValueError(f"challenge must have exactly the keys {CHALLENGE_KEYS}, got {sorted(challenge)}")
        return freeze({"controller": self.settings, **challenge})


def load_plugin(directory: str | Path, *, import_code: bool = True) -> Plugin:
    """Check a plugin directory and import its controller once.

    Args:
        directory: the plugin directory.
        import_code: False skips the import (the isolated mode checks it in
            a child process: `racing_env.isolation.check_plugin`), so that
            none of the plugin's code runs in this process.

    Raises:
        PluginError: not a directory, ``controller.py`` or ``config.toml``
            missing, invalid TOML, or a controller that does not import or
            does not define exactly one concrete Controller subclass.
    """
    path = Path(directory).expanduser().resolve()
    if not path.is_dir():
        raise PluginError(f"plugin directory {path} does not exist or is not a directory")
    for name in ("controller.py", "config.toml"):
        if not (path / name).is_file():
            raise PluginError(f"plugin directory {path} has no {name}")
    try:
        settings = tomllib.loads((path / "config.toml").read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise PluginError(f"{path / 'config.toml'} is not valid TOML: {error}") from error
    slug = re.sub(r"\W", "_", path.name) or "plugin"
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:10]
    plugin = Plugin(directory=path, package=f"{PLUGIN_PACKAGE}.{slug}_{digest}", settings=freeze(settings))
    if import_code:
        plugin.load_class()
    return plugin


def _ensure_root() -> None:
    if PLUGIN_PACKAGE not in sys.modules:
        root = importlib.util.module_from_spec(importlib.machinery.ModuleSpec(PLUGIN_PACKAGE, None, is_package=True))
        root.__path__ = []
        sys.modules[PLUGIN_PACKAGE] = root
