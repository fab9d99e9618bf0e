"""Controller plugins: exactly one concrete Controller, isolated relative
imports, a fresh class per load, an immutable config whose Challenge values
come from the env and cannot be shadowed by the plugin's TOML."""

from __future__ import annotations

import re
import sys
import textwrap

import numpy as np
import pytest

from racing_env import LEVEL_0, CarRacingEnv, ProjectConfig, level0_track
from racing_env.controller import Controller
from racing_env.plugins import CHALLENGE_KEYS, TEMPLATE, PluginError, load_plugin
from racing_env.runner import challenge_values

HEADER = "import numpy as np\nfrom racing_env.controller import Controller\n"
ONE = HEADER + textwrap.dedent("""
    class Driver(Controller):
        def compute_control(self, obs, info=None):
            return np.zeros(2, np.float32)
""")


def make_plugin(root, name, controller=ONE, config='name = "x"\n', **files):
    path = root / name
    path.mkdir()
    if controller is not None:
        (path / "controller.py").write_text(controller)
    if config is not None:
        (path / "config.toml").write_text(config)
    for file, text in files.items():
        (path / f"{file}.py").write_text(text)
    return path


@pytest.fixture(scope="module")
def env():
    return CarRacingEnv(config=ProjectConfig(), level=LEVEL_0, backend="cpu_reference", track=level0_track())


def test_the_template_loads_and_is_neutral(env):
    plugin = load_plugin(TEMPLATE)
    obs, info = env.reset(seed=0)
    controller = plugin.load_class()(obs, info, plugin.config(challenge_values(env)))
    np.testing.assert_array_equal(controller.compute_control(obs, info), np.zeros(2, np.float32))


@pytest.mark.parametrize("body,found", [
    (HEADER, "found 0 (none)"),
    (ONE + "\nclass Other(Driver):\n    pass\n", "found 2 (Driver, Other)"),
    (HEADER + "class Half(Controller):\n    pass\n", "found 0"),  # abstract: no compute_control
])
def test_exactly_one_concrete_controller_is_required(tmp_path, body, found):
    path = make_plugin(tmp_path, "p", controller=body)
    with pytest.raises(PluginError, match=rf"exactly one concrete subclass.*{re.escape(found)}"):
        load_plugin(path)


def test_an_imported_base_class_is_not_counted(tmp_path):
    """A controller.py that imports another concrete Controller (here the
    template's, through a helper) still defines exactly one of its own."""
    helper = HEADER + "class Base(Controller):\n    def compute_control(self, obs, info=None):\n        return 1\n"
    body = "from .base import Base\n\nclass Mine(Base):\n    pass\n"
    assert load_plugin(make_plugin(tmp_path, "p", controller=body, base=helper)).load_class().__name__ == "Mine"


@pytest.mark.parametrize("config, name", [('name = "my run"\n', "my run"), ("", "dir"), ("name = 3\n", "dir"),
                                          ('name = " "\n', "dir"), ('[name]\nfirst = "x"\n', "dir")])
def test_a_plugin_is_called_by_its_config_name_else_its_directory(tmp_path, config, name):
    """What captions and titles show: config.toml's top-level ``name`` where
    it is a non-empty string, else the directory's name."""
    assert load_plugin(make_plugin(tmp_path, "dir", config=config), import_code=False).name == name
    assert load_plugin(TEMPLATE, import_code=False).name == "template"


@pytest.mark.parametrize("missing", ["controller", "config"])
def test_missing_files_are_named(tmp_path, missing):
    path = make_plugin(tmp_path, "p", **{missing: None})
    with pytest.raises(PluginError, match=f"{missing}.(py|toml)"):
        load_plugin(path)


def test_not_a_directory_and_bad_toml_are_named(tmp_path):
    with pytest.raises(PluginError, match="does not exist"):
        load_plugin(tmp_path / "nowhere")
    with pytest.raises(PluginError, match="config.toml is not valid TOML"):
        load_plugin(make_plugin(tmp_path, "p", config="name = \n"))


def test_an_import_error_is_reported_with_its_cause(tmp_path):
    path = make_plugin(tmp_path, "p", controller=ONE + "\nraise RuntimeError('boom')\n")
    with pytest.raises(PluginError, match="failed to import: RuntimeError: boom") as error:
        load_plugin(path)
    assert isinstance(error.value.__cause__, RuntimeError)


@pytest.mark.parametrize("code", ["3", "'bye'", ""])
def test_a_sys_exit_at_import_is_an_import_error_not_an_exit(tmp_path, code):
    path = make_plugin(tmp_path, "p", controller=ONE + f"\nimport sys\nsys.exit({code})\n")
    shown = repr(eval(code)) if code else "None"
    with pytest.raises(PluginError, match=re.escape(f"failed to import: it called sys.exit({shown})")) as error:
        load_plugin(path)
    assert isinstance(error.value.__cause__, SystemExit)


def test_two_plugins_with_the_same_helper_name_never_see_each_other(tmp_path):
    body = ONE + "\nfrom .helpers import VALUE\n"
    a = load_plugin(make_plugin(tmp_path, "a", controller=body, helpers="VALUE = 'a'\n"))
    b = load_plugin(make_plugin(tmp_path, "b", controller=body, helpers="VALUE = 'b'\n"))
    assert a.package != b.package
    assert a.load_class().compute_control.__globals__["VALUE"] == "a"
    assert b.load_class().compute_control.__globals__["VALUE"] == "b"
    assert "helpers" not in sys.modules


def test_each_load_is_a_fresh_import(tmp_path):
    """Module globals do not carry state from one episode's class to the next."""
    body = ONE + "\nCALLS = []\n"
    plugin = load_plugin(make_plugin(tmp_path, "p", controller=body))
    first, second = plugin.load_class(), plugin.load_class()
    assert first is not second
    first.compute_control.__globals__["CALLS"].append(1)  # the first class's own module
    assert second.compute_control.__globals__["CALLS"] == []


def test_the_config_is_immutable_and_the_challenge_values_come_from_the_env(tmp_path, env):
    toml = 'name = "x"\nlevel = { max_episode_steps = 1 }\n[gains]\nkp = [1.0, 2.0]\n'
    plugin = load_plugin(make_plugin(tmp_path, "p", config=toml))
    config = plugin.config(challenge_values(env))
    assert set(config) == {"controller", *CHALLENGE_KEYS}
    assert config["controller"]["gains"]["kp"] == (1.0, 2.0)
    # The plugin's "level" stays inside its own section; the Challenge's is the env's.
    assert config["controller"]["level"]["max_episode_steps"] == 1
    assert config["level"]["max_episode_steps"] == LEVEL_0.max_episode_steps
    assert config["vehicle"]["chassis_mass_kg"] == ProjectConfig().chassis_mass_kg
    assert config["benchmark"]["version"] == env.vector_env.benchmark_version
    np.testing.assert_allclose(config["action"]["low"], env.action_space.low)
    with pytest.raises(TypeError):
        config["controller"]["name"] = "y"
    with pytest.raises(TypeError):
        config["level"]["max_episode_steps"] = 1


def test_controllers_get_no_env(env):
    """The lifecycle signatures carry only observations, info, actions and
    outcomes: nothing that could reach the env, pool or simulator."""
    import inspect

    names = {name for _, method in inspect.getmembers(Controller, inspect.isfunction)
             for name in inspect.signature(method).parameters}
    assert names <= {"self", "obs", "info", "config", "action", "reward", "terminated", "truncated", "debug_draw"}
